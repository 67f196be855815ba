"""Availability a(t): may this queue's worker claim work right now?

A worker asks :meth:`Availability.check` before every claim. When the answer is no, the
queue **parks**: the worker does not claim, nothing fails, and the work waits on the board
until a(t) comes back (``Verdict.until`` says when, if that is known). Each shape of a(t)
on a card is one small class, and a card's shapes compose: *every* shape must allow.

====================  =================================================================
shape (card)          class: when it says no
====================  =================================================================
``always``            :class:`AlwaysOn`: never
``quota``             :class:`~workers.quota.QuotaWindow`: N calls per rolling window are
                      spent (and an optional second, longer cap), or a provider answered 429
``budget``            :class:`~workers.quota.CostBudget`: the dollars spent in the rolling
                      period reached the budget (from the per-call cost LiteLLM reports)
``on_demand``         :class:`~workers.probes.OnDemand`: the health probe fails; a wake
                      hook is fired, at most once per ``wake_timeout``
``gpu``               :class:`~workers.probes.LocalGpu`: free VRAM is short of
                      ``vram_mb + headroom_mb``, or loading would evict a never-evict model
                      (:class:`~workers.probes.GpuResidents`)
``hours``             :class:`HumanHours`: outside waking hours, or on vacation
====================  =================================================================

This module is the model, shared by workers and the keeper (which follows people's
hours): verdicts, the shape protocol, their composition, the calendar shapes, the 429 park
every agent gets, and park states. A worker's counters are in :mod:`workers.quota` and
its probes in :mod:`workers.probes`.

Every shape is pure logic over an explicit ``now`` (unix seconds); probes (HTTP health,
wake hooks, ``nvidia-smi``) are injected callables with real defaults, so tests need no
sleeps and no network. A probe that fails is an *unavailable* verdict with a readable
reason, never an exception out of ``check``.

Provider 429s
-------------
:meth:`Availability.on_rate_limited` parks the queue until the reset the provider announced
(``Retry-After`` or a reset header, see :func:`fabric.retry_after.parse_rate_limit_headers`)
and resumes by itself after it. With no announced reset it parks for a default (60 s) that
doubles on each further 429 until a call succeeds (:meth:`Availability.record`). Every
agent gets this, not only quota cards: an :class:`Availability` without a
:class:`~workers.quota.QuotaWindow` carries its own :class:`RateLimitBackoff`.

Admission
---------
A paid call starts with :meth:`Availability.admit`, which checks and counts it in one step
in every :class:`Admitting` shape, then ends with :meth:`Availability.settle` (it ran) or
:meth:`Availability.refund` (the provider never took it). A worker's quota and budget are
its model endpoint's, shared by every caller on the host (:mod:`workers.endpoint`).

Local counters are rebuildable state
------------------------------------
Request timestamps, spend and park deadlines of the shapes that are not shared live in
this process. :meth:`Availability.
snapshot` / :meth:`Availability.restore` carry them across a worker restart (as JSON), but
they are a cache of what the provider already knows, not a ledger: losing them costs at most
one call over quota, which the provider refuses with a 429 that parks the queue again. So a
snapshot that does not parse, or was taken for a different set of shapes, is ignored and the
worker starts fresh; ``restore`` never raises.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from fabric.cards import AlwaysSpec, AvailabilitySpec, Card, HoursSpec
from fabric.plain import Plain
from fabric.retry_after import parse_rate_limit_headers

__all__ = [
    "INTERACTIVE_PRIORITY",
    "Admitting",
    "AlwaysOn",
    "Availability",
    "HumanHours",
    "ParkState",
    "ParkTracker",
    "RateLimitBackoff",
    "Shape",
    "ShapeBase",
    "ShapeOf",
    "Stateful",
    "Verdict",
    "calendar_shape",
    "finite",
    "fmt_duration",
    "fmt_time",
    "is_interactive",
    "opt_finite",
    "park_changed",
    "reason_key",
]

#: Kanboard priority from which a task counts as interactive (high=2, urgent=3).
INTERACTIVE_PRIORITY = 2


# ---------------------------------------------------------------------------------------
# Verdicts and the shape protocol


class Verdict(Plain):
    """One answer of a(t). ``until``: unix seconds when it is expected to come back (a
    lower bound — re-check then), None when unknown (re-check at the poll interval).
    ``reason`` reads ``"<kind>: <detail>"``; :func:`reason_key` gives the stable kind."""

    available: bool
    reason: str = ""
    until: float | None = None

    @classmethod
    def ok(cls, reason: str = "") -> Verdict:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str, until: float | None = None) -> Verdict:
        return cls(False, reason, until)


def reason_key(reason: str) -> str:
    """The stable head of a reason (before the first ``:``), e.g. ``"quota spent"``."""
    return reason.split(":", 1)[0].strip()


def is_interactive(runtime_interactive: bool, priority: int) -> bool:
    """Whether a task may use the interactive reserve: the card's runtime is interactive,
    or the task is high or urgent (priority >= 2)."""
    return runtime_interactive or priority >= INTERACTIVE_PRIORITY


class Shape(Protocol):
    """One shape of a(t)."""

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        """May work start at ``now``?"""
        ...

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        """A call was made (and accepted by the provider) at ``now``, costing ``cost_usd``."""
        ...

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        """The provider answered 429 at ``now``; ``retry_after`` seconds / ``reset_at`` unix
        seconds when announced."""
        ...


@runtime_checkable
class Admitting(Protocol):
    """A shape that counts a call when it lets it start (a quota slot).

    ``check`` then ``record`` leaves a gap in which two slots, or two processes, both see
    the last free call; ``admit`` closes it by checking and counting in one step. A call
    the provider never took (a 429, an unreachable endpoint) is ``refund``-ed; a call that
    ran is ``settle``-d with its cost.
    """

    def admit(self, now: float, *, interactive: bool = False) -> Verdict: ...

    def refund(self, at: float) -> None: ...

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None: ...


@runtime_checkable
class Stateful(Protocol):
    """A shape whose local counters a snapshot carries across a restart."""

    kind: str

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


class ShapeBase:
    """No-op defaults; shapes override what they care about."""

    kind: ClassVar[str] = "shape"
    #: Probing shapes (HTTP, subprocess) run only when every local shape allows.
    probing: ClassVar[bool] = False
    #: Shapes that park on a provider 429 themselves (else :class:`Availability` adds a
    #: :class:`RateLimitBackoff`).
    handles_429: ClassVar[bool] = False

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        return Verdict.ok()

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        return None

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        return None


def fmt_duration(seconds: float) -> str:
    """``42s``, ``5m``, ``1.5h``, ``2d``: a duration as reasons show it."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h".replace(".0h", "h")
    return f"{seconds / 86400:.1f}d".replace(".0d", "d")


def fmt_time(ts: float) -> str:
    """A unix time as reasons show it (UTC, to the second)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def finite(value: object) -> float:
    """A finite float from snapshot data, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def opt_finite(value: object) -> float | None:
    """:func:`finite`, or None for None."""
    return None if value is None else finite(value)


# ---------------------------------------------------------------------------------------
# always


class AlwaysOn(ShapeBase):
    """a(t) = 1."""

    kind = "always"


# ---------------------------------------------------------------------------------------
# Provider 429s


class RateLimitBackoff(ShapeBase):
    """Parks after a provider 429: until the announced reset, or for ``default_seconds``
    doubling with each 429 in a row (capped at ``max_seconds``) when none was announced.
    A recorded call ends the streak. An announced reset further away than ``max_park``
    (a garbled header) is clamped to it."""

    kind = "rate_limit"
    handles_429 = True

    def __init__(
        self,
        *,
        default_seconds: float = 60.0,
        max_seconds: float = 3600.0,
        min_seconds: float = 1.0,
        max_park: float = 8 * 86400.0,
    ) -> None:
        self.default_seconds = default_seconds
        self.max_seconds = max_seconds
        self.min_seconds = min_seconds
        self.max_park = max_park
        self.parked_until: float | None = None
        self.streak = 0
        self.announced = False

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        self.streak += 1
        candidates: list[float] = []
        if retry_after is not None and math.isfinite(retry_after):
            candidates.append(now + retry_after)
        if reset_at is not None and math.isfinite(reset_at):
            candidates.append(reset_at)
        if candidates:
            self.announced = True
            until = min(max(max(candidates), now + self.min_seconds), now + self.max_park)
        else:
            self.announced = False
            delay = min(self.default_seconds * 2 ** (self.streak - 1), self.max_seconds)
            until = now + delay
        # A later 429 never shortens a park already announced.
        self.parked_until = max(until, self.parked_until or until)

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        self.streak = 0

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        if self.parked_until is None or now >= self.parked_until:
            return Verdict.ok()
        if self.announced:
            detail = f"provider asked to wait until {fmt_time(self.parked_until)}"
        else:
            detail = f"429 #{self.streak} with no reset announced, backing off"
        return Verdict.no(f"rate limited: {detail}", self.parked_until)

    def snapshot(self) -> dict[str, Any]:
        return {"parked_until": self.parked_until, "streak": self.streak, "announced": self.announced}

    def restore(self, state: Mapping[str, Any]) -> None:
        parked_until = opt_finite(state["parked_until"])
        streak = state["streak"]
        if isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
            raise ValueError("bad streak")
        self.parked_until, self.streak = parked_until, streak
        self.announced = bool(state["announced"])


# ---------------------------------------------------------------------------------------
# human hours


class HumanHours(ShapeBase):
    """A person's waking hours (:meth:`HoursSpec.is_open`) and vacation. Closed → until the
    next opening (found by scanning forward minute by minute, at most ``horizon_days``);
    on vacation → until unknown."""

    kind = "hours"

    def __init__(self, spec: HoursSpec, *, horizon_days: int = 8) -> None:
        self.spec = spec
        self.horizon_days = horizon_days
        self._next_open: float | None = None
        self._scanned_at = 0.0

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        if self.spec.vacation:
            return Verdict.no("on vacation: until switched off on the card")
        if self.spec.is_open(datetime.fromtimestamp(now, UTC)):
            return Verdict.ok()
        # Still closed between the last scan and the opening it found: that opening stands.
        if self._next_open is None or not self._scanned_at <= now < self._next_open:
            self._next_open, self._scanned_at = self.next_open(now), now
        hours = f"{self.spec.start}-{self.spec.end} {self.spec.timezone}"
        return Verdict.no(f"outside waking hours: {hours}", self._next_open)

    def next_open(self, now: float) -> float | None:
        """The first whole minute after ``now`` inside the hours, or None within the horizon."""
        t = math.floor(now / 60.0) * 60.0 + 60.0
        for _ in range(self.horizon_days * 1440):
            if self.spec.is_open(datetime.fromtimestamp(t, UTC)):
                return t
            t += 60.0
        return None


# ---------------------------------------------------------------------------------------
# Composition

#: Makes the shape of one availability entry of a card, or None to leave it out.
ShapeOf = Callable[[Card, AvailabilitySpec], Shape | None]


def calendar_shape(card: Card, spec: AvailabilitySpec) -> Shape | None:
    """The shape of an entry that is pure calendar (``always``, ``hours``), else None."""
    if isinstance(spec, AlwaysSpec):
        return AlwaysOn()
    if isinstance(spec, HoursSpec):
        return HumanHours(spec)
    return None


class Availability:
    """A card's composed a(t): every shape must allow.

    :meth:`check` evaluates the local shapes first (quota, budget, hours, 429 park) and
    only when they all allow the probing ones (health, GPU), so a node is not woken for a
    queue whose quota is spent anyway. It returns the first refusal in card order, with
    ``until`` the latest known ``until`` among the refusals (all of them must clear).
    """

    def __init__(self, shapes: Sequence[Shape], *, queue: str = "", park_on_429: bool = True) -> None:
        self.queue = queue
        # A worker's slots (threads) share one Availability: one caller at a time.
        self._lock = threading.RLock()
        self.shapes: list[Shape] = list(shapes)
        if park_on_429 and not any(getattr(s, "handles_429", False) for s in self.shapes):
            self.shapes.append(RateLimitBackoff())

    @classmethod
    def from_card(cls, card: Card, *, shape_of: ShapeOf | None = None) -> Availability:
        """The card's shapes in card order, each made by ``shape_of`` (an entry it makes no
        shape for is left out). The default, :func:`calendar_shape`, knows a person's a(t):
        quotas, budgets and probes are a worker's (:func:`workers.probes.card_availability`).
        """
        make = shape_of or calendar_shape
        shapes = [s for s in (make(card, spec) for spec in card.availability) if s is not None]
        return cls(shapes, queue=card.queue_name)

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        with self._lock:
            return self._check(now, interactive)

    def _check(self, now: float, interactive: bool) -> Verdict:
        refusals: list[tuple[int, Verdict]] = []
        for phase in (False, True):
            if refusals:
                break
            for i, shape in enumerate(self.shapes):
                if bool(getattr(shape, "probing", False)) != phase:
                    continue
                verdict = shape.check(now, interactive=interactive)
                if not verdict.available:
                    refusals.append((i, verdict))
        if not refusals:
            return Verdict.ok()
        refusals.sort(key=lambda item: item[0])  # card order
        first = refusals[0][1]
        known = [v.until for _, v in refusals if v.until is not None]
        return Verdict.no(first.reason, max(known) if known else None)

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        """A call was made at ``now`` and cost ``cost_usd`` (the provider accepted it)."""
        with self._lock:
            for shape in self.shapes:
                shape.record(now, cost_usd=cost_usd)

    def admit(self, now: float, *, interactive: bool = False) -> Verdict:
        """:meth:`check`, and when it allows, count the call at once in every
        :class:`Admitting` shape (all or none): the way to start a paid call."""
        with self._lock:
            verdict = self._check(now, interactive)
            if not verdict.available:
                return verdict
            taken: list[Admitting] = []
            for shape in self.shapes:
                if not isinstance(shape, Admitting):
                    continue
                verdict = shape.admit(now, interactive=interactive)
                if not verdict.available:  # another process took the last slot meanwhile
                    for done in taken:
                        done.refund(now)
                    return verdict
                taken.append(shape)
            return Verdict.ok()

    def refund(self, at: float) -> None:
        """The call admitted at ``at`` never reached the provider: give its slot back."""
        with self._lock:
            for shape in self.shapes:
                if isinstance(shape, Admitting):
                    shape.refund(at)

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        """The admitted call ran (answered, or abandoned at a timeout): record its cost."""
        with self._lock:
            for shape in self.shapes:
                if isinstance(shape, Admitting):
                    shape.settle(now, cost_usd=cost_usd)
                else:
                    shape.record(now, cost_usd=cost_usd)

    def on_rate_limited(
        self, now: float, retry_after: float | None = None, reset_at: float | None = None
    ) -> None:
        """The provider answered 429: park until its announced reset, or back off."""
        with self._lock:
            for shape in self.shapes:
                shape.on_rate_limited(now, retry_after, reset_at)

    def on_rate_limited_headers(self, now: float, headers: Mapping[str, str]) -> None:
        """:meth:`on_rate_limited` with the reset read from the 429's headers."""
        self.on_rate_limited(now, None, parse_rate_limit_headers(headers, now))

    def snapshot(self) -> dict[str, Any]:
        """JSON-able local counters (see the module docstring: a cache, not a ledger)."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        shapes = [
            {"kind": s.kind, "state": s.snapshot()} if isinstance(s, Stateful) else {"kind": "?", "state": {}}
            for s in self.shapes
        ]
        return {"version": 1, "queue": self.queue, "shapes": shapes}

    def restore(self, data: object) -> bool:
        """Load a :meth:`snapshot`. Anything that does not fit — another version, another
        set of shapes, bad values — is ignored and the state stays fresh. Returns whether
        the snapshot was applied."""
        with self._lock:
            fresh = self._snapshot()
            try:
                self._apply(data)
            except Exception:
                self._apply(fresh)
                return False
            return True

    def _apply(self, data: object) -> None:
        if not isinstance(data, Mapping) or data.get("version") != 1:
            raise ValueError("not a version 1 availability snapshot")
        items = data["shapes"]
        if not isinstance(items, list) or len(items) != len(self.shapes):
            raise ValueError("snapshot is for another set of shapes")
        for shape, item in zip(self.shapes, items, strict=True):
            if not isinstance(item, Mapping) or not isinstance(item.get("state"), Mapping):
                raise ValueError("bad shape entry")
            if isinstance(shape, Stateful):
                if item.get("kind") != shape.kind:
                    raise ValueError("snapshot is for another set of shapes")
                shape.restore(item["state"])


# ---------------------------------------------------------------------------------------
# Park state: publish transitions, not polls


class ParkState(Plain):
    """Whether a queue is parked, why, until when, and since when (unix seconds)."""

    queue: str
    parked: bool
    reason: str = ""
    until: float | None = None
    since: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "parked": self.parked,
            "reason": self.reason,
            "until": self.until,
            "since": self.since,
        }


def park_changed(old: ParkState | None, new: ParkState) -> bool:
    """A transition worth publishing: the first state, parked ↔ running, or a parked queue
    whose kind of reason changed (:func:`reason_key`). A refreshed detail or ``until``
    with the same kind of reason is not a transition."""
    if old is None or old.parked != new.parked:
        return True
    return new.parked and reason_key(old.reason) != reason_key(new.reason)


class ParkTracker(Plain, frozen=False):
    """Follows a queue's park state from successive verdicts. :meth:`update` returns the new
    :class:`ParkState` on a transition (publish it) and None otherwise; :attr:`state` is
    always the latest, detail and ``until`` included, with ``since`` kept from the
    transition."""

    queue: str
    state: ParkState | None = None

    def update(self, verdict: Verdict, now: float) -> ParkState | None:
        parked = not verdict.available
        candidate = ParkState(
            self.queue,
            parked,
            verdict.reason if parked else "",
            verdict.until if parked else None,
            now,
        )
        if park_changed(self.state, candidate):
            self.state = candidate
            return candidate
        assert self.state is not None
        self.state = ParkState(self.queue, parked, candidate.reason, candidate.until, self.state.since)
        return None
