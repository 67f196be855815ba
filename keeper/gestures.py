"""Tell a human's move of a card from the fabric's own lagging projection.

The fabric writes a task's record first and moves its card in the same batch. A card whose
column (or open/closed state) disagrees with its record is therefore one of two things:

* a **lagging projection**: the card last changed no later than the record's time plus a
  small tolerance (the projection part of a batch failed): the keeper quietly puts the
  card where the record says;
* a **human's gesture**: the card changed after the record was written. It is an input,
  acted on through the epoch ledger:

  ====================================  ======================================
  record says / card shows              action
  ====================================  ======================================
  input required, moved to Queued or    resume (the answer is the human's latest
  Working                               comment after the question)
  queued for a human, moved to Done     approve (claimed and completed by the human)
  done, closed                          verify
  done, moved back to Queued            reopen
  queued, working or input required,    cancel
  closed
  dead letter, moved to Queued          revive
  anything else                         put back, with one comment listing the
                                        gestures that mean something
  ====================================  ======================================

With Kanboard's application token the human is unknown: the ledger records
``by="human (Kanboard UI)"``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from fabric.core import Fabric
from fabric.kanboard.layout import COLUMN_OF_STATE, TERMINAL, Column, State
from fabric.kanboard.taskboard import TaskView
from fabric.task import Record
from keeper.snapshot import Snapshot, column_of
from keeper.sweeps import SweepReport, guarded, usable

log = logging.getLogger("agap.keeper.gestures")

HUMAN = "human (Kanboard UI)"
APPROVED_REF = "kanboard:approved"

HELP = (
    "The keeper put this card back where the task's state says it belongs ({column}). "
    "Moves that mean something: answer a question by commenting and moving the card to "
    "Queued; approve a task waiting on you by moving it to Done; verify a done task by "
    "closing it; send a done task back by moving it to Queued; cancel a task by closing "
    "it; retry a dead letter by moving it to Queued."
)


@dataclass
class GestureReport(SweepReport):
    """What the gesture sweep did: actions per task and quiet repairs."""

    acted: dict[int, str] = field(default_factory=dict)  # task id -> gesture
    explained: list[int] = field(default_factory=list)  # put back with a comment


def expected_column(rec: Record) -> Column:
    """Where the projection shows a record (a queued task for a human waits on them)."""
    if rec.state == State.QUEUED and rec.assignee:
        return Column.WAITING
    return COLUMN_OF_STATE[rec.state]


def expected_open(rec: Record) -> bool:
    return rec.state not in TERMINAL


def changed_at(view: TaskView, closed_mismatch: bool) -> float:
    """When the card last changed in the way that disagrees with the record."""
    row = view.task
    if closed_mismatch:
        # Closed: when it was closed; reopened: when it was last changed.
        at = row.completed_at if not view.is_open else row.modified_at
        return float(at or row.modified_at)
    return float(row.moved_at)


def sweep_gestures(fab: Fabric, snap: Snapshot, *, tolerance: float = 15.0) -> GestureReport:
    """Act on human gestures, repair lagging projections (see the module doc)."""
    report = GestureReport()
    for view in (*snap.views, *snap.closed_active, *snap.vanished):
        report.scanned += 1
        if view.current is None or not usable(view, report) or view.spec is None:
            continue
        rec = view.current
        col = column_of(fab, view.task)
        open_mismatch = view.is_open != expected_open(rec)
        if col == expected_column(rec) and not open_mismatch:
            continue
        if col is None:
            continue  # a column the fabric does not own: leave it alone
        if changed_at(view, open_mismatch) <= view.fabric_moved_at + tolerance:
            guarded(view, report, partial(_repair, fab, view, rec, report))
            continue
        guarded(view, report, partial(_act, fab, view, rec, col, report))
    return report


def _act(fab: Fabric, view: TaskView, rec: Record, col: Column, report: GestureReport) -> None:
    ledger = fab.ledger
    s = rec.state
    if not view.is_open:
        if s == State.DONE:
            ledger.verify(view.id, HUMAN, "closed in the Kanboard UI", view=view)
            report.acted[view.id] = "verify"
            return
        if s in (State.QUEUED, State.WORKING, State.INPUT_REQUIRED):
            reason = _latest_human_comment(fab, view, rec) or "closed in the Kanboard UI"
            ledger.cancel(view.id, HUMAN, reason, view=view)
            report.acted[view.id] = "cancel"
            return
    else:
        if s == State.INPUT_REQUIRED and col in (Column.QUEUED, Column.WORKING):
            ledger.resume(view.id, HUMAN, _latest_human_comment(fab, view, rec), view=view)
            report.acted[view.id] = "resume"
            return
        if s == State.DONE and col == Column.QUEUED:
            reason = _latest_human_comment(fab, view, rec) or "moved back to Queued in the Kanboard UI"
            ledger.reopen(view.id, HUMAN, reason, view=view)
            report.acted[view.id] = "reopen"
            return
        if s == State.DEAD and col == Column.QUEUED:
            ledger.revive(view.id, HUMAN, "moved to Queued in the Kanboard UI", view=view)
            report.acted[view.id] = "revive"
            return
        if s == State.QUEUED and expected_column(rec) == Column.WAITING and col == Column.DONE:
            lease = ledger.claim(view, HUMAN, lease_seconds=600)
            ledger.complete(lease, APPROVED_REF, note="Approved in the Kanboard UI.")
            report.acted[view.id] = "approve"
            return
    _repair(fab, view, rec, report, explain=True)


def _repair(fab: Fabric, view: TaskView, rec: Record, report: SweepReport, *, explain: bool = False) -> None:
    """Put the card where its record says (one round trip); optionally say why."""
    want = expected_column(rec)
    fab.board.put_back(
        view,
        rec.epoch,
        want,
        is_open=expected_open(rec),
        comment=HELP.format(column=want.value) if explain else None,
    )
    if explain and isinstance(report, GestureReport):
        report.explained.append(view.id)
    else:
        report.repaired.append(view.id)
    log.info(
        "task #%s: card put back to %s (%s)",
        view.id,
        want.value,
        "a gesture with no meaning" if explain else "lagging projection",
    )


def _latest_human_comment(fab: Fabric, view: TaskView, rec: Record) -> str | None:
    """The newest comment a person (not the app token) wrote after the record, if any."""
    mine = [c for c in fab.board.comments(view.id) if c.user_id != 0 and c.created_at >= int(rec.at)]
    if not mine:
        return None
    text = mine[-1].text.strip()
    return text[:2000] or None
