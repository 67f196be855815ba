"""The keeper's policy duties: a dead letter becomes a decision, a stuck task moves on.

Routing and policy decide (:func:`fabric.policy.plan_escalation`,
:func:`fabric.router.plan_reroute`); the keeper carries the decision out with its fabric
connection: it submits the decision task, or cancels the task on the parked queue and
submits the same work again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.views import TaskView
from fabric.policy import plan_escalation
from fabric.router import plan_reroute
from fabric.submit import Receipt
from fabric.task import TERMINAL, State


def escalate_dead_letter(fab: Fabric, view: TaskView, *, actor: str = "keeper") -> Receipt | None:
    """Submit a dead letter's decision task for the responsible human (idempotent per dead
    epoch); None when the task is not one to escalate (see :func:`~fabric.policy.plan_escalation`)."""
    decision = plan_escalation(fab.cards, fab.settings.cards_dir, view, actor=actor)
    if decision is None:
        return None
    return fab.submit(
        decision.intent,
        target=decision.human,
        refs=[decision.ref],
        priority="high",
        key=decision.key,
        actor=decision.actor,
    )


DECISION_PREFIX = "escalate/"  # the action id of a dead letter's decision task (fabric.policy)


def settle_decisions(fab: Fabric, views: Iterable[TaskView], *, by: str = "keeper") -> list[int]:
    """Close each open decision task whose dead letter is no longer the one it was about
    (revived, dropped or otherwise moved on): verified if the person had approved it,
    else canceled with a line saying why. Returns the decision tasks closed."""
    closed: list[int] = []
    for view in views:
        about = _decision_subject(view)
        if about is None:
            continue
        subject_id, uid, epoch = about
        subject = fab.board.read_many([subject_id]).get(subject_id)
        cur = subject.current if subject is not None else None
        if subject is None or subject.uid != uid or cur is None or subject.epoch <= epoch:
            continue
        why = f"task #{subject_id} is {cur.state.value} now ({cur.op} by {cur.by})"
        closed.append(settle_decision(fab, view, why, by=by))
    return closed


def settle_decision(fab: Fabric, view: TaskView, why: str, *, by: str = "keeper") -> int:
    """Close one decision task: verify it when approved, else cancel it."""
    cur = view.current
    assert cur is not None
    if cur.state == State.DONE:
        fab.ledger.verify(view.id, by, why, view=view)
    elif cur.state not in TERMINAL and cur.state != State.DEAD:
        fab.ledger.cancel(view.id, by, why, view=view)
    return view.id


def _decision_subject(view: TaskView) -> tuple[int, str, int] | None:
    """(task id, uid, dead epoch) a decision task is about, or None for other tasks."""
    spec, cur = view.spec, view.current
    key = spec.action_id if spec is not None else None
    if spec is None or cur is None or cur.state in TERMINAL or not key or not key.startswith(DECISION_PREFIX):
        return None
    uid, _, epoch = key[len(DECISION_PREFIX) :].partition("/e")
    ids = [r.split(":", 1)[1] for r in spec.refs if r.startswith("task:")]
    if not ids or not ids[0].isdigit() or not epoch.isdigit():
        return None
    return int(ids[0]), uid, int(epoch)


def decision_for(fab: Fabric, dead: TaskView, *, actor: str = "keeper") -> TaskView | None:
    """The open decision task about a dead letter's current epoch, if one was raised."""
    if dead.uid is None:
        return None
    (tid,) = fab.board.tasks_by_keys([(actor, f"{DECISION_PREFIX}{dead.uid}/e{dead.epoch}")])
    view = fab.board.read_many([tid]).get(tid) if tid is not None else None
    return view if view is not None and _decision_subject(view) is not None else None


def reroute_parked(
    fab: Fabric,
    view: TaskView,
    *,
    by: str = "router",
    parks: Mapping[str, Mapping[str, Any]] | None = None,
) -> Receipt | None:
    """Move a queued, constraint-routed task off a parked queue to an available agent.

    Returns the new task's receipt, or None when nothing is to be done (see
    :func:`~fabric.router.plan_reroute`). Calling again after a crash between the cancel
    and the submit finishes the move, never duplicates it.
    """
    move = plan_reroute(
        fab.cards, fab.board, fab.settings.cards_dir, view, by=by, parks=parks, clock=fab.clock
    )
    if move is None:
        return None
    if move.cancel_reason is not None:
        fab.ledger.cancel(view.id, by, reason=move.cancel_reason, view=view)
    return fab.resubmit(move.spec, constraints=move.constraints, key=move.key)


__all__ = ["decision_for", "escalate_dead_letter", "reroute_parked", "settle_decision", "settle_decisions"]
