"""Creating, adopting and discovering the fabric's layout on a board.

``agap init`` (:func:`init_board`) creates or adopts, idempotently: the work project
with its columns, one swimlane per agent queue, the humans as project members, and the
separate locks project. :func:`load_layout` only reads; :func:`cached_layout` keeps the
ids in a local cache (a projection: deleting it costs two round trips, nothing else).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric.cards import CardSet
from fabric.errors import ConfigError
from fabric.kanboard.layout import COLUMN_ORDER, LAYOUT_VERSION, Column
from fabric.kanboard.migrate import MigrationReport, migrate
from fabric.kanboard.port import BoardRefused, Call, RpcPort
from fabric.kanboard.taskboard import BoardLayout
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.submit import seal_key

# Kanboard's default columns, renamed in place when the fabric adopts a new project.
_RENAME_DEFAULTS = {
    Column.QUEUED: "Backlog",
    Column.WORKING: "Ready",
    Column.WAITING: "Work in progress",
}


@dataclass
class InitReport:
    """What ``agap init`` changed (empty lists mean the board was already in shape)."""

    created: list[str] = field(default_factory=list)
    layout: BoardLayout | None = None
    new_users: list[str] = field(default_factory=list)
    migration: MigrationReport | None = None

    @property
    def changed(self) -> bool:
        return bool(self.created)


def init_board(port: RpcPort, settings: Settings, cards: CardSet) -> InitReport:
    """Create or adopt the fabric's projects, columns, swimlanes and members. Idempotent."""
    report = InitReport()
    if settings.project.casefold() == settings.locks_project.casefold():
        # MySQL compares project names case-insensitively: these would be one project.
        raise ConfigError(
            f"the work project {settings.project!r} and the locks project "
            f"{settings.locks_project!r} differ only in case",
            where="AGAP_PROJECT / AGAP_LOCKS_PROJECT",
            hint="give them different names",
        )
    pid = _ensure_project(port, settings.project, report)
    locks_pid = _ensure_project(port, settings.locks_project, report)

    out = port.batch(
        [
            Call("getColumns", {"project_id": pid}),
            Call("getAllSwimlanes", {"project_id": pid}),
            Call("getProjectUsers", {"project_id": pid}),
        ]
    )
    columns = {c["title"]: int(c["id"]) for c in out[0].unwrap() or []}
    lanes = {s["name"]: int(s["id"]) for s in out[1].unwrap() or []}
    members = {int(k) for k in (out[2].unwrap() or {})}
    _ensure_columns(port, pid, columns, report)
    _ensure_swimlanes(port, pid, lanes, cards.queues(), report)
    users = _ensure_members(port, pid, cards, members, report)

    report.layout = BoardLayout(
        project_name=settings.project,
        project_id=pid,
        locks_project_id=locks_pid,
        columns={c: columns[c.value] for c in COLUMN_ORDER},
        swimlanes={q: lanes[q] for q in cards.queues()},
        users=users,
    )
    # A board written by an older storage layout is brought up to date (one read when
    # it already is).
    report.migration = migrate(port, report.layout, seal_key=seal_key(settings.board_token))
    m = report.migration
    if m.changed:
        report.created.append(
            f"storage layout {m.from_version} -> {LAYOUT_VERSION}: "
            f"{m.values_chunked} values chunked, {m.references} references "
            f"hashed, {m.blocks_sealed} spec blocks sealed"
        )
    return report


def _ensure_columns(port: RpcPort, pid: int, columns: dict[str, int], report: InitReport) -> None:
    """Add the fabric's columns that are missing (renaming Kanboard's defaults in place)."""
    for col in COLUMN_ORDER:
        if col.value in columns:
            continue
        default = _RENAME_DEFAULTS.get(col)
        if default and default in columns:
            cid = columns.pop(default)
            _expect(
                port.call("updateColumn", {"column_id": cid, "title": col.value}),
                "updateColumn",
                f"rename column {default!r} to {col.value!r}",
            )
            columns[col.value] = cid
        else:
            columns[col.value] = int(
                _expect(
                    port.call("addColumn", {"project_id": pid, "title": col.value}),
                    "addColumn",
                    f"add column {col.value!r}",
                )
            )
        report.created.append(f"column {col.value!r}")


def _ensure_swimlanes(
    port: RpcPort, pid: int, lanes: dict[str, int], queues: Iterable[str], report: InitReport
) -> None:
    """Add a swimlane for each queue that has none."""
    for queue in queues:
        if queue not in lanes:
            lanes[queue] = int(
                _expect(
                    port.call("addSwimlane", {"project_id": pid, "name": queue}),
                    "addSwimlane",
                    f"add swimlane {queue!r}",
                )
            )
            report.created.append(f"swimlane {queue!r}")


def _ensure_members(
    port: RpcPort, pid: int, cards: CardSet, members: set[int], report: InitReport
) -> dict[str, int]:
    """Each human card's Kanboard user (created if missing), as a project member."""
    users: dict[str, int] = {}
    for human in cards.humans():
        assert human.human is not None
        username = human.human.username
        user = port.call("getUserByName", {"username": username})
        if not user:
            uid = _expect(
                port.call(
                    "createUser",
                    {
                        "username": username,
                        # A random password nobody knows: the human sets their own in Kanboard.
                        "password": secrets.token_urlsafe(24),
                        "name": human.human.display_name,
                        "email": human.human.email,
                    },
                ),
                "createUser",
                f"create user {username!r}",
            )
            report.created.append(f"user {username!r}")
            report.new_users.append(username)
        else:
            uid = user["id"]
        users[username] = int(uid)
        if int(uid) not in members:
            _expect(
                port.call("addProjectUser", {"project_id": pid, "user_id": uid, "role": "project-member"}),
                "addProjectUser",
                f"add {username!r} to the project",
            )
            report.created.append(f"member {username!r}")
    return users


def _ensure_project(port: RpcPort, name: str, report: InitReport) -> int:
    project = port.call("getProjectByName", {"name": name})
    if isinstance(project, dict):
        return int(project["id"])
    pid = _expect(port.call("createProject", {"name": name}), "createProject", f"create project {name!r}")
    report.created.append(f"project {name!r}")
    return int(pid)


def _expect(result: Any, method: str, doing: str) -> Any:
    if result is None or result is False or result == 0:
        raise BoardRefused(method, result, doing)
    return result


def load_layout(port: RpcPort, settings: Settings) -> BoardLayout:
    """Discover the fabric's layout without changing anything (two round trips)."""
    out = port.batch(
        [
            Call("getProjectByName", {"name": settings.project}),
            Call("getProjectByName", {"name": settings.locks_project}),
        ]
    )
    work, locks = out[0].unwrap(), out[1].unwrap()
    if not isinstance(work, dict) or not isinstance(locks, dict):
        missing = settings.project if not isinstance(work, dict) else settings.locks_project
        raise ConfigError(f"project {missing!r} is not on the board", hint="run `agap init` first")
    pid = int(work["id"])
    out = port.batch(
        [
            Call("getColumns", {"project_id": pid}),
            Call("getAllSwimlanes", {"project_id": pid}),
            Call("getProjectUsers", {"project_id": pid}),
            Call("getAllUsers"),
        ]
    )
    columns = {c["title"]: int(c["id"]) for c in out[0].unwrap() or []}
    missing_cols = [c.value for c in COLUMN_ORDER if c.value not in columns]
    if missing_cols:
        raise ConfigError(
            f"column(s) {', '.join(missing_cols)} missing in {settings.project!r}", hint="run `agap init`"
        )
    members = {int(k) for k in (out[2].unwrap() or {})}
    return BoardLayout(
        project_name=settings.project,
        project_id=pid,
        locks_project_id=int(locks["id"]),
        columns={c: columns[c.value] for c in COLUMN_ORDER},
        swimlanes={s["name"]: int(s["id"]) for s in out[1].unwrap() or []},
        users={u["username"]: int(u["id"]) for u in out[3].unwrap() or [] if int(u["id"]) in members},
    )


def _cache_path(settings: Settings) -> Path:
    base = registry.get_path("XDG_CACHE_HOME", fallback=Path.home() / ".cache") / "agap"
    key = hashlib.sha256(f"{settings.board_url}\x00{settings.project}".encode()).hexdigest()[:16]
    return base / f"layout-{key}.json"


def cached_layout(port: RpcPort, settings: Settings, *, refresh: bool = False) -> BoardLayout:
    """The layout from the local cache, or from the board (then cached).

    Writes that use a cached layout verify the project in the same round trip, so a
    stale cache is detected, never silently used.
    """
    path = _cache_path(settings)
    if not refresh:
        try:
            return BoardLayout.from_json(path.read_text())
        except (OSError, ValueError, KeyError):
            pass
    layout = load_layout(port, settings)
    save_layout_cache(settings, layout)
    return layout


def save_layout_cache(settings: Settings, layout: BoardLayout) -> None:
    """Remember the layout ids for the next process (best effort)."""
    path = _cache_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(layout.to_json())
        tmp.replace(path)
    except OSError:
        pass


def forget_layout_cache(settings: Settings) -> None:
    """Drop the cached layout (after a stale-cache error)."""
    with contextlib.suppress(OSError):
        _cache_path(settings).unlink()


__all__ = [
    "InitReport",
    "cached_layout",
    "forget_layout_cache",
    "init_board",
    "load_layout",
    "save_layout_cache",
]
