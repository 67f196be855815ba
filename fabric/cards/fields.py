"""The cards' vocabularies, their orderings, and field types that refuse readably.

A refusal here is a :class:`ValueError` whose message becomes the card problem's text, so
it says what to write instead. :class:`StrictModel` is the base of every card model: an
unknown key is an error, not a silently ignored typo.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from fabric.durations import duration_seconds
from fabric.errors import InvalidInput

__all__ = [
    "CHANNEL_TYPES",
    "COST_CLASSES",
    "DAYS",
    "HHMM",
    "SHAPES",
    "TIERS",
    "TRUST_ORDER",
    "Capability",
    "CostClass",
    "Day",
    "Domain",
    "Duration",
    "EnvName",
    "Kind",
    "RelPath",
    "RuleViolations",
    "RuntimeMode",
    "Slug",
    "StrictModel",
    "Text",
    "Tier",
    "TimeZoneName",
    "Trust",
    "Url",
    "Username",
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
# Field types with readable refusals

_SLUG = re.compile(r"^[a-z][a-z0-9-]{1,38}$")
_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{1,38}$")
_CAPABILITY = re.compile(r"^[a-z][a-z0-9-]{0,38}$")
_DOMAIN = re.compile(r"^[a-z][a-z0-9-]{0,38}(?::[a-z][a-z0-9_.-]{0,38})?$")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_SECRET_PREFIXES = ("sk-", "sk_", "ghp_", "gho_", "github_pat_", "xox", "glpat-", "bearer ")


def _check_duration(value: object) -> object:
    if duration_seconds(value) <= 0:
        raise ValueError("must be longer than zero")
    return value


def _check_slug(value: str) -> str:
    if not _SLUG.match(value):
        raise ValueError(
            f"{value!r} must be 2-39 characters of lowercase letters, digits and '-', starting with a letter"
        )
    return value


def _check_username(value: str) -> str:
    if not _USERNAME.match(value):
        raise ValueError(
            f"{value!r} must be 2-39 characters of lowercase letters, digits, '_', '.' and '-', "
            "starting with a letter"
        )
    return value


def _check_capability(value: str) -> str:
    if not _CAPABILITY.match(value):
        raise ValueError(f"{value!r} must be lowercase letters, digits and '-' (e.g. long-context)")
    return value


def _check_domain(value: str) -> str:
    if not _DOMAIN.match(value) or (":" in value and not value.startswith("private:")):
        raise ValueError(f"{value!r} must be 'shared' or 'private:<human>' (or another plain name)")
    if value == "private":
        raise ValueError("'private' needs an owner: write 'private:<human>'")
    return value


def _looks_like_secret(value: str) -> bool:
    if value.lower().startswith(_SECRET_PREFIXES):
        return True
    if len(value) >= 32:
        return True
    letters_and_digits = set(string.ascii_letters + string.digits)
    return (
        len(value) >= 20
        and "_" not in value
        and any(c.isdigit() for c in value)
        and all(c in letters_and_digits for c in value)
    )


def _check_env_name(value: str) -> str:
    # Never echo the value: if it is a secret, the refusal must not print it again.
    if _looks_like_secret(value):
        raise ValueError(
            "this looks like a secret, not the NAME of an environment variable — put the key "
            "in the environment (or .env) and write its name here, e.g. KIMI_API_KEY"
        )
    if not _ENV_NAME.match(value):
        raise ValueError(
            "must be the NAME of an environment variable: uppercase letters, digits and '_' "
            "(e.g. KIMI_API_KEY)"
        )
    return value


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL")
    if parts.password:
        raise ValueError("must not carry a password; put credentials in an environment variable instead")
    return value


def _check_hhmm(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError('write the time in quotes as "HH:MM", e.g. "07:30"')
    if isinstance(value, str) and not _HHMM.match(value):
        raise ValueError(f'{value!r} is not a 24-hour "HH:MM" time (00:00 to 23:59)')
    return value


def _check_timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{value!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)") from None
    return value


def _check_relative_path(value: str) -> str:
    path = Path(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be a path inside the repository, e.g. souls/adolf.md")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def one_or_many(value: object) -> object:
    """A single string given where a list is expected, as a one-item list."""
    return [value] if isinstance(value, str) else value


Slug = Annotated[str, AfterValidator(_check_slug)]
Username = Annotated[str, AfterValidator(_check_username)]
Capability = Annotated[str, AfterValidator(_check_capability)]
Domain = Annotated[str, AfterValidator(_check_domain)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Url = Annotated[str, AfterValidator(_check_url)]
Duration = Annotated[str, BeforeValidator(_check_duration)]
HHMM = Annotated[str, BeforeValidator(_check_hhmm)]
TimeZoneName = Annotated[str, AfterValidator(_check_timezone)]
RelPath = Annotated[str, AfterValidator(_check_relative_path)]
Text = Annotated[str, AfterValidator(_not_blank)]


class RuleViolations(ValueError):
    """Several rule violations found by one model validator, each at its own field path."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


def raise_violations(problems: list[tuple[str, str]]) -> None:
    """Raise :class:`RuleViolations` if a model validator found any ``(field, message)``."""
    if problems:
        raise RuleViolations(problems)


class StrictModel(BaseModel):
    """Unknown keys refused, no type coercion, immutable. Validators are built on first
    use: a process that reads its cards from fabric.cardcache's snapshot never builds one."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)
