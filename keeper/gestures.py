"""A person's gestures on the board, told from the fabric's own lagging projection.

The fabric writes a task's record first and moves its card in the same batch. A card whose
column, swimlane or open/closed state disagrees with its record is one of two things:

* a **person's gesture**: the board's activity shows a person moved, closed or reopened
  the card since the record was written (or, where the activity does not reach back, the
  card changed more than a tolerance after the record). It is an input, acted on through
  the epoch ledger as that person (the table below; the README has the same one);
* a **lagging projection** (the projection part of a batch failed): no person touched the
  card, and it last changed within the tolerance: the keeper quietly puts it right.

  What each gesture means is one table, :data:`fabric.kanboard.gestures.GESTURES`: this
  module dispatches on it (:data:`HANDLERS`), cards offer its lines, and the README's
  gesture table is made from it.

A card a person made with "+" (or copied with "Duplicate") is handled by
:mod:`keeper.handmade`; a person's edits (title, description, priority, due date,
assignee) and a card moved to another project by :mod:`keeper.edits`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.gestures import MOVED_TO, Rule, Trigger, help_text, match
from fabric.kanboard.gestures import card_kind as table_kind
from fabric.kanboard.layout import COLUMN_OF_STATE, Column, column_fits
from fabric.kanboard.rows import BoardComment
from fabric.kanboard.taskboard import TaskView
from fabric.ledger import APPROVAL_REF, IllegalTransition
from fabric.task import GATE_ACTOR, PROMOTE_ACTOR, TERMINAL, Record, State, TaskSpec
from keeper import acts, edits, handmade
from keeper.acts import UNKNOWN, Act
from keeper.decisions import decision_for, settle_decision
from keeper.snapshot import Snapshot, column_of
from keeper.sweeps import SweepReport, guarded, usable

log = logging.getLogger("agap.keeper.gestures")

HUMAN = UNKNOWN  # who a gesture is recorded as when the board's activity does not say
#: Actors of the cards that ask a person to approve something: closing one refuses it.
APPROVALS = frozenset({GATE_ACTOR, PROMOTE_ACTOR})
APPROVED_REF = APPROVAL_REF


@dataclass
class GestureReport(SweepReport):
    """What the gesture sweep did: actions per task, refusals and quiet repairs."""

    acted: dict[int, str] = field(default_factory=dict)  # task id -> gesture
    explained: list[int] = field(default_factory=list)  # put back with a comment
    refused: dict[int, str] = field(default_factory=dict)  # task id -> why (put back)
    by: dict[int, str] = field(default_factory=dict)  # task id -> who made the gesture
    decisions_closed: list[int] = field(default_factory=list)
    submitted: dict[int, int] = field(default_factory=dict)  # hand-made card or copy -> its task
    edited: dict[int, list[str]] = field(default_factory=dict)  # task id -> the edit rules applied
    brought_back: list[int] = field(default_factory=list)  # moved to another project, and back
    # Cards a person moved here from another project: their own project's keeper brings
    # them back; this one leaves them alone (and does not watch them).
    foreign: list[int] = field(default_factory=list)
    # Cards drawn again because they lagged their record (a confined agent's worker has
    # no seal key: TaskBoard.redraw).
    redrawn: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Gesture:
    """One card's disagreement with its record, and who caused it."""

    view: TaskView
    rec: Record
    col: Column
    lane: str | None  # the queue of the swimlane the card sits in
    by: str  # the person (a username or card id), or UNKNOWN
    username: str | None  # their Kanboard username, when the activity names them
    # What the person wrote with the gesture itself (a Matrix reply): used instead of their
    # latest comment on the card. None: read the comment.
    text: str | None = None
    where: str = "in the Kanboard UI"  # how the gesture was made, for the records' notes


class Refused(Exception):
    """A gesture the fabric will not act on: the card goes back, with this line."""


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


def sweep_gestures(
    fab: Fabric, snap: Snapshot, *, tolerance: float = 15.0, escalate_to: str = ""
) -> GestureReport:
    """Act on people's gestures and edits, repair lagging projections (see the module doc)."""
    report = GestureReport()
    by_card = acts.acts_by_people(fab.cards, snap.activity)  # task id -> its act
    watched = snap.watched()
    arrived = acts.arrivals(fab.cards, snap.activity) - watched
    report.foreign = sorted(
        v.id for v in (*snap.views, *snap.closed_active) if v.id in arrived and _foreign(fab, v)
    )
    views = [v for v in (*snap.views, *snap.closed_active, *snap.vanished) if v.id not in report.foreign]
    for view in views:
        report.scanned += 1
        if edits.moved_away(fab, view):
            if view.current is not None and view.spec is not None and usable(view, report):
                # One this keeper watched is its project's; any other (the webhook named it)
                # only if its uid is bound here.
                mine = partial(_bring_back, fab, view, view.current, report, watched=view.id in watched)
                guarded(view, report, mine)
            continue
        if view.current is None and not view.problems:
            act = by_card.get(view.id)
            guarded(view, report, partial(handmade.consider, fab, view, act, report.submitted))
            continue
        if view.current is None or not usable(view, report) or view.spec is None:
            continue
        _consider(fab, view, view.current, by_card.get(view.id), tolerance, report)
    # Edits, once a card's moves are settled: a card acted on now is weighed next time.
    touched = {*report.acted, *report.refused, *report.explained, *report.repaired, *report.brought_back}
    report.edited = edits.sweep_edits(
        fab,
        views,
        acts.edits_by_people(fab.cards, snap.activity),
        report,
        escalate_to=escalate_to,
        skip=touched,
    )
    return report


def _foreign(fab: Fabric, view: TaskView) -> bool:
    """A card a person moved here from another project that is a task of another project
    (its uid is not bound here). A card with no records is a person's own card, whatever
    project it was made in."""
    if view.uid is None:
        return False
    try:
        return not fab.board.owns(view)
    except FabricError:
        return True  # unsure: leave it for the next sweep


def _bring_back(fab: Fabric, view: TaskView, rec: Record, report: GestureReport, *, watched: bool) -> None:
    if not watched and not fab.board.owns(view):
        return  # another project's task: its own keeper's
    edits.bring_back(fab, view, expected_column(rec), is_open=expected_open(rec))
    report.brought_back.append(view.id)
    log.info("task #%s: moved to another project; brought back", view.id)


def _consider(
    fab: Fabric, view: TaskView, rec: Record, act: Act | None, tolerance: float, report: GestureReport
) -> None:
    col = column_of(fab, view.task)
    if col is None:
        return  # a column the fabric does not own: leave it alone
    assert view.spec is not None
    layout = fab.board.layout
    lane = layout.queue_of(view.task.swimlane_id)
    open_mismatch = view.is_open != expected_open(rec)
    home = layout.swimlanes.get(view.spec.queue, view.task.swimlane_id)
    lane_mismatch = view.is_open and view.task.swimlane_id != home  # a lane of no queue too
    if column_fits(col, rec.state, rec.assignee) and not open_mismatch and not lane_mismatch:
        return
    if not open_mismatch and not view.is_open and rec.state in TERMINAL:
        return  # closed as it should be; Kanboard leaves a closed card in its column
    # A person's move, close or reopen since the fabric's own last move is theirs, however
    # soon after; without one in the activity, only a change well after it is a gesture.
    by_person = act is not None and act.at >= int(view.fabric_moved_at)
    if not by_person and changed_at(view, open_mismatch) <= view.fabric_moved_at + tolerance:
        if not fab.board.writer_first(rec):  # else its writer moves it: the next sweep looks again
            guarded(view, report, partial(_repair, fab, view, rec, report))
        return
    who = acts.person_id(fab.cards, act.person) if by_person and act else UNKNOWN
    g = Gesture(view, rec, col, lane, who, act.person if by_person and act else None)
    guarded(view, report, partial(_act, fab, g, report))


def _act(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    rule = _rule(g)
    if rule is None:
        _repair(fab, g.view, g.rec, report, explain=True)
        return
    try:
        name = perform(fab, g, rule, report)
    except Refused as exc:
        _refuse(fab, g, str(exc), report)
        return
    except IllegalTransition as exc:
        _refuse(fab, g, exc.line(), report)
        return
    report.acted[g.view.id] = name
    report.by[g.view.id] = g.by
    log.info("task #%s: %s by %s", g.view.id, name, g.by)


# An action returns None, or the name of what it turned out to be.
Action = Callable[[Fabric, Gesture, GestureReport], str | None]


def _rule(g: Gesture) -> Rule | None:
    """The rule of the gesture table this card's change answers (None: it means nothing)."""
    assert g.view.spec is not None
    rec = g.rec
    waiting, approval = card_kind(g.view, rec)
    if not g.view.is_open:
        return match(Trigger.CLOSE, rec.state, waiting=waiting, approval=approval)
    # A move to another lane is a reroute only for work queued for an agent (what waits on
    # a person stays theirs); a dead letter revived there goes to that agent (_revive).
    if g.col in (Column.QUEUED, Column.BACKLOG) and _moved_lane(g):
        rule = match(Trigger.TO_LANE, rec.state, waiting=waiting, approval=approval)
        if rule is not None:
            return rule
    trigger = MOVED_TO.get(g.col)
    return match(trigger, rec.state, waiting=waiting, approval=approval) if trigger else None


def card_kind(view: TaskView, rec: Record) -> tuple[bool, bool]:
    """(waits on a person, is an approval): what picks a card's rules in the table."""
    assert view.spec is not None
    waiting, approval, _ = table_kind(rec, view.spec)
    return waiting, approval


def perform(fab: Fabric, g: Gesture, rule: Rule, report: GestureReport) -> str:
    """Do what ``rule`` says for gesture ``g`` (the name of what it turned out to be).
    Raises :class:`Refused` or :class:`~fabric.ledger.IllegalTransition` when it may not."""
    return HANDLERS[rule.handler](fab, g, report) or rule.handler


def _moved_lane(g: Gesture) -> bool:
    return g.lane is not None and g.view.spec is not None and g.lane != g.view.spec.queue


# -- the actions ---------------------------------------------------------------------------


def _comment(fab: Fabric, g: Gesture) -> str | None:
    """What the mover wrote with the gesture, else their own latest comment (anyone's when
    the board does not say who moved)."""
    if g.text is not None:
        return g.text.strip()[:2000] or None
    found = _latest(fab, g)
    return found.text.strip()[:2000] if found is not None else None


def _latest(fab: Fabric, g: Gesture) -> BoardComment | None:
    agents = acts.agent_usernames(fab.cards)
    return acts.latest_comment(fab.board.comments(g.view.id), g.rec.at, by=g.username, agents=agents)


def _check_allowed(fab: Fabric, g: Gesture, verb: str, answerer: str | None = None) -> None:
    """Refuse unless the mover (or, when the board does not say who moved, the answer's
    author) is the person the card waits on or their deputy."""
    assert g.view.spec is not None
    owner = acts.waits_on(fab.cards, g.rec, g.view.spec)
    who = g.username or answerer
    if owner is None or (who is not None and acts.allowed(fab.cards, owner, who)):
        return
    may = acts.who_may(fab.cards, owner)
    if who is None:
        raise Refused(f"Kanboard does not say who moved this card; only {may} may {verb} it.")
    raise Refused(f"Only {may} may {verb} this ({who} tried).")


def _resume(fab: Fabric, g: Gesture, report: GestureReport) -> str | None:
    if g.text is not None:
        _check_allowed(fab, g, "answer")
        answer = _comment(fab, g)
    else:
        found = _latest(fab, g)
        _check_allowed(fab, g, "answer", found.username if found is not None else None)
        answer = found.text.strip()[:2000] if found is not None else None
    if _moved_lane(g):
        # Answered and dragged to another agent's lane: the work goes there with the answer
        # (a resume here, then a reroute of the bare spec, would lose it).
        assert g.view.spec is not None
        intent = with_answer(g.view.spec.intent, g.rec.reason, answer, g.by)
        _reroute(fab, g, report, spec=g.view.spec.evolve(intent=intent))
        return "answer and reroute"
    fab.ledger.resume(g.view.id, g.by, answer, view=g.view)
    return None


def with_answer(intent: str, question: str | None, answer: str | None, by: str) -> str:
    """The intent of work given to another agent, with the question it asked and the answer."""
    lines = [intent, ""]
    if question:
        lines.append(f"Asked: {question}")
    lines.append(f"Answer ({by}): {answer}" if answer else f"No answer given ({by} moved it without one).")
    return "\n".join(lines)


def _approve(fab: Fabric, g: Gesture, report: GestureReport, note: str | None = None) -> None:
    _check_allowed(fab, g, "approve")
    if note is None and g.text is not None:
        note = _comment(fab, g)  # "approve <note>" from Matrix
    lease = fab.ledger.claim(g.view, g.by, lease_seconds=600)
    fab.ledger.complete(lease, APPROVAL_REF, note=note or f"Approved by {g.by} {g.where}.")


def _close_gate(fab: Fabric, g: Gesture, report: GestureReport) -> str:
    """A card waiting on a person, closed. An approval (a taint gate, a promotion) is
    refused, whatever the comment says ("No, refuse this" must never approve): it is
    approved only by moving it to Done. Anything else is answered with the person's
    comment (approved with it, then verified), or dismissed without one."""
    assert g.view.spec is not None
    answer = _comment(fab, g)
    if answer is None or g.view.spec.actor in APPROVALS:
        _check_allowed(fab, g, "dismiss")
        _cancel(fab, g, report)
        return "dismiss"
    _approve(fab, g, report, note=answer)
    fab.ledger.verify(g.view.id, g.by, f"closed {g.where}")
    return "approve"


def _verify(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    # A result waits on the person who verifies it (its assignee): nobody else accepts it.
    _check_allowed(fab, g, "verify")
    fab.ledger.verify(g.view.id, g.by, f"closed {g.where}", view=g.view)


def _cancel(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    reason = _comment(fab, g) or f"closed {g.where}"
    fab.ledger.cancel(g.view.id, g.by, reason, view=g.view)


def _reopen(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    _check_allowed(fab, g, "send back")  # a rework spends a model call: the verifier's call
    reason = _comment(fab, g) or f"moved back to Queued {g.where}"
    fab.ledger.reopen(g.view.id, g.by, reason, view=g.view)


def _revive(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    """A fresh set of attempts; moved into another agent's lane too, it goes to that agent."""
    decision = decision_for(fab, g.view)
    fab.ledger.revive(g.view.id, g.by, "moved to Queued in the Kanboard UI", view=g.view)
    if decision is not None:
        why = f"task #{g.view.id} was revived by {g.by}"
        report.decisions_closed.append(settle_decision(fab, decision, why))
    if _moved_lane(g):
        fresh = fab.board.read(g.view.id)
        assert fresh.current is not None
        moved = Gesture(fresh, fresh.current, g.col, g.lane, g.by, g.username)
        try:
            _reroute(fab, moved, report)
        except Refused as exc:
            _refuse(fab, moved, f"Revived, but {exc}", report)


def _drop(fab: Fabric, g: Gesture, report: GestureReport) -> None:
    decision = decision_for(fab, g.view)
    fab.ledger.drop(g.view.id, g.by, _comment(fab, g) or "closed in the Kanboard UI", view=g.view)
    if decision is not None:
        why = f"task #{g.view.id} was dropped by {g.by}"
        report.decisions_closed.append(settle_decision(fab, decision, why))


def _reroute(fab: Fabric, g: Gesture, report: GestureReport, spec: TaskSpec | None = None) -> None:
    """Give a queued task to the agent whose lane it was moved to: the same work (``spec``:
    the card's, unless given), submitted there (routing and policy apply), then this one
    canceled, pointing at the new one."""
    spec, lane = spec or g.view.spec, g.lane
    assert spec is not None and lane is not None
    target = fab.cards.by_queue(lane).id
    try:
        receipt = fab.resubmit(spec, target=target, key=f"moved/{g.view.uid}/e{g.rec.epoch}")
    except FabricError as exc:
        raise Refused(f"Not moved to {target}: {exc.line()}") from exc
    why = f"moved to {target}'s lane by {g.by}: now task #{receipt.task_id}"
    fab.ledger.cancel(g.view.id, g.by, why, view=g.view)


# -- putting a card back -------------------------------------------------------------------


def _refuse(fab: Fabric, g: Gesture, why: str, report: GestureReport) -> None:
    want = expected_column(g.rec)
    assert g.view.spec is not None
    line = f"{why} The card is back in {want.value}."
    fab.board.put_back(
        g.view, g.rec.epoch, want, is_open=expected_open(g.rec), comment=line, queue=g.view.spec.queue
    )
    report.refused[g.view.id] = why
    log.info("task #%s: gesture by %s refused: %s", g.view.id, g.by, why)


def _repair(fab: Fabric, view: TaskView, rec: Record, report: SweepReport, *, explain: bool = False) -> None:
    """Put the card where its record says (one round trip); optionally say why."""
    want = expected_column(rec)
    fab.board.put_back(
        view,
        rec.epoch,
        want,
        is_open=expected_open(rec),
        comment=help_text(want.value) if explain else None,
        queue=view.spec.queue if view.spec is not None else None,
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


#: The keeper's action for each handler the gesture table names.
HANDLERS: dict[str, Action] = {
    "resume": _resume,
    "approve": _approve,
    "close_waiting": _close_gate,
    "verify": _verify,
    "reopen": _reopen,
    "reroute": _reroute,
    "cancel": _cancel,
    "revive": _revive,
    "drop": _drop,
}
