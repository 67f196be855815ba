"""The cards' vocabularies, their orderings, and how a rule says what is wrong.

Plain Python: every process that reads cards imports this. The field types that refuse
readably (``Slug``, ``Url``, ...) are :mod:`fabric.cards.models`', with the checks.
"""

from __future__ import annotations

from typing import Literal

from fabric.errors import InvalidInput

__all__ = [
    "CHANNEL_TYPES",
    "COST_CLASSES",
    "DAYS",
    "SHAPES",
    "TIERS",
    "TRUST_ORDER",
    "CostClass",
    "Day",
    "Kind",
    "RuleViolations",
    "RuntimeMode",
    "Tier",
    "Trust",
    "cost_rank",
    "one_or_many",
    "raise_violations",
    "tier_rank",
    "trust_rank",
]

# ---------------------------------------------------------------------------------------
# Vocabularies and their orderings

Kind = Literal["model", "persona", "human", "router"]
Tier = Literal["small", "medium", "large", "reasoning"]
CostClass = Literal["free", "cheap", "standard", "premium"]
Trust = Literal["human", "trusted", "sandboxed", "untrusted"]
RuntimeMode = Literal["gateway", "sdk", "demo", "external", "human"]
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

#: Model strength, weakest first: ``tier_rank("small") < tier_rank("reasoning")``.
TIERS: tuple[Tier, ...] = ("small", "medium", "large", "reasoning")
#: Trust classes, most trusted first (human > trusted > sandboxed > untrusted).
TRUST_ORDER: tuple[Trust, ...] = ("human", "trusted", "sandboxed", "untrusted")
#: Cost classes, cheapest first.
COST_CLASSES: tuple[CostClass, ...] = ("free", "cheap", "standard", "premium")
#: The availability shapes a card may compose.
SHAPES: tuple[str, ...] = ("always", "quota", "budget", "on_demand", "gpu", "hours")
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CHANNEL_TYPES: tuple[str, ...] = ("matrix", "webhook")


def tier_rank(tier: str) -> int:
    """Position of ``tier`` in :data:`TIERS` (small=0 … reasoning=3); higher is stronger."""
    try:
        return TIERS.index(tier)
    except ValueError:
        raise InvalidInput(f"unknown tier {tier!r}", hint="one of: " + ", ".join(TIERS)) from None


def trust_rank(trust: str) -> int:
    """Rank of a trust class: untrusted=0 … human=3 (higher is more trusted)."""
    try:
        return len(TRUST_ORDER) - 1 - TRUST_ORDER.index(trust)
    except ValueError:
        raise InvalidInput(
            f"unknown trust class {trust!r}", hint="one of: " + ", ".join(TRUST_ORDER)
        ) from None


def cost_rank(cost_class: str) -> int:
    """Position of a cost class in :data:`COST_CLASSES` (free=0 … premium=3)."""
    try:
        return COST_CLASSES.index(cost_class)
    except ValueError:
        raise InvalidInput(
            f"unknown cost class {cost_class!r}", hint="one of: " + ", ".join(COST_CLASSES)
        ) from None


# ---------------------------------------------------------------------------------------
# A model validator's findings


class RuleViolations(ValueError):
    """Several rule violations found by one model validator, each at its own field path."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


def raise_violations(problems: list[tuple[str, str]]) -> None:
    """Raise :class:`RuleViolations` if a model validator found any ``(field, message)``."""
    if problems:
        raise RuleViolations(problems)


def one_or_many(value: object) -> object:
    """A single string given where a list is expected, as a one-item list."""
    return [value] if isinstance(value, str) else value
