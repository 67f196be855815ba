"""Cards a person made with the board's "+": a task submitted by that person, or a hint.

A card made in the Queued column of a queue's swimlane becomes a task for that queue,
submitted as the person who made it: routing and policy apply as to any submit, and its
title and description are only the intent (nothing in them is read as a spec). The
hand-made card is then closed in Done with a comment naming the new task. A card made
anywhere else, or one the policy refuses, gets one comment saying why and where to make
it instead. A card made by anyone without a human card, or one carrying the fabric's
sealed spec (a submit still writing its records), is not a person's: the lease sweep's
repair looks after the latter.
"""

from __future__ import annotations

import logging

from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.layout import META_HINTED, Column
from fabric.kanboard.taskboard import TaskView
from keeper import acts
from keeper.acts import Act
from keeper.snapshot import column_of

log = logging.getLogger("agap.keeper.handmade")

WHERE = (
    'The fabric did not take this card: a task is made with the "+" of the Queued column '
    "in the swimlane of the agent (or person) who should do it, or with `agap submit`."
)


def creator(fab: Fabric, view: TaskView, act: Act | None) -> str | None:
    """The Kanboard username of the person (a human card) who made the card by hand, or None.

    None too for a card carrying the fabric's own sealed spec: a submit still writing its
    records, whoever's credentials it used.
    """
    if fab.board.sealed(view.task.description) is not None:
        return None
    name = act.person if act is not None and act.kind == "create" else None
    if name is None and view.task.creator_id:
        name = next((n for n, i in fab.board.layout.users.items() if i == view.task.creator_id), None)
    people = {c.human.username for c in fab.cards.humans() if c.human is not None}
    return name if name in people else None


def consider(fab: Fabric, view: TaskView, act: Act | None, submitted: dict[int, int]) -> None:
    """Submit or answer a card with no fabric records that a person made."""
    username = creator(fab, view, act)
    if username is None or view.uid is not None or view.meta.get(META_HINTED) or not view.is_open:
        return
    lane = fab.board.layout.queue_of(view.task.swimlane_id)
    if column_of(fab, view.task) not in (Column.QUEUED, Column.BACKLOG) or lane is None:
        _hint(fab, view, WHERE)
        return
    person = acts.person_id(fab.cards, username)
    target = fab.cards.by_queue(lane).id
    intent = "\n\n".join(t for t in (view.task.title.strip(), view.task.description.strip()) if t)
    try:
        receipt = fab.submit(intent, target=target, key=f"card/{view.id}", actor=person)
    except FabricError as exc:
        _hint(fab, view, f"The fabric did not take this card: {exc.line()}")
        return
    line = f"Submitted by {person} as task #{receipt.task_id} for {target}; this card is closed."
    fab.board.put_back(view, -1, Column.DONE, is_open=False, comment=line, queue=lane)
    submitted[view.id] = receipt.task_id
    log.info("card #%s made by %s: submitted as task #%s", view.id, person, receipt.task_id)


def _hint(fab: Fabric, view: TaskView, text: str) -> None:
    """One comment, once (the card's metadata remembers it)."""
    fab.board.save_meta(view.id, {META_HINTED: "1"}, comment=text)
    log.info("card #%s: %s", view.id, text)


__all__ = ["WHERE", "consider", "creator"]
