"""One look at the board's *active* tasks, in two round trips.

The keeper never lists history. Every sweep reads:

1. one batch of searches: the open tasks in the active columns (Queued, Working,
   Waiting on me; Done too when asked), the open dead letters (rows only, for counts), the
   closed cards still sitting in an active column (a human closed them), and the work
   project's metadata (queue park states, the keeper's watch list);
2. one batch of metadata reads for those tasks, plus a full read of the few watched tasks
   that left the open columns since the last look (closed, or moved to another project),
   and of the tasks the newest activity shows a person closing, making or editing that no
   search above read in full (one closed before any sweep saw it open, a copy made in the
   Dead letter column, an edit of a closed card).

Both batches grow with active work, never with the number of closed tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.keeperstore import KeeperStore
from fabric.kanboard.layout import META_WATCH, Column
from fabric.kanboard.rows import BoardActivity, BoardTask
from fabric.kanboard.taskboard import TaskView, parse_park_states

ACTIVE_COLUMNS = (Column.QUEUED, Column.WORKING, Column.WAITING)
# META_WATCH (project metadata): the open tasks the keeper saw last time, to notice a person
# closing one in Done or moving one to another project, which takes it out of every search.
# Activity kinds that name a task to read in full, wherever it is.
# Activity kinds that name a card to read in full when no search found it: "move" for a
# card a person dragged into Backlog, which the active searches leave out.
NAMING = frozenset({"close", "create", "edit", "move"})


def _cols(columns: Iterable[Column]) -> str:
    return " ".join(f'column:"{c.value}"' for c in columns)


@dataclass
class Snapshot:
    """What one sweep sees."""

    at: float
    views: list[TaskView]  # open tasks in the active columns (and Done when asked)
    dead_rows: list[BoardTask]  # open dead letters (rows only)
    # Open cards in Backlog, the keeper's overflow of a long queue (rows only, when asked):
    # their metadata is read only for the few that need a look (keeper.backlog).
    backlog_rows: list[BoardTask] = field(default_factory=list)
    closed_active: list[TaskView] = field(default_factory=list)  # closed, in an active column
    vanished: list[TaskView] = field(default_factory=list)  # watched or named, read in full
    project_meta: dict[str, str] = field(default_factory=dict)
    parks: dict[str, dict[str, Any]] = field(default_factory=dict)
    activity: list[BoardActivity] = field(default_factory=list)  # newest first (when asked)
    trips: int = 0

    def watched(self) -> set[int]:
        raw = self.project_meta.get(META_WATCH, "")
        try:
            ids = json.loads(raw) if raw else []
            return {int(i) for i in ids}
        except (ValueError, TypeError):
            return set()


def column_of(fab: Fabric, row: BoardTask) -> Column | None:
    """The fabric column a row sits in (None for a column the fabric does not know)."""
    return fab.board.layout.column_of(row.column_id)


def take(
    fab: Fabric,
    *,
    with_done: bool = False,
    with_activity: bool = False,
    with_backlog: bool = False,
    extra: Iterable[int] = (),
) -> Snapshot:
    """Read the active part of the board (two round trips), with the project's newest
    activity and the rows of its Backlog when asked (in the first of them), and the tasks
    ``extra`` names in full (with ``with_done``: cards the webhook said a person moved to
    another project)."""
    store = KeeperStore(fab.board)
    cols = ACTIVE_COLUMNS + ((Column.DONE,) if with_done else ())
    queries = [f"status:open {_cols(cols)}", f'status:open column:"{Column.DEAD.value}"']
    backlog = with_backlog and Column.BACKLOG in fab.board.layout.columns
    if with_done:
        # Closed by a person where the fabric would not leave a closed card (Backlog too).
        queries.append(f"status:closed {_cols((*ACTIVE_COLUMNS, Column.DEAD, Column.BACKLOG))}")
    if backlog:
        queries.append(f'status:open column:"{Column.BACKLOG.value}"')
    found, meta, activity = store.search_meta_activity(queries, with_activity=with_activity)
    rows, dead_rows = found[0], found[1]
    closed_rows = found[2] if with_done else []
    snap = Snapshot(
        at=fab.clock(),
        views=[],
        dead_rows=dead_rows,
        backlog_rows=found[-1] if backlog else [],
        project_meta=meta,
        parks=parse_park_states(meta),
        activity=activity,
        trips=1,
    )
    open_ids = {r.id for r in rows} | {r.id for r in dead_rows} | {r.id for r in snap.backlog_rows}
    # A card a person closed before any sweep saw it open in Done (a result closed seconds
    # after it was finished) is in no open search and not watched yet, nor is a copy made in
    # the Dead letter column or a closed card edited: the activity names them.
    named = {a.task_id for a in activity if a.kind in NAMING and a.user_id and a.task_id}
    closed_ids = {r.id for r in closed_rows}
    recent = ((named | set(extra)) - {r.id for r in rows} - closed_ids) if with_done else set()
    vanished = sorted((snap.watched() - open_ids - closed_ids) | recent) if with_done else []
    if not rows and not closed_rows and not vanished:
        return snap
    views, snap.vanished = store.read_views([*rows, *closed_rows], vanished)
    snap.trips += 1
    snap.views, snap.closed_active = views[: len(rows)], views[len(rows) :]
    return snap


def save_watch(fab: Fabric, snap: Snapshot, *, skip: Iterable[int] = ()) -> None:
    """Remember the open tasks but ``skip`` (cards of another project's tasks: one write,
    only when the set changed)."""
    now_ids = sorted(({v.id for v in snap.views} | {r.id for r in snap.dead_rows}) - set(skip))
    if set(now_ids) == snap.watched():
        return
    fab.board.save_project_meta({META_WATCH: json.dumps(now_ids)})
