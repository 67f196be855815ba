"""The keeper's lease and gap sweeps, as plain functions (the daemon schedules them).

Each sweep reads only *active* tasks (open, in the columns where work happens), so its
cost grows with active work, never with history. A task whose metadata cannot be read
is reported in :attr:`SweepReport.problems` and skipped; it never stops the sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError, BoardUnavailable
from fabric.kanboard.taskboard import TaskView
from fabric.ledger import IllegalTransition, LedgerError, LostRace
from fabric.policy import vet_unrecorded
from fabric.submit import repair_unrecorded
from fabric.task import State
from keeper import snapshot
from keeper.snapshot import ACTIVE_COLUMNS, Snapshot

log = logging.getLogger("agap.keeper")

__all__ = [
    "ACTIVE_COLUMNS",
    "SweepReport",
    "active_views",
    "sweep_gaps",
    "sweep_leases",
    "sweep_leases_and_gaps",
]


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    scanned: int = 0
    requeued: list[int] = field(default_factory=list)
    dead_lettered: list[int] = field(default_factory=list)
    gaps_resolved: list[int] = field(default_factory=list)
    repaired: list[int] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)
    trips: int = 0

    def problem(self, task_id: int, text: str) -> None:
        self.problems.setdefault(task_id, []).append(text)


def active_views(fab: Fabric) -> list[TaskView]:
    """Open tasks in the active columns with their records (two round trips)."""
    return snapshot.take(fab).views


def usable(view: TaskView, report: SweepReport) -> bool:
    """True when the task's metadata is readable; otherwise report it and skip it."""
    if view.problems:
        report.problems.setdefault(view.id, []).extend(view.problems)
        log.warning("task #%s: corrupted metadata, skipped: %s", view.id, "; ".join(view.problems))
        return False
    return True


def guarded(view: TaskView, report: SweepReport, action: Callable[[], None]) -> None:
    """Run one task's action; a lost race or a refusal is logged, anything else reported.

    The board being unreachable is re-raised: the job backs off instead of hammering it.
    """
    try:
        action()
    except (LostRace, IllegalTransition) as exc:
        log.info("task #%s: %s", view.id, exc)
    except BoardUnavailable:
        raise
    except (BoardError, LedgerError) as exc:
        log.warning("task #%s: %s", view.id, exc)
        report.problem(view.id, str(exc))
    except Exception as exc:  # a bad task must never stop the sweep
        log.exception("task #%s: unexpected error", view.id)
        report.problem(view.id, f"{type(exc).__name__}: {exc}")


def sweep_leases(
    fab: Fabric,
    snap: Snapshot,
    report: SweepReport,
    *,
    by: str = "keeper",
    grace: float = 0.0,
    repair_after: float = 60.0,
) -> None:
    """Requeue expired leases (dead letter on the last attempt); repair half-submits."""
    now = fab.clock()
    for view in snap.views:
        report.scanned += 1
        cur = view.current
        if cur is None and not view.problems:
            if now - (view.task.created_at or now) >= repair_after:
                guarded(view, report, partial(_repair, fab, view, report))
            continue
        if not usable(view, report) or cur is None or view.spec is None:
            continue
        if fab.ledger.gap_due(view):
            continue  # the gap sweep steps over it
        if cur.state == State.WORKING and cur.lease_until is not None and cur.lease_until + grace < now:
            guarded(view, report, partial(_requeue, fab, view, report, by))


def _repair(fab: Fabric, view: TaskView, report: SweepReport) -> None:
    """Rebuild a half-submitted task's records from its description."""
    # Only a card the fabric sealed, bound to this id, that still passes routing and
    # policy; anything else is left as it is.
    try:
        if repair_unrecorded(fab.board, view, vet=partial(vet_unrecorded, fab.policy_context())) is not None:
            report.repaired.append(view.id)
    except BoardError:
        raise
    except FabricError as exc:  # refused by routing or policy
        report.problem(view.id, f"not rebuilt from its description: {exc}")


def _requeue(fab: Fabric, view: TaskView, report: SweepReport, by: str) -> None:
    rec = fab.ledger.requeue_expired(view, by=by)
    (report.dead_lettered if rec.state == State.DEAD else report.requeued).append(view.id)


def sweep_gaps(fab: Fabric, snap: Snapshot, report: SweepReport, *, by: str = "keeper") -> None:
    """Resolve epoch gaps (a lock without its record) older than the ledger's timeout."""
    for view in snap.views:
        if view.current is None or view.problems or not fab.ledger.gap_due(view):
            continue

        def resolve(v: TaskView = view) -> None:
            fab.ledger.resolve_gap(v, by=by)
            report.gaps_resolved.append(v.id)

        guarded(view, report, resolve)


def sweep_leases_and_gaps(
    fab: Fabric, *, by: str = "keeper", repair_after: float = 60.0, grace: float = 0.0
) -> SweepReport:
    """Requeue expired leases, resolve old gaps, repair half-submitted tasks."""
    report = SweepReport()
    snap = snapshot.take(fab)
    report.trips = snap.trips
    sweep_gaps(fab, snap, report, by=by)
    sweep_leases(fab, snap, report, by=by, grace=grace, repair_after=repair_after)
    return report
