"""Who made a gesture on the board, and whether they may.

Kanboard writes a project activity row for everything a signed-in person does (a move, a
close, a comment, a new card), never for the application token the fabric uses; the
keeper reads the newest of them with its sweep (:func:`keeper.snapshot.take`). A row by an
agent's own Kanboard user is not a person's.

An approval or an answer counts only from the person the card waits on, or from one of
their ``deputies`` (their human card).
"""

from __future__ import annotations

from collections.abc import Iterable

from fabric.cards import CardSet
from fabric.kanboard.principals import board_username
from fabric.kanboard.rows import BoardActivity, BoardComment
from fabric.people import find_person
from fabric.plain import Plain
from fabric.task import Record, TaskSpec

UNKNOWN = "human (Kanboard UI)"  # a gesture whose author the board's activity does not show
GESTURE_KINDS = frozenset({"move", "close", "open"})


class Act(Plain):
    """A person's newest gesture on one card: who, what, when (the board's clock)."""

    person: str
    kind: str
    at: int


def acts_by_people(cards: CardSet, activity: Iterable[BoardActivity]) -> dict[int, Act]:
    """Each card's newest move, close, open or creation by a person (activity is newest first)."""
    agents = agent_usernames(cards)
    found: dict[int, Act] = {}
    for row in activity:
        if not row.user_id or not row.username or row.username in agents or row.task_id in found:
            continue
        if row.kind in GESTURE_KINDS or row.kind == "create":
            found[row.task_id] = Act(row.username, row.kind, row.at)
    return found


def edits_by_people(cards: CardSet, activity: Iterable[BoardActivity]) -> dict[int, list[BoardActivity]]:
    """Each card's edits by people (title, description, priority, due date, assignee),
    oldest first; an agent's own user's (a confined worker's projection) are not a person's."""
    agents = agent_usernames(cards)
    found: dict[int, list[BoardActivity]] = {}
    for row in activity:
        if row.kind == "edit" and row.user_id and row.username and row.username not in agents and row.edited:
            found.setdefault(row.task_id, []).insert(0, row)
    return found


def arrivals(cards: CardSet, activity: Iterable[BoardActivity]) -> set[int]:
    """Cards a person moved into this project from another ("Move to another project");
    an agent's own user moving its cards within its home writes the same row."""
    agents = agent_usernames(cards)
    return {r.task_id for r in activity if r.kind == "arrive" and r.user_id and r.username not in agents}


def agent_usernames(cards: CardSet) -> set[str]:
    """Kanboard usernames an agent may act under: its card id, and a confined agent's own user."""
    return {name for c in cards if not c.is_human for name in (c.id, board_username(c))}


def person_id(cards: CardSet, username: str) -> str:
    """The human card of a Kanboard username, else the username itself."""
    card = find_person(cards, username)
    return card.id if card is not None else username


def waits_on(cards: CardSet, rec: Record, spec: TaskSpec) -> str | None:
    """The Kanboard username a gate, question or decision waits on (None: nobody's)."""
    if rec.assignee:
        return rec.assignee
    card = cards.get(spec.target) if spec.target in cards else None
    return card.human.username if card is not None and card.human is not None else None


def allowed(cards: CardSet, owner: str | None, person: str) -> bool:
    """True when ``person`` (a username) may approve or answer what waits on ``owner``."""
    if owner is None or person == owner:
        return True
    for card in cards.humans():
        if card.human is not None and card.human.username == owner:
            return person in card.human.deputies
    return False


def who_may(cards: CardSet, owner: str) -> str:
    """``owner`` and their deputies, for a refusal's comment."""
    names = [owner]
    for card in cards.humans():
        if card.human is not None and card.human.username == owner:
            names += card.human.deputies
    return " or ".join(names)


def latest_comment(
    comments: Iterable[BoardComment], since: float, *, by: str | None = None, agents: Iterable[str] = ()
) -> BoardComment | None:
    """The newest comment a person (not the application token, not an agent's own user)
    wrote since ``since``; with ``by``, only that person's: what one person wrote never
    becomes another person's answer or approval."""
    skip = set(agents)
    mine = [
        c
        for c in comments
        if c.user_id != 0
        and c.created_at >= int(since)
        and c.text.strip()
        and c.username not in skip
        and (by is None or c.username == by)
    ]
    return mine[-1] if mine else None


__all__ = [
    "GESTURE_KINDS",
    "UNKNOWN",
    "Act",
    "acts_by_people",
    "agent_usernames",
    "allowed",
    "arrivals",
    "edits_by_people",
    "latest_comment",
    "person_id",
    "waits_on",
    "who_may",
]
