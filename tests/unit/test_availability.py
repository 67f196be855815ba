"""a(t) shapes: each one's park and resume on a fake clock, their composition, snapshots."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from fabric.availability import (
    AlwaysOn,
    Availability,
    HumanHours,
    ParkState,
    ParkTracker,
    RateLimitBackoff,
    Verdict,
    is_interactive,
    park_changed,
    reason_key,
)
from fabric.cards import Card, GpuResidency, HoursSpec
from fabric.cards.models import check_card
from fabric.retry_after import parse_rate_limit_headers
from workers.probes import (
    GpuProbeError,
    GpuResidents,
    LocalGpu,
    OnDemand,
    Probes,
    card_availability,
    nvidia_smi_probe,
    parse_free_mib,
)
from workers.quota import CostBudget, QuotaWindow

T0 = 1_800_000_000.0
H = 3600.0
D = 86400.0


def card(availability: list[dict[str, Any]], **extra: Any) -> Card:
    data: dict[str, Any] = {
        "id": "m1",
        "kind": "model",
        "name": "M1",
        "tier": "small",
        "trust": "trusted",
        "runtime": {"mode": "demo"},
        "availability": availability,
    }
    data.update(extra)
    return check_card(data)


# -- verdicts ---------------------------------------------------------------------------


def test_verdict_basics() -> None:
    assert Verdict.ok() == Verdict(True, "", None)
    assert Verdict.ok().available
    assert reason_key("quota spent: 60 of 60 per 5h") == "quota spent"
    assert reason_key("on vacation") == "on vacation"


@pytest.mark.parametrize(
    ("runtime_interactive", "priority", "expected"),
    [(False, 0, False), (False, 1, False), (False, 2, True), (False, 3, True), (True, 0, True)],
)
def test_is_interactive(runtime_interactive: bool, priority: int, expected: bool) -> None:
    assert is_interactive(runtime_interactive, priority) is expected


def test_always_on() -> None:
    shape = AlwaysOn()
    shape.record(T0, cost_usd=3.0)
    shape.on_rate_limited(T0, None, None)
    assert shape.check(T0).available


# -- quota ------------------------------------------------------------------------------


def spend_quota(q: QuotaWindow, n: int, start: float, step: float = 60.0) -> float:
    t = start
    for _ in range(n):
        q.record(t)
        t += step
    return t - step  # time of the last call


def test_quota_parks_when_spent_until_oldest_leaves_then_resumes() -> None:
    q = QuotaWindow(60, 5 * H)
    last = spend_quota(q, 59, T0)
    assert q.check(last).available
    q.record(last + 1)
    v = q.check(last + 2)
    assert not v.available
    assert v.reason == "quota spent: 60 of 60 per 5h"
    assert v.until == T0 + 5 * H  # the oldest call leaves the window
    assert not q.check(T0 + 5 * H - 0.001).available
    assert q.check(T0 + 5 * H).available
    # Spend the freed slot: now the second-oldest call bounds the park.
    q.record(T0 + 5 * H)
    v = q.check(T0 + 5 * H + 1)
    assert not v.available and v.until == T0 + 60 + 5 * H


def test_quota_second_cap_binds() -> None:
    q = QuotaWindow(60, 5 * H, second_limit=100, second_window=7 * D)
    spend_quota(q, 60, T0, step=1.0)
    assert q.check(T0 + 100).reason.startswith("quota spent: 60 of 60 per 5h")
    spend_quota(q, 40, T0 + 6 * H, step=1.0)  # the first window has room again
    v = q.check(T0 + 6 * H + 100)
    assert not v.available
    assert v.reason == "quota spent: 100 of 100 per 7d"
    assert v.until == T0 + 7 * D
    assert q.check(T0 + 7 * D).available


def test_quota_both_caps_bound_waits_for_the_later() -> None:
    q = QuotaWindow(3, 10.0, second_limit=3, second_window=100.0)
    spend_quota(q, 3, T0, step=1.0)
    v = q.check(T0 + 5)
    assert not v.available
    assert "3 of 3 per 10s" in v.reason and "3 of 3 per 2m" in v.reason
    assert v.until == T0 + 100


def test_quota_interactive_reserve() -> None:
    q = QuotaWindow(60, 5 * H, reserve_interactive=0.2)  # 12 calls kept for interactive
    spend_quota(q, 47, T0)
    now = T0 + 47 * 60
    assert q.check(now).available
    q.record(now)  # 48 used, 12 left: the reserve
    v = q.check(now + 1)
    assert not v.available
    assert v.reason.startswith("reserved for interactive work")
    assert v.until == T0 + 5 * H
    assert q.check(now + 1, interactive=True).available
    spend_quota(q, 12, now + 10, step=1.0)
    assert not q.check(now + 100, interactive=True).available
    assert q.check(now + 100, interactive=True).reason.startswith("quota spent")
    # The oldest call leaves: 59 used, still within the reserve for background work.
    assert q.check(T0 + 5 * H, interactive=True).available
    assert not q.check(T0 + 5 * H).available


def test_quota_from_card_spec() -> None:
    c = card(
        [
            {
                "shape": "quota",
                "limit": 60,
                "window": "5h",
                "second_limit": 300,
                "second_window": "7d",
                "reserve_interactive": 0.2,
            }
        ]
    )
    avail = card_availability(c)
    (q,) = avail.shapes
    assert isinstance(q, QuotaWindow)
    assert q.caps == [(60, 5 * H), (300, 7 * D)]
    assert q.reserve_interactive == 0.2


def test_quota_rejects_bad_construction() -> None:
    with pytest.raises(ValueError):
        QuotaWindow(0, 10)
    with pytest.raises(ValueError):
        QuotaWindow(1, 10, second_limit=3)


# -- provider 429 -----------------------------------------------------------------------


def test_429_with_retry_after_parks_and_resumes_by_itself() -> None:
    q = QuotaWindow(60, 5 * H)
    q.on_rate_limited(T0, 30.0, None)
    v = q.check(T0 + 1)
    assert not v.available and v.until == T0 + 30
    assert reason_key(v.reason) == "rate limited"
    assert not q.check(T0 + 1, interactive=True).available  # the provider said no to all
    assert q.check(T0 + 30).available


def test_429_with_reset_timestamp() -> None:
    b = RateLimitBackoff()
    b.on_rate_limited(T0, None, T0 + 600)
    assert b.check(T0 + 599).until == T0 + 600
    assert b.check(T0 + 600).available


def test_429_without_reset_backs_off_exponentially_until_a_call_succeeds() -> None:
    b = RateLimitBackoff(default_seconds=60, max_seconds=200)
    b.on_rate_limited(T0, None, None)
    assert b.check(T0).until == T0 + 60
    b.on_rate_limited(T0 + 60, None, None)
    assert b.check(T0 + 60).until == T0 + 60 + 120
    b.on_rate_limited(T0 + 180, None, None)
    assert b.check(T0 + 180).until == T0 + 180 + 200  # capped
    assert "429 #3" in b.check(T0 + 180).reason
    b.record(T0 + 400)
    b.on_rate_limited(T0 + 500, None, None)
    assert b.check(T0 + 500).until == T0 + 560


def test_429_never_shortens_an_announced_park_and_clamps_nonsense() -> None:
    b = RateLimitBackoff(max_park=D)
    b.on_rate_limited(T0, 600.0, None)
    b.on_rate_limited(T0 + 1, 5.0, None)
    assert b.check(T0 + 2).until == T0 + 600
    b2 = RateLimitBackoff(max_park=D)
    b2.on_rate_limited(T0, None, T0 + 1e9)  # a garbled header
    assert b2.check(T0).until == T0 + D
    b3 = RateLimitBackoff()
    b3.on_rate_limited(T0, 0.0, T0 - 100)  # already reset: still a short pause
    assert b3.check(T0).until == T0 + 1


def test_every_card_parks_on_429_even_without_a_quota_shape() -> None:
    avail = Availability([AlwaysOn()])
    avail.on_rate_limited_headers(T0, {"Retry-After": "120"})
    v = avail.check(T0 + 1)
    assert not v.available and v.until == T0 + 120
    assert avail.check(T0 + 120).available
    assert Availability([AlwaysOn()], park_on_429=False).shapes.__len__() == 1


HTTP_DATE = "Fri, 15 Jan 2027 08:05:00 GMT"
HTTP_DATE_TS = datetime(2027, 1, 15, 8, 5, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "30"}, T0 + 30),
        ({"retry-after": "1.5"}, T0 + 1.5),
        ({"Retry-After": HTTP_DATE}, HTTP_DATE_TS),
        ({"retry-after-ms": "250"}, T0 + 0.25),
        ({"x-ratelimit-reset-requests": "6m0s"}, T0 + 360),
        ({"x-ratelimit-reset-requests": "1.5s"}, T0 + 1.5),
        ({"x-ratelimit-reset-tokens": "20ms"}, T0 + 0.02),
        ({"x-ratelimit-reset-tokens": "1h2m3s"}, T0 + 3723),
        ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "6m0s"}, T0 + 360),
        (  # the exhausted limit decides
            {
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "5000",
            },
            T0 + 2,
        ),
        ({"X-RateLimit-Reset": str(int(T0 + 90))}, T0 + 90),
        ({"x-ratelimit-reset": str(int((T0 + 90) * 1000))}, T0 + 90),
        ({"x-ratelimit-reset": "45"}, T0 + 45),
        ({"anthropic-ratelimit-requests-reset": "2027-01-15T08:05:00Z"}, HTTP_DATE_TS),
        ({"anthropic-ratelimit-tokens-reset": "2027-01-15T09:05:00+01:00"}, HTTP_DATE_TS),
        ({"Retry-After": "10", "x-ratelimit-reset-requests": "6m0s"}, T0 + 10),  # Retry-After wins
        ({"Retry-After": "soon", "x-ratelimit-reset": "45"}, T0 + 45),
        # relayed by the LiteLLM proxy with a prefix; the proxy's own header wins
        ({"llm_provider-retry-after": "7", "llm_provider-x-ratelimit-reset-requests": "20s"}, T0 + 7),
        ({"llm_provider-x-ratelimit-reset-requests": "20s"}, T0 + 20),
        ({"retry-after": "3", "llm_provider-retry-after": "7"}, T0 + 3),
        ({"ratelimit-reset": "12"}, T0 + 12),  # the IETF draft's header
        ({}, None),
        ({"content-type": "application/json"}, None),
        ({"x-ratelimit-reset-requests": "whenever"}, None),
        ({"anthropic-ratelimit-requests-reset": "not a date"}, None),
    ],
)
def test_parse_rate_limit_headers(headers: dict[str, str], expected: float | None) -> None:
    got = parse_rate_limit_headers(headers, T0)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


# -- budget -----------------------------------------------------------------------------


def test_budget_parks_past_the_limit_until_the_period_rolls() -> None:
    b = CostBudget(5.0, 7 * D)
    b.record(T0, cost_usd=2.0)
    b.record(T0 + D, cost_usd=2.5)
    assert b.check(T0 + D).available
    b.record(T0 + 2 * D, cost_usd=0.75)  # 5.25 spent
    v = b.check(T0 + 2 * D)
    assert not v.available
    assert v.reason == "budget spent: $5.25 of $5.00 per 7d"
    assert v.until == T0 + 7 * D  # dropping the first $2 brings it under
    assert b.check(T0 + 7 * D).available
    assert b.spent(T0 + 7 * D) == pytest.approx(3.25)


def test_budget_until_waits_for_enough_spend_to_roll_off() -> None:
    b = CostBudget(1.0, 100.0)
    b.record(T0, cost_usd=0.1)
    b.record(T0 + 10, cost_usd=0.1)
    b.record(T0 + 20, cost_usd=0.9)
    assert b.check(T0 + 30).until == T0 + 110  # the two oldest go: $0.90 < $1
    b.record(T0 + 30, cost_usd=0.2)
    assert b.check(T0 + 31).until == T0 + 120  # $1.30: three must go before spend < $1


def test_budget_ignores_zero_negative_and_nan_costs() -> None:
    b = CostBudget(1.0, 100.0)
    for cost in (0.0, -5.0, float("nan"), float("inf")):
        b.record(T0, cost_usd=cost)
    assert b.spent(T0) == 0.0


def test_budget_interactive_reserve() -> None:
    b = CostBudget(10.0, D, reserve_interactive=0.25)
    b.record(T0, cost_usd=7.0)
    assert b.check(T0 + 1).available
    b.record(T0 + 2, cost_usd=0.5)  # 7.50 = the background cap
    v = b.check(T0 + 3)
    assert not v.available and v.reason.startswith("reserved for interactive work")
    assert v.until == T0 + D
    assert b.check(T0 + 3, interactive=True).available
    b.record(T0 + 4, cost_usd=3.0)
    assert reason_key(b.check(T0 + 5, interactive=True).reason) == "budget spent"


# -- on demand --------------------------------------------------------------------------


class FakeNode:
    def __init__(self) -> None:
        self.healthy = False
        self.probes = 0
        self.wakes = 0
        self.wake_error: Exception | None = None

    def probe(self, url: str, timeout: float) -> tuple[bool, str]:
        self.probes += 1
        return (True, "HTTP 200") if self.healthy else (False, "connection refused")

    def wake(self) -> None:
        self.wakes += 1
        if self.wake_error is not None:
            raise self.wake_error


def test_on_demand_wakes_once_per_wake_timeout_then_available() -> None:
    node = FakeNode()
    od = OnDemand(
        "http://127.0.0.1:1/health", probe=node.probe, wake=node.wake, wake_timeout=120, retry_seconds=5
    )
    v = od.check(T0)
    assert not v.available and reason_key(v.reason) == "asleep"
    assert "connection refused" in v.reason
    assert node.wakes == 1 and v.until == T0 + 5
    for dt in (1, 5, 30, 119):
        assert not od.check(T0 + dt).available
    assert node.wakes == 1
    assert node.probes == 4  # t+1 used the cached failure; every later one probed
    assert not od.check(T0 + 120).available
    assert node.wakes == 2
    node.healthy = True
    assert od.check(T0 + 130).available
    assert od.last_wake is None


def test_on_demand_caches_a_healthy_probe() -> None:
    node = FakeNode()
    node.healthy = True
    od = OnDemand("http://x/health", probe=node.probe, healthy_ttl=5)
    for dt in (0, 1, 2, 4.9):
        assert od.check(T0 + dt).available
    assert node.probes == 1
    assert od.check(T0 + 5).available
    assert node.probes == 2


def test_on_demand_without_wake_hook_is_unhealthy() -> None:
    node = FakeNode()
    od = OnDemand("http://x/health", probe=node.probe)
    assert reason_key(od.check(T0).reason) == "unhealthy"


def test_on_demand_wake_failure_and_probe_exception_never_raise() -> None:
    node = FakeNode()
    node.wake_error = RuntimeError("wakeonlan not found")
    od = OnDemand("http://x/health", probe=node.probe, wake=node.wake)
    v = od.check(T0)
    assert not v.available and "wake failed (wakeonlan not found)" in v.reason

    def boom(url: str, timeout: float) -> tuple[bool, str]:
        raise OSError("kaput")

    od2 = OnDemand("http://x/health", probe=boom)
    assert "probe raised OSError: kaput" in od2.check(T0).reason


def test_on_demand_from_card_uses_injected_probes() -> None:
    node = FakeNode()
    c = card(
        [
            {
                "shape": "on_demand",
                "health_url": "http://127.0.0.1:8081/health",
                "wake_command": "wakeonlan 00:00:00:00:00:00",
                "wake_timeout": "180s",
            }
        ]
    )
    avail = card_availability(c, probes=Probes(health=node.probe, wake=node.wake))
    od = avail.shapes[0]
    assert isinstance(od, OnDemand) and od.wake_timeout == 180 and od.probe_timeout == 3
    assert not avail.check(T0).available
    assert node.wakes == 1


# -- local GPU --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7800\n", [7800]), ("1200\n 5000 \n\n", [1200, 5000]), ("3000 MiB\n", [3000]), ("812.0", [812])],
)
def test_parse_free_mib(text: str, expected: list[int]) -> None:
    assert parse_free_mib(text) == expected


@pytest.mark.parametrize("text", ["", "No devices were found", "N/A", "12 GB"])
def test_parse_free_mib_refuses_garbage(text: str) -> None:
    with pytest.raises(GpuProbeError):
        parse_free_mib(text)


def fixed(*free: int) -> Callable[[], list[int]]:
    return lambda: list(free)


def test_gpu_enough_and_not_enough_vram() -> None:
    assert LocalGpu(3300, headroom_mb=256, probe=fixed(1000, 4000)).check(T0).available
    v = LocalGpu(3300, headroom_mb=256, probe=fixed(1000, 3000)).check(T0)
    assert not v.available
    assert v.reason == "not enough free VRAM: need 3556 MiB, free 3000 MiB"


def test_gpu_probe_is_cached_briefly() -> None:
    calls: list[float] = []

    def probe() -> list[int]:
        calls.append(1)
        return [8000]

    gpu = LocalGpu(1000, probe=probe, cache_seconds=2)
    gpu.check(T0)
    gpu.check(T0 + 1)
    gpu.check(T0 + 2)
    assert len(calls) == 2


def test_missing_nvidia_smi_is_unavailable_not_an_exception() -> None:
    gpu = LocalGpu(3300, probe=nvidia_smi_probe("nvidia-smi-not-installed-here --query-gpu=x"))
    v = gpu.check(T0)
    assert not v.available
    assert v.reason.startswith("GPU probe failed: 'nvidia-smi-not-installed-here' not found")
    # The real default probe on this machine (no GPU here): a verdict either way, never raises.
    assert isinstance(LocalGpu(3300).check(T0), Verdict)


def test_gpu_probe_raising_anything_is_unavailable() -> None:
    def broken() -> list[int]:
        raise RuntimeError("driver hiccup")

    assert "driver hiccup" in LocalGpu(10, probe=broken).check(T0).reason


RESIDENTS = {
    "bge-m3": GpuResidency(vram_mb=1200, never_evict=True, co_residency_group="house-gpu"),
    "reranker": GpuResidency(vram_mb=1000, never_evict=True, co_residency_group="house-gpu"),
    "gemma-local": GpuResidency(vram_mb=3300, co_residency_group="house-gpu"),
    "qwen-small": GpuResidency(vram_mb=2000, co_residency_group="house-gpu"),
    "big-local": GpuResidency(vram_mb=6000, co_residency_group="solo"),
    "loose": GpuResidency(vram_mb=500),
}


def test_preload_check_refuses_to_evict_never_evict_models() -> None:
    reg = GpuResidents(RESIDENTS, loaded={"bge-m3", "reranker", "qwen-small"})
    # 8 GB card: 1200 + 1000 + 2000 loaded → ~3900 free; gemma needs 3300 + 256.
    assert reg.preload_check("gemma-local", 3900, need_mb=3556).available
    # Short of room: qwen-small is evictable and unloading it makes room.
    plan = reg.plan("gemma-local", 2000, need_mb=3556)
    assert plan.verdict.available and plan.evict == ("qwen-small",)
    # Still short after unloading qwen-small: only the never-evict pair could make room.
    v = reg.preload_check("gemma-local", 1000, need_mb=3556)
    assert not v.available
    assert v.reason.startswith("would evict never-evict model: bge-m3, reranker")
    # No amount of eviction helps: plain shortage.
    v = reg.preload_check("gemma-local", 0, need_mb=9000)
    assert v.reason == "not enough free VRAM: need 9000 MiB, free 0 MiB"


def test_preload_check_co_residency_groups() -> None:
    reg = GpuResidents(RESIDENTS, loaded={"bge-m3", "reranker"})
    v = reg.preload_check("big-local", 7000)  # plenty of room, but another group is resident
    assert not v.available
    assert "bge-m3 (group house-gpu)" in v.reason and "big-local (group solo)" in v.reason
    reg.set_loaded({"big-local"})
    plan = reg.plan("gemma-local", 1000)  # big-local is of another group: it goes
    assert plan.verdict.available and plan.evict == ("big-local",)
    reg.set_loaded({"big-local", "loose"})
    assert reg.plan("loose", 0).verdict.reason == "loose is already resident"
    assert not reg.preload_check("nobody", 9999).available


def test_local_gpu_with_residency_policy() -> None:
    reg = GpuResidents.from_cards([], loaded=())
    assert reg.residents == {}
    reg = GpuResidents(RESIDENTS)
    gpu = LocalGpu(
        3300,
        headroom_mb=256,
        probe=fixed(2000),
        model="gemma-local",
        residents=reg,
        loaded_probe=lambda: ["bge-m3", "reranker"],
    )
    v = gpu.check(T0)
    assert not v.available and reason_key(v.reason) == "would evict never-evict model"
    gpu2 = LocalGpu(
        3300,
        probe=fixed(100),
        model="gemma-local",
        residents=reg,
        loaded_probe=lambda: ["gemma-local", "bge-m3"],
    )
    assert gpu2.check(T0).available  # already resident: no room needed


def test_gpu_from_card() -> None:
    c = card(
        [{"shape": "gpu", "vram_mb": 3300, "headroom_mb": 256}],
        gpu={"vram_mb": 3300, "co_residency_group": "house-gpu"},
    )
    avail = card_availability(c, probes=Probes(gpu_free=fixed(2000)))
    v = avail.check(T0)
    assert v.reason == "not enough free VRAM: need 3556 MiB, free 2000 MiB"


# -- human hours ------------------------------------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")


def ts(y: int, mo: int, d: int, h: int, mi: int, tz: ZoneInfo = BERLIN) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=tz).timestamp()


def test_hours_open_and_closed_with_next_opening() -> None:
    spec = HoursSpec(timezone="Europe/Berlin", start="08:00", end="23:30")
    hours = HumanHours(spec)
    assert hours.check(ts(2027, 1, 15, 12, 0)).available
    v = hours.check(ts(2027, 1, 15, 23, 45))
    assert not v.available
    assert v.reason == "outside waking hours: 08:00-23:30 Europe/Berlin"
    assert v.until == ts(2027, 1, 16, 8, 0)
    assert hours.check(ts(2027, 1, 16, 7, 59)).until == ts(2027, 1, 16, 8, 0)  # cached, same
    assert hours.check(ts(2027, 1, 16, 8, 0)).available


def test_hours_across_midnight() -> None:
    spec = HoursSpec(timezone="Europe/Berlin", start="22:00", end="02:00", days=["fri"])
    hours = HumanHours(spec)
    # Friday 2027-01-15.
    assert hours.check(ts(2027, 1, 15, 23, 0)).available
    assert hours.check(ts(2027, 1, 16, 1, 59)).available  # Saturday, still Friday's night
    v = hours.check(ts(2027, 1, 16, 2, 0))
    assert not v.available and v.until == ts(2027, 1, 22, 22, 0)  # next Friday
    assert hours.check(ts(2027, 1, 15, 21, 59)).until == ts(2027, 1, 15, 22, 0)


def test_hours_next_opening_across_dst() -> None:
    spec = HoursSpec(timezone="Europe/Berlin", start="08:00", end="09:00")
    # The night clocks go forward (2027-03-28).
    v = HumanHours(spec).check(ts(2027, 3, 27, 20, 0))
    assert v.until == ts(2027, 3, 28, 8, 0)


def test_hours_vacation() -> None:
    spec = HoursSpec(timezone="UTC", start="00:00", end="23:59", vacation=True)
    v = HumanHours(spec).check(T0)
    assert not v.available and reason_key(v.reason) == "on vacation" and v.until is None


# -- composition ------------------------------------------------------------------------


class Fixed:
    """A shape with a fixed verdict, counting its checks."""

    def __init__(self, verdict: Verdict, probing: bool = False) -> None:
        self.verdict = verdict
        self.probing = probing
        self.checks = 0

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        self.checks += 1
        return self.verdict

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        pass

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        pass


def test_composition_first_reason_latest_until() -> None:
    a = Fixed(Verdict.no("quota spent: x", T0 + 10))
    b = Fixed(Verdict.ok())
    c = Fixed(Verdict.no("budget spent: y", T0 + 99))
    d = Fixed(Verdict.no("outside waking hours: z"))
    v = Availability([a, b, c, d]).check(T0)
    assert v == Verdict(False, "quota spent: x", T0 + 99)
    assert Availability([b, AlwaysOn()]).check(T0) == Verdict.ok()
    assert Availability([d]).check(T0).until is None


def test_composition_skips_probes_when_a_local_shape_refuses() -> None:
    probe = Fixed(Verdict.ok(), probing=True)
    spent = Fixed(Verdict.no("quota spent: x", T0 + 10))
    assert not Availability([probe, spent]).check(T0).available
    assert probe.checks == 0
    v = Availability([Fixed(Verdict.no("asleep: n"), probing=True), Fixed(Verdict.ok())]).check(T0)
    assert v.reason == "asleep: n"


def test_composition_of_real_shapes_from_a_card() -> None:
    node = FakeNode()
    c = card(
        [
            {"shape": "hours", "timezone": "UTC", "start": "08:00", "end": "20:00"},
            {"shape": "budget", "usd": 1, "period": "1d"},
            {
                "shape": "on_demand",
                "health_url": "http://127.0.0.1:9/health",
                "wake_url": "http://127.0.0.1:9/wake",
            },
        ]
    )
    avail = card_availability(c, probes=Probes(health=node.probe, wake=node.wake))
    assert [type(s).__name__ for s in avail.shapes] == [
        "HumanHours",
        "CostBudget",
        "OnDemand",
        "RateLimitBackoff",
    ]
    noon = datetime(2027, 1, 15, 12, 0, tzinfo=UTC).timestamp()
    assert reason_key(avail.check(noon).reason) == "asleep"
    node.healthy = True
    assert avail.check(noon + 10).available
    avail.record(noon + 10, cost_usd=1.5)
    v = avail.check(noon + 20)
    assert reason_key(v.reason) == "budget spent" and v.until == noon + 10 + D
    # At night both hours and budget refuse: hours comes first, budget's until is later.
    night = datetime(2027, 1, 15, 22, 0, tzinfo=UTC).timestamp()
    v = avail.check(night)
    assert reason_key(v.reason) == "outside waking hours" and v.until == noon + 10 + D


def test_the_repository_cards_build() -> None:
    from fabric.cards import load_cards
    from tests.conftest import ROOT

    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    residents = GpuResidents.from_cards(cards)
    node = FakeNode()
    for c in cards:
        avail = card_availability(
            c, probes=Probes(health=node.probe, wake=node.wake, gpu_free=fixed(8000), residents=residents)
        )
        assert avail.queue == c.queue_name
        assert isinstance(avail.check(T0), Verdict)
        json.dumps(avail.snapshot())


# -- snapshot / restore -----------------------------------------------------------------


def kimi_like() -> Availability:
    return Availability(
        [QuotaWindow(60, 5 * H, second_limit=300, second_window=7 * D), CostBudget(5.0, 7 * D)], queue="kimi"
    )


def test_snapshot_restore_round_trip_through_json() -> None:
    a = kimi_like()
    for i in range(60):
        a.record(T0 + i, cost_usd=0.01)
    a.on_rate_limited(T0 + 100, 50.0, None)
    before = a.check(T0 + 101)
    data = json.loads(json.dumps(a.snapshot()))
    b = kimi_like()
    assert b.restore(data) is True
    assert b.check(T0 + 101) == before
    assert b.snapshot() == a.snapshot()
    assert reason_key(b.check(T0 + 200).reason) == "quota spent"


@pytest.mark.parametrize(
    "corrupt",
    [
        None,
        "garbage",
        [],
        {},
        {"version": 2, "shapes": []},
        {"version": 1, "shapes": "nope"},
        {"version": 1, "shapes": [{"kind": "quota", "state": {}}]},  # wrong number of shapes
        {
            "version": 1,
            "shapes": [
                {"kind": "budget", "state": {"spend": []}},  # wrong order
                {"kind": "quota", "state": {"calls": [], "backoff": {}}},
                {"kind": "rate_limit", "state": {}},
            ],
        },
        {
            "version": 1,
            "shapes": [
                {"kind": "quota", "state": {"calls": [T0, "x"], "backoff": {}}},
                {"kind": "budget", "state": {"spend": [[T0, 1.0]]}},
            ],
        },
        {
            "version": 1,
            "shapes": [
                {
                    "kind": "quota",
                    "state": {
                        "calls": [T0] * 60,
                        "backoff": {"parked_until": None, "streak": 0, "announced": False},
                    },
                },
                {"kind": "budget", "state": {"spend": [[T0, float("nan")]]}},
            ],
        },  # second shape bad
        {
            "version": 1,
            "shapes": [
                {
                    "kind": "quota",
                    "state": {
                        "calls": [],
                        "backoff": {"parked_until": "tomorrow", "streak": 0, "announced": False},
                    },
                },
                {"kind": "budget", "state": {"spend": []}},
            ],
        },
        {"version": 1, "shapes": [{"kind": "quota", "state": None}, {"kind": "budget", "state": 3}]},
    ],
)
def test_corrupted_snapshot_is_ignored(corrupt: object) -> None:
    a = kimi_like()
    assert a.restore(corrupt) is False
    assert a.snapshot() == kimi_like().snapshot()  # fresh: nothing half-applied
    assert a.check(T0).available


def test_restore_after_a_failed_restore_keeps_existing_state() -> None:
    a = kimi_like()
    a.record(T0, cost_usd=1.0)
    saved = a.snapshot()
    assert a.restore({"version": 1, "shapes": "bad"}) is False
    assert a.snapshot() == saved


def test_snapshot_of_probing_shapes() -> None:
    node = FakeNode()
    od = OnDemand("http://x/health", probe=node.probe, wake=node.wake, wake_timeout=100)
    a = Availability([od])
    a.check(T0)
    data = json.loads(json.dumps(a.snapshot()))
    node2 = FakeNode()
    od2 = OnDemand("http://x/health", probe=node2.probe, wake=node2.wake, wake_timeout=100)
    b = Availability([od2])
    assert b.restore(data)
    b.check(T0 + 50)
    assert node2.wakes == 0  # the restart does not re-wake inside the wake timeout


# -- park state -------------------------------------------------------------------------


def test_park_tracker_publishes_transitions_only() -> None:
    t = ParkTracker("kimi")
    first = t.update(Verdict.ok(), T0)
    assert first == ParkState("kimi", False, "", None, T0)
    assert t.update(Verdict.ok(), T0 + 2) is None
    parked = t.update(Verdict.no("quota spent: 60 of 60 per 5h", T0 + 100), T0 + 4)
    assert parked == ParkState("kimi", True, "quota spent: 60 of 60 per 5h", T0 + 100, T0 + 4)
    assert t.update(Verdict.no("quota spent: 60 of 60 per 5h", T0 + 100), T0 + 6) is None
    # Same kind of reason, fresher detail: not a transition, but the state follows it.
    assert t.update(Verdict.no("quota spent: 61 of 60 per 5h", T0 + 160), T0 + 8) is None
    assert t.state is not None and t.state.until == T0 + 160 and t.state.since == T0 + 4
    moved = t.update(Verdict.no("rate limited: provider asked", T0 + 300), T0 + 10)
    assert moved is not None and moved.reason.startswith("rate limited") and moved.since == T0 + 10
    back = t.update(Verdict.ok(), T0 + 400)
    assert back == ParkState("kimi", False, "", None, T0 + 400)
    assert back.to_dict()["parked"] is False


def test_park_changed() -> None:
    running = ParkState("q", False, since=T0)
    parked = ParkState("q", True, "asleep: a", None, T0)
    assert park_changed(None, running)
    assert park_changed(running, parked)
    assert not park_changed(parked, ParkState("q", True, "asleep: b", T0 + 5, T0 + 1))
    assert park_changed(parked, ParkState("q", True, "unhealthy: b", None, T0 + 1))
    assert not park_changed(running, ParkState("q", False, since=T0 + 9))


def test_slots_may_share_one_availability() -> None:
    import threading

    a = kimi_like()
    errors: list[BaseException] = []

    def slot(offset: float) -> None:
        try:
            for i in range(300):
                a.record(T0 + offset + i, cost_usd=0.0001)
                a.check(T0 + offset + i)
                a.snapshot()
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=slot, args=(k * 0.5,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
