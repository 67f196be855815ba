"""The keeper's sweeps, as plain functions (the daemon schedules them).

Each sweep reads only *active* tasks (open, in the columns where work happens), so its
cost grows with active work, never with history.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fabric.core import Fabric
from fabric.kanboard.port import BoardError
from fabric.layout import Column, State
from fabric.ledger import IllegalTransition, LostRace
from fabric.submit import repair_unrecorded
from fabric.taskboard import TaskView

log = logging.getLogger("agap.keeper")

ACTIVE_COLUMNS = (Column.QUEUED, Column.WORKING, Column.WAITING)


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    scanned: int = 0
    requeued: list[int] = field(default_factory=list)
    dead_lettered: list[int] = field(default_factory=list)
    gaps_resolved: list[int] = field(default_factory=list)
    repaired: list[int] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)


def active_views(fab: Fabric) -> list[TaskView]:
    """Open tasks in the active columns with their records (two round trips)."""
    rows = fab.board.open_in(ACTIVE_COLUMNS)
    return fab.board.read_meta_many(rows)


def sweep_leases_and_gaps(fab: Fabric, *, by: str = "keeper",
                          repair_after: float = 60.0) -> SweepReport:
    """Requeue expired leases, resolve old gaps, repair half-submitted tasks."""
    report = SweepReport()
    now = fab.clock()
    for view in active_views(fab):
        report.scanned += 1
        if view.problems:
            report.problems[view.id] = view.problems
        try:
            _sweep_one(fab, view, now, by, repair_after, report)
        except (LostRace, IllegalTransition) as exc:
            log.info("task #%s: %s", view.id, exc)
        except BoardError as exc:
            log.warning("task #%s: board error during sweep: %s", view.id, exc)
    return report


def _sweep_one(fab: Fabric, view: TaskView, now: float, by: str, repair_after: float,
               report: SweepReport) -> None:
    cur = view.current
    if cur is None:
        created = int(view.row.get("date_creation") or now)
        if now - created >= repair_after and repair_unrecorded(fab.board, view) is not None:
            report.repaired.append(view.id)
        return
    if fab.ledger.gap_due(view):
        fab.ledger.resolve_gap(view, by=by)
        report.gaps_resolved.append(view.id)
        return
    if cur.state == State.WORKING and cur.lease_until is not None and cur.lease_until < now:
        rec = fab.ledger.requeue_expired(view, by=by)
        (report.dead_lettered if rec.state == State.DEAD else report.requeued).append(view.id)
