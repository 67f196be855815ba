"""What a person's gestures in Kanboard's UI mean: one table, and everything made from it.

Each :class:`Rule` says which cards it is for (the record's state; whether the card
waits on a person; whether it is an approval; whether it is the fabric's own), which
gesture it answers (a close, a move to a column, a move to another lane, a card made with
"+", an edit, a reassign, a duplicate, a move to another project) and what the fabric
does. The keeper dispatches on it (each rule names its handler: :mod:`keeper.gestures`
for moves and closes, :mod:`keeper.edits` for edits, :mod:`keeper.handmade` for new
cards and copies), a card
offers the rules that answer it (:mod:`fabric.kanboard.cardtext`), the comment on a card
put back lists them, and the README's and ``docs/POLICY.md``'s gesture tables are its
:func:`markdown` (a test keeps both in sync, as the settings and exit codes are kept).
"""

from __future__ import annotations

from enum import StrEnum

from fabric.kanboard.layout import Column
from fabric.plain import Plain
from fabric.task import GATE_ACTOR, KEEPER_ACTOR, PROMOTE_ACTOR, TERMINAL, Record, State, TaskSpec


class Trigger(StrEnum):
    """The gesture: what a person did to a card."""

    CLOSE = "close"
    TO_QUEUED = "to Queued"
    TO_WORKING = "to Working"
    TO_DONE = "to Done"
    TO_LANE = "to another lane"  # Queued, in another agent's (or person's) swimlane
    NEW_CARD = "new card"  # made with "+" (keeper.handmade)
    OTHER = "other"  # anything else
    # Edits (keeper.edits): what a person changed in "Edit the task" or the card's menu.
    EDIT_TERMS = "priority or due date"
    EDIT_TEXT = "title, description or reference"
    REASSIGN = "assignee"
    DUPLICATE = "duplicate"  # the card's "Duplicate" (keeper.handmade)
    TO_PROJECT = "to another project"  # "Move to another project"


# The column a card was dragged to, as a gesture.
MOVED_TO = {
    Column.BACKLOG: Trigger.TO_QUEUED,  # queued too, only not next
    Column.QUEUED: Trigger.TO_QUEUED,
    Column.WORKING: Trigger.TO_WORKING,
    Column.DONE: Trigger.TO_DONE,
}


class Rule(Plain):
    """One gesture and its meaning."""

    handler: str  # the keeper's action (keeper.gestures.HANDLERS)
    trigger: Trigger | frozenset[Trigger]
    card: str  # the task is … (the table's first column)
    you: str  # and you … (what the person does)
    fabric: str  # the fabric … (what happens)
    states: frozenset[State] = frozenset()  # the record's states it is for (empty: any)
    waiting: bool | None = None  # the card waits on a person (None: either)
    approval: bool | None = None  # the card is an approval (a taint gate, a promotion)
    own: bool | None = None  # the fabric's own card (a gate, a promotion, a decision, a digest)
    offer: str = ""  # the line a card that it answers shows ("" : none)
    help: str = ""  # the clause in the comment on a card put back ("" : none)
    cli: str = ""  # the same gesture from a shell, {id} for the task ("" : none)

    @property
    def triggers(self) -> frozenset[Trigger]:
        return self.trigger if isinstance(self.trigger, frozenset) else frozenset({self.trigger})

    def applies(self, state: State, *, waiting: bool, approval: bool, own: bool = False) -> bool:
        return (
            (not self.states or state in self.states)
            and (self.waiting is None or self.waiting == waiting)
            and (self.approval is None or self.approval == approval)
            and (self.own is None or self.own == own)
        )


CLOSE = "close this card (**Close this task** in its menu)"
_ASKING = frozenset({State.INPUT_REQUIRED})
_QUEUED = frozenset({State.QUEUED})
_DONE = frozenset({State.DONE})
_DEAD = frozenset({State.DEAD})
_CLOSED = TERMINAL
_OPEN = frozenset(State) - TERMINAL
_EDITS = frozenset({Trigger.EDIT_TERMS, Trigger.EDIT_TEXT, Trigger.REASSIGN})

GESTURES: tuple[Rule, ...] = (
    Rule(
        "resume",
        frozenset({Trigger.TO_QUEUED, Trigger.TO_WORKING}),
        "asking you a question",
        "comment the answer, move the card to Queued",
        "resumes it with your answer",
        states=_ASKING,
        offer="To answer: write the answer as a comment, then drag this card back to **Queued**.",
        help="answer a question by commenting and moving the card to Queued",
        cli='agap resume {id} --answer "…"',
    ),
    Rule(
        "resume",
        Trigger.TO_LANE,
        "asking you a question",
        "comment the answer, move the card to Queued in another agent's (or person's) swimlane",
        "gives it to them with your answer: the same work, the question and your answer, "
        "submitted there (routing and policy apply); this card is canceled, naming the new one",
        states=_ASKING,
        help="answer a question and give it to another agent by commenting and moving it to their lane",
    ),
    Rule(
        "approve",
        Trigger.TO_DONE,
        "waiting on you: a taint gate or a promotion (an approval)",
        "move the card to Done",
        "approves it (done by you)",
        states=_QUEUED,
        waiting=True,
        approval=True,
        offer="Approve: drag this card to **Done**.",
        help="approve a task waiting on you by moving it to Done",
        cli="agap approve {id}",
    ),
    Rule(
        "approve",
        Trigger.TO_DONE,
        "waiting on you: a task or a decision",
        "move the card to Done",
        "marks it done by you",
        states=_QUEUED,
        waiting=True,
        approval=False,
        offer="Done: drag this card to **Done**.",
        cli="agap approve {id}",
    ),
    Rule(
        "close_waiting",
        Trigger.CLOSE,
        "waiting on you: a taint gate or a promotion (an approval)",
        "close the card, with or without a comment",
        "refuses it (canceled; your comment is the reason): closing never approves",
        states=_QUEUED,
        waiting=True,
        approval=True,
        offer=f"Refuse: {CLOSE} (a comment before it says why; closing never approves).",
        cli='agap cancel {id} --reason "…"',
    ),
    Rule(
        "close_waiting",
        Trigger.CLOSE,
        "waiting on you: a task or a decision",
        "comment your answer, close the card",
        "approves it with your comment, and verifies it",
        states=_QUEUED,
        waiting=True,
        approval=False,
        offer="Done: write what you did as a comment, then close this card.",
        help="approve a task that is not an approval also by commenting and closing it",
        cli='agap approve {id} --note "…" && agap verify {id}',
    ),
    Rule(
        "close_waiting",
        Trigger.CLOSE,
        "waiting on you: a task or a decision",
        "close the card, no comment",
        "dismisses it (canceled)",
        states=_QUEUED,
        waiting=True,
        approval=False,
        offer=f"Not doing it: {CLOSE}, without a comment.",
        cli="agap cancel {id}",
    ),
    Rule(
        "verify",
        Trigger.CLOSE,
        "done (unverified; an approved gate too)",
        "close the card",
        "verifies it",
        states=_DONE,
        offer=f"Accept the result: {CLOSE}.",
        help="verify a done task by closing it",
        cli="agap verify {id}",
    ),
    Rule(
        "reopen",
        Trigger.TO_QUEUED,
        "done (unverified)",
        "move it back to Queued, with a comment",
        "reopens it",
        states=_DONE,
        offer="Send it back: write what is wrong as a comment, then drag this card to **Queued**.",
        help="send a done task back by moving it to Queued",
        cli='agap reopen {id} --reason "…"',
    ),
    Rule(
        "reroute",
        Trigger.TO_LANE,
        "queued",
        "move it to another agent's (or person's) swimlane",
        "gives it to them: the same work, submitted there (routing and policy apply); "
        "this card is canceled, naming the new one",
        states=_QUEUED,
        waiting=False,
        help="move a queued task to another agent's lane to give it to that agent",
    ),
    Rule(
        "cancel",
        Trigger.CLOSE,
        "queued, working or asking",
        "close the card",
        "cancels it",
        states=frozenset({State.QUEUED, State.WORKING, State.INPUT_REQUIRED}),
        waiting=False,
        help="cancel a task by closing it",
        cli='agap cancel {id} --reason "…"',
    ),
    Rule(
        "revive",
        Trigger.TO_QUEUED,
        "a dead letter",
        "move it to Queued",
        "revives it, and closes its decision card",
        states=_DEAD,
        offer="Retry it as it is: drag this card to **Queued**.",
        help="retry a dead letter by moving it to Queued",
        cli="agap revive {id}",
    ),
    Rule(
        "drop",
        Trigger.CLOSE,
        "a dead letter",
        "close the card",
        "drops it (state `dropped`), and closes its decision card",
        states=_DEAD,
        offer=f"Drop it: {CLOSE}.",
        help="drop it by closing it",
        cli="agap drop {id}",
    ),
    Rule(
        "handmade",
        Trigger.NEW_CARD,
        "—",
        'make a card with "+" in the Queued column of an agent\'s swimlane',
        "submits it as you, for that agent (routing and policy apply; the title and description "
        "are the intent, never read as a spec); your card is closed, naming the task",
    ),
    Rule(
        "handmade",
        Trigger.NEW_CARD,
        "—",
        "make a card anywhere else",
        "one comment saying where to make it",
    ),
    Rule(
        "duplicate",
        Trigger.DUPLICATE,
        "any task but the fabric's own",
        "**Duplicate** it",
        'submits the same work again as you (routing and policy apply, as for a card made with "+"; '
        "a deadline that has passed is dropped); the copy is closed, naming the new task",
        own=False,
    ),
    Rule(
        "duplicate",
        Trigger.DUPLICATE,
        "a gate, a promotion, a decision or a digest",
        "**Duplicate** it",
        "closes the copy, with one comment: the fabric's own cards are not work to do again",
        own=True,
    ),
    Rule(
        "edit_closed",
        _EDITS,
        "closed (verified, canceled or dropped)",
        "edit it (**Edit the task**), or change its assignee",
        "puts it back, with one comment: a closed task does not change (to do it again, **Duplicate** it)",
        states=_CLOSED,
    ),
    Rule(
        "amend",
        Trigger.EDIT_TERMS,
        "open, and yours: waiting on you, or work done for you (you verify it), or you are their deputy",
        "change its priority or due date (**Edit the task**)",
        "sets the task's priority or deadline, as you, with one comment; anyone else's change, or "
        "a due date that has passed, is put back with one comment saying who may, or what to give",
        states=_OPEN,
    ),
    Rule(
        "restore_text",
        Trigger.EDIT_TEXT,
        "open",
        "edit its title, description or reference (**Edit the task**)",
        "puts them back (a card's text is drawn from its task; agents never read it), with one "
        "comment quoting what you wrote and what to do instead: the card's own gestures (an answer "
        'is a comment), or, for other work, close it and make a new card with "+"',
        states=_OPEN,
    ),
    Rule(
        "restore_assignee",
        Trigger.REASSIGN,
        "open",
        "change its assignee (**Assign to me**, or the assignee in **Edit the task**)",
        "puts the assignee back (a card is assigned to the person it waits on: it stays in their "
        "**My tasks**), with one comment saying who may answer it, and how to give it to someone "
        "(drag it to their lane)",
        states=_OPEN,
    ),
    Rule(
        "bring_back",
        Trigger.TO_PROJECT,
        "any task",
        "**Move to another project**",
        "moves it back where its state says (closed again if it was), with one comment: to give it "
        "to someone, drag it to their lane; to keep a copy, **Duplicate to another project**",
    ),
    Rule(
        "put_back",
        Trigger.OTHER,
        "anything else",
        "move it",
        "puts it back, with one comment listing these gestures",
    ),
)


#: The actors of the fabric's own cards: an approval (a taint gate, a promotion), a decision
#: or a digest (the keeper's).
APPROVAL_ACTORS = frozenset({GATE_ACTOR, PROMOTE_ACTOR})
OWN_ACTORS = APPROVAL_ACTORS | {KEEPER_ACTOR}


def card_kind(rec: Record, spec: TaskSpec) -> tuple[bool, bool, bool]:
    """(waits on a person, is an approval, is the fabric's own): what picks a card's rules."""
    waiting = rec.state == State.QUEUED and bool(rec.assignee)
    return waiting, spec.actor in APPROVAL_ACTORS, spec.actor in OWN_ACTORS


def match(trigger: Trigger, state: State, *, waiting: bool, approval: bool, own: bool = False) -> Rule | None:
    """The first rule for this gesture on this card (None: it means nothing)."""
    for rule in GESTURES:
        if trigger in rule.triggers and rule.applies(state, waiting=waiting, approval=approval, own=own):
            return rule
    return None


def offers(state: State, *, waiting: bool, approval: bool) -> list[str]:
    """The gestures a card in ``state`` offers a person, as the card shows them."""
    return [r.offer for r in GESTURES if r.offer and r.applies(state, waiting=waiting, approval=approval)]


def commands(task_id: int, state: State, *, waiting: bool, approval: bool) -> list[str]:
    """The shell commands that make the gestures a card in ``state`` offers (one each)."""
    seen: list[str] = []
    for r in GESTURES:
        line = r.cli.format(id=task_id)
        if r.cli and r.offer and r.applies(state, waiting=waiting, approval=approval) and line not in seen:
            seen.append(line)
    return seen


def help_text(column: str) -> str:
    """The comment on a card the keeper put back: where it belongs, and what means something."""
    clauses = [r.help for r in GESTURES if r.help]
    return (
        f"The keeper put this card back where the task's state says it belongs ({column}). "
        f"Moves that mean something: {'; '.join(clauses)}."
    )


MARKDOWN_BEGIN = "<!-- gestures: generated by fabric/kanboard/gestures.py; do not edit by hand -->"
MARKDOWN_END = "<!-- end of gestures -->"


def markdown() -> str:
    """The gesture table of the README and docs/POLICY.md, between its markers."""
    lines = [MARKDOWN_BEGIN, "", "| the task is… | and you… | the fabric… |", "|---|---|---|"]
    lines += [f"| {r.card} | {r.you} | {r.fabric} |" for r in GESTURES]
    return "\n".join([*lines, "", MARKDOWN_END]) + "\n"


__all__ = [
    "APPROVAL_ACTORS",
    "CLOSE",
    "GESTURES",
    "MOVED_TO",
    "OWN_ACTORS",
    "Rule",
    "Trigger",
    "card_kind",
    "commands",
    "help_text",
    "markdown",
    "match",
    "offers",
]
