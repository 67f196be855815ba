"""The board's side of ``agap backup`` and ``agap restore``.

:func:`read_board` makes every read an export needs and returns it typed;
:class:`RestoreTarget` makes every write a restore needs. The backup file, its format
and the order of a restore are :mod:`fabric.apps.deploy.backup`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabric.cards import CardSet
from fabric.kanboard.bootstrap import init_board, load_layout
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.fit import fit
from fabric.kanboard.layout import Column
from fabric.kanboard.port import BoardRefused, Call, Outcome, RpcPort
from fabric.kanboard.rows import (
    BoardComment,
    BoardFile,
    BoardTask,
    as_int,
    comment_rows,
    file_rows,
    meta_map,
    tag_rows,
    task_rows,
)
from fabric.kanboard.views import BoardLayout
from fabric.settings.resolve import Settings

CHUNK = 50  # tasks read per round trip
TAG_CHUNK = 200  # lock tags created per round trip
RESTORED_NONCE = "restored"  # the color_id of a recreated lock tag


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _unwrap(out: Outcome, doing: str) -> Any:
    value = out.unwrap()
    if value is False or value is None:
        raise BoardRefused(out.call.method, value, doing)
    return value


def _names(value: Any, name: str) -> list[tuple[int, str]]:
    """(id, name) of the rows of a list answer, in board order (position, then id)."""
    rows = [r for r in value or [] if isinstance(r, Mapping)]
    rows.sort(key=lambda r: (as_int(r.get("position")), as_int(r.get("id"))))
    return [(as_int(r.get("id")), str(r[name])) for r in rows]


# ---------------------------------------------------------------------------------------
# Export


@dataclass(frozen=True)
class FileCopy:
    """A task's file with its content (base64, as the board hands it out)."""

    name: str
    size: int
    blob: str


@dataclass(frozen=True)
class TaskExport:
    """One task as an export reads it: its row, where it sits (by name), and the rest."""

    task: BoardTask
    column: str | None  # the column's title
    swimlane: str | None
    owner: str | None  # the owner's username
    metadata: dict[str, str]
    comments: list[BoardComment]
    files: list[FileCopy]
    tags: list[str]


@dataclass(frozen=True)
class BoardExport:
    """Every task of the work project, with the layout it lives in."""

    project: str
    columns: list[str]  # titles, in board order
    swimlanes: list[str]
    project_meta: dict[str, Any]
    lock_tags: list[str]
    locks_meta: dict[str, Any]
    users: dict[int, str]  # id -> username
    tasks: list[TaskExport]


def read_board(port: RpcPort, settings: Settings) -> BoardExport:
    """Everything an export holds: one round trip for the layout and the rows, then one
    per CHUNK tasks (metadata, comments, files, tags) and per CHUNK file downloads."""
    port = fit(port)  # metadata comes back whole, however it is chunked on the board
    layout = load_layout(port, settings)
    pid, lpid = layout.project_id, layout.locks_project_id
    out = port.batch(
        [
            Call("getColumns", {"project_id": pid}),
            Call("getAllSwimlanes", {"project_id": pid}),
            Call("getProjectMetadata", {"project_id": pid}),
            Call("getTagsByProject", {"project_id": lpid}),
            Call("getProjectMetadata", {"project_id": lpid}),
            Call("getAllUsers"),
            Call("getAllTasks", {"project_id": pid, "status_id": 1}),
            Call("getAllTasks", {"project_id": pid, "status_id": 0}),
        ]
    )
    columns = dict(_names(out[0].unwrap(), "title"))
    lanes = dict(_names(out[1].unwrap(), "name"))
    users = {as_int(u["id"]): str(u["username"]) for u in out[5].unwrap() or []}
    rows = sorted([*task_rows(out[6].unwrap()), *task_rows(out[7].unwrap())], key=lambda r: r.id)
    tasks: list[TaskExport] = []
    for chunk in _chunks(rows, CHUNK):
        tasks += _read_tasks(port, chunk, columns, lanes, users)
    return BoardExport(
        project=layout.project_name,
        columns=list(columns.values()),
        swimlanes=list(lanes.values()),
        project_meta=dict(out[2].unwrap() or {}),
        lock_tags=sorted(t.name for t in tag_rows(out[3].unwrap())),
        locks_meta=dict(out[4].unwrap() or {}),
        users=users,
        tasks=tasks,
    )


def _read_tasks(
    port: RpcPort,
    rows: Sequence[BoardTask],
    columns: dict[int, str],
    lanes: dict[int, str],
    users: dict[int, str],
) -> list[TaskExport]:
    """A chunk of tasks: one round trip for their metadata, comments, files and tags,
    then one per CHUNK files for the downloads."""
    calls: list[Call] = []
    for row in rows:
        calls += [
            Call("getTaskMetadata", {"task_id": row.id}),
            Call("getAllComments", {"task_id": row.id}),
            Call("getAllTaskFiles", {"task_id": row.id}),
            Call("getTaskTags", {"task_id": row.id}),
        ]
    res = port.batch(calls)
    files = [file_rows(res[4 * i + 2].unwrap()) for i in range(len(rows))]
    blobs = _download(port, [f for fs in files for f in fs])
    out = []
    for i, row in enumerate(rows):
        tags = res[4 * i + 3].unwrap()
        out.append(
            TaskExport(
                task=row,
                column=columns.get(row.column_id),
                swimlane=lanes.get(row.swimlane_id),
                owner=users.get(row.owner_id),
                metadata=meta_map(res[4 * i].unwrap()),
                comments=comment_rows(res[4 * i + 1].unwrap()),
                files=[FileCopy(f.name, f.size, blobs[f.id]) for f in files[i]],
                tags=sorted(str(v) for v in (tags.values() if isinstance(tags, Mapping) else ())),
            )
        )
    return out


def _download(port: RpcPort, files: Sequence[BoardFile]) -> dict[int, str]:
    """Each file's content (base64), CHUNK downloads per round trip."""
    blobs: dict[int, str] = {}
    for part in _chunks(files, CHUNK):
        got = port.batch([Call("downloadTaskFile", {"file_id": f.id}) for f in part])
        for f, o in zip(part, got, strict=True):
            blobs[f.id] = str(o.unwrap() or "")
    return blobs


# ---------------------------------------------------------------------------------------
# Restore


def board_holdings(port: RpcPort, settings: Settings) -> tuple[int, bool]:
    """How many tasks the work project holds, and whether the locks project holds lock
    tags (0 and False for projects not on the board): two round trips."""
    port = fit(port)
    out = port.batch(
        [
            Call("getProjectByName", {"name": settings.project}),
            Call("getProjectByName", {"name": settings.locks_project}),
        ]
    )
    work, locks = out[0].unwrap(), out[1].unwrap()
    checks: list[Call] = []
    if isinstance(work, dict):
        for status in (1, 0):
            checks.append(Call("getAllTasks", {"project_id": as_int(work["id"]), "status_id": status}))
    if isinstance(locks, dict):
        checks.append(Call("getTagsByProject", {"project_id": as_int(locks["id"])}))
    res = port.batch(checks) if checks else []
    tasks = sum(len(o.unwrap() or []) for o in res[:2]) if isinstance(work, dict) else 0
    return tasks, isinstance(locks, dict) and bool(res[-1].unwrap())


@dataclass(frozen=True)
class NewTask:
    """A task as a restore creates it (first pass: ids are needed before references)."""

    title: str
    column: Column
    swimlane: str | None
    owner: str | None  # a username
    priority: int
    reference: str
    color: str
    due_at: int
    start_at: int


@dataclass(frozen=True)
class JournalLine:
    """A comment as a restore writes it again (its date is not settable)."""

    user: str  # a username; unknown ones are written as the application
    content: str
    visibility: str


@dataclass(frozen=True)
class TaskContent:
    """What a restore writes on a created task (second pass)."""

    description: str
    metadata: dict[str, str]
    comments: list[JournalLine]
    files: list[tuple[str, str]]  # (name, base64 content)
    tags: list[str]
    closed: bool


class RestoreTarget:
    """The board a backup is restored onto, its layout created by ``init_board``."""

    def __init__(self, port: RpcPort, layout: BoardLayout, swimlanes: dict[str, int]) -> None:
        self.port = port
        self.layout = layout
        self.swimlanes = swimlanes  # name -> id, every swimlane the backup names

    @classmethod
    def prepare(
        cls, port: RpcPort, settings: Settings, cards: CardSet, swimlanes: Sequence[str]
    ) -> RestoreTarget:
        """Create the layout, plus the swimlanes the backup has and the cards no longer name."""
        port = fit(port)  # a backup made on SQLite may hold values PostgreSQL cannot
        layout = init_board(port, settings, cards).layout
        assert layout is not None
        lanes = {
            str(s["name"]): as_int(s["id"])
            for s in port.call("getAllSwimlanes", {"project_id": layout.project_id}) or []
        }
        for name in swimlanes:
            if name not in lanes:
                lanes[name] = int(
                    _unwrap(
                        port.batch([Call("addSwimlane", {"project_id": layout.project_id, "name": name})])[0],
                        f"add swimlane {name!r}",
                    )
                )
        return cls(port, layout, lanes)

    def create_task(self, task: NewTask, *, doing: str) -> int:
        """Create a task in its column and swimlane; its new id (one round trip)."""
        params: dict[str, Any] = {
            "title": task.title,
            "project_id": self.layout.project_id,
            "column_id": self.layout.columns[task.column],
            "priority": task.priority,
            "reference": task.reference,
            "color_id": task.color,
        }
        if task.swimlane:
            params["swimlane_id"] = self.swimlanes[task.swimlane]
        owner = self.layout.users.get(task.owner or "", 0)
        if owner:
            params["owner_id"] = owner
        if task.due_at:
            params["date_due"] = format_input_date(task.due_at)
        if task.start_at:
            params["date_started"] = format_input_date(task.start_at)
        return int(_unwrap(self.port.batch([Call("createTask", params)])[0], doing))

    def fill_task(self, task_id: int, content: TaskContent, *, label: str) -> None:
        """Description, metadata, comments (in order), files, tags and closing, in one
        round trip; any refusal raises, naming ``label``."""
        calls = [Call("updateTask", {"id": task_id, "description": content.description})]
        if content.metadata:
            calls.append(Call("saveTaskMetadata", {"task_id": task_id, "values": content.metadata}))
        calls += [
            Call(
                "createComment",
                {
                    "task_id": task_id,
                    "user_id": self.layout.users.get(c.user, 0),
                    "content": c.content,
                    "visibility": c.visibility,
                },
            )
            for c in content.comments
        ]
        calls += [
            Call(
                "createTaskFile",
                {"project_id": self.layout.project_id, "task_id": task_id, "filename": name, "blob": blob},
            )
            for name, blob in content.files
        ]
        if content.tags:
            calls.append(
                Call(
                    "setTaskTags",
                    {"project_id": self.layout.project_id, "task_id": task_id, "tags": list(content.tags)},
                )
            )
        if content.closed:
            calls.append(Call("closeTask", {"task_id": task_id}))
        for o in self.port.batch(calls):
            _unwrap(o, f"restore {o.call.method} of {label}")

    def create_locks(self, names: Sequence[str]) -> None:
        """Create lock tags (colour RESTORED_NONCE), TAG_CHUNK per round trip."""
        for part in _chunks(names, TAG_CHUNK):
            got = self.port.batch(
                [
                    Call(
                        "createTag",
                        {"project_id": self.layout.locks_project_id, "tag": n, "color_id": RESTORED_NONCE},
                    )
                    for n in part
                ]
            )
            for name, o in zip(part, got, strict=True):
                _unwrap(o, f"recreate lock tag {name!r}")


__all__ = [
    "CHUNK",
    "RESTORED_NONCE",
    "TAG_CHUNK",
    "BoardExport",
    "FileCopy",
    "JournalLine",
    "NewTask",
    "RestoreTarget",
    "TaskContent",
    "TaskExport",
    "board_holdings",
    "read_board",
]
