"""Rules that span cards: ids, queues and usernames used once, private domains that name
a human, backbones that resolve to model cards, soul files and golden sets that exist.

A reference that may point into a file that did not load (``broken``) is not reported:
the fix for that file comes first.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from fabric.cards.backbone import backbone_choices, resolve_backbone
from fabric.cards.files import load_golden, shown_path
from fabric.cards.problems import CardErrors, CardProblem
from fabric.cards.schema import Card
from fabric.plain import Plain

__all__ = ["cross_card_problems"]


def cross_card_problems(loaded: list[tuple[str, Card]], base: Path, broken: set[str]) -> list[CardProblem]:
    """Every cross-card problem of ``loaded`` (``(shown file, card)`` pairs), card by card."""
    cards = {c.id: c for _, c in loaded}
    human_names = _human_names(loaded)
    first = _FirstUse()
    problems: list[CardProblem] = []
    for shown, card in loaded:
        problems.extend(first.clashes(shown, card))
        problems.extend(_privacy_problems(shown, card, human_names, broken))
        if card.backbone is not None:
            problems.extend(_backbone_problems(shown, card, cards, broken))
        if card.persona is not None and not (base / card.persona).is_file():
            problems.append(CardProblem(shown, "persona", f"{card.persona} does not exist (under {base})"))
        if card.golden is not None:
            problems.extend(_golden_problems(shown, card, base))
    return problems


def _human_names(loaded: list[tuple[str, Card]]) -> dict[str, str]:
    """Each human card's id and username -> its id (what ``private:<human>`` may name)."""
    names: dict[str, str] = {}
    for _, card in loaded:
        if card.human is not None:
            names.setdefault(card.id, card.id)
            names.setdefault(card.human.username, card.id)
    return names


class _FirstUse(Plain, frozen=False):
    """The first file to use each id, queue and username: a later one clashes with it."""

    ids: dict[str, str] = field(default_factory=dict)
    queues: dict[str, str] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)

    def clashes(self, shown: str, card: Card) -> list[CardProblem]:
        problems: list[CardProblem] = []
        if card.id in self.ids:
            problems.append(CardProblem(shown, "id", f"{card.id!r} is also the id in {self.ids[card.id]}"))
        self.ids.setdefault(card.id, shown)
        if card.queue_name in self.queues:
            problems.append(
                CardProblem(
                    shown,
                    "queue",
                    f"queue {card.queue_name!r} is already drained by "
                    f"{self.queues[card.queue_name]} (one card per queue)",
                )
            )
        self.queues.setdefault(card.queue_name, shown)
        if card.human is not None:
            user = card.human.username
            if user in self.users:
                problems.append(
                    CardProblem(shown, "human.username", f"{user!r} is also used by {self.users[user]}")
                )
            self.users.setdefault(user, shown)
        return problems


def _privacy_problems(
    shown: str, card: Card, human_names: dict[str, str], broken: set[str]
) -> list[CardProblem]:
    """A ``private:<owner>`` domain names a human card; a human reads only their own."""
    problems: list[CardProblem] = []
    for i, domain in enumerate(card.privacy_domains):
        if not domain.startswith("private:"):
            continue
        owner = domain.split(":", 1)[1]
        if owner not in human_names:
            if broken:
                continue
            known = ", ".join(sorted({f"private:{h}" for h in human_names.values()}))
            problems.append(
                CardProblem(
                    shown,
                    f"privacy_domains.{i}",
                    f"{domain} names no human card (known: {known or 'none'})",
                )
            )
        elif card.human is not None and owner not in (card.id, card.human.username):
            problems.append(
                CardProblem(
                    shown,
                    f"privacy_domains.{i}",
                    f"a human reads only their own private domain, not {domain}",
                )
            )
    return problems


def _backbone_problems(shown: str, card: Card, cards: dict[str, Card], broken: set[str]) -> list[CardProblem]:
    backbone = card.backbone
    assert backbone is not None
    if backbone.model is not None:
        target = cards.get(backbone.model)
        if target is None and backbone.model in broken:
            return []
        if target is None:
            known = ", ".join(sorted(c.id for c in cards.values() if c.kind == "model"))
            return [
                CardProblem(
                    shown,
                    "backbone.model",
                    f"no card {backbone.model!r} (model cards: {known or 'none'})",
                )
            ]
        if target.kind != "model":
            return [
                CardProblem(
                    shown,
                    "backbone.model",
                    f"{backbone.model!r} is a {target.kind} card, not a model",
                )
            ]
        return []
    constraints = backbone.constraints
    assert constraints is not None
    chosen = resolve_backbone(card, cards.values())
    if chosen is not None and card.runtime.model and card.runtime.model != chosen.runtime.model:
        return [
            CardProblem(
                shown,
                "runtime.model",
                f"{card.runtime.model!r}, but the backbone resolves to {chosen.id} "
                f"({chosen.runtime.model}); drop runtime.model: the backbone decides",
            )
        ]
    if chosen is None and not broken:
        want = []
        if constraints.tier:
            want.append(f"tier >= {constraints.tier}")
        if constraints.capabilities:
            want.append("capabilities " + ", ".join(constraints.capabilities))
        why = "; ".join(f"{c.card.id}: {c.why}" for c in backbone_choices(card, cards.values()))
        return [
            CardProblem(
                shown,
                "backbone.constraints",
                f"no model card satisfies {' with '.join(want) or 'these constraints'}"
                + (f" ({why})" if why else ""),
            )
        ]
    return []


def _golden_problems(shown: str, card: Card, base: Path) -> list[CardProblem]:
    assert card.golden is not None
    path = base / card.golden
    if not path.is_file():
        return [CardProblem(shown, "golden", f"{card.golden} does not exist (under {base})")]
    try:
        golden = load_golden(path, base_dir=base)
    except CardErrors as exc:
        return exc.problems
    if golden.agent != card.id:
        return [CardProblem(shown_path(path, base), "agent", f"{golden.agent!r} but the card is {card.id!r}")]
    return []
