"""What the fabric reads off the board: its layout's ids, and tasks as views.

A :class:`TaskView` is one task's typed row, its spec and its per-epoch records, parsed
from the row and the task's metadata; :func:`parse_view` never raises on corrupted
metadata, it lists the problem. Reading and writing are :mod:`fabric.kanboard.taskboard`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from fabric.errors import ConfigError
from fabric.kanboard.layout import (
    META_CRON_PREFIX,
    META_GAP,
    META_PARK_PREFIX,
    META_PROJECTED,
    META_SPEC,
    META_TERMS,
    META_UID,
    Column,
    record_epoch,
)
from fabric.kanboard.rows import BoardTask, meta_map
from fabric.plain import Plain
from fabric.task import Record, TaskSpec, Terms


class BoardLayout(Plain):
    """Kanboard ids of the fabric's projects, columns, queue swimlanes and human users."""

    project_name: str
    project_id: int
    locks_project_id: int
    columns: dict[Column, int]
    swimlanes: dict[str, int]  # queue name -> swimlane id
    users: dict[str, int]  # Kanboard username -> user id (project members)
    me: int = 0  # the signed-in board user's id; 0: the application token
    # The confined agents' homes, by agent id (fabric.kanboard.principals): each a layout
    # of its own, with no homes. A board user's layout is its home and has none.
    homes: dict[str, BoardLayout] = field(default_factory=dict)

    def swimlane(self, queue: str) -> int:
        try:
            return self.swimlanes[queue]
        except KeyError:
            raise ConfigError(
                f"queue {queue!r} has no swimlane on the board",
                hint="run `agap init` after adding a card",
            ) from None

    def queue_of(self, swimlane_id: int) -> str | None:
        for name, sid in self.swimlanes.items():
            if sid == swimlane_id:
                return name
        return None

    def column_id(self, column: Column) -> int:
        """The id of ``column``; a board without Backlog keeps a long queue in Queued."""
        if column not in self.columns and column == Column.BACKLOG:
            column = Column.QUEUED
        return self.columns[column]

    def column_of(self, column_id: int) -> Column | None:
        """The fabric column with this id (None: a column the fabric does not own)."""
        for col, cid in self.columns.items():
            if cid == column_id:
                return col
        return None

    def to_json(self) -> str:
        return json.dumps(self._to_dict(), sort_keys=True)

    def _to_dict(self) -> dict[str, Any]:
        return {
            "project_name": self.project_name,
            "project_id": self.project_id,
            "locks_project_id": self.locks_project_id,
            "columns": {c.value: i for c, i in self.columns.items()},
            "swimlanes": self.swimlanes,
            "users": self.users,
            "me": self.me,
            "homes": {k: h._to_dict() for k, h in self.homes.items()},
        }

    @classmethod
    def from_json(cls, text: str) -> BoardLayout:
        return cls._from_dict(json.loads(text))

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> BoardLayout:
        return cls(
            project_name=str(d["project_name"]),
            project_id=int(d["project_id"]),
            locks_project_id=int(d["locks_project_id"]),
            columns={Column(k): int(v) for k, v in d["columns"].items()},
            swimlanes={k: int(v) for k, v in d["swimlanes"].items()},
            users={k: int(v) for k, v in d["users"].items()},
            me=int(d.get("me", 0)),
            homes={k: cls._from_dict(h) for k, h in d.get("homes", {}).items()},
        )


class GapNote(Plain, frozen=False):
    """A lock for ``epoch`` was seen taken with no record behind it, first at ``seen``."""

    epoch: int
    seen: float


class TaskView(Plain, frozen=False):
    """One task as read from the board: its typed row (``task``), spec and per-epoch records.

    ``spec`` carries the priority and deadline a person set on the card (``terms``), if
    any; :attr:`submitted` is the spec as it was submitted."""

    id: int
    task: BoardTask
    uid: str | None
    spec: TaskSpec | None
    records: dict[int, Record]
    meta: dict[str, str]
    read_at: float
    problems: list[str] = field(default_factory=list)
    terms: Terms | None = None
    as_submitted: TaskSpec | None = None  # set when terms changed the spec

    @property
    def submitted(self) -> TaskSpec | None:
        """The spec as submitted: what an idempotent submit compares with."""
        return self.as_submitted or self.spec

    @property
    def row(self) -> Mapping[str, Any]:
        """The row as the board sent it (tests read raw fields; the fabric reads ``task``)."""
        return self.task.raw

    @property
    def epoch(self) -> int:
        """The highest epoch with a record (-1 when none: a submit still in flight)."""
        return max(self.records, default=-1)

    @property
    def current(self) -> Record | None:
        """The record of the highest epoch: the task's current state."""
        return self.records.get(self.epoch)

    @property
    def gap(self) -> GapNote | None:
        raw = self.meta.get(META_GAP)
        if not raw:
            return None
        try:
            d = json.loads(raw)
            return GapNote(int(d["epoch"]), float(d["seen"]))
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def is_open(self) -> bool:
        return self.task.is_open

    @property
    def fabric_moved_at(self) -> float:
        """The latest time the fabric itself moved the card for the current record.

        The record's own time, or a later re-sent or repaired move (``META_PROJECTED``).
        A card moved well after this was moved by someone else: a person's gesture.
        """
        rec = self.current
        at = rec.at if rec is not None else 0.0
        epoch, _, when = self.meta.get(META_PROJECTED, "").partition(":")
        try:
            if int(epoch) == self.epoch:
                at = max(at, float(when))
        except ValueError:
            pass
        return at


def parse_view(
    task_id: int, row: BoardTask | Mapping[str, Any] | None, meta: Any, read_at: float
) -> TaskView:
    """Build a :class:`TaskView` from a task row (typed, or ``getTask``'s answer) and
    ``getTaskMetadata``'s answer.

    Corrupted metadata does not raise: it is listed in ``problems`` so a sweep can report
    it and carry on.
    """
    values = meta_map(meta)
    problems: list[str] = []
    spec: TaskSpec | None = None
    if META_SPEC in values:
        try:
            spec = TaskSpec.from_meta(values[META_SPEC])
        except ValueError as exc:
            problems.append(f"{META_SPEC}: unreadable ({_short(exc)})")
    terms: Terms | None = None
    if values.get(META_TERMS):
        try:
            terms = Terms.from_meta(values[META_TERMS])
        except ValueError as exc:
            problems.append(f"{META_TERMS}: unreadable ({_short(exc)})")
    records: dict[int, Record] = {}
    for key, value in values.items():
        epoch = record_epoch(key)
        if epoch is None:
            continue
        try:
            rec = Record.from_meta(value)
        except ValueError as exc:
            problems.append(f"{key}: unreadable record ({_short(exc)})")
            continue
        if rec.epoch != epoch:
            problems.append(f"{key}: record says epoch {rec.epoch}")
            continue
        records[epoch] = rec
    amended = terms.apply(spec) if terms is not None and spec is not None else None
    return TaskView(
        id=task_id,
        task=row if isinstance(row, BoardTask) else BoardTask.parse(row or {}),
        uid=values.get(META_UID) or None,
        spec=amended or spec,
        records=records,
        meta=values,
        read_at=read_at,
        problems=problems,
        terms=terms,
        as_submitted=spec if amended is not None else None,
    )


def _named_states(meta: Any, prefix: str, name_field: str) -> dict[str, dict[str, Any]]:
    """Name -> JSON object of the project metadata keys under ``prefix``; unreadable
    entries are skipped. The value names its owner: a long name's key is hashed."""
    states: dict[str, dict[str, Any]] = {}
    for key, value in (meta or {}).items() if isinstance(meta, dict) else ():
        if str(key).startswith(prefix) and value:
            try:
                data = json.loads(value)
            except ValueError:
                continue
            if isinstance(data, dict):
                states[str(data.get(name_field) or str(key)[len(prefix) :])] = data
    return states


def parse_park_states(meta: Any) -> dict[str, dict[str, Any]]:
    """Queue -> park state from project metadata; unreadable entries are skipped."""
    return _named_states(meta, META_PARK_PREFIX, "queue")


def parse_cron_states(meta: Any) -> dict[str, dict[str, Any]]:
    """Schedule -> the state its cron submitter published (``fabric.cron.<schedule>``)."""
    return _named_states(meta, META_CRON_PREFIX, "schedule")


def _short(exc: Exception) -> str:
    """One line in the fabric's words (a SpecError's first problem, and how many more)."""
    return str(exc).splitlines()[0][:160]


__all__ = ["BoardLayout", "GapNote", "TaskView", "parse_cron_states", "parse_park_states", "parse_view"]
