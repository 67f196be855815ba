"""Constraint sets: what a routed task asks of the agent that takes it.

Written ``tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5`` (the
``--constraints`` syntax, and the router rules'), recorded in a routed spec's
``constraints``. :mod:`fabric.router` picks an agent that meets one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fabric.cards import TIERS, cost_rank, tier_rank, trust_rank
from fabric.errors import InvalidInput
from fabric.plain import Plain

#: Keys of a spec's constraints that describe a constraint set (the rest are annotations).
CONSTRAINT_KEYS = ("tier", "capabilities", "trust", "cost_class", "max_cost_usd")


class Constraints(Plain):
    """What a constraint target asks for."""

    tier: str | None = None  # minimum tier
    capabilities: frozenset[str] = frozenset()
    trust: str | None = None  # minimum trust
    cost_class: str | None = None  # maximum cost class
    max_cost_usd: float | None = None  # the agent's per-task cap must be at most this

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
        if self.max_cost_usd is not None:
            d["max_cost_usd"] = self.max_cost_usd
        return d

    def text(self) -> str:
        """Back to the ``--constraints`` syntax (empty for "any agent")."""
        parts = []
        if self.tier:
            parts.append(f"tier>={self.tier}")
        if self.capabilities:
            parts.append("cap=" + "+".join(sorted(self.capabilities)))
        if self.trust:
            parts.append(f"trust>={self.trust}")
        if self.cost_class:
            parts.append(f"cost<={self.cost_class}")
        if self.max_cost_usd is not None:
            parts.append(f"max_cost<={self.max_cost_usd:g}")
        return ",".join(parts)

    def merged(self, other: Constraints) -> Constraints:
        """Both sets at once: the stronger tier and trust, all capabilities, the lower costs."""

        def hi(a: str | None, b: str | None, rank: Any) -> str | None:
            return a if b is None else b if a is None else (a if rank(a) >= rank(b) else b)

        def lo(a: str | None, b: str | None) -> str | None:
            return a if b is None else b if a is None else (a if cost_rank(a) <= cost_rank(b) else b)

        costs = [x for x in (self.max_cost_usd, other.max_cost_usd) if x is not None]
        return Constraints(
            tier=hi(self.tier, other.tier, tier_rank),
            capabilities=self.capabilities | other.capabilities,
            trust=hi(self.trust, other.trust, trust_rank),
            cost_class=lo(self.cost_class, other.cost_class),
            max_cost_usd=min(costs) if costs else None,
        )


_CONSTRAINT_HINT = "e.g. tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5"


def _capabilities(part: str, value: str) -> list[str]:
    """``tools+code`` from ``cap=tools+code``; an empty name (``cap=``, ``cap=a+``) is refused."""
    named = [c.strip() for c in value.split("+")]
    if not all(named):
        raise InvalidInput(
            f"constraint {part!r} names an empty capability",
            where="--constraints",
            hint="name capabilities joined by +, e.g. cap=tools+code",
        )
    return named


def parse_constraints(text: str) -> Constraints:
    """``tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5``."""
    tier = trust = cost = None
    max_cost: float | None = None
    caps: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, op, value = _split(part)
        if key == "tier" and op in (">=", "="):
            if value not in TIERS:
                raise InvalidInput(
                    f"unknown tier {value!r}", where="--constraints", hint=f"tiers: {', '.join(TIERS)}"
                )
            tier = value
        elif key in ("cap", "caps", "capabilities") and op == "=":
            caps.update(_capabilities(part, value))
        elif key == "trust" and op in (">=", "="):
            trust_rank(value)
            trust = value
        elif key == "cost" and op in ("<=", "="):
            cost_rank(value)
            cost = value
        elif key in ("max_cost", "maxcost", "max_cost_usd") and op in ("<=", "="):
            try:
                max_cost = float(value.removeprefix("$"))
            except ValueError:
                max_cost = -1.0
            if not max_cost > 0 or math.isinf(max_cost):
                raise InvalidInput(
                    f"max_cost must be a positive number of dollars, not {value!r}",
                    where="--constraints",
                    hint=_CONSTRAINT_HINT,
                )
        else:
            raise InvalidInput(
                f"cannot read constraint {part!r}", where="--constraints", hint=_CONSTRAINT_HINT
            )
    return Constraints(tier, frozenset(caps), trust, cost, max_cost)


def constraints_from_dict(d: Mapping[str, Any]) -> Constraints:
    """The constraint set recorded in a spec's ``constraints`` (annotations are ignored)."""
    caps = d.get("capabilities") or ()
    cost = d.get("max_cost_usd")
    return Constraints(
        tier=d.get("tier") or None,
        capabilities=frozenset(str(c) for c in caps),
        trust=d.get("trust") or None,
        cost_class=d.get("cost_class") or None,
        max_cost_usd=float(cost) if cost is not None else None,
    )


def is_routed(constraints: Mapping[str, Any]) -> bool:
    """Whether a spec's constraints say it was routed by constraints or auto (not direct)."""
    return any(k in constraints for k in CONSTRAINT_KEYS) or "route" in constraints


def _split(part: str) -> tuple[str, str, str]:
    for op in (">=", "<=", "="):
        if op in part:
            key, _, value = part.partition(op)
            return key.strip().lower(), op, value.strip()
    raise InvalidInput(
        f"cannot read constraint {part!r}",
        where="--constraints",
        hint="write key>=value, key<=value or key=value",
    )


__all__ = [
    "CONSTRAINT_KEYS",
    "Constraints",
    "constraints_from_dict",
    "is_routed",
    "parse_constraints",
]
