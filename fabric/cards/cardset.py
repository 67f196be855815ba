"""The set of cards, by id and by queue."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from fabric.cards.backbone import read_record, with_backbone
from fabric.cards.fields import tier_rank
from fabric.cards.schema import Card, satisfies
from fabric.errors import InvalidInput

__all__ = ["CardSet"]


class CardSet:
    """Every card, by id. Iterating yields cards sorted by id."""

    def __init__(
        self,
        cards: Iterable[Card],
        *,
        base_dir: Path | None = None,
        directory: Path | None = None,
    ) -> None:
        by_id: dict[str, Card] = {}
        for card in sorted(cards, key=lambda c: c.id):
            if card.id in by_id:
                raise InvalidInput(f"duplicate agent id {card.id!r}")
            by_id[card.id] = card
        # A persona's model is its backbone's, resolved once here so every caller (worker,
        # A2A, eval gate, router, compose render) calls, and spends the a(t) of, the same one.
        gated = read_record(directory) if directory is not None else {}
        self.cards: dict[str, Card] = {
            i: with_backbone(c, by_id.values(), gated.get(i)) for i, c in by_id.items()
        }
        by_id = self.cards
        self.base_dir = base_dir
        self.directory = directory
        self._queues: dict[str, Card] = {}
        for card in by_id.values():
            if card.queue_name in self._queues:
                raise InvalidInput(f"queue {card.queue_name!r} is drained by two cards")
            self._queues[card.queue_name] = card

    @classmethod
    def restored(cls, cards: Iterable[Card], *, base_dir: Path | None, directory: Path | None) -> CardSet:
        """The set as it was built once (backbones resolved): from fabric.cardcache's snapshot."""
        new = cls.__new__(cls)
        new.cards = {c.id: c for c in sorted(cards, key=lambda c: c.id)}
        new.base_dir, new.directory = base_dir, directory
        new._queues = {c.queue_name: c for c in new.cards.values()}
        return new

    def __iter__(self) -> Iterator[Card]:
        return iter(self.cards.values())

    def __len__(self) -> int:
        return len(self.cards)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self.cards

    def __repr__(self) -> str:
        return f"CardSet({', '.join(self.cards)})"

    def get(self, agent_id: str) -> Card:
        try:
            return self.cards[agent_id]
        except KeyError:
            raise InvalidInput(
                f"unknown agent {agent_id!r}", hint="known: " + ", ".join(self.cards)
            ) from None

    def humans(self) -> list[Card]:
        return [c for c in self if c.kind == "human"]

    def models(self) -> list[Card]:
        return [c for c in self if c.kind == "model"]

    def personas(self) -> list[Card]:
        return [c for c in self if c.kind == "persona"]

    def queues(self) -> list[str]:
        """Every queue name, sorted; one per card."""
        return sorted(self._queues)

    def by_queue(self, queue: str) -> Card:
        try:
            return self._queues[queue]
        except KeyError:
            raise InvalidInput(
                f"unknown queue {queue!r}", hint="known: " + ", ".join(self.queues())
            ) from None

    def human_by_username(self, username: str) -> Card:
        for card in self.humans():
            if card.human is not None and card.human.username == username:
                return card
        known = ", ".join(c.human.username for c in self.humans() if c.human)
        raise InvalidInput(f"unknown human {username!r}", hint=f"known: {known}")

    def matching(
        self,
        *,
        tier: str | None = None,
        capabilities: Iterable[str] = (),
        kind: str | None = "model",
    ) -> list[Card]:
        """Cards of ``kind`` (any kind if None) whose tier is at least ``tier`` and that
        have every capability, sorted by id. Availability is not considered here."""
        needed = list(capabilities)
        if tier is not None:
            tier_rank(tier)  # refuse an unknown tier loudly
        return [c for c in self if (kind is None or c.kind == kind) and satisfies(c, tier, needed)]

    def persona_path(self, agent_id: str) -> Path | None:
        """Absolute path of the agent's soul file, or None if it has none."""
        card = self.get(agent_id)
        if card.persona is None:
            return None
        return (self.base_dir or Path.cwd()) / card.persona
