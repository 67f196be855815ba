"""One look at the board's *active* tasks, in two round trips.

The keeper never lists history. Every sweep reads:

1. one batch of searches: the open tasks in the active columns (Queued, Working,
   Waiting on me; Done too when asked), the open dead letters (rows only, for counts), the
   closed cards still sitting in an active column (a human closed them), and the work
   project's metadata (queue park states, the keeper's watch list);
2. one batch of metadata reads for those tasks, plus a full read of the few watched tasks
   that left the open Done column since the last look.

Both batches grow with active work, never with the number of closed tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.layout import META_WATCH, Column
from fabric.kanboard.port import Call
from fabric.kanboard.taskboard import TaskView, parse_park_states, parse_view

ACTIVE_COLUMNS = (Column.QUEUED, Column.WORKING, Column.WAITING)
# META_WATCH (project metadata): open Done tasks the keeper saw last time, to notice a
# human closing one, which takes it out of every open search.


def _cols(columns: Iterable[Column]) -> str:
    return " ".join(f'column:"{c.value}"' for c in columns)


@dataclass
class Snapshot:
    """What one sweep sees."""

    at: float
    views: list[TaskView]  # open tasks in the active columns (and Done when asked)
    dead_rows: list[dict[str, Any]]  # open dead letters (rows only)
    closed_active: list[TaskView] = field(default_factory=list)  # closed, in an active column
    vanished: list[TaskView] = field(default_factory=list)  # watched, no longer open in Done
    project_meta: dict[str, str] = field(default_factory=dict)
    parks: dict[str, dict[str, Any]] = field(default_factory=dict)
    trips: int = 0

    def watched(self) -> set[int]:
        raw = self.project_meta.get(META_WATCH, "")
        try:
            ids = json.loads(raw) if raw else []
            return {int(i) for i in ids}
        except (ValueError, TypeError):
            return set()


def column_of(fab: Fabric, row: dict[str, Any]) -> Column | None:
    """The fabric column a row sits in (None for a column the fabric does not know)."""
    cid = int(row.get("column_id") or 0)
    for col, i in fab.board.layout.columns.items():
        if i == cid:
            return col
    return None


def take(fab: Fabric, *, with_done: bool = False) -> Snapshot:
    """Read the active part of the board (two round trips)."""
    layout = fab.board.layout
    pid = layout.project_id
    cols = ACTIVE_COLUMNS + ((Column.DONE,) if with_done else ())
    calls = [
        Call("searchTasks", {"project_id": pid, "query": f"status:open {_cols(cols)}"}),
        Call("searchTasks", {"project_id": pid, "query": f'status:open column:"{Column.DEAD.value}"'}),
        Call("getProjectMetadata", {"project_id": pid}),
    ]
    if with_done:
        calls.append(
            Call(
                "searchTasks",
                {"project_id": pid, "query": f"status:closed {_cols((*ACTIVE_COLUMNS, Column.DEAD))}"},
            )
        )
    out = fab.port.batch(calls)
    rows = list(out[0].unwrap() or [])
    dead_rows = list(out[1].unwrap() or [])
    raw_meta = out[2].unwrap()
    meta = {str(k): str(v) for k, v in raw_meta.items()} if isinstance(raw_meta, dict) else {}
    closed_rows = list(out[3].unwrap() or []) if with_done else []
    snap = Snapshot(
        at=fab.clock(),
        views=[],
        dead_rows=dead_rows,
        project_meta=meta,
        parks=parse_park_states(raw_meta),
        trips=1,
    )
    open_ids = {int(r["id"]) for r in rows} | {int(r["id"]) for r in dead_rows}
    vanished = sorted(snap.watched() - open_ids) if with_done else []
    second: list[Call] = [Call("getTaskMetadata", {"task_id": int(r["id"])}) for r in (*rows, *closed_rows)]
    for tid in vanished:
        second += [Call("getTask", {"task_id": tid}), Call("getTaskMetadata", {"task_id": tid})]
    if not second:
        return snap
    res = fab.port.batch(second)
    snap.trips += 1
    now = fab.clock()
    n = len(rows)
    snap.views = [parse_view(int(r["id"]), r, o.unwrap(), now) for r, o in zip(rows, res[:n], strict=True)]
    m = n + len(closed_rows)
    snap.closed_active = [
        parse_view(int(r["id"]), r, o.unwrap(), now) for r, o in zip(closed_rows, res[n:m], strict=True)
    ]
    for i, tid in enumerate(vanished):
        row, md = res[m + 2 * i].unwrap(), res[m + 2 * i + 1].unwrap()
        if row:
            snap.vanished.append(parse_view(tid, row, md, now))
    return snap


def save_watch(fab: Fabric, snap: Snapshot) -> None:
    """Remember the open Done tasks (one write, only when the set changed)."""
    done_id = fab.board.layout.columns[Column.DONE]
    now_ids = sorted(v.id for v in snap.views if int(v.row.get("column_id") or 0) == done_id)
    if set(now_ids) == snap.watched():
        return
    fab.port.call(
        "saveProjectMetadata",
        {"project_id": fab.board.layout.project_id, "values": {META_WATCH: json.dumps(now_ids)}},
    )
