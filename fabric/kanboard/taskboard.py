"""The fabric's view of a Kanboard board: tasks, their metadata, lock tags, projections.

This module and :mod:`fabric.kanboard` are the only places that know Kanboard's method
names. The rest of the fabric speaks in tasks, epochs and records. Independent calls
are batched: each public method here costs one round trip unless it says otherwise.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fabric.errors import ConfigError, InvalidInput
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.fit import fit
from fabric.kanboard.layout import (
    COLUMN_OF_STATE,
    META_GAP,
    META_PARK_PREFIX,
    META_PROJECTED,
    META_SPEC,
    META_UID,
    Column,
    State,
    epoch_lock,
    park_key,
    record_epoch,
    record_key,
)
from fabric.kanboard.port import (
    BoardRefused,
    BoardUnavailable,
    Call,
    MaybeDone,
    Outcome,
    RpcError,
    RpcPort,
)
from fabric.task import Record, TaskSpec


class TaskNotFound(InvalidInput):
    """No task with this id on the board."""

    def __init__(self, task_id: int) -> None:
        super().__init__(
            f"task #{task_id} does not exist", where="board", hint="`agap ls --all` lists the tasks"
        )
        self.task_id = task_id


BOTTOM = 1_000_000  # Kanboard clamps a too-large position to the bottom of the cell
RETRIES = 8  # re-sends of an idempotent write that failed ambiguously
# Concurrent moveTaskPosition calls lose updates on PostgreSQL: each rewrites the
# positions (and column) of every card in the column it leaves, from a snapshot that
# may predate another mover's commit, so a card can land back where it was. A card
# moved no later than its record's time plus MOVE_TOLERANCE is the fabric's own move;
# VERIFY_AFTER is when the competing transactions have committed and the card can be
# checked; a lost move is sent again up to MOVE_TRIES times, and only while the record
# it projects is still the task's latest (a later transition's writer checks its own).
# Someone else's card is put right only when its record is REPAIR_AGE old, so that its
# writer's own check comes first.
MOVE_TOLERANCE = 15.0  # covers a write batch's own re-sends (deadlocks cost ~1 s each)
VERIFY_AFTER = 0.5
MOVE_TRIES = 5
REPAIR_AGE = 2.0


def _pause(attempt: int) -> None:
    """Backoff between re-sends: exponential, jittered, capped at a second.

    Real Kanboard on SQLite answers "database is locked" while another PHP worker
    writes; spreading the re-sends out is what gets them through.
    """
    time.sleep(min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.5))


# Writes that are safe to send again: upserts, moves, closes. Comments are not (a
# duplicate line in the journal); files are re-sent (a duplicate beats a lost result).
IDEMPOTENT = frozenset(
    {
        "saveTaskMetadata",
        "moveTaskPosition",
        "updateTask",
        "closeTask",
        "openTask",
        "createTaskFile",
        "removeTaskMetadata",
    }
)


@dataclass(frozen=True)
class BoardLayout:
    """Kanboard ids of the fabric's projects, columns, queue swimlanes and human users."""

    project_name: str
    project_id: int
    locks_project_id: int
    columns: dict[Column, int]
    swimlanes: dict[str, int]  # queue name -> swimlane id
    users: dict[str, int]  # Kanboard username -> user id (project members)

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

    def to_json(self) -> str:
        return json.dumps(
            {
                "project_name": self.project_name,
                "project_id": self.project_id,
                "locks_project_id": self.locks_project_id,
                "columns": {c.value: i for c, i in self.columns.items()},
                "swimlanes": self.swimlanes,
                "users": self.users,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> BoardLayout:
        d = json.loads(text)
        return cls(
            project_name=str(d["project_name"]),
            project_id=int(d["project_id"]),
            locks_project_id=int(d["locks_project_id"]),
            columns={Column(k): int(v) for k, v in d["columns"].items()},
            swimlanes={k: int(v) for k, v in d["swimlanes"].items()},
            users={k: int(v) for k, v in d["users"].items()},
        )


@dataclass
class _Move:
    """A card this connection moved, to be checked once competing moves have committed."""

    column_id: int
    swimlane_id: int
    epoch: int  # the record this move projects
    at: float  # the fabric's clock, to compare with the card's date_moved
    due: float  # time.monotonic() after which competing moves have committed
    tries: int = 1


@dataclass
class GapNote:
    """A lock for ``epoch`` was seen taken with no record behind it, first at ``seen``."""

    epoch: int
    seen: float


@dataclass
class TaskView:
    """One task as read from the board: its row, spec and per-epoch records."""

    id: int
    row: dict[str, Any]
    uid: str | None
    spec: TaskSpec | None
    records: dict[int, Record]
    meta: dict[str, str]
    read_at: float
    problems: list[str] = field(default_factory=list)

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
        return bool(self.row.get("is_active", 1))

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


def parse_view(task_id: int, row: dict[str, Any] | None, meta: Any, read_at: float) -> TaskView:
    """Build a :class:`TaskView` from ``getTask`` and ``getTaskMetadata`` results.

    Corrupted metadata does not raise: it is listed in ``problems`` so a sweep can report
    it and carry on.
    """
    meta_map: dict[str, str] = (
        {str(k): ("" if v is None else str(v)) for k, v in (meta or {}).items()}
        if isinstance(meta, dict)
        else {}
    )
    problems: list[str] = []
    spec: TaskSpec | None = None
    if META_SPEC in meta_map:
        try:
            spec = TaskSpec.from_meta(meta_map[META_SPEC])
        except (ValidationError, ValueError) as exc:
            problems.append(f"{META_SPEC}: unreadable ({_short(exc)})")
    records: dict[int, Record] = {}
    for key, value in meta_map.items():
        epoch = record_epoch(key)
        if epoch is None:
            continue
        try:
            rec = Record.from_meta(value)
        except (ValidationError, ValueError) as exc:
            problems.append(f"{key}: unreadable record ({_short(exc)})")
            continue
        if rec.epoch != epoch:
            problems.append(f"{key}: record says epoch {rec.epoch}")
            continue
        records[epoch] = rec
    return TaskView(
        id=task_id,
        row=row or {},
        uid=meta_map.get(META_UID) or None,
        spec=spec,
        records=records,
        meta=meta_map,
        read_at=read_at,
        problems=problems,
    )


def parse_park_states(meta: Any) -> dict[str, dict[str, Any]]:
    """Queue -> park state from project metadata; unreadable entries are skipped."""
    states: dict[str, dict[str, Any]] = {}
    for key, value in (meta or {}).items() if isinstance(meta, dict) else ():
        if str(key).startswith(META_PARK_PREFIX) and value:
            try:
                data = json.loads(value)
            except ValueError:
                continue
            if isinstance(data, dict):
                # The value names its queue: a long queue's key is hashed.
                states[str(data.get("queue") or str(key)[len(META_PARK_PREFIX) :])] = data
    return states


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:160]


class TaskBoard:
    """Fabric operations on one work project and its locks project."""

    def __init__(
        self, port: RpcPort, layout: BoardLayout, *, clock: Any = time.time, seal_key: bytes = b""
    ) -> None:
        # Every value goes through the fitting port: records, specs and answers longer
        # than a PostgreSQL/MySQL metadata column are stored in chunks (fabric.kanboard.fit).
        self.port = fit(port)
        self.layout = layout
        self.clock = clock
        # Seals the spec block of descriptions (fabric.submit): only the fabric's own
        # blocks are ever trusted to rebuild a task.
        self.seal_key = seal_key
        self._moved: dict[int, _Move] = {}

    # -- reading --------------------------------------------------------------------

    def read(self, task_id: int) -> TaskView:
        """The task's row and metadata (one round trip); :class:`TaskNotFound` if gone."""
        views = self.read_many([task_id])
        if task_id not in views:
            raise TaskNotFound(task_id)
        return views[task_id]

    def read_many(self, task_ids: Sequence[int]) -> dict[int, TaskView]:
        """Several tasks' rows and metadata in one round trip; missing tasks are omitted."""
        # Kanboard's ids are 32-bit: PostgreSQL refuses a larger one with an SQL error,
        # where it simply names no task.
        task_ids = [t for t in task_ids if 0 < t < 2**31]
        if not task_ids:
            return {}
        out = self.port.batch(self._read_calls(task_ids))
        now = self.clock()
        views: dict[int, TaskView] = {}
        for i, tid in enumerate(task_ids):
            row, meta = out[2 * i].unwrap(), out[2 * i + 1].unwrap()
            if row:
                views[tid] = parse_view(tid, row, meta, now)
        return views

    def read_meta_many(self, rows: Sequence[dict[str, Any]]) -> list[TaskView]:
        """Views for rows already fetched (e.g. by a search): only metadata is read."""
        if not rows:
            return []
        out = self.port.batch([Call("getTaskMetadata", {"task_id": int(r["id"])}) for r in rows])
        now = self.clock()
        return [parse_view(int(r["id"]), r, o.unwrap(), now) for r, o in zip(rows, out, strict=True)]

    def search(self, query: str) -> list[dict[str, Any]]:
        """``searchTasks`` in the work project (unordered, unlimited, as Kanboard gives it).

        The same round trip reads back the cards this connection moved a moment ago, and
        moves again any whose move was lost (see MOVE_TOLERANCE).
        """
        now = time.monotonic()
        due = [tid for tid, m in self._moved.items() if now >= m.due]
        out = self.port.batch(
            [
                Call("searchTasks", {"project_id": self.layout.project_id, "query": query}),
                *self._read_calls(due),
            ]
        )
        self._recheck_moves(due, out[1:])
        return list(out[0].unwrap() or [])

    @staticmethod
    def _read_calls(task_ids: Sequence[int]) -> list[Call]:
        """A task's row and metadata, per task: what a view is made of."""
        calls: list[Call] = []
        for tid in task_ids:
            calls += [Call("getTask", {"task_id": tid}), Call("getTaskMetadata", {"task_id": tid})]
        return calls

    def _recheck_moves(self, task_ids: Sequence[int], out: Sequence[Outcome]) -> None:
        again: list[Call] = []
        for i, tid in enumerate(task_ids):
            move = self._moved.pop(tid)
            row, meta = out[2 * i], out[2 * i + 1]
            if row.error is not None or meta.error is not None or not isinstance(row.value, dict):
                continue  # gone, or unreadable: the keeper's sweep is the backstop
            if int(row.value.get("column_id") or 0) == move.column_id:
                continue  # where we put it
            if float(row.value.get("date_moved") or 0) > move.at + MOVE_TOLERANCE:
                continue  # moved again since (a person's gesture): theirs to keep
            if parse_view(tid, row.value, meta.value, 0.0).epoch != move.epoch:
                continue  # a later transition: its writer projects it
            again += [self.stamp_call(tid, move.epoch), self.move_call(tid, move.column_id, move.swimlane_id)]
            if move.tries < MOVE_TRIES:
                self._moved[tid] = self._new_move(
                    move.column_id, move.swimlane_id, move.epoch, move.tries + 1
                )
        if again:
            self._batch(again)

    def _new_move(self, column_id: int, swimlane_id: int, epoch: int, tries: int = 1) -> _Move:
        return _Move(column_id, swimlane_id, epoch, self.clock(), time.monotonic() + VERIFY_AFTER, tries)

    def settle_moves(self) -> None:
        """Check every card this connection moved, now: for a worker about to exit.

        Waits until competing moves have committed (at most VERIFY_AFTER per try).
        """
        for _ in range(MOVE_TRIES):
            if not self._moved:
                return
            # Jittered: workers leaving together would otherwise move at the same moment
            # and lose each other's moves again.
            wait = max(m.due for m in self._moved.values()) - time.monotonic()
            time.sleep(min(max(wait, 0.0), VERIFY_AFTER) + random.uniform(0, VERIFY_AFTER))
            due = list(self._moved)
            self._recheck_moves(due, self.port.batch(self._read_calls(due)))

    def repair_projection(self, view: TaskView) -> bool:
        """Move a card a lost move left behind to its record's column (True if moved).

        ``view`` may be stale (a poll's row): the task is read again first, and moved only
        if its latest record is still ``view``'s, at least REPAIR_AGE old (its writer has
        had its own check), and the card was last moved no later than that record plus
        MOVE_TOLERANCE (a later move is a person's gesture, the keeper's to read).
        """
        if view.current is None or self.clock() - view.current.at < REPAIR_AGE:
            return False
        fresh = self.read_many([view.id]).get(view.id)
        rec = fresh.current if fresh is not None else None
        if fresh is None or rec is None or fresh.epoch != view.epoch:
            return False
        calls = [
            c for c in self._projection_calls(fresh, rec, description=None) if c.method == "moveTaskPosition"
        ]
        if not calls or float(fresh.row.get("date_moved") or 0) > fresh.fabric_moved_at + MOVE_TOLERANCE:
            return False
        self._batch([self.stamp_call(fresh.id, rec.epoch), *calls])
        self._remember_moves(calls, fresh.id, rec.epoch)
        return True

    def stamp_call(self, task_id: int, epoch: int) -> Call:
        """Mark a move the fabric makes outside a record's batch (see META_PROJECTED).

        Sent in the same batch, just before the move, so the card's ``date_moved`` and
        the stamp are the same moment.
        """
        return Call(
            "saveTaskMetadata",
            {"task_id": task_id, "values": {META_PROJECTED: f"{epoch}:{self.clock():.3f}"}},
        )

    def _remember_moves(self, calls: Sequence[Call], task_id: int, epoch: int) -> None:
        for c in calls:
            if c.method == "moveTaskPosition" and isinstance(c.params, dict):
                self._moved[task_id] = self._new_move(
                    int(c.params["column_id"]), int(c.params["swimlane_id"]), epoch
                )
        if len(self._moved) > 1000:  # a bounded memory: the keeper's sweep is the backstop
            self._moved.clear()

    def move_call(self, task_id: int, column_id: int, swimlane_id: int) -> Call:
        """Move a card to the bottom of a cell (swimlane 0: where it is)."""
        return Call(
            "moveTaskPosition",
            {
                "project_id": self.layout.project_id,
                "task_id": task_id,
                "column_id": column_id,
                "position": BOTTOM,
                "swimlane_id": swimlane_id,
            },
        )

    def open_in(self, columns: Iterable[Column], queue: str | None = None) -> list[dict[str, Any]]:
        """Open tasks in the given columns (and queue): what polls and sweeps look at."""
        terms = ["status:open"] + [f'column:"{c.value}"' for c in columns]
        if queue is not None:
            terms.append(f'swimlane:"{queue}"')
        return self.search(" ".join(terms))

    # -- locks ----------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> bool:
        """Try to create lock tag ``name``: True if this caller created it.

        With ``owner`` (a fixed colour naming who may hold it), also True when the tag
        already names that owner: an earlier call of the same owner created it.

        ``createTag`` is a plain INSERT under UNIQUE(project_id, name), so exactly one
        concurrent caller wins. The tag's ``color_id`` carries a nonce naming its creator
        (Kanboard stores it verbatim), so an ambiguous failure — Kanboard can report
        "database is locked" after inserting — is settled by reading the tag back: our
        nonce means we won, another means we lost, none means the insert never happened
        and may be tried again. If even that cannot be read, it counts as a loss; a lock
        that was in fact won then shows up as a gap and is resolved like one.
        """
        nonce = owner or secrets.token_hex(6)
        params = {"project_id": self.layout.locks_project_id, "tag": name, "color_id": nonce}
        for attempt in range(RETRIES):
            try:
                if self.port.call("createTag", params):
                    return True
                if owner is None:
                    return False
            except (MaybeDone, RpcError) as exc:
                if isinstance(exc, RpcError) and not exc.maybe_done:
                    return False
            try:
                holder = self._lock_holder(name)
            except (BoardUnavailable, RpcError):
                return False
            if holder is not None:
                return holder == nonce
            _pause(attempt)
        return False

    def _lock_holder(self, name: str) -> str | None:
        """The nonce of lock tag ``name``'s creator, or None if the tag does not exist.

        Reads every tag of the locks project: used only to settle an ambiguous write.
        """
        tags = self.port.call("getTagsByProject", {"project_id": self.layout.locks_project_id})
        for tag in tags or []:
            if tag.get("name") == name:
                return str(tag.get("color_id") or "")
        return None

    def _batch(self, calls: Sequence[Call]) -> list[Outcome]:
        """Run a batch; re-send its idempotent items that failed ambiguously.

        Only the failed items are sent again (a batch is not atomic: the others ran).
        A whole batch lost in transit is re-sent without its non-idempotent items.
        """
        try:
            out = self.port.batch(calls)
        except MaybeDone:
            kept = [c for c in calls if c.method in IDEMPOTENT or c.is_read]
            out = self._resend(calls, kept)
        for attempt in range(RETRIES):
            redo = [
                i
                for i, o in enumerate(out)
                if o.error is not None and o.error.maybe_done and calls[i].method in IDEMPOTENT
            ]
            if not redo:
                break
            _pause(attempt)
            try:
                again = self.port.batch([calls[i] for i in redo])
            except MaybeDone:
                continue
            for i, o in zip(redo, again, strict=True):
                out[i] = o
        return out

    def _resend(self, calls: Sequence[Call], kept: Sequence[Call]) -> list[Outcome]:
        for attempt in range(RETRIES):
            _pause(attempt)
            try:
                again = iter(self.port.batch(kept))
            except MaybeDone:
                continue
            # Items not re-sent (comments) report "unknown": treated as best effort.
            unknown = RpcError(-32000, "not re-sent after an ambiguous failure")
            return [
                next(again) if (c.method in IDEMPOTENT or c.is_read) else Outcome(c, error=unknown)
                for c in calls
            ]
        raise MaybeDone("the board kept failing ambiguously", calls=calls)

    # -- writing --------------------------------------------------------------------

    def create_task(
        self,
        spec: TaskSpec,
        *,
        description: str,
        reference: str,
        owner_id: int = 0,
        receipt: str | None = None,
    ) -> tuple[int, bool]:
        """Create the Kanboard task (one round trip): returns (task id, receipt won).

        With ``receipt``, the receipt's lock tag is created in the same batch, before the
        task; when the lock is lost the caller must remove the task (it has no records
        yet, so nothing can claim it meanwhile).
        """
        params: dict[str, Any] = {
            "title": spec.title(),
            "project_id": self.layout.project_id,
            # A task for a person waits in their inbox from the start.
            "column_id": self.layout.columns[Column.WAITING if owner_id else Column.QUEUED],
            "swimlane_id": self.layout.swimlane(spec.queue),
            "description": description,
            "priority": spec.priority,
            "reference": reference,
        }
        if owner_id:
            params["owner_id"] = owner_id
        if spec.deadline:
            params["date_due"] = format_input_date(spec.deadline)
        if spec.not_before and (not spec.deadline or spec.not_before <= spec.deadline):
            params["date_started"] = format_input_date(spec.not_before)
        calls = [Call("createTask", params)]
        nonce = secrets.token_hex(6)
        if receipt is not None:
            calls.insert(
                0,
                Call(
                    "createTag",
                    {"project_id": self.layout.locks_project_id, "tag": receipt, "color_id": nonce},
                ),
            )
        try:
            out = self.port.batch(calls)
        except MaybeDone:
            out = [Outcome(c, error=RpcError(0, "lost in transit", method=c.method)) for c in calls]
        won = True
        if receipt is not None:
            first = out[0]
            if first.error is not None and first.error.maybe_done:
                won = self._lock_holder(receipt) == nonce
            else:
                won = bool(first.value) and first.error is None
        created = out[-1]
        if created.error is not None and created.error.maybe_done:
            # The reference is unique to this submit: look before creating again.
            task_id = self._created_or_retry(params)
        elif created.error is None and created.value:
            task_id = created.value
        else:
            # Certainly not created: give the receipt back, or the action id is stuck.
            if receipt is not None and won and isinstance(out[0].value, int):
                self.port.call("removeTag", {"tag_id": out[0].value})
            if created.error is not None and not created.error.refused:
                created.unwrap()
            # A missing project or column is 0 on every backend (an SQL error without a
            # column): the cached layout is stale, which the caller can repair.
            self._check_project(self.port.call("getProjectById", {"project_id": self.layout.project_id}))
            task_id = created.unwrap()
        if not task_id:
            raise BoardRefused("createTask", task_id, f"create the task for queue {spec.queue!r}")
        return int(task_id), won

    def _created_or_retry(self, params: dict[str, Any]) -> int:
        """Settle an ambiguous ``createTask`` by its (unique) reference."""
        for attempt in range(RETRIES):
            row = self.find_by_reference(str(params["reference"]))
            if row is not None:
                return int(row["id"])
            _pause(attempt)
            try:
                result = self.port.call("createTask", params)
            except (MaybeDone, RpcError) as exc:
                if isinstance(exc, RpcError) and not exc.maybe_done:
                    raise
                continue
            return int(result or 0)
        raise MaybeDone("createTask kept failing ambiguously", calls=[Call("createTask", params)])

    def write_initial(self, task_id: int, uid: str, spec: TaskSpec, record: Record) -> None:
        """Bind the uid, write the spec and the epoch-0 record (one round trip, with a
        project check)."""
        calls = [
            self._bind_call(uid, task_id),
            Call(
                "saveTaskMetadata",
                {
                    "task_id": task_id,
                    "values": {
                        META_UID: uid,
                        META_SPEC: spec.to_meta(),
                        record_key(0): record.to_meta(),
                    },
                },
            ),
            Call("getProjectById", {"project_id": self.layout.project_id}),
        ]
        out = self._batch(calls)
        # The binding tag may already exist (a repair bound it first): that is fine.
        if not out[1].unwrap():
            raise BoardRefused("saveTaskMetadata", out[1].value, f"write task #{task_id}'s records")
        self._check_project(out[2].unwrap())

    def _bind_call(self, uid: str, task_id: int) -> Call:
        return Call(
            "createTag",
            {
                "project_id": self.layout.locks_project_id,
                "tag": epoch_lock(uid, 0),
                "color_id": f"t{task_id}",
            },
        )

    def bind_uid(self, uid: str, task_id: int) -> bool:
        """True when ``uid`` belongs to task ``task_id``: its ``<uid>/e0`` tag names it.

        Creates the tag when there is none. A block copied into another card names a uid
        already bound to its real task, so the copy is never adopted.
        """
        return self.lock(epoch_lock(uid, 0), owner=f"t{task_id}")

    def _check_project(self, project: Any) -> None:
        if (
            not isinstance(project, dict)
            or int(project.get("id", 0)) != self.layout.project_id
            or project.get("name") != self.layout.project_name
        ):
            raise ConfigError(
                f"project #{self.layout.project_id} is gone from the board",
                hint="the cached board layout is stale: run `agap init`",
            )

    def remove_task(self, task_id: int) -> None:
        """Remove a task (used to undo a submit that lost its receipt)."""
        self.port.call("removeTask", {"task_id": task_id})

    def find_by_reference(self, reference: str) -> dict[str, Any] | None:
        """The first task with this exact reference, or None."""
        row = self.port.call(
            "getTaskByReference", {"project_id": self.layout.project_id, "reference": reference}
        )
        return row if isinstance(row, dict) else None

    def write_record(
        self,
        view: TaskView,
        record: Record,
        *,
        comment: str | None = None,
        extra_meta: dict[str, str] | None = None,
        close: bool = False,
        reopen: bool = False,
        description: str | None = None,
        files: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Write ``record`` and update the projection, all in one round trip.

        The record comes first: it is the truth. Column, assignee, comment and the rest
        are projections for humans and polls; their failures (e.g. ``moveTaskPosition``
        answering false because the card is already there) do not matter.
        """
        values = {record_key(record.epoch): record.to_meta(), **(extra_meta or {})}
        calls = [Call("saveTaskMetadata", {"task_id": view.id, "values": values})]
        for name, blob in files:
            calls.append(
                Call(
                    "createTaskFile",
                    {
                        "project_id": self.layout.project_id,
                        "task_id": view.id,
                        "filename": name,
                        "blob": blob,
                    },
                )
            )
        calls.extend(self._projection_calls(view, record, description=description))
        if comment:
            calls.append(Call("createComment", {"task_id": view.id, "user_id": 0, "content": comment}))
        if close:
            calls.append(Call("closeTask", {"task_id": view.id}))
        if reopen:
            calls.append(Call("openTask", {"task_id": view.id}))
        out = self._batch(calls)
        saved = out[0].unwrap()
        if not saved:
            raise BoardRefused("saveTaskMetadata", saved, f"write record e{record.epoch} of task #{view.id}")
        self._remember_moves(calls, view.id, record.epoch)
        for o in out[1 : 1 + len(files)]:
            if not o.unwrap():
                raise BoardRefused("createTaskFile", o.value, f"attach a file to task #{view.id}")

    def _projection_calls(self, view: TaskView, record: Record, *, description: str | None) -> list[Call]:
        column = COLUMN_OF_STATE[record.state]
        if record.state == State.QUEUED and record.assignee:
            column = Column.WAITING  # a queued task for a human waits on that human
        lane = int(view.row.get("swimlane_id") or 0)
        calls = []
        if int(view.row.get("column_id") or 0) != self.layout.columns[column]:
            calls.append(self.move_call(view.id, self.layout.columns[column], lane))
        update: dict[str, Any] = {}
        owner = self.layout.users.get(record.assignee or "", 0)
        if int(view.row.get("owner_id") or 0) != owner:
            update["owner_id"] = owner
        if record.not_before and record.state == State.QUEUED:
            due = int(view.row.get("date_due") or 0)
            if not due or record.not_before <= due:
                update["date_started"] = format_input_date(record.not_before)
        if description is not None:
            update["description"] = description
        if update:
            calls.append(Call("updateTask", {"id": view.id, **update}))
        return calls

    def save_meta(self, task_id: int, values: dict[str, str]) -> None:
        """Upsert metadata keys (one round trip)."""
        out = self._batch([Call("saveTaskMetadata", {"task_id": task_id, "values": values})])
        if not out[0].unwrap():
            raise BoardRefused("saveTaskMetadata", False, f"save metadata on task #{task_id}")

    def save_meta_and_read(self, task_id: int, values: dict[str, str]) -> TaskView:
        """Upsert metadata keys, then read the task back, in one round trip."""
        out = self._batch(
            [
                Call("saveTaskMetadata", {"task_id": task_id, "values": values}),
                Call("getTask", {"task_id": task_id}),
                Call("getTaskMetadata", {"task_id": task_id}),
            ]
        )
        if not out[0].unwrap():
            raise BoardRefused("saveTaskMetadata", out[0].value, f"save metadata on task #{task_id}")
        return parse_view(task_id, out[1].unwrap(), out[2].unwrap(), self.clock())

    # -- queue park state (project metadata) -------------------------------------------

    def publish_park(self, queue: str, state: dict[str, Any]) -> None:
        """Publish a queue's park state (only on changes: it is a projection for humans)."""
        self._batch(
            [
                Call(
                    "saveProjectMetadata",
                    {
                        "project_id": self.layout.project_id,
                        "values": {park_key(queue): json.dumps({**state, "queue": queue}, sort_keys=True)},
                    },
                )
            ]
        )

    def save_project_meta(self, values: dict[str, str]) -> None:
        """Upsert work-project metadata keys (one round trip)."""
        out = self._batch(
            [Call("saveProjectMetadata", {"project_id": self.layout.project_id, "values": values})]
        )
        if not out[0].unwrap():
            raise BoardRefused("saveProjectMetadata", out[0].value, "save project metadata")

    def park_states(self) -> dict[str, dict[str, Any]]:
        """Every queue's last published park state (one round trip)."""
        meta = self.port.call("getProjectMetadata", {"project_id": self.layout.project_id})
        return parse_park_states(meta)

    def search_with_parks(self, query: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """A search and the park states together, in one round trip."""
        out = self.port.batch(
            [
                Call("searchTasks", {"project_id": self.layout.project_id, "query": query}),
                Call("getProjectMetadata", {"project_id": self.layout.project_id}),
            ]
        )
        return list(out[0].unwrap() or []), parse_park_states(out[1].unwrap())

    def comment(self, task_id: int, text: str) -> None:
        """Append a line to the task's journal (its comments)."""
        self.port.call("createComment", {"task_id": task_id, "user_id": 0, "content": text})

    def comments(self, task_id: int) -> list[dict[str, Any]]:
        return list(self.port.call("getAllComments", {"task_id": task_id}) or [])

    def files(self, task_id: int) -> list[dict[str, Any]]:
        return list(self.port.call("getAllTaskFiles", {"task_id": task_id}) or [])

    def download(self, file_id: int) -> str:
        return str(self.port.call("downloadTaskFile", {"file_id": file_id}) or "")
