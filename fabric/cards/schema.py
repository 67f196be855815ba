"""The card schema as every process reads it: availability shapes, runtime, backbone,
humans, GPU residency, the card itself, and golden sets.

Frozen dataclasses, made without compiling code (:class:`fabric.plain.Plain`). A card file
is checked by :mod:`fabric.cards.models` (pydantic: unknown keys, types, bounds, the rules
within one card) and read as these classes; a process that starts from the checked
snapshot (:mod:`fabric.cardcache`) builds them directly and never imports pydantic, which
would cost a short-lived ``agap claim`` more than all its other work. The two are kept
field for field alike by ``tests/unit/test_card_models.py``. Build a variant with
:func:`dataclasses.replace`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import field
from datetime import datetime, timedelta
from typing import Literal

from fabric.cards.fields import DAYS, CostClass, Day, Kind, RuntimeMode, Tier, Trust, tier_rank
from fabric.durations import parse_duration
from fabric.plain import Plain

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

# ---------------------------------------------------------------------------------------
# Availability a(t): composable shapes; every shape must allow for a(t) > 0


class AlwaysSpec(Plain, kw_only=True):
    """Always available (a(t) = 1)."""

    shape: Literal["always"] = "always"


class QuotaSpec(Plain, kw_only=True):
    """``limit`` messages per rolling ``window`` (optionally also ``second_limit`` per
    ``second_window``, e.g. 60 per 5h and 300 per 7d). ``reserve_interactive`` is the
    fraction of each window kept for interactive work by the budget governor.
    ``across_hosts``: workers of this model run on several hosts, so the quota is also
    kept on the board, where every host counts against one limit (docs/DESIGN.md, "One
    quota across hosts")."""

    shape: Literal["quota"] = "quota"
    limit: int
    window: str
    second_limit: int | None = None
    second_window: str | None = None
    reserve_interactive: float = 0.0
    across_hosts: bool = False

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window)

    @property
    def second_window_seconds(self) -> float | None:
        return None if self.second_window is None else parse_duration(self.second_window)


class BudgetSpec(Plain, kw_only=True):
    """At most ``usd`` dollars per ``period``; the tail ``reserve_interactive`` is kept for
    interactive work."""

    shape: Literal["budget"] = "budget"
    usd: float
    period: str
    reserve_interactive: float = 0.0

    @property
    def period_seconds(self) -> float:
        return parse_duration(self.period)


class OnDemandSpec(Plain, kw_only=True):
    """A node that sleeps: available when ``health_url`` answers; woken by ``wake_command``
    (run locally) or ``wake_url`` (an HTTP POST)."""

    shape: Literal["on_demand"] = "on_demand"
    health_url: str
    wake_command: str | None = None
    wake_url: str | None = None
    probe_timeout: str = "3s"
    wake_timeout: str = "120s"

    @property
    def probe_timeout_seconds(self) -> float:
        return parse_duration(self.probe_timeout)

    @property
    def wake_timeout_seconds(self) -> float:
        return parse_duration(self.wake_timeout)


class GpuSpec(Plain, kw_only=True):
    """A local GPU model: available while ``vram_mb`` + ``headroom_mb`` fit in free VRAM as
    reported by ``probe_command`` (megabytes, one line per GPU)."""

    shape: Literal["gpu"] = "gpu"
    vram_mb: int
    probe_command: str = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"
    headroom_mb: int = 256


class HoursSpec(Plain, kw_only=True):
    """Waking hours in a time zone. ``end`` before ``start`` spans midnight. ``vacation``
    makes a(t) = 0 until it is switched off again."""

    shape: Literal["hours"] = "hours"
    timezone: str
    start: str
    end: str
    days: list[Day] = field(default_factory=lambda: list(DAYS))
    vacation: bool = False

    def is_open(self, at: datetime) -> bool:
        """Whether ``at`` (an aware datetime) falls inside these hours."""
        if self.vacation:
            return False
        # Here, not at the top: a worker whose cards have no hours never needs it.
        from zoneinfo import ZoneInfo

        local = at.astimezone(ZoneInfo(self.timezone))
        now = local.strftime("%H:%M")
        day = DAYS[local.weekday()]
        if self.start < self.end:
            return day in self.days and self.start <= now < self.end
        if now >= self.start:
            return day in self.days
        yesterday = DAYS[(local - timedelta(days=1)).weekday()]
        return now < self.end and yesterday in self.days


AvailabilitySpec = AlwaysSpec | QuotaSpec | BudgetSpec | OnDemandSpec | GpuSpec | HoursSpec


# ---------------------------------------------------------------------------------------
# Runtime, backbone, humans, GPU residency


class RuntimeSpec(Plain, kw_only=True):
    """How the agent's work is executed.

    ``gateway``: a LiteLLM proxy over HTTP; ``sdk``: litellm in process; ``demo``: the
    offline deterministic demo model; ``external``: a persona runtime that pulls work via the
    CLI (a Claude Code loop, OpenClaw); ``human``: a person working the Kanboard UI.
    """

    mode: RuntimeMode
    model: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    concurrency: int = 1
    max_attempts: int = 3
    lease_seconds: int = 60
    poll_seconds: float = 2.0
    backoff_seconds: float = 5.0
    interactive: bool = False
    timeout_seconds: float = 120.0


class BackboneConstraints(Plain, kw_only=True):
    """Any model card at least this ``tier`` with all these ``capabilities``."""

    tier: Tier | None = None
    capabilities: list[str] = field(default_factory=list)


class Backbone(Plain, kw_only=True):
    """What a persona thinks with: one named model card, or a constraint set."""

    model: str | None = None
    constraints: BackboneConstraints | None = None


class MatrixChannel(Plain, kw_only=True):
    """A person's Matrix room: the fabric posts and reads as the bot whose access token is
    in ``token_env``; a reply counts as the person's only from ``user``."""

    type: Literal["matrix"] = "matrix"
    room: str
    homeserver: str
    token_env: str
    user: str | None = None


class WebhookChannel(Plain, kw_only=True):
    """A URL the fabric posts a person's urgent work to."""

    type: Literal["webhook"] = "webhook"
    url: str
    token_env: str | None = None


Channel = MatrixChannel | WebhookChannel


class HumanSpec(Plain, kw_only=True):
    """The person behind a ``kind: human`` card and how to reach them for urgent work.
    ``deputies``: Kanboard usernames who may approve or answer in their place."""

    username: str
    display_name: str
    email: str = ""
    channels: list[Channel] = field(default_factory=list)
    deputies: list[str] = field(default_factory=list)


class GpuResidency(Plain, kw_only=True):
    """Residency of a local GPU model: its footprint, whether it may never be evicted,
    and the group of models allowed to share the GPU with it."""

    vram_mb: int
    never_evict: bool = False
    co_residency_group: str | None = None


class MemorySpec(Plain, kw_only=True):
    """What becomes of the agent's results: each done task's result is retained into the
    Hindsight bank of ``retain`` that is of the task's own privacy domain (one bank per
    domain; a task of no listed bank's domain is not retained), by the keeper, once
    (docs/HINDSIGHT.md). ``consolidate``: then ask Hindsight's own consolidation.

    Which domain a bank is of, and whether the card may write it, is decided with the
    owner rules of ``cards/_policy.yaml`` once the cards are loaded
    (:func:`fabric.memorybanks.memory_problems`: the bank refs are read there too)."""

    retain: list[str]
    consolidate: bool = False


# ---------------------------------------------------------------------------------------
# The card


def _always() -> list[AvailabilitySpec]:
    return [AlwaysSpec()]


class Card(Plain, kw_only=True):
    """One agent. Immutable: derive variants with ``dataclasses.replace(card, ...)``."""

    id: str
    kind: Kind
    name: str
    description: str = ""
    capabilities: list[str] = field(default_factory=list)
    tier: Tier | None = None
    cost_class: CostClass = "free"
    max_cost_usd: float | None = None
    trust: Trust
    queue: str | None = None
    privacy_domains: list[str] = field(default_factory=lambda: ["shared"])
    availability: list[AvailabilitySpec] = field(default_factory=_always)
    runtime: RuntimeSpec
    persona: str | None = None
    backbone: Backbone | None = None
    human: HumanSpec | None = None
    golden: str | None = None
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


def satisfies(card: Card, tier: str | None, capabilities: Iterable[str]) -> bool:
    """Whether ``card`` is at least ``tier`` and has every capability."""
    if tier is not None and (card.tier is None or tier_rank(card.tier) < tier_rank(tier)):
        return False
    return set(capabilities) <= set(card.capabilities)


# ---------------------------------------------------------------------------------------
# Golden sets: canonical exchanges replayed before a backbone or routing change


class GoldenExpect(Plain, kw_only=True):
    """How an answer is judged: it ``contains`` all these strings (case-insensitive), is
    ``exact``ly this text (whitespace-trimmed), matches the ``regex``, or a ``judge`` model
    given this rubric answers PASS (``agap eval``; see fabric/deploy/evalgate.py)."""

    contains: list[str] | None = None
    exact: str | None = None
    regex: str | None = None
    judge: str | None = None

    def matches(self, answer: str) -> bool:
        """Whether ``answer`` passes; a ``judge`` rubric needs a model (``agap eval``)."""
        if self.judge is not None:
            raise ValueError("a judge rubric is scored by a model: use agap eval")
        if self.contains is not None:
            return all(s.lower() in answer.lower() for s in self.contains)
        if self.exact is not None:
            return answer.strip() == self.exact.strip()
        return re.search(self.regex or "", answer) is not None


class GoldenCase(Plain, kw_only=True):
    """One exchange: the ``input`` and what its answer must be."""

    name: str = ""
    input: str
    expect: GoldenExpect


class GoldenSet(Plain, kw_only=True):
    """A persona's golden set (``cards/golden/<id>.yaml``)."""

    agent: str
    cases: list[GoldenCase]
