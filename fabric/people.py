"""Who a task concerns among the people: the person it is reported to and verified by.

A pure function of the cards and the spec, shared by the keeper (escalations, digests)
and the ledger (a done card is assigned to the person who verifies it, so "please verify"
shows in their Kanboard "My tasks").
"""

from __future__ import annotations

from fabric.cards import Card, CardSet
from fabric.task import TaskSpec


def find_person(cards: CardSet, name: str) -> Card | None:
    """The human card with this id or Kanboard username."""
    for card in cards.humans():
        if card.id == name or (card.human is not None and card.human.username == name):
            return card
    return None


def responsible(cards: CardSet, spec: TaskSpec | None, escalate_to: str = "") -> Card | None:
    """The person a task is escalated and reported to, and who verifies its result.

    The task's target if it is a person; else a person named in its constraints
    (``escalate_to`` or ``human``); else its submitter if that is a person; else
    ``escalate_to`` (``AGAP_KEEPER_ESCALATE_TO``); else the first human card.
    """
    names: list[str] = []
    if spec is not None:
        names.append(spec.target)
        for key in ("escalate_to", "human"):
            value = spec.constraints.get(key)
            if isinstance(value, str):
                names.append(value)
        names.append(spec.actor)
    if escalate_to:
        names.append(escalate_to)
    for name in names:
        card = find_person(cards, name)
        if card is not None:
            return card
    humans = cards.humans()
    return humans[0] if humans else None


def verifier(cards: CardSet, spec: TaskSpec, escalate_to: str = "") -> str | None:
    """The Kanboard username of the person who verifies ``spec``'s result, if any."""
    card = responsible(cards, spec, escalate_to)
    return card.human.username if card is not None and card.human is not None else None
