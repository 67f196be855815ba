"""The card schema: availability shapes, runtime, backbone, humans, GPU residency, the
card itself, and golden sets.

Rules within one card are checked here (a ``kind: human`` card has ``trust: human``);
rules that span cards are :mod:`fabric.cards.checks`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

from pydantic import BeforeValidator, Field, model_validator

from fabric.cards.fields import (
    DAYS,
    HHMM,
    TIERS,
    Capability,
    CostClass,
    Day,
    Domain,
    Duration,
    EnvName,
    Kind,
    RelPath,
    RuntimeMode,
    Slug,
    StrictModel,
    Text,
    Tier,
    TimeZoneName,
    Trust,
    Url,
    Username,
    one_or_many,
    raise_violations,
    tier_rank,
)
from fabric.durations import parse_duration

__all__ = [
    "AlwaysSpec",
    "AvailabilitySpec",
    "Backbone",
    "BackboneConstraints",
    "BudgetSpec",
    "Card",
    "Channel",
    "GoldenCase",
    "GoldenExpect",
    "GoldenSet",
    "GpuResidency",
    "GpuSpec",
    "HoursSpec",
    "HumanSpec",
    "MatrixChannel",
    "MemorySpec",
    "OnDemandSpec",
    "QuotaSpec",
    "RuntimeSpec",
    "WebhookChannel",
    "satisfies",
]

# Room ids of room versions before 12 end in ":server"; version 12's do not (MSC4291).
_MATRIX_ROOM = re.compile(r"^![^:\s]+(:[^\s]+)?$")
_MATRIX_USER = re.compile(r"^@[^:\s]+:[^\s]+$")
#: ``(field path, message)`` pairs a model validator found.
_Violations = list[tuple[str, str]]

# ---------------------------------------------------------------------------------------
# Availability a(t): composable shapes; every shape must allow for a(t) > 0


class AlwaysSpec(StrictModel):
    """Always available (a(t) = 1)."""

    shape: Literal["always"] = "always"


class QuotaSpec(StrictModel):
    """``limit`` messages per rolling ``window`` (optionally also ``second_limit`` per
    ``second_window``, e.g. 60 per 5h and 300 per 7d). ``reserve_interactive`` is the
    fraction of each window kept for interactive work by the budget governor.
    ``across_hosts``: workers of this model run on several hosts, so the quota is also
    kept on the board, where every host counts against one limit (docs/DESIGN.md, "One
    quota across hosts")."""

    shape: Literal["quota"] = "quota"
    limit: int = Field(gt=0)
    window: Duration
    second_limit: int | None = Field(default=None, gt=0)
    second_window: Duration | None = None
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)
    across_hosts: bool = False

    @model_validator(mode="after")
    def _pairs(self) -> QuotaSpec:
        if (self.second_limit is None) != (self.second_window is None):
            missing = "second_window" if self.second_window is None else "second_limit"
            raise_violations([(missing, "second_limit and second_window go together")])
        return self

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window)

    @property
    def second_window_seconds(self) -> float | None:
        return None if self.second_window is None else parse_duration(self.second_window)


class BudgetSpec(StrictModel):
    """At most ``usd`` dollars per ``period``; the tail ``reserve_interactive`` is kept for
    interactive work."""

    shape: Literal["budget"] = "budget"
    usd: float = Field(gt=0)
    period: Duration
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)

    @property
    def period_seconds(self) -> float:
        return parse_duration(self.period)


class OnDemandSpec(StrictModel):
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


class GpuSpec(StrictModel):
    """A local GPU model: available while ``vram_mb`` + ``headroom_mb`` fit in free VRAM as
    reported by ``probe_command`` (megabytes, one line per GPU)."""

    shape: Literal["gpu"] = "gpu"
    vram_mb: int = Field(gt=0)
    probe_command: Text = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"
    headroom_mb: int = Field(default=256, ge=0)


class HoursSpec(StrictModel):
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
        raise_violations(problems)
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


class RuntimeSpec(StrictModel):
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


class BackboneConstraints(StrictModel):
    """Any model card at least this ``tier`` with all these ``capabilities``."""

    tier: Tier | None = None
    capabilities: list[Capability] = Field(default_factory=list)


class Backbone(StrictModel):
    """What a persona thinks with: one named model card, or a constraint set."""

    model: Slug | None = None
    constraints: BackboneConstraints | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Backbone:
        if (self.model is None) == (self.constraints is None):
            raise_violations([("", "give exactly one of model (a card id) or constraints")])
        return self


class MatrixChannel(StrictModel):
    type: Literal["matrix"] = "matrix"
    room: str
    homeserver: Url
    token_env: EnvName  # the bot's access token (the fabric posts and reads as the bot)
    # The person's own Matrix id: a reply in the room counts as theirs only from it.
    user: str | None = None

    @model_validator(mode="after")
    def _room(self) -> MatrixChannel:
        if not _MATRIX_ROOM.match(self.room):
            raise_violations([("room", "must be a room id like '!abcdef:example.org'")])
        if self.user is not None and not _MATRIX_USER.match(self.user):
            raise_violations([("user", "must be a Matrix user id like '@alvis:example.org'")])
        return self


class WebhookChannel(StrictModel):
    type: Literal["webhook"] = "webhook"
    url: Url
    token_env: EnvName | None = None


Channel = Annotated[MatrixChannel | WebhookChannel, Field(discriminator="type")]


class HumanSpec(StrictModel):
    """The person behind a ``kind: human`` card and how to reach them for urgent work."""

    username: Username
    display_name: Text
    email: str = ""
    channels: list[Channel] = Field(default_factory=list)
    # Kanboard usernames who may approve or answer in this person's place on the board.
    deputies: list[Username] = Field(default_factory=list)

    @model_validator(mode="after")
    def _email(self) -> HumanSpec:
        if self.email and not re.match(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", self.email):
            raise_violations([("email", "is not an email address")])
        return self


class GpuResidency(StrictModel):
    """Residency of a local GPU model: its footprint, whether it may never be evicted,
    and the group of models allowed to share the GPU with it."""

    vram_mb: int = Field(gt=0)
    never_evict: bool = False
    co_residency_group: Slug | None = None


class MemorySpec(StrictModel):
    """What becomes of the agent's results: each done task's result is retained into the
    Hindsight bank of ``retain`` that is of the task's own privacy domain (one bank per
    domain; a task of no listed bank's domain is not retained), by the keeper, once
    (docs/HINDSIGHT.md). ``consolidate``: then ask Hindsight's own consolidation.

    Which domain a bank is of, and whether the card may write it, is decided with the
    owner rules of ``cards/_policy.yaml`` once the cards are loaded
    (:func:`fabric.memorybanks.memory_problems`: the bank refs are read there too)."""

    retain: Annotated[list[Text], BeforeValidator(one_or_many)] = Field(min_length=1)
    consolidate: bool = False

    @model_validator(mode="after")
    def _banks(self) -> MemorySpec:
        raise_violations(_duplicates("retain", self.retain))
        return self


# ---------------------------------------------------------------------------------------
# The card


def _always() -> list[AvailabilitySpec]:
    return [AlwaysSpec()]


class Card(StrictModel):
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
    memory: MemorySpec | None = None

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
        raise_violations(
            [
                *_human_rules(self),
                *_kind_rules(self),
                *_privacy_rules(self),
                *_duplicates("capabilities", self.capabilities),
                *_duplicates("privacy_domains", self.privacy_domains),
                *_gpu_shape_rules(self),
                *_memory_rules(self),
            ]
        )
        return self


def _human_rules(card: Card) -> _Violations:
    """A person and only a person has kind, trust and runtime mode ``human`` and a human block."""
    p: _Violations = []
    human = card.kind == "human"
    if human and card.trust != "human":
        p.append(("trust", "a kind: human card must have trust: human"))
    if not human and card.trust == "human":
        p.append(("trust", "trust: human is only for kind: human cards"))
    if human and card.runtime.mode != "human":
        p.append(("runtime.mode", "a kind: human card must have runtime mode: human"))
    if not human and card.runtime.mode == "human":
        p.append(("runtime.mode", "mode: human is only for kind: human cards"))
    if human and card.human is None:
        p.append(("human", "required for kind: human (username, display_name, channels)"))
    if not human and card.human is not None:
        p.append(("human", "only kind: human cards have a human block"))
    return p


def _kind_rules(card: Card) -> _Violations:
    """The fields only some kinds have, or must have."""
    p: _Violations = []
    if card.kind == "model":
        if card.tier is None:
            p.append(("tier", "required for kind: model (one of " + ", ".join(TIERS) + ")"))
        if card.runtime.model is None and card.runtime.mode != "demo":
            p.append(("runtime.model", "required for a model card unless mode is demo"))
    if card.runtime.mode in ("gateway", "sdk") and card.runtime.model is None and card.backbone is None:
        # A persona's backbone names its model; everything else that calls one must.
        p.append(("runtime.model", f"required for mode {card.runtime.mode} (a LiteLLM model name)"))
    if card.backbone is not None and card.kind not in ("persona", "router"):
        p.append(("backbone", "only persona and router cards have a backbone"))
    if card.persona is not None and card.kind not in ("persona", "router"):
        p.append(("persona", "only persona and router cards have a soul file"))
    if card.gpu is not None and card.kind != "model":
        p.append(("gpu", "only kind: model cards have GPU residency"))
    return p


def _privacy_rules(card: Card) -> _Violations:
    """A sandboxed or untrusted agent sees only shared domains."""
    return [
        (
            f"privacy_domains.{i}",
            f"a {card.trust} agent may not read {domain}; it sees only shared domains",
        )
        for i, domain in enumerate(card.privacy_domains)
        if domain.startswith("private:") and card.trust in ("sandboxed", "untrusted")
    ]


def _memory_rules(card: Card) -> _Violations:
    """The output of untrusted work never becomes memory (it would lose its taint)."""
    if card.memory is not None and card.trust == "untrusted":
        return [("memory", f"a {card.trust} agent's results are never retained (taint.retain)")]
    return []


def _gpu_shape_rules(card: Card) -> _Violations:
    """A ``gpu`` availability shape and the card's GPU residency agree on the VRAM."""
    gpu = card.gpu
    return [
        (f"availability.{i}.vram_mb", f"{spec.vram_mb} differs from gpu.vram_mb {gpu.vram_mb}")
        for i, spec in enumerate(card.availability)
        if isinstance(spec, GpuSpec) and gpu and spec.vram_mb != gpu.vram_mb
    ]


def satisfies(card: Card, tier: str | None, capabilities: Iterable[str]) -> bool:
    """Whether ``card`` is at least ``tier`` and has every capability."""
    if tier is not None and (card.tier is None or tier_rank(card.tier) < tier_rank(tier)):
        return False
    return set(capabilities) <= set(card.capabilities)


def _duplicates(field: str, values: Sequence[str]) -> _Violations:
    seen: set[str] = set()
    out: _Violations = []
    for i, value in enumerate(values):
        if value in seen:
            out.append((f"{field}.{i}", f"{value!r} is listed twice"))
        seen.add(value)
    return out


# ---------------------------------------------------------------------------------------
# Golden sets: canonical exchanges replayed before a backbone or routing change


class GoldenExpect(StrictModel):
    """How an answer is judged: it ``contains`` all these strings (case-insensitive), is
    ``exact``ly this text (whitespace-trimmed), matches the ``regex``, or a ``judge`` model
    given this rubric answers PASS (``agap eval``; see fabric/deploy/evalgate.py)."""

    contains: Annotated[list[Text] | None, BeforeValidator(one_or_many)] = None
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
            raise_violations([("", f"give exactly one of {kinds}")])
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise_violations([("regex", f"is not a valid regular expression: {exc}")])
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


class GoldenCase(StrictModel):
    name: str = ""
    input: Text
    expect: GoldenExpect


class GoldenSet(StrictModel):
    agent: Slug
    cases: list[GoldenCase] = Field(min_length=1)
