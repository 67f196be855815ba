"""Availability a(t): may this queue's worker claim work right now?

A worker asks :meth:`Availability.check` before every claim. When the answer is no, the
queue **parks**: the worker does not claim, nothing fails, and the work waits on the board
until a(t) comes back (``Verdict.until`` says when, if that is known). Each shape of a(t)
on a card is one small class here, and a card's shapes compose: *every* shape must allow.

====================  =================================================================
shape (card)          class: when it says no
====================  =================================================================
``always``            :class:`AlwaysOn`: never
``quota``             :class:`QuotaWindow`: N calls per rolling window are spent (and an
                      optional second, longer cap), or a provider answered 429
``budget``            :class:`CostBudget`: the dollars spent in the rolling period reached
                      the budget (from the per-call cost LiteLLM reports)
``on_demand``         :class:`OnDemand`: the health probe fails; a wake hook is fired, at
                      most once per ``wake_timeout``
``gpu``               :class:`LocalGpu`: free VRAM is short of ``vram_mb + headroom_mb``,
                      or loading would evict a never-evict model (:class:`GpuResidents`)
``hours``             :class:`HumanHours`: outside waking hours, or on vacation
====================  =================================================================

Every shape is pure logic over an explicit ``now`` (unix seconds); probes (HTTP health,
wake hooks, ``nvidia-smi``) are injected callables with real defaults, so tests need no
sleeps and no network. A probe that fails is an *unavailable* verdict with a readable
reason, never an exception out of ``check``.

Interactive work and the budget governor
----------------------------------------
``quota`` and ``budget`` may keep a tail of the window for interactive work
(``reserve_interactive``, a fraction). Once what is left is within that reserve, background
work sees "reserved for interactive work" while interactive work still runs. The worker
decides what is interactive and passes ``check(now, interactive=...)``: a task is
interactive when ``card.runtime.interactive`` is set or the task's priority is high or
urgent (Kanboard priority >= 2) — see :func:`is_interactive`. That is the whole governor;
no separate admission function is needed.

Provider 429s
-------------
:meth:`Availability.on_rate_limited` parks the queue until the reset the provider announced
(``Retry-After`` or a reset header, see :func:`parse_rate_limit_headers`) and resumes by
itself after it. With no announced reset it parks for a default (60 s) that doubles on each
further 429 until a call succeeds (:meth:`Availability.record`). Every agent gets this, not
only quota cards: an :class:`Availability` without a :class:`QuotaWindow` carries its own
:class:`RateLimitBackoff`.

Local counters are rebuildable state
------------------------------------
Request timestamps, spend and park deadlines live in this process. :meth:`Availability.
snapshot` / :meth:`Availability.restore` carry them across a worker restart (as JSON), but
they are a cache of what the provider already knows, not a ledger: losing them costs at most
one call over quota, which the provider refuses with a 429 that parks the queue again. So a
snapshot that does not parse, or was taken for a different set of shapes, is ignored and the
worker starts fresh; ``restore`` never raises.
"""

from __future__ import annotations

import email.utils
import math
import re
import shlex
import subprocess
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from fabric.cards import (
    AlwaysSpec,
    BudgetSpec,
    Card,
    GpuResidency,
    GpuSpec,
    HoursSpec,
    OnDemandSpec,
    QuotaSpec,
)

__all__ = [
    "DEFAULT_GPU_PROBE",
    "AlwaysOn",
    "Availability",
    "CostBudget",
    "GpuProbeError",
    "GpuResidents",
    "HumanHours",
    "LocalGpu",
    "OnDemand",
    "ParkState",
    "ParkTracker",
    "PreloadPlan",
    "Probes",
    "QuotaWindow",
    "RateLimitBackoff",
    "Shape",
    "Verdict",
    "command_waker",
    "http_health_probe",
    "is_interactive",
    "nvidia_smi_probe",
    "park_changed",
    "parse_free_mib",
    "parse_rate_limit_headers",
    "reason_key",
    "url_waker",
]

#: Kanboard priority from which a task counts as interactive (high=2, urgent=3).
INTERACTIVE_PRIORITY = 2
DEFAULT_GPU_PROBE = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"


# ---------------------------------------------------------------------------------------
# Verdicts and the shape protocol


@dataclass(frozen=True)
class Verdict:
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
class _Stateful(Protocol):
    kind: str

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


class _Base:
    """No-op defaults; shapes override what they care about."""

    kind: ClassVar[str] = "shape"
    #: Probing shapes (HTTP, subprocess) run only when every local shape allows.
    probing: ClassVar[bool] = False

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


def _fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h".replace(".0h", "h")
    return f"{seconds / 86400:.1f}d".replace(".0d", "d")


def _fmt_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _finite(value: object) -> float:
    """A finite float from snapshot data, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def _opt_finite(value: object) -> float | None:
    return None if value is None else _finite(value)


def _reserve_count(limit: int, fraction: float) -> int:
    # 60 * 0.2 is 12.000000000000002 in floating point: do not let that round up to 13.
    return max(0, math.ceil(limit * fraction - 1e-9))


# ---------------------------------------------------------------------------------------
# always


class AlwaysOn(_Base):
    """a(t) = 1."""

    kind = "always"


# ---------------------------------------------------------------------------------------
# Provider 429s


class RateLimitBackoff(_Base):
    """Parks after a provider 429: until the announced reset, or for ``default_seconds``
    doubling with each 429 in a row (capped at ``max_seconds``) when none was announced.
    A recorded call ends the streak. An announced reset further away than ``max_park``
    (a garbled header) is clamped to it."""

    kind = "rate_limit"

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
            detail = f"provider asked to wait until {_fmt_time(self.parked_until)}"
        else:
            detail = f"429 #{self.streak} with no reset announced, backing off"
        return Verdict.no(f"rate limited: {detail}", self.parked_until)

    def snapshot(self) -> dict[str, Any]:
        return {"parked_until": self.parked_until, "streak": self.streak, "announced": self.announced}

    def restore(self, state: Mapping[str, Any]) -> None:
        parked_until = _opt_finite(state["parked_until"])
        streak = state["streak"]
        if isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
            raise ValueError("bad streak")
        self.parked_until, self.streak = parked_until, streak
        self.announced = bool(state["announced"])


# ---------------------------------------------------------------------------------------
# quota


class QuotaWindow(_Base):
    """``limit`` calls per rolling ``window`` seconds, optionally also ``second_limit`` per
    ``second_window`` (e.g. 60 per 5h and 300 per 7d).

    Spent → unavailable until the oldest call in the window leaves it. With
    ``reserve_interactive`` r, the last ``ceil(r * limit)`` calls of each window are for
    interactive work only. A provider 429 parks too (:class:`RateLimitBackoff`).
    """

    kind = "quota"

    def __init__(
        self,
        limit: int,
        window: float,
        *,
        second_limit: int | None = None,
        second_window: float | None = None,
        reserve_interactive: float = 0.0,
        backoff: RateLimitBackoff | None = None,
    ) -> None:
        if limit <= 0 or window <= 0:
            raise ValueError("limit and window must be positive")
        if (second_limit is None) != (second_window is None):
            raise ValueError("second_limit and second_window go together")
        self.caps: list[tuple[int, float]] = [(limit, window)]
        if second_limit is not None and second_window is not None:
            self.caps.append((second_limit, second_window))
        self.reserve_interactive = reserve_interactive
        self.calls: deque[float] = deque()
        self.backoff = backoff or RateLimitBackoff()

    @classmethod
    def from_spec(cls, spec: QuotaSpec) -> QuotaWindow:
        return cls(
            spec.limit,
            spec.window_seconds,
            second_limit=spec.second_limit,
            second_window=spec.second_window_seconds,
            reserve_interactive=spec.reserve_interactive,
        )

    def _trim(self, now: float) -> None:
        longest = max(w for _, w in self.caps)
        while self.calls and self.calls[0] <= now - longest:
            self.calls.popleft()

    def in_window(self, now: float, window: float) -> list[float]:
        """Timestamps of the calls inside the window ending at ``now``, oldest first."""
        return [t for t in self.calls if t > now - window]

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        self._trim(now)
        parked = self.backoff.check(now)
        spent: list[tuple[str, float | None]] = []
        reserved: list[tuple[str, float | None]] = []
        for limit, window in self.caps:
            inside = self.in_window(now, window)
            used = len(inside)
            per = _fmt_duration(window)
            if used >= limit:
                spent.append((f"{used} of {limit} per {per}", inside[used - limit] + window))
                continue
            reserve = _reserve_count(limit, self.reserve_interactive)
            if not interactive and reserve and limit - used <= reserve:
                cap = limit - reserve  # background may run while used < cap
                until = inside[used - cap] + window if cap > 0 else None
                reserved.append((f"{limit - used} of {limit} left per {per}", until))
        # Every refusal must clear before this work may run: wait for the latest of them.
        if not parked.available:
            return Verdict.no(parked.reason, _latest([("", parked.until), *spent, *reserved]))
        if spent:
            detail = ", ".join(d for d, _ in spent)
            return Verdict.no(f"quota spent: {detail}", _latest([*spent, *reserved]))
        if reserved:
            detail = ", ".join(d for d, _ in reserved)
            return Verdict.no(f"reserved for interactive work: {detail}", _latest(reserved))
        return Verdict.ok()

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        self.calls.append(now)
        if len(self.calls) > 1 and self.calls[-2] > now:  # clock stepped back: keep order
            self.calls = deque(sorted(self.calls))
        self.backoff.record(now)

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        self.backoff.on_rate_limited(now, retry_after, reset_at)

    def snapshot(self) -> dict[str, Any]:
        return {"calls": list(self.calls), "backoff": self.backoff.snapshot()}

    def restore(self, state: Mapping[str, Any]) -> None:
        calls = sorted(_finite(t) for t in state["calls"])
        backoff = state["backoff"]
        if not isinstance(backoff, Mapping):
            raise ValueError("bad backoff")
        self.backoff.restore(backoff)
        self.calls = deque(calls)


def _latest(items: Sequence[tuple[str, float | None]]) -> float | None:
    """The latest known ``until`` (every refusal must clear), None if none is known."""
    known = [u for _, u in items if u is not None]
    return max(known) if known else None


# ---------------------------------------------------------------------------------------
# budget


class CostBudget(_Base):
    """At most ``usd`` dollars per rolling ``period`` seconds, from the cost LiteLLM
    reports per call (``record(now, cost_usd=...)``).

    The check is made before a call whose cost is not known yet, so the last call of a
    period may overshoot the budget by its own cost. With ``reserve_interactive`` r,
    background work stops once the spend reaches ``(1 - r) * usd``.
    """

    kind = "budget"

    def __init__(self, usd: float, period: float, *, reserve_interactive: float = 0.0) -> None:
        if usd <= 0 or period <= 0:
            raise ValueError("usd and period must be positive")
        self.usd = usd
        self.period = period
        self.reserve_interactive = reserve_interactive
        self.spend: deque[tuple[float, float]] = deque()

    @classmethod
    def from_spec(cls, spec: BudgetSpec) -> CostBudget:
        return cls(spec.usd, spec.period_seconds, reserve_interactive=spec.reserve_interactive)

    def spent(self, now: float) -> float:
        """Dollars spent in ``(now - period, now]``."""
        return sum(c for t, c in self.spend if t > now - self.period)

    def _until_below(self, now: float, threshold: float) -> float | None:
        """When the rolling spend falls below ``threshold`` as old calls leave the period."""
        inside = [(t, c) for t, c in self.spend if t > now - self.period]
        total = sum(c for _, c in inside)
        for t, c in inside:
            total -= c
            if total < threshold - 1e-12:
                return t + self.period
        return None

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        while self.spend and self.spend[0][0] <= now - self.period:
            self.spend.popleft()
        spent = self.spent(now)
        per = _fmt_duration(self.period)
        if spent >= self.usd - 1e-12:
            return Verdict.no(
                f"budget spent: ${spent:.2f} of ${self.usd:.2f} per {per}",
                self._until_below(now, self.usd),
            )
        background_cap = self.usd * (1.0 - self.reserve_interactive)
        if not interactive and self.reserve_interactive > 0 and spent >= background_cap - 1e-12:
            return Verdict.no(
                f"reserved for interactive work: ${self.usd - spent:.2f} of ${self.usd:.2f} left per {per}",
                self._until_below(now, background_cap) if background_cap > 0 else None,
            )
        return Verdict.ok()

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        if not math.isfinite(cost_usd) or cost_usd <= 0:
            return
        self.spend.append((now, cost_usd))
        if len(self.spend) > 1 and self.spend[-2][0] > now:
            self.spend = deque(sorted(self.spend))

    def snapshot(self) -> dict[str, Any]:
        return {"spend": [[t, c] for t, c in self.spend]}

    def restore(self, state: Mapping[str, Any]) -> None:
        spend: list[tuple[float, float]] = []
        for item in state["spend"]:
            t, c = item
            spend.append((_finite(t), _finite(c)))
        self.spend = deque(sorted(spend))


# ---------------------------------------------------------------------------------------
# on-demand

#: ``(url, timeout_seconds) -> (healthy, detail)``
HealthProbe = Callable[[str, float], tuple[bool, str]]
#: Fires a wake; raises on failure (the message becomes part of the reason).
WakeHook = Callable[[], None]

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_health_probe(url: str, timeout: float) -> tuple[bool, str]:
    """HTTP GET ``url`` directly (no proxy); healthy on a 2xx answer within ``timeout``."""
    try:
        with _DIRECT.open(urllib.request.Request(url, method="GET"), timeout=timeout) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return False, str(exc.reason)
    except (OSError, ValueError) as exc:  # timeouts, resets, a malformed URL
        return False, str(exc) or type(exc).__name__
    if 200 <= status < 300:
        return True, f"HTTP {status}"
    return False, f"HTTP {status}"


def command_waker(command: str, timeout: float = 30.0) -> WakeHook:
    """A wake hook running ``command`` (no shell) with a ``timeout``."""

    def wake() -> None:
        try:
            done = subprocess.run(
                shlex.split(command), capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            raise RuntimeError(f"{shlex.split(command)[0]!r} not found") from None
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"wake command timed out after {timeout:g}s") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"wake command exited {done.returncode} {tail[0]}".strip())

    return wake


def url_waker(url: str, timeout: float = 10.0) -> WakeHook:
    """A wake hook POSTing to ``url``; a non-2xx answer is a failure."""

    def wake() -> None:
        request = urllib.request.Request(url, data=b"", method="POST")
        try:
            with _DIRECT.open(request, timeout=timeout) as resp:
                status = int(resp.status)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"wake URL answered HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"wake URL failed: {exc}") from None
        if not 200 <= status < 300:
            raise RuntimeError(f"wake URL answered HTTP {status}")

    return wake


class OnDemand(_Base):
    """A node that sleeps: available while its health probe answers 2xx.

    Unhealthy with a wake hook → "asleep": the hook fires at once, then at most once per
    ``wake_timeout``. Unhealthy without one → "unhealthy". A healthy answer is trusted for
    ``healthy_ttl`` seconds and a failed one for ``retry_seconds`` (the verdict's ``until``),
    so a busy worker does not probe before every task.
    """

    kind = "on_demand"
    probing = True

    def __init__(
        self,
        health_url: str,
        *,
        probe: HealthProbe = http_health_probe,
        wake: WakeHook | None = None,
        probe_timeout: float = 3.0,
        wake_timeout: float = 120.0,
        healthy_ttl: float = 5.0,
        retry_seconds: float = 5.0,
    ) -> None:
        self.health_url = health_url
        self.probe = probe
        self.wake = wake
        self.probe_timeout = probe_timeout
        self.wake_timeout = wake_timeout
        self.healthy_ttl = healthy_ttl
        self.retry_seconds = retry_seconds
        self.healthy_until: float | None = None
        self.last_wake: float | None = None
        self.wake_error = ""
        self.wakes = 0
        self._last: Verdict | None = None
        self._next_probe: float | None = None

    @classmethod
    def from_spec(
        cls, spec: OnDemandSpec, *, probe: HealthProbe | None = None, wake: WakeHook | None = None
    ) -> OnDemand:
        if wake is None and spec.wake_command is not None:
            wake = command_waker(spec.wake_command)
        elif wake is None and spec.wake_url is not None:
            wake = url_waker(spec.wake_url)
        return cls(
            spec.health_url,
            probe=probe or http_health_probe,
            wake=wake,
            probe_timeout=spec.probe_timeout_seconds,
            wake_timeout=spec.wake_timeout_seconds,
        )

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        if self.healthy_until is not None and now < self.healthy_until:
            return Verdict.ok()
        recent = self._next_probe is not None and now < self._next_probe
        if self._last is not None and recent and not self._wake_due(now):
            return self._last
        try:
            healthy, detail = self.probe(self.health_url, self.probe_timeout)
        except Exception as exc:  # an injected probe must not take the worker down
            healthy, detail = False, f"probe raised {type(exc).__name__}: {exc}"
        if healthy:
            self.healthy_until = now + self.healthy_ttl
            self.last_wake, self.wake_error, self._last, self._next_probe = None, "", None, None
            return Verdict.ok()
        self.healthy_until = None
        self._next_probe = now + self.retry_seconds
        if self.wake is None:
            self._last = Verdict.no(f"unhealthy: {self.health_url} {detail}", self._next_probe)
            return self._last
        if self._wake_due(now):
            self.last_wake = now
            self.wakes += 1
            try:
                self.wake()
                self.wake_error = ""
            except Exception as exc:
                self.wake_error = str(exc) or type(exc).__name__
        sent = now if self.last_wake is None else self.last_wake
        waking = f"wake sent {_fmt_duration(now - sent)} ago"
        if self.wake_error:
            waking = f"wake failed ({self.wake_error}), retrying after {_fmt_duration(self.wake_timeout)}"
        self._last = Verdict.no(f"asleep: {self.health_url} {detail}; {waking}", self._next_probe)
        return self._last

    def _wake_due(self, now: float) -> bool:
        return self.wake is not None and (self.last_wake is None or now - self.last_wake >= self.wake_timeout)

    def snapshot(self) -> dict[str, Any]:
        return {"last_wake": self.last_wake}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.last_wake = _opt_finite(state["last_wake"])


# ---------------------------------------------------------------------------------------
# local GPU


class GpuProbeError(RuntimeError):
    """The free-VRAM probe could not run or its output did not parse."""


#: ``() -> free MiB per GPU``; raises :class:`GpuProbeError`.
GpuProbe = Callable[[], list[int]]


def parse_free_mib(text: str) -> list[int]:
    """Free MiB per GPU from ``nvidia-smi --query-gpu=memory.free --format=csv,noheader,
    nounits`` (one number per line; a trailing ``MiB`` is tolerated)."""
    out: list[int] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:MiB)?", line, flags=re.IGNORECASE)
        if match is None:
            raise GpuProbeError(f"cannot read free VRAM from {line[:80]!r}")
        out.append(int(float(match.group(1))))
    if not out:
        raise GpuProbeError("the probe reported no GPU")
    return out


def nvidia_smi_probe(command: str = DEFAULT_GPU_PROBE, timeout: float = 5.0) -> GpuProbe:
    """A probe running ``command`` (no shell) with a ``timeout`` and parsing its output."""

    def probe() -> list[int]:
        argv = shlex.split(command)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise GpuProbeError(f"{argv[0]!r} not found (no GPU driver on this machine?)") from None
        except subprocess.TimeoutExpired:
            raise GpuProbeError(f"{argv[0]!r} timed out after {timeout:g}s") from None
        except OSError as exc:
            raise GpuProbeError(f"{argv[0]!r} could not run: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise GpuProbeError(f"{argv[0]!r} exited {done.returncode} {tail[0]}".strip())
        return parse_free_mib(done.stdout)

    return probe


@dataclass(frozen=True)
class PreloadPlan:
    """The answer of a pre-load check: may the model be loaded, and which resident models
    must be unloaded first (evictable ones only)."""

    verdict: Verdict
    evict: tuple[str, ...] = ()


class GpuResidents:
    """The GPU residency policy: every local model's footprint, whether it may never be
    evicted (embedder, reranker: interactive-critical) and its co-residency group, plus
    which of them are loaded now.

    Models in *different* co-residency groups may not share the GPU, so loading one evicts
    the loaded models of other groups; a model without a group shares with anyone.
    """

    def __init__(
        self, residents: Mapping[str, GpuResidency], loaded: Iterable[str] = (), *, headroom_mb: int = 0
    ) -> None:
        self.residents = dict(residents)
        self.loaded: set[str] = set(loaded)
        self.headroom_mb = headroom_mb

    @classmethod
    def from_cards(cls, cards: Iterable[Card], loaded: Iterable[str] = ()) -> GpuResidents:
        return cls({c.id: c.gpu for c in cards if c.gpu is not None}, loaded)

    def set_loaded(self, loaded: Iterable[str]) -> None:
        self.loaded = set(loaded)

    def plan(self, model: str, free_mb: int, *, need_mb: int | None = None) -> PreloadPlan:
        """Whether ``model`` may be loaded with ``free_mb`` free, and what it would evict."""
        me = self.residents.get(model)
        if need_mb is None:
            if me is None:
                return PreloadPlan(Verdict.no(f"unknown GPU model: {model!r} has no residency entry"))
            need_mb = me.vram_mb + self.headroom_mb
        if model in self.loaded:
            return PreloadPlan(Verdict.ok(f"{model} is already resident"))
        group = me.co_residency_group if me else None
        others = sorted(m for m in self.loaded if m != model)

        def size(m: str) -> int:
            r = self.residents.get(m)
            return r.vram_mb if r else 0

        def pinned(m: str) -> bool:
            r = self.residents.get(m)
            return bool(r and r.never_evict)

        # Loaded models of another group must go whatever the free VRAM.
        clash = [
            m
            for m in others
            if group is not None
            and (r := self.residents.get(m)) is not None
            and r.co_residency_group is not None
            and r.co_residency_group != group
        ]
        clash_pinned = [m for m in clash if pinned(m)]
        if clash_pinned:
            return PreloadPlan(
                Verdict.no(
                    "would evict never-evict model: "
                    + ", ".join(f"{m} (group {self._group(m)})" for m in clash_pinned)
                    + f" may not share the GPU with {model} (group {group})"
                )
            )
        evict = list(clash)
        room = free_mb + sum(size(m) for m in clash)
        if room >= need_mb:
            return PreloadPlan(Verdict.ok(_evicting(evict)), tuple(evict))
        for m in sorted((m for m in others if m not in clash and not pinned(m)), key=size, reverse=True):
            evict.append(m)
            room += size(m)
            if room >= need_mb:
                return PreloadPlan(Verdict.ok(_evicting(evict)), tuple(evict))
        blocking = [m for m in others if pinned(m)]
        need = f"need {need_mb} MiB, free {free_mb} MiB"
        if blocking and room + sum(size(m) for m in blocking) >= need_mb:
            return PreloadPlan(
                Verdict.no(
                    f"would evict never-evict model: {', '.join(blocking)} ({need}, "
                    f"{room} MiB even after unloading every evictable model)"
                )
            )
        return PreloadPlan(Verdict.no(f"not enough free VRAM: {need}"))

    def preload_check(self, model: str, free_mb: int, *, need_mb: int | None = None) -> Verdict:
        """The verdict of :meth:`plan`: refuses when the only way to make room would evict
        a never-evict model (naming it), or when there is no room at all."""
        return self.plan(model, free_mb, need_mb=need_mb).verdict

    def _group(self, model: str) -> str:
        r = self.residents.get(model)
        return (r.co_residency_group if r else None) or "none"


def _evicting(models: Sequence[str]) -> str:
    return f"evicts {', '.join(models)}" if models else ""


class LocalGpu(_Base):
    """A local GPU model: available while ``vram_mb + headroom_mb`` fits in the free VRAM
    of the roomiest GPU (one model, one GPU; more GPUs is a placement problem this does not
    solve). With a :class:`GpuResidents` policy the pre-load check decides instead, so the
    worker never pulls a model that would push out a never-evict one; a model already
    resident is available. The probe result is cached for ``cache_seconds``."""

    kind = "gpu"
    probing = True

    def __init__(
        self,
        vram_mb: int,
        *,
        headroom_mb: int = 256,
        probe: GpuProbe | None = None,
        model: str | None = None,
        residents: GpuResidents | None = None,
        loaded_probe: Callable[[], Iterable[str]] | None = None,
        cache_seconds: float = 2.0,
    ) -> None:
        self.vram_mb = vram_mb
        self.headroom_mb = headroom_mb
        self.probe = probe or nvidia_smi_probe()
        self.model = model
        self.residents = residents
        self.loaded_probe = loaded_probe
        self.cache_seconds = cache_seconds
        self.last_plan: PreloadPlan | None = None
        self._cached: tuple[float, Verdict] | None = None

    @classmethod
    def from_spec(
        cls,
        spec: GpuSpec,
        *,
        model: str | None = None,
        probe: GpuProbe | None = None,
        residents: GpuResidents | None = None,
        loaded_probe: Callable[[], Iterable[str]] | None = None,
    ) -> LocalGpu:
        return cls(
            spec.vram_mb,
            headroom_mb=spec.headroom_mb,
            probe=probe or nvidia_smi_probe(spec.probe_command),
            model=model,
            residents=residents,
            loaded_probe=loaded_probe,
        )

    @property
    def need_mb(self) -> int:
        return self.vram_mb + self.headroom_mb

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        if self._cached is not None and now - self._cached[0] < self.cache_seconds:
            return self._cached[1]
        verdict = self._check()
        self._cached = (now, verdict)
        return verdict

    def _check(self) -> Verdict:
        try:
            free = max(self.probe())
        except GpuProbeError as exc:
            return Verdict.no(f"GPU probe failed: {exc}")
        except Exception as exc:  # an injected probe must not take the worker down
            return Verdict.no(f"GPU probe failed: {type(exc).__name__}: {exc}")
        if self.residents is not None and self.model is not None:
            if self.loaded_probe is not None:
                try:
                    self.residents.set_loaded(self.loaded_probe())
                except Exception as exc:
                    return Verdict.no(f"GPU probe failed: cannot list loaded models: {exc}")
            self.last_plan = self.residents.plan(self.model, free, need_mb=self.need_mb)
            return self.last_plan.verdict
        if free >= self.need_mb:
            return Verdict.ok()
        return Verdict.no(f"not enough free VRAM: need {self.need_mb} MiB, free {free} MiB")


# ---------------------------------------------------------------------------------------
# human hours


class HumanHours(_Base):
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


@dataclass
class Probes:
    """Probes to use instead of the real ones (tests, or a worker sharing one residency
    registry across its GPU models). None means the default for the card."""

    health: HealthProbe | None = None
    wake: WakeHook | None = None
    gpu_free: GpuProbe | None = None
    gpu_loaded: Callable[[], Iterable[str]] | None = None
    residents: GpuResidents | None = None


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
        if park_on_429 and not any(isinstance(s, QuotaWindow | RateLimitBackoff) for s in self.shapes):
            self.shapes.append(RateLimitBackoff())

    @classmethod
    def from_card(cls, card: Card, *, probes: Probes | None = None) -> Availability:
        p = probes or Probes()
        shapes: list[Shape] = []
        for spec in card.availability:
            if isinstance(spec, AlwaysSpec):
                shapes.append(AlwaysOn())
            elif isinstance(spec, QuotaSpec):
                shapes.append(QuotaWindow.from_spec(spec))
            elif isinstance(spec, BudgetSpec):
                shapes.append(CostBudget.from_spec(spec))
            elif isinstance(spec, OnDemandSpec):
                shapes.append(OnDemand.from_spec(spec, probe=p.health, wake=p.wake))
            elif isinstance(spec, GpuSpec):
                residents = p.residents
                if residents is None and card.gpu is not None:
                    residents = GpuResidents({card.id: card.gpu})
                shapes.append(
                    LocalGpu.from_spec(
                        spec,
                        model=card.id,
                        probe=p.gpu_free,
                        residents=residents,
                        loaded_probe=p.gpu_loaded,
                    )
                )
            else:
                shapes.append(HumanHours(spec))
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
            {"kind": s.kind, "state": s.snapshot()}
            if isinstance(s, _Stateful)
            else {"kind": "?", "state": {}}
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
            if isinstance(shape, _Stateful):
                if item.get("kind") != shape.kind:
                    raise ValueError("snapshot is for another set of shapes")
                shape.restore(item["state"])


# ---------------------------------------------------------------------------------------
# Park state: publish transitions, not polls


@dataclass(frozen=True)
class ParkState:
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


@dataclass
class ParkTracker:
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


# ---------------------------------------------------------------------------------------
# Rate-limit headers

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s|d)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def _duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``6m0s``, ``1.5s``, ``20ms``, ``1h2m``) or a bare
    number of seconds."""
    text = text.strip().lower()
    if _NUMBER.match(text):
        return float(text)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _http_date(text: str) -> float | None:
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _rfc3339(text: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _epoch_or_delta(text: str, now: float) -> float | None:
    """``x-ratelimit-reset``: unix seconds, unix milliseconds, or seconds from now."""
    value = text.strip()
    if _NUMBER.match(value):
        number = float(value)
        if number >= 1e12:
            return number / 1000.0
        if number >= 1e9:
            return number
        return now + number
    delta = _duration(value)
    if delta is not None:
        return now + delta
    return _rfc3339(value) or _http_date(value)


def parse_rate_limit_headers(headers: Mapping[str, str], now: float) -> float | None:
    """When (unix seconds) a 429's limit resets, from its headers; None if not announced.

    ``Retry-After`` (seconds or an HTTP-date) and ``retry-after-ms`` win: they are the
    provider's instruction. Otherwise the reset headers are read — ``x-ratelimit-reset-
    requests`` / ``-tokens`` (OpenAI durations like ``6m0s``), ``x-ratelimit-reset`` (unix
    seconds or seconds), ``anthropic-ratelimit-*-reset`` (RFC 3339) — preferring the limits
    whose ``remaining`` header says 0, and taking the latest.
    """
    h = {str(k).lower(): str(v) for k, v in headers.items()}
    retry_after = h.get("retry-after")
    if retry_after is not None:
        seconds = _duration(retry_after)
        if seconds is not None:
            return now + seconds
        when = _http_date(retry_after)
        if when is not None:
            return when
    retry_ms = h.get("retry-after-ms")
    if retry_ms is not None and _NUMBER.match(retry_ms.strip()):
        return now + float(retry_ms) / 1000.0

    resets: dict[str, float] = {}  # limit name -> reset time
    for name, value in h.items():
        at: float | None
        if name.startswith("x-ratelimit-reset-"):
            delta = _duration(value)
            at = now + delta if delta is not None else _rfc3339(value)
            key = "x:" + name.removeprefix("x-ratelimit-reset-")
        elif name == "x-ratelimit-reset":
            at = _epoch_or_delta(value, now)
            key = "x:"
        elif name.startswith("anthropic-ratelimit-") and name.endswith("-reset"):
            at = _rfc3339(value)
            key = "a:" + name.removeprefix("anthropic-ratelimit-").removesuffix("-reset")
        else:
            continue
        if at is not None:
            resets[key] = at
    if not resets:
        return None
    exhausted = [key for key in resets if _remaining(h, key) == 0]
    chosen = exhausted or list(resets)
    return max(resets[k] for k in chosen)


def _remaining(h: Mapping[str, str], key: str) -> float | None:
    source, _, limit = key.partition(":")
    if source == "x":
        name = f"x-ratelimit-remaining-{limit}" if limit else "x-ratelimit-remaining"
    else:
        name = f"anthropic-ratelimit-{limit}-remaining"
    value = h.get(name, "").strip()
    return float(value) if _NUMBER.match(value) else None
