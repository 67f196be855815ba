"""Agent cards: who can receive work, how strong and how trusted it is, and when it is there.

Every agent — a model endpoint, a persona, a router, a person — is described by one YAML
file in ``cards/`` whose stem is the agent's id. Cards are code: they live in git and are
deployed, never edited live. This module parses them strictly (an unknown key is an error,
not a silently ignored typo), checks the rules that span several cards, and reports *every*
problem at once, one line each, so a broken deploy is fixed in one pass.

Files whose name starts with ``_`` or ``.``, files that are not ``*.yaml``/``*.yml``, and
anything in a subfolder (``cards/golden/``) are not cards.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from fabric.errors import InvalidInput

__all__ = [
    "COST_CLASSES",
    "SHAPES",
    "TIERS",
    "TRUST_ORDER",
    "AlwaysSpec",
    "AvailabilitySpec",
    "Backbone",
    "BackboneConstraints",
    "BudgetSpec",
    "Card",
    "CardErrors",
    "CardProblem",
    "CardSet",
    "GoldenCase",
    "GoldenExpect",
    "GoldenSet",
    "GpuDevice",
    "GpuRegistry",
    "GpuResidency",
    "GpuSpec",
    "HoursSpec",
    "HumanSpec",
    "MatrixChannel",
    "OnDemandSpec",
    "QuotaSpec",
    "RuntimeSpec",
    "WebhookChannel",
    "cost_rank",
    "load_cards",
    "load_golden",
    "parse_duration",
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
# Durations

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_DURATION_HINT = "write a number and a unit (s, m, h, d, w), e.g. 30s, 5m, 5h, 7d, 1w or 1h30m"


def _duration_seconds(text: object) -> float:
    """Seconds in ``text``; :class:`ValueError` with a readable message otherwise."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"a duration must be text like '5m' — {_DURATION_HINT}")
    if isinstance(text, int | float):
        raise ValueError(f"a duration needs a unit: write '{text}s' for seconds — {_DURATION_HINT}")
    compact = text.strip().lower().replace(" ", "")
    if not _DURATION.match(compact):
        raise ValueError(f"bad duration {text!r} — {_DURATION_HINT}")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(compact))


_BARE_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """Seconds in a duration: ``"30s"``, ``"5m"``, ``"5h"``, ``"7d"``, ``"1w"``, ``"1h30m"``.

    Raises :class:`InvalidInput` for anything else (including a bare number: the unit is
    not optional, because "300" is ambiguous to the person reading the card). Settings
    pass ``bare_seconds``: there a bare number has always meant seconds
    (``AGAP_POLL_SECONDS=2``), and the same grammar serves both.
    """
    if bare_seconds and isinstance(text, str) and _BARE_SECONDS.match(text.strip()):
        return float(text.strip())
    try:
        return _duration_seconds(text)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _check_duration(value: object) -> object:
    if _duration_seconds(value) <= 0:
        raise ValueError("must be longer than zero")
    return value


# ---------------------------------------------------------------------------------------
# Field types with readable refusals

_SLUG = re.compile(r"^[a-z][a-z0-9-]{1,38}$")
_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{1,38}$")
_CAPABILITY = re.compile(r"^[a-z][a-z0-9-]{0,38}$")
_DOMAIN = re.compile(r"^[a-z][a-z0-9-]{0,38}(?::[a-z][a-z0-9_.-]{0,38})?$")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_MATRIX_ROOM = re.compile(r"^![^:\s]+:[^\s]+$")
_SECRET_PREFIXES = ("sk-", "sk_", "ghp_", "gho_", "github_pat_", "xox", "glpat-", "bearer ")


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


def _one_or_many(value: object) -> object:
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


class _Rules(ValueError):
    """Several rule violations found by one model validator, each at its own field path."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


def _raise(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise _Rules(problems)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ---------------------------------------------------------------------------------------
# Availability a(t): composable shapes; every shape must allow for a(t) > 0


class AlwaysSpec(_Strict):
    """Always available (a(t) = 1)."""

    shape: Literal["always"] = "always"


class QuotaSpec(_Strict):
    """``limit`` messages per rolling ``window`` (optionally also ``second_limit`` per
    ``second_window``, e.g. 60 per 5h and 300 per 7d). ``reserve_interactive`` is the
    fraction of each window kept for interactive work by the budget governor."""

    shape: Literal["quota"] = "quota"
    limit: int = Field(gt=0)
    window: Duration
    second_limit: int | None = Field(default=None, gt=0)
    second_window: Duration | None = None
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _pairs(self) -> QuotaSpec:
        if (self.second_limit is None) != (self.second_window is None):
            missing = "second_window" if self.second_window is None else "second_limit"
            _raise([(missing, "second_limit and second_window go together")])
        return self

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window)

    @property
    def second_window_seconds(self) -> float | None:
        return None if self.second_window is None else parse_duration(self.second_window)


class BudgetSpec(_Strict):
    """At most ``usd`` dollars per ``period``; the tail ``reserve_interactive`` is kept for
    interactive work."""

    shape: Literal["budget"] = "budget"
    usd: float = Field(gt=0)
    period: Duration
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)

    @property
    def period_seconds(self) -> float:
        return parse_duration(self.period)


class OnDemandSpec(_Strict):
    """A node that sleeps: available when ``health_url`` answers; woken by ``wake_command``
    (run locally) or ``wake_url`` (an HTTP POST)."""

    shape: Literal["on_demand"] = "on_demand"
    health_url: Url
    wake_command: Text | None = None
    wake_url: Url | None = None
    probe_timeout: Duration = "3s"
    wake_timeout: Duration = "120s"

    @property
    def probe_timeout_seconds(self) -> float:
        return parse_duration(self.probe_timeout)

    @property
    def wake_timeout_seconds(self) -> float:
        return parse_duration(self.wake_timeout)


class GpuSpec(_Strict):
    """A local GPU model: available while ``vram_mb`` + ``headroom_mb`` fit in free VRAM as
    reported by ``probe_command`` (megabytes, one line per GPU)."""

    shape: Literal["gpu"] = "gpu"
    vram_mb: int = Field(gt=0)
    probe_command: Text = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"
    headroom_mb: int = Field(default=256, ge=0)


class HoursSpec(_Strict):
    """Waking hours in a time zone. ``end`` before ``start`` spans midnight. ``vacation``
    makes a(t) = 0 until it is switched off again."""

    shape: Literal["hours"] = "hours"
    timezone: TimeZoneName
    start: HHMM
    end: HHMM
    days: list[Day] = Field(default_factory=lambda: list(DAYS), min_length=1)
    vacation: bool = False

    @model_validator(mode="after")
    def _window(self) -> HoursSpec:
        problems: list[tuple[str, str]] = []
        if self.start == self.end:
            problems.append(("end", "equals start; for all day use {shape: always}"))
        if len(set(self.days)) != len(self.days):
            problems.append(("days", "lists a day twice"))
        _raise(problems)
        return self

    def is_open(self, at: datetime) -> bool:
        """Whether ``at`` (an aware datetime) falls inside these hours."""
        if self.vacation:
            return False
        local = at.astimezone(ZoneInfo(self.timezone))
        now = local.strftime("%H:%M")
        day = DAYS[local.weekday()]
        if self.start < self.end:
            return day in self.days and self.start <= now < self.end
        if now >= self.start:
            return day in self.days
        yesterday = DAYS[(local - timedelta(days=1)).weekday()]
        return now < self.end and yesterday in self.days


AvailabilitySpec = Annotated[
    AlwaysSpec | QuotaSpec | BudgetSpec | OnDemandSpec | GpuSpec | HoursSpec,
    Field(discriminator="shape"),
]


# ---------------------------------------------------------------------------------------
# Runtime, backbone, humans, GPU residency


class RuntimeSpec(_Strict):
    """How the agent's work is executed.

    ``gateway``: a LiteLLM proxy over HTTP; ``sdk``: litellm in process; ``demo``: the
    offline deterministic demo model; ``external``: a persona runtime that pulls work via the
    CLI (a Claude Code loop, OpenClaw); ``human``: a person working the Kanboard UI.
    """

    mode: RuntimeMode
    model: Text | None = None
    api_base: Url | None = None
    api_key_env: EnvName | None = None
    concurrency: int = Field(default=1, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    lease_seconds: int = Field(default=60, ge=5)
    poll_seconds: float = Field(default=2.0, gt=0)
    backoff_seconds: float = Field(default=5.0, ge=0)
    interactive: bool = False
    timeout_seconds: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _model_needed(self) -> RuntimeSpec:
        if self.mode in ("gateway", "sdk") and self.model is None:
            _raise([("model", f"required for mode {self.mode} (a LiteLLM model name)")])
        return self


class BackboneConstraints(_Strict):
    """Any model card at least this ``tier`` with all these ``capabilities``."""

    tier: Tier | None = None
    capabilities: list[Capability] = Field(default_factory=list)


class Backbone(_Strict):
    """What a persona thinks with: one named model card, or a constraint set."""

    model: Slug | None = None
    constraints: BackboneConstraints | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Backbone:
        if (self.model is None) == (self.constraints is None):
            _raise([("", "give exactly one of model (a card id) or constraints")])
        return self


class MatrixChannel(_Strict):
    type: Literal["matrix"] = "matrix"
    room: str
    homeserver: Url
    token_env: EnvName

    @model_validator(mode="after")
    def _room(self) -> MatrixChannel:
        if not _MATRIX_ROOM.match(self.room):
            _raise([("room", "must be a room id like '!abcdef:example.org'")])
        return self


class WebhookChannel(_Strict):
    type: Literal["webhook"] = "webhook"
    url: Url
    token_env: EnvName | None = None


Channel = Annotated[MatrixChannel | WebhookChannel, Field(discriminator="type")]


class HumanSpec(_Strict):
    """The person behind a ``kind: human`` card and how to reach them for urgent work."""

    username: Username
    display_name: Text
    email: str = ""
    channels: list[Channel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _email(self) -> HumanSpec:
        if self.email and not re.match(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", self.email):
            _raise([("email", "is not an email address")])
        return self


class GpuResidency(_Strict):
    """Residency of a local GPU model: its footprint, whether it may never be evicted,
    and the group of models allowed to share the GPU with it."""

    vram_mb: int = Field(gt=0)
    never_evict: bool = False
    co_residency_group: Slug | None = None


# ---------------------------------------------------------------------------------------
# The card


def _always() -> list[AvailabilitySpec]:
    return [AlwaysSpec()]


class Card(_Strict):
    """One agent. Immutable: derive variants with ``card.model_copy(update=...)``."""

    id: Slug
    kind: Kind
    name: Text
    description: str = ""
    capabilities: list[Capability] = Field(default_factory=list)
    tier: Tier | None = None
    cost_class: CostClass = "free"
    max_cost_usd: float | None = Field(default=None, gt=0)
    trust: Trust
    queue: Slug | None = None
    privacy_domains: list[Domain] = Field(default_factory=lambda: ["shared"])
    availability: list[AvailabilitySpec] = Field(default_factory=_always, min_length=1)
    runtime: RuntimeSpec
    persona: RelPath | None = None
    backbone: Backbone | None = None
    human: HumanSpec | None = None
    golden: RelPath | None = None
    gpu: GpuResidency | None = None

    @property
    def queue_name(self) -> str:
        """The queue (Kanboard swimlane) this agent drains: ``queue`` or else ``id``."""
        return self.queue or self.id

    @property
    def is_human(self) -> bool:
        return self.kind == "human"

    @property
    def shapes(self) -> list[str]:
        """The availability shapes, in card order."""
        return [spec.shape for spec in self.availability]

    @model_validator(mode="after")
    def _rules(self) -> Card:
        p: list[tuple[str, str]] = []
        human = self.kind == "human"
        if human and self.trust != "human":
            p.append(("trust", "a kind: human card must have trust: human"))
        if not human and self.trust == "human":
            p.append(("trust", "trust: human is only for kind: human cards"))
        if human and self.runtime.mode != "human":
            p.append(("runtime.mode", "a kind: human card must have runtime mode: human"))
        if not human and self.runtime.mode == "human":
            p.append(("runtime.mode", "mode: human is only for kind: human cards"))
        if human and self.human is None:
            p.append(("human", "required for kind: human (username, display_name, channels)"))
        if not human and self.human is not None:
            p.append(("human", "only kind: human cards have a human block"))
        if self.kind == "model":
            if self.tier is None:
                p.append(("tier", "required for kind: model (one of " + ", ".join(TIERS) + ")"))
            if self.runtime.model is None and self.runtime.mode != "demo":
                p.append(("runtime.model", "required for a model card unless mode is demo"))
        if self.backbone is not None and self.kind not in ("persona", "router"):
            p.append(("backbone", "only persona and router cards have a backbone"))
        if self.persona is not None and self.kind not in ("persona", "router"):
            p.append(("persona", "only persona and router cards have a soul file"))
        if self.gpu is not None and self.kind != "model":
            p.append(("gpu", "only kind: model cards have GPU residency"))
        for i, domain in enumerate(self.privacy_domains):
            if domain.startswith("private:") and self.trust in ("sandboxed", "untrusted"):
                p.append(
                    (
                        f"privacy_domains.{i}",
                        f"a {self.trust} agent may not read {domain}; it sees only shared domains",
                    )
                )
        p.extend(_duplicates("capabilities", self.capabilities))
        p.extend(_duplicates("privacy_domains", self.privacy_domains))
        for i, spec in enumerate(self.availability):
            if isinstance(spec, GpuSpec) and self.gpu and spec.vram_mb != self.gpu.vram_mb:
                p.append(
                    (
                        f"availability.{i}.vram_mb",
                        f"{spec.vram_mb} differs from gpu.vram_mb {self.gpu.vram_mb}",
                    )
                )
        _raise(p)
        return self


def _satisfies(card: Card, tier: str | None, capabilities: Iterable[str]) -> bool:
    """Whether ``card`` is at least ``tier`` and has every capability."""
    if tier is not None and (card.tier is None or tier_rank(card.tier) < tier_rank(tier)):
        return False
    return set(capabilities) <= set(card.capabilities)


def _duplicates(field: str, values: Sequence[str]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for i, value in enumerate(values):
        if value in seen:
            out.append((f"{field}.{i}", f"{value!r} is listed twice"))
        seen.add(value)
    return out


# ---------------------------------------------------------------------------------------
# Golden sets: canonical exchanges replayed before a backbone or routing change


class GoldenExpect(_Strict):
    """How an answer is judged: it ``contains`` all these strings (case-insensitive), is
    ``exact``ly this text (whitespace-trimmed), matches the ``regex``, or a ``judge`` model
    given this rubric answers PASS (``agap eval``; see fabric/deploy/evalgate.py)."""

    contains: Annotated[list[Text] | None, BeforeValidator(_one_or_many)] = None
    exact: str | None = None
    regex: str | None = None
    judge: Text | None = None

    @model_validator(mode="after")
    def _one(self) -> GoldenExpect:
        given = [k for k in ("contains", "exact", "regex", "judge") if getattr(self, k) is not None]
        if len(given) != 1:
            kinds = (
                "contains, exact, regex or judge" if self.judge is not None else "contains, exact or regex"
            )
            _raise([("", f"give exactly one of {kinds}")])
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                _raise([("regex", f"is not a valid regular expression: {exc}")])
        return self

    def matches(self, answer: str) -> bool:
        """Whether ``answer`` passes; a ``judge`` rubric needs a model (``agap eval``)."""
        if self.judge is not None:
            raise ValueError("a judge rubric is scored by a model: use agap eval")
        if self.contains is not None:
            return all(s.lower() in answer.lower() for s in self.contains)
        if self.exact is not None:
            return answer.strip() == self.exact.strip()
        return re.search(self.regex or "", answer) is not None


class GoldenCase(_Strict):
    name: str = ""
    input: Text
    expect: GoldenExpect


class GoldenSet(_Strict):
    agent: Slug
    cases: list[GoldenCase] = Field(min_length=1)


# ---------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class CardProblem:
    """One thing wrong with one card file; ``field`` is a dotted path (``availability.0.limit``)
    or empty for the file as a whole; ``line`` is set for YAML syntax errors."""

    file: str
    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class CardErrors(InvalidInput):
    """The cards do not load; :attr:`problems` lists every problem found, one per line."""

    def __init__(self, problems: Sequence[CardProblem], *, where: str = "", hint: str = "") -> None:
        self.problems = list(problems)
        n = len(self.problems)
        what = f"{n} problem{'s' if n != 1 else ''} in agent cards"
        super().__init__(what, where=where, hint=hint)

    def line(self) -> str:
        if len(self.problems) == 1 and not self.hint:
            return str(self.problems[0])
        return "\n".join([super().line(), *(str(p) for p in self.problems)])


# ---------------------------------------------------------------------------------------
# YAML: YAML 1.2-ish scalars (no sexagesimal 22:30 -> 1350, no yes/no/on/off booleans)
# and duplicate keys refused


class _CardLoader(yaml.SafeLoader):
    pass


_CardLoader.yaml_implicit_resolvers = {
    key: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CardLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_CardLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)
_CardLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _DuplicateKey(yaml.MarkedYAMLError):
    pass


def _construct_mapping(loader: _CardLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise _DuplicateKey(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_CardLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _read_yaml(path: Path, shown: str) -> tuple[Any, list[CardProblem]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [CardProblem(shown, "", f"cannot read: {exc}")]
    try:
        return yaml.load(text, Loader=_CardLoader), []  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = f" (column {mark.column + 1})" if mark is not None else ""
        what = exc.problem or exc.context or "unreadable"
        return None, [CardProblem(shown, "", f"YAML error{col}: {what}", line=line)]
    except yaml.YAMLError as exc:
        return None, [CardProblem(shown, "", f"YAML error: {exc}")]


# ---------------------------------------------------------------------------------------
# Validation errors -> one readable line each

_TAGS = frozenset(SHAPES) | frozenset(CHANNEL_TYPES)
_ALL_FIELDS = sorted(
    {
        name
        for model in (
            Card,
            RuntimeSpec,
            QuotaSpec,
            BudgetSpec,
            OnDemandSpec,
            GpuSpec,
            HoursSpec,
            Backbone,
            BackboneConstraints,
            HumanSpec,
            MatrixChannel,
            WebhookChannel,
            GpuResidency,
            GoldenSet,
            GoldenCase,
            GoldenExpect,
        )
        for name in model.model_fields
    }
)
_TAG_CHOICES = {"shape": SHAPES, "type": CHANNEL_TYPES}


def _clean_loc(loc: Sequence[int | str]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(loc):
        # A discriminated union puts the tag in the path (availability.0.quota.limit).
        if isinstance(part, str) and part in _TAGS and i > 0 and isinstance(loc[i - 1], int):
            continue
        out.append(str(part))
    return out


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _message(err: Any) -> str:
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    simple = {
        "missing": "required",
        "string_type": "must be text",
        "int_type": "must be a whole number",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "list_type": "must be a list",
        "model_type": "must be a mapping (key: value)",
        "dict_type": "must be a mapping (key: value)",
        "model_attributes_type": "must be a mapping (key: value)",
    }
    if kind in simple:
        return simple[kind]
    if kind == "greater_than":
        return f"must be greater than {_num(ctx['gt'])}"
    if kind == "greater_than_equal":
        return f"must be at least {_num(ctx['ge'])}"
    if kind == "less_than":
        return f"must be less than {_num(ctx['lt'])}"
    if kind == "less_than_equal":
        return f"must be at most {_num(ctx['le'])}"
    if kind == "too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else err["msg"]
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {err['input']!r})"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        disc = str(ctx.get("discriminator", "")).strip("'")
        choices = ", ".join(_TAG_CHOICES.get(disc, ()))
        if kind == "union_tag_invalid":
            return f"unknown {disc} {ctx.get('tag')!r} (one of: {choices})"
        return f"needs a {disc!r} (one of: {choices})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    msg: str = err["msg"]
    return msg[:1].lower() + msg[1:]


def _problems(shown: str, exc: ValidationError) -> list[CardProblem]:
    out: list[CardProblem] = []
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        error = (err.get("ctx") or {}).get("error")
        if err["type"] == "value_error" and isinstance(error, _Rules):
            for sub, message in error.problems:
                path = [*loc, *sub.split(".")] if sub else loc
                out.append(CardProblem(shown, ".".join(path), message))
            continue
        if err["type"] == "extra_forbidden":
            unknown = loc[-1] if loc else ""
            close = difflib.get_close_matches(unknown, _ALL_FIELDS, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(CardProblem(shown, ".".join(loc), f"unknown field{hint}"))
            continue
        out.append(CardProblem(shown, ".".join(loc), _message(err)))
    return out


# ---------------------------------------------------------------------------------------
# The set of cards


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
        self.cards: dict[str, Card] = by_id
        self.base_dir = base_dir
        self.directory = directory
        self._queues: dict[str, Card] = {}
        for card in by_id.values():
            if card.queue_name in self._queues:
                raise InvalidInput(f"queue {card.queue_name!r} is drained by two cards")
            self._queues[card.queue_name] = card

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
        return [c for c in self if (kind is None or c.kind == kind) and _satisfies(c, tier, needed)]

    def persona_path(self, agent_id: str) -> Path | None:
        """Absolute path of the agent's soul file, or None if it has none."""
        card = self.get(agent_id)
        if card.persona is None:
            return None
        return (self.base_dir or Path.cwd()) / card.persona


# ---------------------------------------------------------------------------------------
# Loading


def _shown(path: Path, base_dir: Path) -> str:
    for root in (base_dir, Path.cwd()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def _card_files(directory: Path) -> list[Path]:
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix in (".yaml", ".yml") and not p.name.startswith(("_", "."))
    )


def load_cards(directory: str | Path = "cards", *, base_dir: Path | None = None) -> CardSet:
    """Load and check every card in ``directory``.

    ``base_dir`` is what ``persona`` and ``golden`` paths are relative to (the repository
    root); it defaults to the parent of ``directory``. Raises :class:`CardErrors` listing
    every problem found, across all files.
    """
    directory = Path(directory)
    base = Path(base_dir) if base_dir is not None else directory.resolve().parent
    shown_dir = directory.as_posix()
    if not directory.is_dir():
        what = "no such directory" if not directory.exists() else "not a directory"
        raise CardErrors(
            [
                CardProblem(
                    shown_dir,
                    "",
                    f"{what} (run from the repository root, or pass --dir / set "
                    "AGAP_CARDS_DIR to the folder holding the agent cards)",
                )
            ]
        )
    files = _card_files(directory)
    if not files:
        raise CardErrors(
            [
                CardProblem(
                    shown_dir,
                    "",
                    "no agent cards here (expected one <id>.yaml per agent; files starting "
                    "with '_' and subfolders are skipped)",
                )
            ]
        )

    problems: list[CardProblem] = []
    loaded: list[tuple[str, Card]] = []
    broken: set[str] = set()  # stems of files that did not load
    for path in files:
        shown = _shown(path, base)
        broken.add(path.stem)
        data, found = _read_yaml(path, shown)
        if found:
            problems.extend(found)
            continue
        if data is None:
            problems.append(CardProblem(shown, "", "empty file"))
            continue
        if not isinstance(data, dict):
            problems.append(CardProblem(shown, "", "a card must be a YAML mapping of key: value"))
            continue
        try:
            card = Card.model_validate(data)
        except ValidationError as exc:
            problems.extend(_problems(shown, exc))
            continue
        if card.id != path.stem:
            problems.append(CardProblem(shown, "id", f"{card.id!r} must equal the file name {path.stem!r}"))
            continue
        loaded.append((shown, card))
        broken.discard(path.stem)

    problems.extend(_cross_card_problems(loaded, base, broken))
    if not broken:
        problems.extend(_gpu_problems(loaded, directory, base))
    if problems:
        raise CardErrors(problems, where=shown_dir, hint="fix them and run `agap cards validate`")
    return CardSet((c for _, c in loaded), base_dir=base, directory=directory)


def _cross_card_problems(loaded: list[tuple[str, Card]], base: Path, broken: set[str]) -> list[CardProblem]:
    """Rules that span cards. A reference that may point into a file that did not load
    (``broken``) is not reported: the fix for that file comes first."""
    problems: list[CardProblem] = []
    first_id: dict[str, str] = {}
    first_queue: dict[str, str] = {}
    first_user: dict[str, str] = {}
    cards = {c.id: c for _, c in loaded}
    human_names: dict[str, str] = {}  # id or username -> card id
    for _, card in loaded:
        if card.human is not None:
            human_names.setdefault(card.id, card.id)
            human_names.setdefault(card.human.username, card.id)

    for shown, card in loaded:
        if card.id in first_id:
            problems.append(CardProblem(shown, "id", f"{card.id!r} is also the id in {first_id[card.id]}"))
        first_id.setdefault(card.id, shown)
        if card.queue_name in first_queue:
            problems.append(
                CardProblem(
                    shown,
                    "queue",
                    f"queue {card.queue_name!r} is already drained by "
                    f"{first_queue[card.queue_name]} (one card per queue)",
                )
            )
        first_queue.setdefault(card.queue_name, shown)
        if card.human is not None:
            user = card.human.username
            if user in first_user:
                problems.append(
                    CardProblem(shown, "human.username", f"{user!r} is also used by {first_user[user]}")
                )
            first_user.setdefault(user, shown)

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

        if card.backbone is not None:
            problems.extend(_backbone_problems(shown, card, cards, broken))
        if card.persona is not None and not (base / card.persona).is_file():
            problems.append(CardProblem(shown, "persona", f"{card.persona} does not exist (under {base})"))
        if card.golden is not None:
            problems.extend(_golden_problems(shown, card, base))
    return problems


# ---------------------------------------------------------------------------------------
# GPU residency across cards: cards/_gpu.yaml names the GPUs and their VRAM

GPU_REGISTRY = "_gpu.yaml"


class GpuDevice(_Strict):
    """One GPU local models run on: its VRAM, and what the driver and display keep."""

    name: Slug
    vram_mb: int = Field(gt=0)
    reserved_mb: int = Field(default=0, ge=0)

    @property
    def usable_mb(self) -> int:
        return self.vram_mb - self.reserved_mb


class GpuRegistry(_Strict):
    """``cards/_gpu.yaml``: the GPUs of the house."""

    gpus: list[GpuDevice] = Field(min_length=1)


def _gpu_problems(loaded: list[tuple[str, Card]], directory: Path, base: Path) -> list[CardProblem]:
    """The residency policy must be satisfiable on the GPUs in ``cards/_gpu.yaml``:

    * a model card with a ``gpu`` availability shape declares its ``gpu`` residency (VRAM);
    * every model fits the largest GPU (its usable VRAM: ``vram_mb - reserved_mb``);
    * the never-evict set fits, and fits alongside the largest other model (else that model
      could never be loaded without evicting an interactive-critical one);
    * the never-evict set plus each co-residency group fit together;
    * a model in another co-residency group than a never-evict model could never load (the
      pre-load check refuses to evict a never-evict model of another group).

    One GPU is what the pre-load check handles (workers/availability.py): with several, the
    largest is the placement target.
    """
    residents = [(shown, c) for shown, c in loaded if c.gpu is not None]
    problems: list[CardProblem] = []
    for shown, card in loaded:
        if card.kind == "model" and "gpu" in card.shapes and card.gpu is None:
            problems.append(
                CardProblem(
                    shown,
                    "gpu",
                    "a local GPU model must declare its residency: gpu: {vram_mb: …, never_evict: …}",
                )
            )
    if not residents:
        return problems
    path = directory / GPU_REGISTRY
    shown_reg = _shown(path, base)
    if not path.is_file():
        return [
            *problems,
            CardProblem(
                shown_reg,
                "",
                "missing: cards declare GPU residency, so "
                "name the GPUs here (gpus: [{name, vram_mb, reserved_mb}])",
            ),
        ]
    data, found = _read_yaml(path, shown_reg)
    if found:
        return problems + found
    try:
        registry = GpuRegistry.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as exc:
        return problems + _problems(shown_reg, exc)
    gpu = max(registry.gpus, key=lambda g: g.usable_mb)
    room = gpu.usable_mb
    where = f"GPU {gpu.name!r} ({room} MiB usable)"

    def need(cards: Iterable[Card]) -> int:
        return sum(c.gpu.vram_mb for c in cards if c.gpu is not None)

    pinned = [c for _, c in residents if c.gpu is not None and c.gpu.never_evict]
    pinned_mb = need(pinned)
    pinned_names = ", ".join(c.id for c in pinned)
    for shown, card in residents:
        assert card.gpu is not None
        if card.gpu.vram_mb > room:
            problems.append(CardProblem(shown, "gpu.vram_mb", f"{card.gpu.vram_mb} MiB does not fit {where}"))
    if pinned and pinned_mb > room:
        problems.append(
            CardProblem(
                shown_reg, "", f"the never-evict set ({pinned_names}: {pinned_mb} MiB) does not fit {where}"
            )
        )
        return problems
    pinned_groups = {
        c.gpu.co_residency_group for c in pinned if c.gpu is not None and c.gpu.co_residency_group
    }
    for shown, card in residents:
        assert card.gpu is not None
        if card.gpu.never_evict:
            continue
        group = card.gpu.co_residency_group
        other = sorted(g for g in pinned_groups if group is not None and g != group)
        if other:
            problems.append(
                CardProblem(
                    shown,
                    "gpu.co_residency_group",
                    f"{group!r} can never load: the never-evict model(s) of "
                    f"group {', '.join(other)} may not share the GPU with it",
                )
            )
        elif pinned and card.gpu.vram_mb + pinned_mb > room:
            problems.append(
                CardProblem(
                    shown,
                    "gpu.vram_mb",
                    f"{card.gpu.vram_mb} MiB does not fit alongside the "
                    f"never-evict set ({pinned_names}: {pinned_mb} MiB) on "
                    f"{where}",
                )
            )
    groups: dict[str, list[tuple[str, Card]]] = {}
    for shown, card in residents:
        if card.gpu is not None and card.gpu.co_residency_group and not card.gpu.never_evict:
            groups.setdefault(card.gpu.co_residency_group, []).append((shown, card))
    for name, members in sorted(groups.items()):
        total = need(c for _, c in members) + pinned_mb
        if len(members) > 1 and total > room:
            ids = ", ".join(c.id for _, c in members)
            problems.append(
                CardProblem(
                    members[0][0],
                    "gpu.co_residency_group",
                    f"group {name!r} ({ids}) with the never-evict set needs {total} MiB, more than {where}",
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
    fit = [
        c
        for c in cards.values()
        if c.kind == "model" and _satisfies(c, constraints.tier, constraints.capabilities)
    ]
    if not fit and not broken:
        want = []
        if constraints.tier:
            want.append(f"tier >= {constraints.tier}")
        if constraints.capabilities:
            want.append("capabilities " + ", ".join(constraints.capabilities))
        return [
            CardProblem(
                shown,
                "backbone.constraints",
                f"no model card satisfies {' with '.join(want) or 'these constraints'}",
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
        return [CardProblem(_shown(path, base), "agent", f"{golden.agent!r} but the card is {card.id!r}")]
    return []


def load_golden(path: str | Path, *, base_dir: Path | None = None) -> GoldenSet:
    """Load a golden set (``{agent, cases: [{input, expect: {contains|exact|regex}}]}``)."""
    path = Path(path)
    shown = _shown(path, base_dir or Path.cwd())
    data, problems = _read_yaml(path, shown)
    if problems:
        raise CardErrors(problems)
    if not isinstance(data, dict):
        message = "a golden set must be a mapping with agent and cases"
        raise CardErrors([CardProblem(shown, "", message)])
    try:
        return GoldenSet.model_validate(data)
    except ValidationError as exc:
        raise CardErrors(_problems(shown, exc)) from None
