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
class ProjectExport:
    """One work project the fabric made, its locks project, and every task in it."""

    project: str
    locks_project: str
    columns: list[str]  # titles, in board order
    swimlanes: list[str]
    project_meta: dict[str, Any]
    lock_tags: list[str]
    locks_meta: dict[str, Any]
    members: dict[str, str]  # username -> project role, of the work project
    locks_members: dict[str, str]
    tasks: list[TaskExport]


@dataclass(frozen=True)
class QuotaExport:
    """The quota project's slot tags, with the colours that name their holders."""

    name: str
    tags: list[tuple[str, str]]  # (name, colour)
    metadata: dict[str, Any]


@dataclass(frozen=True)
class BoardExport:
    """Every project the fabric made: the work project, the confined agents' homes (each a
    work and a locks project), the quota project when there is one."""

    work: ProjectExport
    homes: dict[str, ProjectExport]  # agent id -> its home
    quota: QuotaExport | None
    users: dict[int, str]  # id -> username, every user of the board


def read_board(port: RpcPort, settings: Settings) -> BoardExport:
    """Everything an export holds: a round trip for the users and the quota project, one
    per project for its layout, members and rows, then one per CHUNK tasks (metadata,
    comments, files, tags) and per CHUNK file downloads."""
    port = fit(port)  # metadata comes back whole, however it is chunked on the board
    layout = load_layout(port, settings)
    out = port.batch([Call("getAllUsers"), Call("getProjectByName", {"name": settings.quota_project})])
    users = {as_int(u["id"]): str(u["username"]) for u in out[0].unwrap() or []}
    quota = out[1].unwrap()
    homes = {
        agent: _read_project(port, home, f"{settings.locks_project}: {agent}", users)
        for agent, home in sorted(layout.homes.items())
    }
    return BoardExport(
        work=_read_project(port, layout, settings.locks_project, users),
        homes=homes,
        quota=_read_quota(port, str(quota["name"]), as_int(quota["id"])) if isinstance(quota, dict) else None,
        users=users,
    )


def _read_quota(port: RpcPort, name: str, pid: int) -> QuotaExport:
    out = port.batch(
        [Call("getTagsByProject", {"project_id": pid}), Call("getProjectMetadata", {"project_id": pid})]
    )
    tags = sorted((t.name, t.color) for t in tag_rows(out[0].unwrap()))
    return QuotaExport(name, tags, dict(out[1].unwrap() or {}))


def _read_project(
    port: RpcPort, layout: BoardLayout, locks_name: str, users: dict[int, str]
) -> ProjectExport:
    pid, lpid = layout.project_id, layout.locks_project_id
    out = port.batch(
        [
            Call("getColumns", {"project_id": pid}),
            Call("getAllSwimlanes", {"project_id": pid}),
            Call("getProjectMetadata", {"project_id": pid}),
            Call("getTagsByProject", {"project_id": lpid}),
            Call("getProjectMetadata", {"project_id": lpid}),
            Call("getAllTasks", {"project_id": pid, "status_id": 1}),
            Call("getAllTasks", {"project_id": pid, "status_id": 0}),
            Call("getProjectUsers", {"project_id": pid}),
            Call("getProjectUsers", {"project_id": lpid}),
        ]
    )
    columns = dict(_names(out[0].unwrap(), "title"))
    lanes = dict(_names(out[1].unwrap(), "name"))
    rows = sorted([*task_rows(out[5].unwrap()), *task_rows(out[6].unwrap())], key=lambda r: r.id)
    members = _roles(port, pid, out[7].unwrap(), users)
    locks_members = _roles(port, lpid, out[8].unwrap(), users)
    tasks: list[TaskExport] = []
    for chunk in _chunks(rows, CHUNK):
        tasks += _read_tasks(port, chunk, columns, lanes, users)
    return ProjectExport(
        project=layout.project_name,
        locks_project=locks_name,
        columns=list(columns.values()),
        swimlanes=list(lanes.values()),
        project_meta=dict(out[2].unwrap() or {}),
        lock_tags=sorted(t.name for t in tag_rows(out[3].unwrap())),
        locks_meta=dict(out[4].unwrap() or {}),
        members=members,
        locks_members=locks_members,
        tasks=tasks,
    )


def _roles(port: RpcPort, pid: int, members: Any, users: dict[int, str]) -> dict[str, str]:
    """username -> role of a project's members (one round trip, none without members)."""
    ids = sorted(as_int(k) for k in (members or {}) if as_int(k) in users)
    if not ids:
        return {}
    out = port.batch([Call("getProjectUserRole", {"project_id": pid, "user_id": u}) for u in ids])
    return {users[u]: str(o.unwrap() or "project-member") for u, o in zip(ids, out, strict=True)}


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


def board_holdings(
    port: RpcPort, pairs: Sequence[tuple[str, str]], tag_projects: Sequence[str] = ()
) -> list[str]:
    """What the named projects already hold, one line each ([] when empty): tasks in
    each (work, locks) pair's work project, tags in its locks project and in each of
    ``tag_projects`` (projects not on the board hold nothing). Two round trips."""
    port = fit(port)
    works = [w for w, _ in pairs]
    tagged = [*(lk for _, lk in pairs), *tag_projects]
    names = [*works, *tagged]
    found = port.batch([Call("getProjectByName", {"name": n}) for n in names])
    ids = {
        n: as_int(o.unwrap()["id"]) for n, o in zip(names, found, strict=True) if isinstance(o.unwrap(), dict)
    }
    checks: list[tuple[str, str, Call]] = []
    for n in works:
        if n in ids:
            checks += [
                ("tasks", n, Call("getAllTasks", {"project_id": ids[n], "status_id": s})) for s in (1, 0)
            ]
    for n in tagged:
        if n in ids:
            checks.append(("tags", n, Call("getTagsByProject", {"project_id": ids[n]})))
    res = port.batch([c for _, _, c in checks]) if checks else []
    count: dict[tuple[str, str], int] = {}
    for (kind, n, _), o in zip(checks, res, strict=True):
        count[kind, n] = count.get((kind, n), 0) + len(o.unwrap() or [])
    lines = []
    for (kind, n), k in count.items():
        if k:
            lines.append(
                f"project {n!r} holds {k} task(s)" if kind == "tasks" else f"project {n!r} holds lock tags"
            )
    return lines


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
    """A project a backup is restored into (the work project or a home), its layout
    created by ``init_board``."""

    def __init__(
        self,
        port: RpcPort,
        layout: BoardLayout,
        swimlanes: dict[str, int],
        *,
        board_users: dict[str, int] | None = None,
    ) -> None:
        self.port = port
        self.layout = layout
        self.swimlanes = swimlanes  # name -> id, every swimlane the backup names
        # Every user of the board by username: a comment keeps its author (a person, or a
        # confined agent's own user in its home); an owner must be a member (layout.users).
        self.board_users = board_users if board_users is not None else dict(layout.users)

    @classmethod
    def prepare(
        cls, port: RpcPort, settings: Settings, cards: CardSet, swimlanes: Sequence[str]
    ) -> RestoreTarget:
        """Create the layout (the homes and the quota project too, as ``agap init`` does),
        plus the swimlanes the backup has and the cards no longer name."""
        port = fit(port)  # a backup made on SQLite may hold values PostgreSQL cannot
        layout = init_board(port, settings, cards).layout
        assert layout is not None
        users = {str(u["username"]): as_int(u["id"]) for u in port.call("getAllUsers") or []}
        return cls(port, layout, _lanes(port, layout.project_id, swimlanes), board_users=users)

    def home(self, agent: str, swimlanes: Sequence[str]) -> RestoreTarget | None:
        """The target for ``agent``'s home (None: ``init_board`` made none for it)."""
        layout = self.layout.homes.get(agent)
        if layout is None:
            return None
        return RestoreTarget(
            self.port, layout, _lanes(self.port, layout.project_id, swimlanes), board_users=self.board_users
        )

    def create_task(self, task: NewTask, *, doing: str) -> int:
        """Create a task in its column and swimlane; its new id (one round trip)."""
        params: dict[str, Any] = {
            "title": task.title,
            "project_id": self.layout.project_id,
            "column_id": self.layout.column_id(task.column),
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
                    "user_id": self.board_users.get(c.user, 0),
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


def _lanes(port: RpcPort, pid: int, wanted: Sequence[str]) -> dict[str, int]:
    """A project's swimlanes by name, adding the ones in ``wanted`` it lacks."""
    lanes = {str(r["name"]): as_int(r["id"]) for r in port.call("getAllSwimlanes", {"project_id": pid}) or []}
    for name in wanted:
        if name not in lanes:
            lanes[name] = int(
                _unwrap(
                    port.batch([Call("addSwimlane", {"project_id": pid, "name": name})])[0],
                    f"add swimlane {name!r}",
                )
            )
    return lanes


def restore_quota(port: RpcPort, name: str, tags: Sequence[tuple[str, str]]) -> None:
    """The quota project (made when ``agap init`` did not) and its slot tags with their
    colours (who held each slot, and when), TAG_CHUNK per round trip."""
    port = fit(port)
    project = port.call("getProjectByName", {"name": name})
    if isinstance(project, dict):
        pid = as_int(project["id"])
    else:
        pid = int(_unwrap(port.batch([Call("createProject", {"name": name})])[0], f"create project {name!r}"))
    for part in _chunks(tags, TAG_CHUNK):
        got = port.batch([Call("createTag", {"project_id": pid, "tag": n, "color_id": c}) for n, c in part])
        for (n, _), o in zip(part, got, strict=True):
            _unwrap(o, f"recreate quota slot tag {n!r}")


def restore_members(port: RpcPort, project: str, members: Mapping[str, str]) -> tuple[int, list[str]]:
    """Give ``project`` the members the backup names that it lacks, each with its role:
    how many were added, and the usernames not on the board (two round trips, and one
    per member added)."""
    port = fit(port)
    out = port.batch([Call("getProjectByName", {"name": project}), Call("getAllUsers")])
    row = out[0].unwrap()
    if not isinstance(row, dict) or not members:
        return 0, []
    pid = as_int(row["id"])
    users = {str(u["username"]): as_int(u["id"]) for u in out[1].unwrap() or []}
    have = {as_int(k) for k in (port.call("getProjectUsers", {"project_id": pid}) or {})}
    added, missing = 0, []
    for username, role in sorted(members.items()):
        uid = users.get(username)
        if uid is None:
            missing.append(username)
        elif uid not in have:
            call = Call("addProjectUser", {"project_id": pid, "user_id": uid, "role": role})
            _unwrap(port.batch([call])[0], f"add {username!r} to {project!r}")
            added += 1
    return added, missing


__all__ = [
    "CHUNK",
    "RESTORED_NONCE",
    "TAG_CHUNK",
    "BoardExport",
    "FileCopy",
    "JournalLine",
    "NewTask",
    "ProjectExport",
    "QuotaExport",
    "RestoreTarget",
    "TaskContent",
    "TaskExport",
    "board_holdings",
    "read_board",
    "restore_members",
    "restore_quota",
]
