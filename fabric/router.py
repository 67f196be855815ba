"""Choosing an agent for a target: direct (an agent id) or a constraint set.

The rule is deterministic and explainable: among cards that can take work (not
humans, not routers) and satisfy every constraint, pick the lowest cost class, then
the lowest sufficient tier, then the id in alphabetical order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric.cards import TIERS, Card, CardSet, cost_rank, tier_rank, trust_rank
from fabric.errors import InvalidInput


@dataclass(frozen=True)
class Constraints:
    """What a constraint target asks for."""

    tier: str | None = None  # minimum tier
    capabilities: frozenset[str] = frozenset()
    trust: str | None = None  # minimum trust
    cost_class: str | None = None  # maximum cost class

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {}
        if self.tier:
            d["tier"] = self.tier
        if self.capabilities:
            d["capabilities"] = sorted(self.capabilities)
        if self.trust:
            d["trust"] = self.trust
        if self.cost_class:
            d["cost_class"] = self.cost_class
        return d


def parse_constraints(text: str) -> Constraints:
    """``tier>=large,cap=tools+code,trust>=trusted,cost<=standard`` to :class:`Constraints`."""
    tier = trust = cost = None
    caps: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, op, value = _split(part)
        if key == "tier" and op in (">=", "="):
            if value not in TIERS:
                raise InvalidInput(f"unknown tier {value!r}", where="--constraints",
                                   hint=f"tiers: {', '.join(TIERS)}")
            tier = value
        elif key in ("cap", "caps", "capabilities") and op == "=":
            caps.update(filter(None, value.split("+")))
        elif key == "trust" and op in (">=", "="):
            trust_rank(value)
            trust = value
        elif key == "cost" and op in ("<=", "="):
            cost_rank(value)
            cost = value
        else:
            raise InvalidInput(f"cannot read constraint {part!r}", where="--constraints",
                               hint="e.g. tier>=large,cap=tools+code,trust>=trusted,cost<=standard")
    return Constraints(tier, frozenset(caps), trust, cost)


def _split(part: str) -> tuple[str, str, str]:
    for op in (">=", "<=", "="):
        if op in part:
            key, _, value = part.partition(op)
            return key.strip().lower(), op, value.strip()
    raise InvalidInput(f"cannot read constraint {part!r}", where="--constraints",
                       hint="write key>=value, key<=value or key=value")


@dataclass
class Choice:
    """The pick, and why each candidate was or was not chosen."""

    card: Card
    reasons: dict[str, str] = field(default_factory=dict)


def unmet(card: Card, c: Constraints) -> list[str]:
    """The constraints ``card`` does not satisfy (empty when it qualifies)."""
    misses: list[str] = []
    if card.kind in ("human", "router"):
        misses.append(f"is a {card.kind}")
    if c.tier and (card.tier is None or tier_rank(card.tier) < tier_rank(c.tier)):
        misses.append(f"tier {card.tier or 'none'} < {c.tier}")
    missing = sorted(c.capabilities - set(card.capabilities))
    if missing:
        misses.append("lacks " + "+".join(missing))
    if c.trust and trust_rank(card.trust) < trust_rank(c.trust):
        misses.append(f"trust {card.trust} < {c.trust}")
    if c.cost_class and cost_rank(card.cost_class) > cost_rank(c.cost_class):
        misses.append(f"cost {card.cost_class} > {c.cost_class}")
    return misses


def choose(cards: CardSet, c: Constraints) -> Choice:
    """The deterministic pick for constraint set ``c`` (raises when nobody qualifies)."""
    reasons: dict[str, str] = {}
    fit: list[Card] = []
    for card in cards:
        misses = unmet(card, c)
        if misses:
            reasons[card.id] = "; ".join(misses)
        else:
            fit.append(card)
    if not fit:
        raise InvalidInput("no agent satisfies the constraints", where="--constraints",
                           hint="; ".join(f"{k}: {v}" for k, v in sorted(reasons.items())))
    fit.sort(key=lambda k: (cost_rank(k.cost_class), tier_rank(k.tier) if k.tier else 0, k.id))
    for i, card in enumerate(fit):
        reasons[card.id] = "chosen (cheapest, then smallest sufficient tier, then id)" if i == 0 \
            else f"qualifies, ranked {i + 1}"
    return Choice(fit[0], reasons)
