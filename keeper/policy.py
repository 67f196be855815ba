"""The keeper's policy duties: a dead letter becomes a decision, a stuck task moves on.

Routing and policy decide (:func:`fabric.policy.plan_escalation`,
:func:`fabric.router.plan_reroute`); the keeper carries the decision out with its fabric
connection: it submits the decision task, or cancels the task on the parked queue and
submits the same work again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.views import TaskView
from fabric.policy import plan_escalation
from fabric.router import plan_reroute
from fabric.submit import Receipt
from fabric.taint import find_by_uid


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
    spec = move.spec
    parent_id = _task_id_of_uid(fab, spec.parent) if spec.parent else None
    return fab.submit(
        spec.intent,
        constraints=move.constraints,
        refs=spec.refs,
        priority=spec.priority,
        deadline=spec.deadline,
        not_before=spec.not_before,
        key=move.key,
        actor=spec.actor,
        parent=parent_id,
    )


def _task_id_of_uid(fab: Fabric, uid: str) -> int | None:
    found = find_by_uid(fab.board, [uid])
    return found[uid][0] if uid in found else None


__all__ = ["escalate_dead_letter", "reroute_parked"]
