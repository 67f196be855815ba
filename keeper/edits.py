"""A person's edits of a card in Kanboard's UI: each means something, or says why not.

Kanboard records every edit a signed-in person makes in the project's activity
(``task.update`` with the fields it changed, ``task.assignee_change``) and nothing the
fabric's application token does, so the gesture sweep reads them whether or not the webhook
came, and an undo of the keeper's never looks like an edit. For each card, the rows newer
than the last one handled (``fabric.edited``: each once, across restarts) are weighed
against the card as it is now, read afresh:

* a field that no longer holds what the person set was changed again since (by the fabric,
  or by them): that row is spent;
* a field that holds what the task says anyway is no edit (a browser sends a description
  back with CRLF; a person signed in at a shell writes the fabric's own drawing);
* anything else is the person's edit, and the gesture table's rule for it says what it
  means (:data:`HANDLERS`): all of one card's edits are handled in one round trip, with one
  comment.

A card moved to another project is noticed when it goes missing from the project (the
keeper's watch list, :mod:`keeper.snapshot`) and moved back (:func:`bring_back`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from fabric import people
from fabric.core import Fabric
from fabric.kanboard import cardedits
from fabric.kanboard.gestures import Rule, Trigger, card_kind, match, offers
from fabric.kanboard.layout import META_EDITED, META_ESCALATED, Column
from fabric.kanboard.rows import BoardActivity
from fabric.kanboard.taskboard import TaskView
from fabric.task import PRIORITY_NAMES, Record, State, TaskSpec, Terms
from keeper import acts
from keeper.sweeps import SweepReport, guarded

log = logging.getLogger("agap.keeper.edits")

# What each editable attribute is called in a comment, and the gesture it is.
NAMES = {
    "title": "title",
    "description": "description",
    "reference": "reference",
    "priority": "priority",
    "due_at": "due date",
}
TRIGGER = {
    "title": Trigger.EDIT_TEXT,
    "description": Trigger.EDIT_TEXT,
    "reference": Trigger.EDIT_TEXT,
    "priority": Trigger.EDIT_TERMS,
    "due_at": Trigger.EDIT_TERMS,
    "owner_id": Trigger.REASSIGN,
}
STATE_WORDS = {State.CANCELED: "canceled", State.CLOSED: "verified and closed", State.DROPPED: "dropped"}


@dataclass
class Case:
    """One card's edits that one rule of the gesture table answers."""

    fab: Fabric
    view: TaskView  # read afresh
    rec: Record
    spec: TaskSpec  # with the terms a person set before, if any
    edits: dict[str, BoardActivity]  # attribute -> the row of the person who set what it holds
    escalate_to: str = ""

    def who(self, attr: str) -> str:
        return self.edits[attr].username

    def value(self, attr: str) -> object:
        return getattr(self.view.task, attr)


@dataclass
class EditResult:
    """What the keeper does about a card's edits: attributes drawn again from the task, the
    person's terms kept, and the lines of the one comment."""

    put_back: set[str] = field(default_factory=set)
    terms: Terms | None = None
    lines: list[str] = field(default_factory=list)


def handled(view: TaskView) -> int:
    """The id of the newest edit row of this card the keeper has handled (0: none)."""
    try:
        return int(view.meta.get(META_EDITED) or 0)
    except ValueError:
        return 0


def sweep_edits(
    fab: Fabric,
    views: Iterable[TaskView],
    rows: dict[int, list[BoardActivity]],
    report: SweepReport,
    *,
    escalate_to: str = "",
    skip: Iterable[int] = (),
) -> dict[int, list[str]]:
    """Handle the people's edits ``rows`` (task id -> rows, oldest first) of these cards;
    cards in ``skip`` (acted on this sweep) are left for the next. Returns task id -> the
    rules applied."""
    done: dict[int, list[str]] = {}
    left = set(skip)
    for view in views:
        mine = rows.get(view.id)
        if not mine or view.id in left or view.current is None or view.spec is None:
            continue
        if not [r for r in mine if r.id > handled(view)]:
            continue
        left.add(view.id)
        guarded(view, report, partial(_handle, fab, view.id, mine, done, escalate_to))
    return done


def _handle(
    fab: Fabric, task_id: int, rows: list[BoardActivity], done: dict[int, list[str]], escalate_to: str
) -> None:
    view = fab.board.read(task_id)  # the card as it is now: at least what the activity shows
    fresh = [r for r in rows if r.id > handled(view)]
    if not fresh or view.current is None or view.spec is None:
        return
    if view.task.project_id and view.task.project_id != fab.board.layout.project_id:
        return  # moved to another project since: bring_back's
    edits = _edits(fab, view, fresh)
    by_rule: dict[str, tuple[Rule, dict[str, BoardActivity]]] = {}
    waiting, approval = _kind(view, view.current)
    for attr, row in edits.items():
        rule = match(TRIGGER[attr], view.current.state, waiting=waiting, approval=approval)
        if rule is not None:
            by_rule.setdefault(rule.handler, (rule, {}))[1][attr] = row
    outcome = EditResult()
    for name, (_, mine) in by_rule.items():
        case = Case(fab, view, view.current, view.spec, mine, escalate_to)
        got = HANDLERS[name](case)
        outcome.put_back |= got.put_back
        outcome.terms = got.terms or outcome.terms
        outcome.lines += got.lines
    forget = outcome.terms is not None and outcome.terms.deadline != view.spec.deadline
    cardedits.settle(
        fab.board,
        view,
        put_back=outcome.put_back,
        marker=max(r.id for r in fresh),
        terms=outcome.terms,
        escalated=forget and bool(view.meta.get(META_ESCALATED)),
        comment=" ".join(outcome.lines) or None,
    )
    if by_rule:
        done[view.id] = sorted(by_rule)
        log.info(
            "task #%s: edits by %s: %s",
            view.id,
            sorted({r.username for r in edits.values()}),
            sorted(by_rule),
        )


def _edits(fab: Fabric, view: TaskView, rows: list[BoardActivity]) -> dict[str, BoardActivity]:
    """Attribute -> the row of the person whose edit the card holds (see the module doc)."""
    want = cardedits.expected(fab.board, view)
    out: dict[str, BoardActivity] = {}
    for attr in cardedits.EDITABLE:
        touched = [r for r in rows if attr in r.edited]
        if not touched:
            continue
        row = touched[-1]
        now = getattr(view.task, attr)
        if not cardedits.same(attr, now, row.edited[attr]):
            continue  # changed again since
        if attr == "description":
            if cardedits.drawn(fab.board, view):
                continue
        elif cardedits.same(attr, now, want[attr]):
            continue
        out[attr] = row
    return out


def _kind(view: TaskView, rec: Record) -> tuple[bool, bool]:
    assert view.spec is not None
    waiting, approval, _ = card_kind(rec, view.spec)
    return waiting, approval


# -- the rules -----------------------------------------------------------------------------


def _edit_closed(case: Case) -> EditResult:
    """A closed task's card is its record: everything edited is put back."""
    names = _names(case.edits)
    who = _people(case.edits)
    state = STATE_WORDS.get(case.rec.state, case.rec.state.value)
    return EditResult(
        put_back=set(case.edits),
        lines=[
            f"This task is {state}: its card does not change, so {who}'s change of its {names} was put "
            "back. To do it again, **Duplicate** it: a new task, as you."
        ],
    )


def _amend(case: Case) -> EditResult:
    """A priority or due date set by the person the card is for (or their deputy), kept as
    the task's terms; anyone else's, or a due date that has passed, put back."""
    fab, spec, now = case.fab, case.spec, case.fab.clock()
    owner = acts.waits_on(fab.cards, case.rec, spec) or people.verifier(fab.cards, spec, case.escalate_to)
    priority, deadline = spec.priority, spec.deadline
    out = EditResult()
    setters: list[str] = []
    for attr in ("priority", "due_at"):
        if attr not in case.edits:
            continue
        who = case.who(attr)
        value = case.value(attr)
        if owner is None or not acts.allowed(fab.cards, owner, who):
            may = acts.who_may(fab.cards, owner) if owner else "nobody"
            out.put_back.add(attr)
            out.lines.append(
                f"Only {may} may change this task's {NAMES[attr]} ({who} tried): "
                f"it stays {_shown(attr, spec)}."
            )
        elif attr == "due_at" and value and int(str(value)) <= now:
            out.put_back.add(attr)
            out.lines.append(
                f"A due date that has passed ({_when(int(str(value)))}) is no deadline: it stays "
                f"{_shown(attr, spec)}. Set one after now."
            )
        elif attr == "priority":
            priority = int(str(value))
            setters.append(who)
            out.lines.append(f"{who} set its priority to {_priority(priority)} (was {_shown(attr, spec)}).")
        else:
            deadline = float(int(str(value))) if value else None
            setters.append(who)
            what = f"its deadline to {_when(deadline)}" if deadline else "it no deadline"
            out.lines.append(f"{who} gave {what} (was {_shown(attr, spec)}).")
    if setters:
        out.terms = Terms(
            priority=priority, deadline=deadline, by=acts.person_id(fab.cards, setters[-1]), at=now
        )
    return out


def _restore_text(case: Case) -> EditResult:
    """A card's title, description and reference are the task's: put back, quoting what the
    person wrote (the description last: its quote ends the sentence)."""
    fab, view = case.fab, case.view
    parts = []
    if "title" in case.edits:
        parts.append(f'{case.who("title")} changed its title to "{_line(view.task.title)}"')
    if "reference" in case.edits:
        parts.append(f"{case.who('reference')} changed its reference (the key a repeated submit finds it by)")
    quote = ""
    if "description" in case.edits:
        added = cardedits.added_lines(fab.board, view)
        quote = "\n".join(f"> {line}" for line in added.splitlines())
        parts.append(f"{case.who('description')} edited its description" + (":" if quote else ""))
    head = "; ".join(parts)
    back = f"A card's text is drawn from its task, so it is back as it was. {_instead_of_text(case)}"
    text = f"{head}\n\n{quote}\n\n{back}" if quote else f"{head}. {back}"
    return EditResult(put_back=set(case.edits), lines=[text])


def _instead_of_text(case: Case) -> str:
    waiting, approval = _kind(case.view, case.rec)
    lines = offers(case.rec.state, waiting=waiting, approval=approval)
    if lines:
        return "What this card takes: " + " ".join(lines)
    return (
        "The agent works from the task as it was submitted and does not read the card. To ask for "
        'something else, close this card (that cancels the task) and make a new card with "+" in the '
        "Queued column of the agent's lane, or use `agap submit`."
    )


def _restore_assignee(case: Case) -> EditResult:
    """Who a card is assigned to is the task's: the person it waits on."""
    fab, rec, spec = case.fab, case.rec, case.spec
    users = {i: n for n, i in fab.board.layout.users.items()}
    now = users.get(int(str(case.value("owner_id"))), "someone who is not a member of the project")
    gave = f"gave this card to {now}" if case.value("owner_id") else "took this card from its assignee"
    owner = acts.waits_on(fab.cards, rec, spec) if rec.assignee or rec.state == State.QUEUED else None
    if owner:
        verb = "verify" if rec.state == State.DONE else "answer"
        may = acts.who_may(fab.cards, owner)
        back = f"it is back with {owner}, whom it waits on. Only {may} may {verb} it"
        instead = (
            f"; to let someone else {verb} it, {owner} names them among the `deputies` of their human card."
        )
    elif rec.state == State.WORKING:
        back, instead = "it is back as it was: an agent is working on it", "; to stop it, close the card."
    else:
        back = "it is back as it was: it waits on no one"
        instead = (
            "; to give the work to a person or another agent, drag the card to their lane in **Queued**."
        )
    return EditResult(put_back={"owner_id"}, lines=[f"{case.who('owner_id')} {gave}; {back}{instead}"])


#: The keeper's action for each edit rule of the gesture table.
HANDLERS: dict[str, Callable[[Case], EditResult]] = {
    "edit_closed": _edit_closed,
    "amend": _amend,
    "restore_text": _restore_text,
    "restore_assignee": _restore_assignee,
}


# -- a card moved to another project -------------------------------------------------------


def moved_away(fab: Fabric, view: TaskView) -> bool:
    """A card of this project's tasks that now sits in another project."""
    return bool(view.task.project_id) and view.task.project_id != fab.board.layout.project_id


def bring_back(fab: Fabric, view: TaskView, column: Column, *, is_open: bool) -> None:
    """Move a card a person moved to another project back where its record says."""
    assert view.spec is not None
    cardedits.bring_back(
        fab.board,
        view,
        column,
        queue=view.spec.queue,
        is_open=is_open,
        comment=(
            f"This card was moved to another project and is back in {fab.board.layout.project_name}: "
            "it is a task of the fabric, which works from this project. To give the work to someone "
            "else, drag the card to their lane in **Queued**; to keep a copy in your project, use "
            "**Duplicate to another project**."
        ),
    )


# -- words ---------------------------------------------------------------------------------


def _names(edits: dict[str, BoardActivity]) -> str:
    names = [NAMES.get(a, "assignee") for a in cardedits.EDITABLE if a in edits]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _people(edits: dict[str, BoardActivity]) -> str:
    return " and ".join(sorted({r.username for r in edits.values()}))


def _priority(value: int) -> str:
    return PRIORITY_NAMES.get(value, str(value))


def _shown(attr: str, spec: TaskSpec) -> str:
    if attr == "priority":
        return _priority(spec.priority)
    return _when(spec.deadline) if spec.deadline else "none"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _line(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 200 else one[:199] + "…"


__all__ = ["HANDLERS", "Case", "EditResult", "bring_back", "handled", "moved_away", "sweep_edits"]
