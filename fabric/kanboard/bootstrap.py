"""Creating, adopting and discovering the fabric's layout on a board.

``agap init`` (:func:`init_board`) creates or adopts, idempotently: the work project
with its columns, one swimlane per agent queue, the humans as project members, and the
separate locks project. :func:`load_layout` only reads; :func:`cached_layout` keeps the
ids in a local cache (a projection: deleting it costs two round trips, nothing else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from fabric.cards import CardSet, QuotaSpec
from fabric.errors import ConfigError
from fabric.kanboard import homes
from fabric.kanboard.fit import unpack
from fabric.kanboard.layout import COLUMN_ORDER, LAYOUT_VERSION, META_MEMBERS, REQUIRED_COLUMNS, Column
from fabric.kanboard.migrate import MigrationReport, migrate
from fabric.kanboard.port import BoardRefused, Call, Outcome, RpcPort
from fabric.kanboard.taskboard import BoardLayout
from fabric.plain import Plain
from fabric.settings import registry
from fabric.settings.resolve import Settings

# Kanboard's default columns, renamed in place when the fabric adopts a new project.
_RENAME_DEFAULTS = {
    Column.QUEUED: "Backlog",
    Column.WORKING: "Ready",
    Column.WAITING: "Work in progress",
}


class InitReport(Plain, frozen=False):
    """What ``agap init`` changed (empty lists mean the board was already in shape)."""

    created: list[str] = field(default_factory=list)
    layout: BoardLayout | None = None
    new_users: list[str] = field(default_factory=list)
    migration: MigrationReport | None = None
    # Sign-in for new people: username -> the one-time password made for them (print it
    # once, never store it), or -> the variable the operator's password came from.
    one_time: dict[str, str] = field(default_factory=dict, repr=False)
    password_from: dict[str, str] = field(default_factory=dict)
    # People whose user existed before while a password was given for them: Kanboard's
    # API cannot change a password (an admin does, in its UI).
    password_not_set: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created)


def init_board(port: RpcPort, settings: Settings, cards: CardSet, *, env: registry.Env = None) -> InitReport:
    """Create or adopt the fabric's projects, columns, swimlanes and members, and the
    confined agents' homes and users (their passwords from ``env``, default: the process
    environment). Idempotent."""
    report = InitReport()
    if settings.project.casefold() == settings.locks_project.casefold():
        # MySQL compares project names case-insensitively: these would be one project.
        raise ConfigError(
            f"the work project {settings.project!r} and the locks project "
            f"{settings.locks_project!r} differ only in case",
            where="AGAP_PROJECT / AGAP_LOCKS_PROJECT",
            hint="give them different names",
        )
    passwords = people_passwords(cards, env)  # checked before anything is written
    homes.check_passwords(cards, env)
    pid = _ensure_project(port, settings.project, report)
    locks_pid = _ensure_project(port, settings.locks_project, report)
    if shares_quota(cards):  # the slots of quotas kept across hosts (fabric.kanboard.quotas)
        _ensure_project(port, settings.quota_project, report)

    out = port.batch(
        [
            Call("getColumns", {"project_id": pid}),
            Call("getAllSwimlanes", {"project_id": pid}),
            Call("getProjectUsers", {"project_id": pid}),
        ]
    )
    columns = {c["title"]: int(c["id"]) for c in out[0].unwrap() or []}
    lane_rows = out[1].unwrap() or []
    lanes = {s["name"]: int(s["id"]) for s in lane_rows}
    members = {int(k) for k in (out[2].unwrap() or {})}
    _ensure_columns(port, pid, columns, report)
    _ensure_swimlanes(port, pid, lanes, cards.queues(), report)
    _show_used_lanes(port, pid, lane_rows, set(cards.queues()), report)
    users = _ensure_members(port, pid, cards, members, passwords, report)

    report.layout = BoardLayout(
        project_name=settings.project,
        project_id=pid,
        locks_project_id=locks_pid,
        columns={c: columns[c.value] for c in COLUMN_ORDER},
        swimlanes={q: lanes[q] for q in cards.queues()},
        users=users,
    )
    _ensure_homes(port, settings, cards, users, report, env)
    report.layout = dataclasses.replace(report.layout, homes=discover_homes(port, settings, users))
    # A board written by an older storage layout is brought up to date (one read when
    # it already is).
    report.migration = migrate(port, report.layout, secret=settings.board_token)
    m = report.migration
    if m.changed:
        report.created.append(
            f"storage layout {m.from_version} -> {LAYOUT_VERSION}: "
            f"{m.values_chunked} values chunked, {m.references} references "
            f"hashed, {m.blocks_sealed} spec blocks sealed"
        )
    return report


def _ensure_homes(
    port: RpcPort,
    settings: Settings,
    cards: CardSet,
    people: dict[str, int],
    report: InitReport,
    env: registry.Env,
) -> None:
    """The confined agents' homes, users and memberships (:mod:`fabric.kanboard.homes`)."""

    def shape(name: str, queues: list[str]) -> int:
        pid = _ensure_project(port, name, report)
        out = port.batch(
            [Call("getColumns", {"project_id": pid}), Call("getAllSwimlanes", {"project_id": pid})]
        )
        lane_rows = out[1].unwrap() or []
        _ensure_columns(port, pid, {c["title"]: int(c["id"]) for c in out[0].unwrap() or []}, report)
        _ensure_swimlanes(port, pid, {s["name"]: int(s["id"]) for s in lane_rows}, queues, report)
        _show_used_lanes(port, pid, lane_rows, set(queues), report)
        return pid

    homes.ensure_homes(
        port,
        settings,
        cards,
        people,
        report.created,
        shape=shape,
        project=lambda n: _ensure_project(port, n, report),
        env=env,
    )


def _ensure_columns(port: RpcPort, pid: int, columns: dict[str, int], report: InitReport) -> None:
    """Add the fabric's columns that are missing (renaming Kanboard's defaults in place);
    Backlog, added to a board made before it, is put first."""
    # Kanboard's own "Backlog" becomes Queued (as it always has); the fabric's Backlog is
    # then added and moved to the front.
    for col in (*REQUIRED_COLUMNS, Column.BACKLOG):
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
            if col == Column.BACKLOG:
                _expect(
                    port.call(
                        "changeColumnPosition",
                        {"project_id": pid, "column_id": columns[col.value], "position": 1},
                    ),
                    "changeColumnPosition",
                    f"put column {col.value!r} first",
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


def _show_used_lanes(
    port: RpcPort, pid: int, rows: list[dict[str, Any]], queues: set[str], report: InitReport
) -> None:
    """Hide the lanes nobody uses, show the ones the cards name.

    Kanboard's "Default swimlane" and the lane of a queue no card names any more are
    disabled, but only while they hold no open task (a disabled lane hides its cards from
    the board). A queue's lane that was disabled is enabled again.
    """
    idle = [r for r in rows if r["name"] not in queues and _active(r)]
    hidden = [r for r in rows if r["name"] in queues and not _active(r)]
    if idle:
        found = port.batch(
            [
                Call("searchTasks", {"project_id": pid, "query": f'status:open swimlane:"{r["name"]}"'})
                for r in idle
            ]
        )
        for row, hits in zip(idle, found, strict=True):
            if any(int(t.get("swimlane_id") or 0) == int(row["id"]) for t in hits.unwrap() or []):
                continue
            port.call("disableSwimlane", {"project_id": pid, "swimlane_id": int(row["id"])})
            report.created.append(f"hid unused swimlane {row['name']!r}")
    for row in hidden:
        port.call("enableSwimlane", {"project_id": pid, "swimlane_id": int(row["id"])})
        report.created.append(f"showed swimlane {row['name']!r}")


def _active(row: dict[str, Any]) -> bool:
    # PostgreSQL answers booleans, SQLite and MySQL integers (or their strings).
    return str(row.get("is_active")).lower() in ("1", "true")


def people_passwords(cards: CardSet, env: registry.Env = None) -> dict[str, tuple[str, str]]:
    """username -> (password, where it came from) for each person's new Kanboard user.

    From ``AGAP_PASSWORD_<USER>`` when the operator set it (Kanboard wants 6 characters or
    more: a shorter one stops ``agap init`` before it writes anything), else a one-time one.
    """
    out: dict[str, tuple[str, str]] = {}
    for human in cards.humans():
        assert human.human is not None
        username = human.human.username
        name = registry.person_variable(registry.PERSON_PASSWORD, username)
        given = registry.person_secret(registry.PERSON_PASSWORD, username, env)
        if given and len(given) < 6:
            raise ConfigError(
                f"the password for {username!r} has {len(given)} characters; Kanboard needs 6 or more",
                where=name,
                hint="set a longer one, or unset it for a one-time password",
            )
        import secrets  # here: only a new person's one-time password needs it

        out[username] = (given, name) if given else (secrets.token_urlsafe(9), "")
    return out


def _ensure_members(
    port: RpcPort,
    pid: int,
    cards: CardSet,
    members: set[int],
    passwords: dict[str, tuple[str, str]],
    report: InitReport,
) -> dict[str, int]:
    """Each human card's Kanboard user (created if missing), as a project member."""
    users: dict[str, int] = {}
    for human in cards.humans():
        assert human.human is not None
        username = human.human.username
        password, source = passwords[username]
        user = port.call("getUserByName", {"username": username})
        if not user:
            uid = _expect(
                port.call(
                    "createUser",
                    {
                        "username": username,
                        "password": password,
                        "name": human.human.display_name,
                        "email": human.human.email,
                    },
                ),
                "createUser",
                f"create user {username!r}",
            )
            report.created.append(f"user {username!r}")
            report.new_users.append(username)
            if source:
                report.password_from[username] = source
            else:
                report.one_time[username] = password
        else:
            uid = user["id"]
            _update_profile(port, user, human.human.display_name, human.human.email, report)
            if source:
                report.password_not_set.append(username)
        users[username] = int(uid)
        if int(uid) not in members:
            _expect(
                port.call("addProjectUser", {"project_id": pid, "user_id": uid, "role": "project-member"}),
                "addProjectUser",
                f"add {username!r} to the project",
            )
            report.created.append(f"member {username!r}")
    return users


def _update_profile(port: RpcPort, user: dict[str, Any], name: str, email: str, report: InitReport) -> None:
    """Give an existing user the card's name and e-mail (Kanboard mails a password reset
    link there, when its mail is set up)."""
    change = {k: v for k, v in (("name", name), ("email", email)) if v and str(user.get(k) or "") != v}
    if change:
        _expect(
            port.call("updateUser", {"id": int(user["id"]), **change}),
            "updateUser",
            f"update user {user['username']!r}",
        )
        report.created.append(f"user {user['username']!r} {' and '.join(sorted(change))}")


def shares_quota(cards: CardSet) -> bool:
    """Whether a card keeps a quota across hosts (then the board has a quota project)."""
    return any(isinstance(s, QuotaSpec) and s.across_hosts for c in cards for s in c.availability)


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


def board_version(port: RpcPort) -> str:
    """The board's version (one round trip): also proves the credentials are accepted."""
    return str(port.call("getVersion"))


def load_layout(port: RpcPort, settings: Settings) -> BoardLayout:
    """Discover the fabric's layout, the confined agents' homes with it, without changing
    anything (two round trips)."""
    # A board user may not list users or projects (Kanboard refuses getAllUsers and
    # getAllProjects): it reads the people `agap init` recorded in its home, and its own id.
    as_user = bool(settings.board_user)
    out = port.batch(
        [
            Call("getProjectByName", {"name": settings.project}),
            Call("getProjectByName", {"name": settings.locks_project}),
            *([] if as_user else [Call("getAllProjects")]),
        ]
    )
    work, locks = out[0].unwrap(), out[1].unwrap()
    if not isinstance(work, dict) or not isinstance(locks, dict):
        missing = settings.project if not isinstance(work, dict) else settings.locks_project
        raise ConfigError(f"project {missing!r} is not on the board", hint="run `agap init` first")
    pairs = {} if as_user else _home_pairs(settings, out[2].unwrap() or [])
    pid = int(work["id"])
    if as_user:
        who = [Call("getProjectMetadata", {"project_id": pid}), Call("getMe")]
    else:
        who = [Call("getProjectUsers", {"project_id": pid}), Call("getAllUsers")]
    out = port.batch([*_lane_calls([pid]), *who, *_lane_calls([w for w, _ in pairs.values()])])
    if as_user:
        users = _recorded_members(out[2].unwrap())
        me = int((out[3].unwrap() or {}).get("id", 0))
    else:
        members = {int(k) for k in (out[2].unwrap() or {})}
        users = {u["username"]: int(u["id"]) for u in out[3].unwrap() or [] if int(u["id"]) in members}
        me = 0
    main = _project_layout(settings.project, pid, int(locks["id"]), out[0], out[1], users, me=me)
    return dataclasses.replace(main, homes=_home_layouts(settings, pairs, out[4:], users))


def _lane_calls(pids: list[int]) -> list[Call]:
    """Each project's columns and swimlanes."""
    return [
        c
        for p in pids
        for c in (Call("getColumns", {"project_id": p}), Call("getAllSwimlanes", {"project_id": p}))
    ]


def _project_layout(
    name: str,
    pid: int,
    locks_pid: int,
    columns: Outcome,
    lanes: Outcome,
    users: dict[str, int],
    *,
    me: int = 0,
) -> BoardLayout:
    """A work project's layout from its columns and swimlanes; its columns must be there."""
    by_title = {c["title"]: int(c["id"]) for c in columns.unwrap() or []}
    missing = [c.value for c in REQUIRED_COLUMNS if c.value not in by_title]
    if missing:
        raise ConfigError(f"column(s) {', '.join(missing)} missing in {name!r}", hint="run `agap init`")
    return BoardLayout(
        project_name=name,
        project_id=pid,
        locks_project_id=locks_pid,
        columns={c: by_title[c.value] for c in COLUMN_ORDER if c.value in by_title},
        swimlanes={s["name"]: int(s["id"]) for s in lanes.unwrap() or []},
        users=users,
        me=me,
    )


def _home_pairs(settings: Settings, projects: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """agent -> (work, locks) project ids of the homes among ``projects`` (by their names)."""
    work, locks = f"{settings.project}: ", f"{settings.locks_project}: "
    by_name = {str(p["name"]): int(p["id"]) for p in projects}
    pairs = {}
    for name, pid in sorted(by_name.items()):
        agent = name[len(work) :]
        if name.startswith(work) and locks + agent in by_name:
            pairs[agent] = (pid, by_name[locks + agent])
    return pairs


def _home_layouts(
    settings: Settings, pairs: dict[str, tuple[int, int]], lanes: Sequence[Outcome], users: dict[str, int]
) -> dict[str, BoardLayout]:
    """The homes' layouts (a half-made home, one missing a column, is left out)."""
    homes = {}
    for i, (agent, (pid, locks_pid)) in enumerate(pairs.items()):
        name = f"{settings.project}: {agent}"
        try:
            homes[agent] = _project_layout(name, pid, locks_pid, lanes[2 * i], lanes[2 * i + 1], users)
        except ConfigError:
            continue
    return homes


def discover_homes(port: RpcPort, settings: Settings, users: dict[str, int]) -> dict[str, BoardLayout]:
    """The confined agents' homes on the board (two round trips)."""
    pairs = _home_pairs(settings, port.call("getAllProjects") or [])
    return _home_layouts(settings, pairs, port.batch(_lane_calls([w for w, _ in pairs.values()])), users)


def _recorded_members(meta: Any) -> dict[str, int]:
    """The people `agap init` recorded in a home project (``fabric.members``)."""
    try:
        recorded = json.loads(str(unpack(meta or {}).get(META_MEMBERS) or "{}"))
        return {str(k): int(v) for k, v in recorded.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _cache_path(settings: Settings) -> Path:
    base = registry.get_path("XDG_CACHE_HOME", fallback=Path.home() / ".cache") / "agap"
    # Per signed-in user too: a board user's layout knows its own id, the application's none.
    who = f"{settings.board_url}\x00{settings.project}\x00{settings.board_user}"
    key = hashlib.sha256(who.encode()).hexdigest()[:16]
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
    "discover_homes",
    "forget_layout_cache",
    "init_board",
    "load_layout",
    "save_layout_cache",
]
