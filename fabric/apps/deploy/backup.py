"""``agap backup`` and ``agap restore``: every fabric task to one JSON file, and back.

Kanboard is tier 0: the database dump (``pg_dump``) and the files volume are the primary
backup (docs/OPERATIONS.md). This export is the fabric-level one: it goes through the API,
so it restores onto any Kanboard (PostgreSQL, SQLite, the embedded board) and survives a
Kanboard upgrade. It holds every project the fabric made: the work project and its locks
project, each confined agent's home (its own pair, :mod:`fabric.kanboard.principals`), and
the quota project when there is one (:mod:`fabric.kanboard.quotas`). The file is one JSON
document::

    {"format": "agap-fabric-backup", "version": 2, "created_at": …,
     "projects": {"work": {"name", "columns", "swimlanes", "metadata", "members"},
                  "locks": {"name", "tags", "metadata", "members"},
                  "quota": {"name", "tags": [{"name", "color"}], "metadata"}},  (if any)
     "homes": {"<agent>": {"projects": {"work": …, "locks": …}, "tasks": […]}},
     "users": {"<old id>": "<username>"},
     "tasks": [{"id", "uid", "column", "swimlane", "owner", "row", "metadata",
                "comments": [{"user", "content", "visibility", "date_creation"}],
                "files": [{"name", "size", "blob": "<base64>"}], "tags"}]}

``members`` maps each member's username to its project role. Version 1 files (the work
project alone) still restore.

This module owns the file; every read and write on the board is
:mod:`fabric.kanboard.backup`'s. :func:`restore` refuses a board where any of the backup's
projects already holds tasks or tags, and a backup with a home these cards do not make,
before it writes anything. It creates the layout with
:func:`fabric.kanboard.bootstrap.init_board` (the homes, their users and memberships too;
plus any swimlane the backup has and the cards no longer name), recreates every task in
its own project, column and swimlane, with all its metadata, comments (in order, by their
authors; their dates are not settable through the API) and files, closes the closed ones,
and recreates each locks project's tags: every tag the backup held, and for each task
``<uid>/e1 … <uid>/e<n>`` up to its highest epoch and its submit receipt — so no
transition can win an epoch that already has a record, and a resubmit with the same
action id still finds its task. The quota project's slot tags come back with their
colours (their holders' task ids renumbered). Members the backup names that ``agap init``
did not make again are added with their roles (a user not on the board is a warning:
Kanboard's API cannot give it its password). Task uids are kept; numeric ids change
(they are the board's, across projects), and every reference to a restored task
(``task:<id>``, ``kanboard://task/<id>/…``) in descriptions, metadata and comments is
rewritten to the new id. Project metadata (queue park states, the keeper's watch list,
GC sightings) is saved for the record but not restored: those are projections that the
workers and the keeper rebuild.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabric.cards import CardSet
from fabric.errors import EXIT_INVALID, FabricError, InvalidInput
from fabric.kanboard.backup import (
    JournalLine,
    NewTask,
    ProjectExport,
    RestoreTarget,
    TaskContent,
    TaskExport,
    board_holdings,
    read_board,
    restore_members,
    restore_quota,
)
from fabric.kanboard.bootstrap import forget_layout_cache
from fabric.kanboard.layout import (
    COLUMN_ORDER,
    META_SPEC,
    META_UID,
    Column,
    epoch_lock,
    receipt_lock,
    record_epoch,
)
from fabric.kanboard.port import RpcPort
from fabric.kanboard.principals import confined, home_names
from fabric.kanboard.quotas import moved_holder
from fabric.kanboard.rows import BoardTask
from fabric.settings.resolve import Settings
from fabric.task import TaskSpec

FORMAT = "agap-fabric-backup"
VERSION = 2
READS = (1, 2)  # version 1: the work project only (no homes, quota project or members)

# A reference to a task by its numeric id: task:12, task:#12, kanboard://task/12/file/x.md
_TASK_REF = re.compile(r"(?<![A-Za-z0-9_])(kanboard://task/|task:)(#?)(\d+)(?!\d)")
_EPOCH_TAG = re.compile(r"^([0-9a-f]{16})/e(\d+)$")
# A link on a card to a task's page or to one of its files (fabric.kanboard.weblinks).
# File ids change on restore: such a link is pointed at the task's page, which lists them.
_PAGE_LINK = re.compile(
    r"\?controller=(?:TaskViewController|FileViewerController)&action=show&task_id=(\d+)(?:&file_id=\d+)?"
)
_COLUMNS = {c.value for c in COLUMN_ORDER}


class BoardNotEmpty(FabricError):
    """``agap restore`` needs an empty board."""

    exit_code = EXIT_INVALID

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the board is not empty: {what}",
            where="agap restore",
            hint="restore into a fresh Kanboard (a new database); a restore never merges "
            "into a board that already has fabric tasks or lock tags",
        )


@dataclass
class RestoreReport:
    """What a restore created."""

    tasks: int = 0
    closed: int = 0
    comments: int = 0
    files: int = 0
    lock_tags: int = 0
    homes: dict[str, int] = field(default_factory=dict)  # agent -> tasks restored in its home
    quota_tags: int = 0
    members: int = 0  # memberships added beyond the ones `agap init` makes
    id_map: dict[int, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Backup


def export_board(
    port: RpcPort, settings: Settings, *, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """Every project the fabric made, with every task in it (see the module doc)."""
    board = read_board(port, settings)
    projects = _pair_entry(board.work, board.users)
    if board.quota is not None:
        projects["quota"] = {
            "name": board.quota.name,
            "tags": [{"name": n, "color": c} for n, c in board.quota.tags],
            "metadata": board.quota.metadata,
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": clock(),
        "projects": projects,
        "homes": {
            agent: {
                "projects": _pair_entry(home, board.users),
                "tasks": [_task_entry(t, board.users) for t in home.tasks],
            }
            for agent, home in board.homes.items()
        },
        "users": {str(k): v for k, v in sorted(board.users.items())},
        "tasks": [_task_entry(t, board.users) for t in board.work.tasks],
    }


def _pair_entry(p: ProjectExport, users: dict[int, str]) -> dict[str, Any]:
    """A work project and its locks project as the file holds them (without the tasks)."""
    return {
        "work": {
            "name": p.project,
            "columns": p.columns,
            "swimlanes": p.swimlanes,
            "metadata": p.project_meta,
            "members": p.members,
        },
        "locks": {
            "name": p.locks_project,
            "tags": p.lock_tags,
            "metadata": p.locks_meta,
            "members": p.locks_members,
        },
    }


def _task_entry(t: TaskExport, users: dict[int, str]) -> dict[str, Any]:
    """One task as the file holds it: the board's own row, names rather than ids."""
    return {
        "id": t.task.id,
        "uid": t.metadata.get(META_UID) or None,
        "column": t.column,
        "swimlane": t.swimlane,
        "owner": t.owner,
        "row": dict(t.task.raw),
        "metadata": t.metadata,
        "comments": [
            {
                "user": c.username or users.get(c.user_id),
                "content": c.text,
                "visibility": c.visibility or "app-user",
                # Kept for the record: a restore cannot set a comment's date.
                "date_creation": c.created_at,
            }
            for c in t.comments
        ],
        "files": [{"name": f.name, "size": f.size, "blob": f.blob} for f in t.files],
        "tags": t.tags,
    }


def write_backup(doc: dict[str, Any], path: Path) -> None:
    """Write ``doc`` atomically (a crash leaves the old file or the new one, never half).

    A folder the process cannot write (a container's user in a host folder owned by root)
    is one line naming the folder and the way around it: ``agap backup -`` to stdout."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(doc, sort_keys=True, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # nothing half-written is left behind
            tmp.unlink(missing_ok=True)
        raise InvalidInput(
            f"cannot write {path}: {exc.strerror}",
            where="agap backup",
            hint="name a folder this user can write, or write to stdout: `agap backup - > FILE`",
        ) from None


def dump_backup(doc: dict[str, Any]) -> str:
    """``doc`` as the text a backup file holds (for ``agap backup -``)."""
    return json.dumps(doc, sort_keys=True, ensure_ascii=False)


def read_backup(path: Path, text: str | None = None) -> dict[str, Any]:
    """Load and check a backup file (format and version); ``text`` is its content when it
    came on stdin (``agap restore -``)."""
    try:
        doc = json.loads(text if text is not None else path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist", where="agap restore") from None
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{path} is not a readable backup ({exc})", where="agap restore") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InvalidInput(
            f"{path} is not an agap fabric backup",
            where="agap restore",
            hint="make one with `agap backup FILE`",
        )
    if doc.get("version") not in READS:
        raise InvalidInput(
            f"{path} is backup format version {doc.get('version')!r}; this agap reads versions "
            + ", ".join(map(str, READS)),
            where="agap restore",
            hint="restore it with the agap release that wrote it",
        )
    for key in ("projects", "tasks", "users"):
        if key not in doc:
            raise InvalidInput(f"{path} has no {key!r}", where="agap restore")
    return doc


# ---------------------------------------------------------------------------------------
# Restore


def map_refs(text: str, id_map: dict[int, int]) -> str:
    """``text`` with ``task:<old>``, ``kanboard://task/<old>/…`` and the links to a task's
    page or files pointing at new ids (references to tasks not in ``id_map`` are left
    alone)."""

    def sub(m: re.Match[str]) -> str:
        new = id_map.get(int(m.group(3)))
        return m.group(0) if new is None else f"{m.group(1)}{m.group(2)}{new}"

    def page(m: re.Match[str]) -> str:
        new = id_map.get(int(m.group(1)))
        return m.group(0) if new is None else f"?controller=TaskViewController&action=show&task_id={new}"

    return _PAGE_LINK.sub(page, _TASK_REF.sub(sub, text))


def _lock_names(tags: list[Any], tasks: list[dict[str, Any]]) -> list[str]:
    """Every lock tag a restored locks project needs: the backup's, each task's epochs up
    to its highest (record or tag), and each task's submit receipt."""
    names: set[str] = {str(n) for n in tags}
    highest: dict[str, int] = {}
    for name in names:
        if m := _EPOCH_TAG.match(name):
            highest[m.group(1)] = max(highest.get(m.group(1), 0), int(m.group(2)))
    for task in tasks:
        uid = task.get("uid")
        meta: dict[str, str] = task.get("metadata") or {}
        if not uid:
            continue
        epochs = [e for k in meta if (e := record_epoch(k)) is not None]
        top = max([highest.get(uid, 0), *epochs])
        names.update(epoch_lock(uid, n) for n in range(1, top + 1))
        if META_SPEC in meta:
            try:
                spec = TaskSpec.from_meta(meta[META_SPEC])
            except ValueError:
                continue
            if spec.action_id:
                names.add(receipt_lock(spec.actor, spec.action_id))
    return sorted(names)


@dataclass
class _Part:
    """One (work, locks) pair of the backup: the work project's or a home's."""

    agent: str  # "" for the work project
    projects: dict[str, Any]  # {"work": …, "locks": …}
    tasks: list[dict[str, Any]]
    target: RestoreTarget


def restore(port: RpcPort, settings: Settings, cards: CardSet, doc: dict[str, Any]) -> RestoreReport:
    """Recreate a backup on a board that holds none of its projects' tasks or tags (see
    the module doc); raises :class:`BoardNotEmpty`, or :class:`InvalidInput` for a home
    the cards do not make, before anything is written."""
    projects = doc["projects"]
    quota = projects.get("quota")
    settings = replace(
        settings,
        project=str(projects["work"]["name"]),
        locks_project=str(projects["locks"]["name"]),
        quota_project=str(quota["name"]) if quota else settings.quota_project,
    )
    homes: dict[str, Any] = doc.get("homes") or {}
    _check_homes(settings, cards, homes)
    pairs = [(settings.project, settings.locks_project)]
    pairs += [
        (str(h["projects"]["work"]["name"]), str(h["projects"]["locks"]["name"])) for h in homes.values()
    ]
    held = board_holdings(port, pairs, [settings.quota_project] if quota else [])
    if held:
        raise BoardNotEmpty("; ".join(held))
    parts = _prepare(port, settings, cards, doc)
    report = RestoreReport(warnings=_unknown_columns(parts))
    # Ids are the board's, across projects (a ref in a home may name a work task): every
    # task is created first, in the order of its old id, then filled with rewritten refs.
    everything = sorted(((int(t["id"]), t, p) for p in parts for t in p.tasks), key=lambda e: e[0])
    for old, task, part in everything:
        report.id_map[old] = part.target.create_task(_new_task(task), doing=f"recreate task #{old}")
        if part.agent:
            report.homes[part.agent] = report.homes.get(part.agent, 0) + 1
    report.tasks = len(report.id_map)
    for _, task, part in everything:
        _fill_task(part.target, task, report)
    # Locks last: with every record in place, no epoch that has one can be won again.
    for part in parts:
        names = _lock_names(part.projects["locks"].get("tags", []), part.tasks)
        part.target.create_locks(names)
        report.lock_tags += len(names)
    if quota:
        # A holder's colour names its task by id: the new one (the keeper gives the slot
        # back when that task's lease dies).
        slots = [
            (str(t["name"]), moved_holder(str(t.get("color") or ""), report.id_map))
            for t in quota.get("tags", [])
        ]
        restore_quota(port, settings.quota_project, slots)
        report.quota_tags = len(slots)
    _restore_members(port, parts, report)
    # This host's cached layouts name the projects as they were before (a board reset
    # under the same address): the next process reads the restored ones.
    for part in parts:
        forget_layout_cache(replace(settings, project=part.target.layout.project_name))
    return report


def _prepare(port: RpcPort, settings: Settings, cards: CardSet, doc: dict[str, Any]) -> list[_Part]:
    """The layout made (``agap init``'s, homes included), and each pair's target."""
    projects = doc["projects"]
    main = RestoreTarget.prepare(port, settings, cards, projects["work"].get("swimlanes", []))
    parts = [_Part("", projects, list(doc["tasks"]), main)]
    for agent, home in sorted((doc.get("homes") or {}).items()):
        target = main.home(agent, home["projects"]["work"].get("swimlanes", []))
        assert target is not None  # _check_homes: init_board made every home the file has
        parts.append(_Part(agent, home["projects"], list(home.get("tasks") or []), target))
    return parts


def _unknown_columns(parts: list[_Part]) -> list[str]:
    warnings = []
    for part in parts:
        missing = [c for c in part.projects["work"].get("columns", []) if c not in _COLUMNS]
        if missing:
            warnings.append(
                f"columns of {part.target.layout.project_name!r} not in the fabric's layout, "
                "tasks in them go to Queued: " + ", ".join(missing)
            )
    return warnings


def _restore_members(port: RpcPort, parts: list[_Part], report: RestoreReport) -> None:
    """The members each project had that ``agap init`` did not make again, with their roles."""
    for part in parts:
        for key in ("work", "locks"):
            entry = part.projects[key]
            added, missing = restore_members(port, str(entry["name"]), entry.get("members") or {})
            report.members += added
            if missing:
                report.warnings.append(
                    f"members of {entry['name']!r} not on the board (not in the cards; add them "
                    "in Kanboard, then to the project): " + ", ".join(missing)
                )


def _check_homes(settings: Settings, cards: CardSet, homes: dict[str, Any]) -> None:
    """Each home in the file is one ``agap init`` makes from these cards, by its names."""
    by_id = {c.id: c for c in cards}
    for agent, home in sorted(homes.items()):
        card = by_id.get(agent)
        names = (str(home["projects"]["work"]["name"]), str(home["projects"]["locks"]["name"]))
        if card is None or not confined(card):
            raise InvalidInput(
                f"the backup holds the home of {agent!r}, which these cards do not make "
                "(no such card, or not sandboxed/untrusted)",
                where="agap restore",
                hint="restore with the cards the backup was made with (AGAP_CARDS_DIR)",
            )
        if names != home_names(settings, card):
            raise InvalidInput(
                f"the backup's home of {agent!r} is named {names[0]!r}, "
                f"not {home_names(settings, card)[0]!r}",
                where="agap restore",
            )


def _row(task: dict[str, Any]) -> BoardTask:
    """The board's row a backup entry carries."""
    return BoardTask.parse(task.get("row") or {})


def _new_task(task: dict[str, Any]) -> NewTask:
    row = _row(task)
    column = task.get("column")
    return NewTask(
        title=row.title or "Untitled",
        column=Column(column) if column in _COLUMNS else Column.QUEUED,
        swimlane=str(task["swimlane"]) if task.get("swimlane") else None,
        owner=str(task.get("owner") or ""),
        priority=row.priority,
        reference=row.reference,
        color=row.color or "yellow",
        due_at=row.due_at,
        start_at=row.start_at,
    )


def _fill_task(target: RestoreTarget, task: dict[str, Any], report: RestoreReport) -> None:
    """Write a created task's content, its references pointing at the new ids."""
    new_id, id_map, row = report.id_map[int(task["id"])], report.id_map, _row(task)
    files = []
    for f in task.get("files") or []:
        if f.get("blob"):
            files.append((str(f["name"]), str(f["blob"])))
        else:
            report.warnings.append(
                f"task #{task['id']}: file {f['name']!r} is empty; Kanboard stores no empty file, skipped"
            )
    content = TaskContent(
        description=map_refs(row.description, id_map),
        metadata={k: map_refs(str(v), id_map) for k, v in (task.get("metadata") or {}).items()},
        comments=[
            JournalLine(
                user=str(c.get("user") or ""),
                content=map_refs(str(c["content"]), id_map),
                visibility=c.get("visibility") or "app-user",
            )
            for c in task.get("comments") or []
        ],
        files=files,
        tags=list(task.get("tags") or []),
        closed=not row.is_open,
    )
    target.fill_task(new_id, content, label=f"task #{task['id']} (now #{new_id})")
    report.comments += len(content.comments)
    report.files += len(files)
    report.closed += content.closed


__all__ = [
    "FORMAT",
    "VERSION",
    "BoardNotEmpty",
    "RestoreReport",
    "export_board",
    "map_refs",
    "read_backup",
    "restore",
    "write_backup",
]
