"""``agap backup`` and ``agap restore``: every fabric task to one JSON file, and back.

Kanboard is tier 0: the database dump (``pg_dump``) and the files volume are the primary
backup (docs/OPERATIONS.md). This export is the fabric-level one: it goes through the API,
so it restores onto any Kanboard (PostgreSQL, SQLite, the embedded board) and survives a
Kanboard upgrade. The file is one JSON document::

    {"format": "agap-fabric-backup", "version": 1, "created_at": …,
     "projects": {"work": {"name", "columns", "swimlanes", "metadata"},
                  "locks": {"name", "tags", "metadata"}},
     "users": {"<old id>": "<username>"},
     "tasks": [{"id", "uid", "column", "swimlane", "owner", "row", "metadata",
                "comments": [{"user", "content", "visibility", "date_creation"}],
                "files": [{"name", "size", "blob": "<base64>"}], "tags"}]}

:func:`restore` refuses a board that already holds fabric tasks or lock tags. It creates
the layout with :func:`fabric.kanboard.bootstrap.init_board` (plus any swimlane the backup has and
the cards no longer name), recreates every task in its column and swimlane, with all its
metadata, comments (in order; their dates are not settable through the API) and files,
closes the closed ones, and recreates the lock tags: every tag the backup held, and for
each task ``<uid>/e1 … <uid>/e<n>`` up to its highest epoch and its submit receipt — so no
transition can win an epoch that already has a record, and a resubmit with the same action
id still finds its task. Task uids are kept; numeric ids change, and every reference to a
restored task (``task:<id>``, ``kanboard://task/<id>/…``) in descriptions, metadata and
comments is rewritten to the new id. Project metadata (queue park states, the keeper's
watch list, GC sightings) is saved for the record but not restored: those are projections
that the workers and the keeper rebuild.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabric.cards import CardSet
from fabric.errors import FabricError, InvalidInput
from fabric.kanboard.bootstrap import init_board, load_layout
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.fit import fit
from fabric.kanboard.layout import (
    COLUMN_ORDER,
    META_SPEC,
    META_UID,
    epoch_lock,
    receipt_lock,
    record_epoch,
)
from fabric.kanboard.port import BoardRefused, Call, RpcPort
from fabric.settings.resolve import Settings
from fabric.task import TaskSpec

FORMAT = "agap-fabric-backup"
VERSION = 1
CHUNK = 50  # tasks read per round trip
TAG_CHUNK = 200  # lock tags created per round trip
RESTORED_NONCE = "restored"  # the color_id of a recreated lock tag

# A reference to a task by its numeric id: task:12, task:#12, kanboard://task/12/file/x.md
_TASK_REF = re.compile(r"(?<![A-Za-z0-9_])(kanboard://task/|task:)(#?)(\d+)(?!\d)")
_EPOCH_TAG = re.compile(r"^([0-9a-f]{16})/e(\d+)$")


class BoardNotEmpty(FabricError):
    """``agap restore`` needs an empty board."""

    exit_code = 2

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
    id_map: dict[int, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Backup


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _unwrap(out: Any, doing: str) -> Any:
    value = out.unwrap()
    if value is False or value is None:
        raise BoardRefused(out.call.method, value, doing)
    return value


def export_board(
    port: RpcPort, settings: Settings, *, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """Every fabric task on the board, with the layout it lives in (see the module doc)."""
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
    columns = sorted(out[0].unwrap() or [], key=lambda c: (int(c.get("position") or 0), int(c["id"])))
    column_names = {int(c["id"]): str(c["title"]) for c in columns}
    lanes = sorted(out[1].unwrap() or [], key=lambda s: (int(s.get("position") or 0), int(s["id"])))
    lane_names = {int(s["id"]): str(s["name"]) for s in lanes}
    users = {int(u["id"]): str(u["username"]) for u in out[5].unwrap() or []}
    rows = sorted([*(out[6].unwrap() or []), *(out[7].unwrap() or [])], key=lambda r: int(r["id"]))

    tasks: list[dict[str, Any]] = []
    for chunk in _chunks(rows, CHUNK):
        calls: list[Call] = []
        for row in chunk:
            tid = int(row["id"])
            calls += [
                Call("getTaskMetadata", {"task_id": tid}),
                Call("getAllComments", {"task_id": tid}),
                Call("getAllTaskFiles", {"task_id": tid}),
                Call("getTaskTags", {"task_id": tid}),
            ]
        res = port.batch(calls)
        downloads: list[tuple[dict[str, Any], Call]] = []
        for i, row in enumerate(chunk):
            meta = res[4 * i].unwrap() or {}
            meta = {str(k): "" if v is None else str(v) for k, v in dict(meta).items()}
            comments = [
                {
                    "user": c.get("username") or users.get(int(c.get("user_id") or 0)),
                    "content": str(c.get("comment") or ""),
                    "visibility": c.get("visibility") or "app-user",
                    "date_creation": int(c.get("date_creation") or 0),
                }
                for c in res[4 * i + 1].unwrap() or []
            ]
            files: list[dict[str, Any]] = []
            task: dict[str, Any] = {
                "id": int(row["id"]),
                "uid": meta.get(META_UID) or None,
                "column": column_names.get(int(row.get("column_id") or 0)),
                "swimlane": lane_names.get(int(row.get("swimlane_id") or 0)),
                "owner": users.get(int(row.get("owner_id") or 0)),
                "row": dict(row),
                "metadata": meta,
                "comments": comments,
                "files": files,
                "tags": sorted(str(v) for v in dict(res[4 * i + 3].unwrap() or {}).values()),
            }
            for f in res[4 * i + 2].unwrap() or []:
                entry: dict[str, Any] = {"name": str(f["name"]), "size": int(f.get("size") or 0), "blob": ""}
                files.append(entry)
                downloads.append((entry, Call("downloadTaskFile", {"file_id": int(f["id"])})))
            tasks.append(task)
        for part in _chunks(downloads, CHUNK):
            got = port.batch([c for _, c in part])
            for (entry, _), o in zip(part, got, strict=True):
                entry["blob"] = str(o.unwrap() or "")
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": clock(),
        "projects": {
            "work": {
                "name": layout.project_name,
                "columns": [column_names[c] for c in column_names],
                "swimlanes": [lane_names[s] for s in lane_names],
                "metadata": dict(out[2].unwrap() or {}),
            },
            "locks": {
                "name": settings.locks_project,
                "tags": sorted(str(t["name"]) for t in out[3].unwrap() or []),
                "metadata": dict(out[4].unwrap() or {}),
            },
        },
        "users": {str(k): v for k, v in sorted(users.items())},
        "tasks": tasks,
    }


def write_backup(doc: dict[str, Any], path: Path) -> None:
    """Write ``doc`` atomically (a crash leaves the old file or the new one, never half)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def read_backup(path: Path) -> dict[str, Any]:
    """Load and check a backup file (format and version)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
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
    if doc.get("version") != VERSION:
        raise InvalidInput(
            f"{path} is backup format version {doc.get('version')!r}; this agap reads version {VERSION}",
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
    """``text`` with ``task:<old>`` and ``kanboard://task/<old>/…`` pointing at new ids
    (references to tasks not in ``id_map`` are left alone)."""

    def sub(m: re.Match[str]) -> str:
        new = id_map.get(int(m.group(3)))
        return m.group(0) if new is None else f"{m.group(1)}{m.group(2)}{new}"

    return _TASK_REF.sub(sub, text)


def _ensure_empty(port: RpcPort, settings: Settings) -> None:
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
            checks.append(Call("getAllTasks", {"project_id": int(work["id"]), "status_id": status}))
    if isinstance(locks, dict):
        checks.append(Call("getTagsByProject", {"project_id": int(locks["id"])}))
    res = port.batch(checks) if checks else []
    tasks = sum(len(o.unwrap() or []) for o in res[:2]) if isinstance(work, dict) else 0
    if tasks:
        raise BoardNotEmpty(f"project {settings.project!r} holds {tasks} task(s)")
    if isinstance(locks, dict) and res[-1].unwrap():
        raise BoardNotEmpty(f"project {settings.locks_project!r} holds lock tags")


def _lock_names(doc: dict[str, Any]) -> list[str]:
    """Every lock tag the restored board needs: the backup's, each task's epochs up to its
    highest (record or tag), and each task's submit receipt."""
    names: set[str] = {str(n) for n in doc["projects"].get("locks", {}).get("tags", [])}
    highest: dict[str, int] = {}
    for name in names:
        if m := _EPOCH_TAG.match(name):
            highest[m.group(1)] = max(highest.get(m.group(1), 0), int(m.group(2)))
    for task in doc["tasks"]:
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


def restore(port: RpcPort, settings: Settings, cards: CardSet, doc: dict[str, Any]) -> RestoreReport:
    """Recreate a backup on an EMPTY board (see the module doc); raises :class:`BoardNotEmpty`."""
    port = fit(port)  # a backup made on SQLite may hold values PostgreSQL cannot
    work = doc["projects"]["work"]
    settings = replace(
        settings, project=str(work["name"]), locks_project=str(doc["projects"]["locks"]["name"])
    )
    _ensure_empty(port, settings)
    missing_cols = [c for c in work.get("columns", []) if c not in {col.value for col in COLUMN_ORDER}]
    init = init_board(port, settings, cards)
    layout = init.layout
    assert layout is not None
    report = RestoreReport()
    if missing_cols:
        report.warnings.append(
            "columns not in the fabric's layout, tasks in them go to Queued: " + ", ".join(missing_cols)
        )
    columns = {c.value: i for c, i in layout.columns.items()}
    lanes = {
        str(s["name"]): int(s["id"])
        for s in port.call("getAllSwimlanes", {"project_id": layout.project_id}) or []
    }
    for name in work.get("swimlanes", []):
        if name not in lanes:
            lanes[name] = int(
                _unwrap(
                    port.batch([Call("addSwimlane", {"project_id": layout.project_id, "name": name})])[0],
                    f"add swimlane {name!r}",
                )
            )
    users = dict(layout.users)
    tasks = sorted(doc["tasks"], key=lambda t: int(t["id"]))

    # Pass 1: the tasks themselves (ids are needed before references can be rewritten).
    for task in tasks:
        row = task.get("row") or {}
        column = task.get("column") if task.get("column") in columns else "Queued"
        params: dict[str, Any] = {
            "title": str(row.get("title") or "Untitled"),
            "project_id": layout.project_id,
            "column_id": columns[str(column)],
            "priority": int(row.get("priority") or 0),
            "reference": str(row.get("reference") or ""),
            "color_id": str(row.get("color_id") or "yellow"),
        }
        if task.get("swimlane"):
            params["swimlane_id"] = lanes[str(task["swimlane"])]
        owner = users.get(str(task.get("owner") or ""), 0)
        if owner:
            params["owner_id"] = owner
        for key in ("date_due", "date_started"):
            if int(row.get(key) or 0):
                params[key] = format_input_date(int(row[key]))
        new_id = _unwrap(port.batch([Call("createTask", params)])[0], f"recreate task #{task['id']}")
        report.id_map[int(task["id"])] = int(new_id)
    report.tasks = len(report.id_map)

    # Pass 2: description, metadata, comments, files, tags, closing.
    for task in tasks:
        new_id = report.id_map[int(task["id"])]
        row = task.get("row") or {}
        meta = {k: map_refs(str(v), report.id_map) for k, v in (task.get("metadata") or {}).items()}
        calls = [
            Call(
                "updateTask",
                {"id": new_id, "description": map_refs(str(row.get("description") or ""), report.id_map)},
            )
        ]
        if meta:
            calls.append(Call("saveTaskMetadata", {"task_id": new_id, "values": meta}))
        for c in task.get("comments") or []:
            calls.append(
                Call(
                    "createComment",
                    {
                        "task_id": new_id,
                        "user_id": users.get(str(c.get("user") or ""), 0),
                        "content": map_refs(str(c["content"]), report.id_map),
                        "visibility": c.get("visibility") or "app-user",
                    },
                )
            )
        for f in task.get("files") or []:
            if not f.get("blob"):
                report.warnings.append(
                    f"task #{task['id']}: file {f['name']!r} is empty; Kanboard stores no empty file, skipped"
                )
                continue
            calls.append(
                Call(
                    "createTaskFile",
                    {
                        "project_id": layout.project_id,
                        "task_id": new_id,
                        "filename": f["name"],
                        "blob": f["blob"],
                    },
                )
            )
        if task.get("tags"):
            calls.append(
                Call(
                    "setTaskTags",
                    {"project_id": layout.project_id, "task_id": new_id, "tags": list(task["tags"])},
                )
            )
        closed = not int(row.get("is_active", 1))
        if closed:
            calls.append(Call("closeTask", {"task_id": new_id}))
        for o in port.batch(calls):
            _unwrap(o, f"restore {o.call.method} of task #{task['id']} (now #{new_id})")
        report.comments += len(task.get("comments") or [])
        report.files += sum(1 for f in task.get("files") or [] if f.get("blob"))
        report.closed += closed

    # Locks last: with every record in place, no epoch that has one can be won again.
    names = _lock_names(doc)
    for part in _chunks(names, TAG_CHUNK):
        got = port.batch(
            [
                Call(
                    "createTag", {"project_id": layout.locks_project_id, "tag": n, "color_id": RESTORED_NONCE}
                )
                for n in part
            ]
        )
        for name, o in zip(part, got, strict=True):
            _unwrap(o, f"recreate lock tag {name!r}")
    report.lock_tags = len(names)
    return report


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
