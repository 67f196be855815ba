"""A worker's counters: calls per rolling window (quota) and dollars per period (budget).

Both are shapes of a(t) (:mod:`fabric.availability`), fed by the executor with each call
the provider accepted.

Interactive work and the budget governor
----------------------------------------
``quota`` and ``budget`` may keep a tail of the window for interactive work
(``reserve_interactive``, a fraction). Once what is left is within that reserve, background
work sees "reserved for interactive work" while interactive work still runs. The worker
decides what is interactive and passes ``check(now, interactive=...)``: a task is
interactive when ``card.runtime.interactive`` is set or the task's priority is high or
urgent (Kanboard priority >= 2) — see :func:`fabric.availability.is_interactive`. That is
the whole governor; no separate admission function is needed.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from fabric.availability import RateLimitBackoff, ShapeBase, Verdict, finite, fmt_duration
from fabric.cards import BudgetSpec, QuotaSpec

__all__ = ["CostBudget", "QuotaWindow"]


def _reserve_count(limit: int, fraction: float) -> int:
    # 60 * 0.2 is 12.000000000000002 in floating point: do not let that round up to 13.
    return max(0, math.ceil(limit * fraction - 1e-9))


# ---------------------------------------------------------------------------------------
# quota


class QuotaWindow(ShapeBase):
    """``limit`` calls per rolling ``window`` seconds, optionally also ``second_limit`` per
    ``second_window`` (e.g. 60 per 5h and 300 per 7d).

    Spent → unavailable until the oldest call in the window leaves it. With
    ``reserve_interactive`` r, the last ``ceil(r * limit)`` calls of each window are for
    interactive work only. A provider 429 parks too (:class:`RateLimitBackoff`).
    """

    kind = "quota"
    handles_429 = True

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
            per = fmt_duration(window)
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
        self._count(now)
        self.backoff.record(now)

    def _count(self, now: float) -> None:
        self.calls.append(now)
        if len(self.calls) > 1 and self.calls[-2] > now:  # clock stepped back: keep order
            self.calls = deque(sorted(self.calls))

    def admit(self, now: float, *, interactive: bool = False) -> Verdict:
        verdict = self.check(now, interactive=interactive)
        if verdict.available:
            self._count(now)
        return verdict

    def refund(self, at: float) -> None:
        with contextlib.suppress(ValueError):  # already out of the window: nothing to give back
            self.calls.remove(at)

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        self.backoff.record(now)  # counted when admitted; an answer ends a 429 streak

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        self.backoff.on_rate_limited(now, retry_after, reset_at)

    def snapshot(self) -> dict[str, Any]:
        return {"calls": list(self.calls), "backoff": self.backoff.snapshot()}

    def restore(self, state: Mapping[str, Any]) -> None:
        calls = sorted(finite(t) for t in state["calls"])
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


class CostBudget(ShapeBase):
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
        per = fmt_duration(self.period)
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

    def admit(self, now: float, *, interactive: bool = False) -> Verdict:
        return self.check(now, interactive=interactive)  # the cost is known only afterwards

    def refund(self, at: float) -> None:
        return None

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        self.record(now, cost_usd=cost_usd)

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
            spend.append((finite(t), finite(c)))
        self.spend = deque(sorted(spend))
