"""Cards a person made: with the board's "+", a task submitted by that person, or a hint;
with "Duplicate", the same work submitted again by that person.

A card made in the Queued column of a queue's swimlane becomes a task for that queue,
submitted as the person who made it: routing and policy apply as to any submit, and its
title and description are only the intent (nothing in them is read as a spec). The
hand-made card is then closed in Done with a comment naming the new task. A card made
anywhere else, or one the policy refuses, gets one comment saying why and where to make
it instead. A card made by anyone without a human card is not a person's.

A card carrying the fabric's sealed spec with no records of its own is either a submit
still writing its records (the lease sweep's repair looks after that) or a copy a person
made with Kanboard's "Duplicate" (which copies the description and reference, not the
metadata): it is a copy when another card carries the same task uid. A copy becomes a new
task with the same work, submitted as that person (routing and policy apply; a deadline
that has passed is dropped), and is closed naming it; a copy of the fabric's own card (a
gate, a promotion, a decision, a digest), or one the policy refuses, is closed with one
comment. Either way the copy loses the reference and the sealed spec it copied: it must
never answer for the original.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.cardedits import close_copy
from fabric.kanboard.gestures import OWN_ACTORS
from fabric.kanboard.layout import META_HINTED, Column
from fabric.kanboard.taskboard import TaskView
from fabric.task import TaskSpec
from keeper import acts
from keeper.acts import Act
from keeper.snapshot import column_of

log = logging.getLogger("agap.keeper.handmade")

WHERE = (
    'The fabric did not take this card: a task is made with the "+" of the Queued column '
    "in the swimlane of the agent (or person) who should do it, or with `agap submit`."
)


def creator(fab: Fabric, view: TaskView, act: Act | None) -> str | None:
    """The Kanboard username of the person (a human card) who made the card, or None."""
    name = act.person if act is not None and act.kind == "create" else None
    if name is None and view.task.creator_id:
        name = next((n for n, i in fab.board.layout.users.items() if i == view.task.creator_id), None)
    people = {c.human.username for c in fab.cards.humans() if c.human is not None}
    return name if name in people else None


def consider(fab: Fabric, view: TaskView, act: Act | None, submitted: dict[int, int]) -> None:
    """Submit or answer a card with no fabric records that a person made."""
    if view.uid is not None or view.meta.get(META_HINTED) or not view.is_open:
        return
    username = creator(fab, view, act)
    if username is None:
        return
    sealed = fab.board.sealed(view.task.description)
    if sealed is not None:
        original = original_of(fab, view, sealed.uid)
        if original is not None:
            _copied(fab, view, sealed.spec, original, username, submitted)
        return  # else a submit still writing its records: the lease sweep's repair
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


def original_of(fab: Fabric, view: TaskView, uid: str) -> int | None:
    """The card ``view`` is a copy of: another one carrying the sealed spec of task ``uid``
    (the oldest), in this project or, for a home's keeper, the work project; None when no
    other card does (a submit still writing its records)."""
    for board in (fab.board, *((fab.main,) if fab.main is not None else ())):
        found: list[int] = [
            row.id
            for row in board.search(f"desc:{uid}")
            if row.id != view.id and (s := board.sealed(row.description)) is not None and s.uid == uid
        ]
        if found:
            return min(found)
    return None


def _copied(
    fab: Fabric, view: TaskView, spec: TaskSpec, original: int, username: str, submitted: dict[int, int]
) -> None:
    """A person's copy of task ``original``: the same work again, as them (see the module)."""
    person = acts.person_id(fab.cards, username)
    if spec.actor in OWN_ACTORS:
        line = (
            f"{person} copied task #{original}, which is the fabric's own (a gate, a promotion, a "
            "decision or a digest), not work to do again: the copy is closed and nothing is submitted."
        )
        close_copy(fab.board, view, line)
        log.info("card #%s: a copy of the fabric's own card #%s, closed", view.id, original)
        return
    now = fab.clock()
    passed = spec.deadline is not None and spec.deadline <= now
    again = replace(spec, actor=person, deadline=None if passed else spec.deadline)
    try:
        receipt = fab.resubmit(again, key=f"copy/{view.id}/{view.task.created_at}", target=spec.target)
    except FabricError as exc:
        close_copy(
            fab.board, view, f"The fabric did not take {person}'s copy of task #{original}: {exc.line()}"
        )
        log.info("card #%s: a copy of #%s refused: %s", view.id, original, exc.line())
        return
    dropped = " (its deadline had passed: the new one has none)" if passed else ""
    close_copy(
        fab.board,
        view,
        f"{person} copied task #{original}: the same work is submitted again as {person}, as task "
        f"#{receipt.task_id} for {receipt.queue}{dropped}. This copy is closed.",
    )
    submitted[view.id] = receipt.task_id
    log.info(
        "card #%s: a copy of #%s by %s, submitted as task #%s", view.id, original, person, receipt.task_id
    )


def _hint(fab: Fabric, view: TaskView, text: str) -> None:
    """One comment, once (the card's metadata remembers it)."""
    fab.board.save_meta(view.id, {META_HINTED: "1"}, comment=text)
    log.info("card #%s: %s", view.id, text)


__all__ = ["WHERE", "consider", "creator", "original_of"]
