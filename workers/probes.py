"""A worker's probes of a(t): nodes that sleep (health, wake) and local GPUs (free VRAM).

The model of a(t) (verdicts, composition, the calendar shapes, park states) is
:mod:`fabric.availability`; the call counters are :mod:`workers.quota`. The shapes here
ask the outside world, so :class:`~fabric.availability.Availability` runs them only once
every local shape allows. Their probes are injected callables with real defaults
(:class:`Probes`), so tests need no sleeps and no network; a probe that fails is an
*unavailable* verdict with a readable reason, never an exception out of ``check``.
:func:`card_availability` composes a card's a(t) with all of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabric.availability import (
    Availability,
    Shape,
    ShapeBase,
    Verdict,
    calendar_shape,
    fmt_duration,
    opt_finite,
)
from fabric.cards import (
    AvailabilitySpec,
    BudgetSpec,
    Card,
    CardSet,
    GpuResidency,
    GpuSpec,
    OnDemandSpec,
    QuotaSpec,
)
from fabric.cards.backbone import backbone_choices
from fabric.plain import Plain
from workers.backbone import Backbones, Endpoint
from workers.endpoint import endpoint_card, endpoint_shapes
from workers.quota import CostBudget, QuotaWindow
from workers.shared_quota import Across

if TYPE_CHECKING:
    import urllib.request

# subprocess, shlex and urllib.request (which brings http.client, email and ssl) are
# imported where a probe or a wake runs: a worker whose cards have neither starts without.

__all__ = [
    "DEFAULT_GPU_PROBE",
    "GpuProbeError",
    "GpuResidents",
    "LocalGpu",
    "OnDemand",
    "PreloadPlan",
    "Probes",
    "card_availability",
    "command_waker",
    "http_health_probe",
    "nvidia_smi_probe",
    "parse_free_mib",
    "url_waker",
    "worker_shape",
]

DEFAULT_GPU_PROBE = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"


# ---------------------------------------------------------------------------------------
# on-demand

#: ``(url, timeout_seconds) -> (healthy, detail)``
HealthProbe = Callable[[str, float], tuple[bool, str]]
#: Fires a wake; raises on failure (the message becomes part of the reason).
WakeHook = Callable[[], None]


@cache
def _direct() -> urllib.request.OpenerDirector:
    import urllib.request  # here: see the note at the top

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_health_probe(url: str, timeout: float) -> tuple[bool, str]:
    """HTTP GET ``url`` directly (no proxy); healthy on a 2xx answer within ``timeout``."""
    import urllib.error  # here: see the note at the top
    import urllib.request  # here: see the note at the top

    try:
        with _direct().open(urllib.request.Request(url, method="GET"), timeout=timeout) as resp:
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
        import shlex  # here: see the note at the top
        import subprocess  # here: see the note at the top

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
        import urllib.error  # here: see the note at the top
        import urllib.request  # here: see the note at the top

        request = urllib.request.Request(url, data=b"", method="POST")
        try:
            with _direct().open(request, timeout=timeout) as resp:
                status = int(resp.status)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"wake URL answered HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"wake URL failed: {exc}") from None
        if not 200 <= status < 300:
            raise RuntimeError(f"wake URL answered HTTP {status}")

    return wake


class OnDemand(ShapeBase):
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
        waking = f"wake sent {fmt_duration(now - sent)} ago"
        if self.wake_error:
            waking = f"wake failed ({self.wake_error}), retrying after {fmt_duration(self.wake_timeout)}"
        self._last = Verdict.no(f"asleep: {self.health_url} {detail}; {waking}", self._next_probe)
        return self._last

    def _wake_due(self, now: float) -> bool:
        return self.wake is not None and (self.last_wake is None or now - self.last_wake >= self.wake_timeout)

    def snapshot(self) -> dict[str, Any]:
        return {"last_wake": self.last_wake}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.last_wake = opt_finite(state["last_wake"])


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
        import shlex  # here: see the note at the top
        import subprocess  # here: see the note at the top

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


class PreloadPlan(Plain):
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
        clash = self._clashing(others, group)
        clash_pinned = [m for m in clash if self._pinned(m)]
        if clash_pinned:
            return PreloadPlan(
                Verdict.no(
                    "would evict never-evict model: "
                    + ", ".join(f"{m} (group {self._group(m)})" for m in clash_pinned)
                    + f" may not share the GPU with {model} (group {group})"
                )
            )
        return self._make_room(others, clash, free_mb, need_mb)

    def _clashing(self, others: Sequence[str], group: str | None) -> list[str]:
        """Loaded models of another group: they must go whatever the free VRAM."""
        return [
            m
            for m in others
            if group is not None
            and (r := self.residents.get(m)) is not None
            and r.co_residency_group is not None
            and r.co_residency_group != group
        ]

    def _make_room(
        self, others: Sequence[str], clash: Sequence[str], free_mb: int, need_mb: int
    ) -> PreloadPlan:
        """Evict the clashing models, then the biggest evictable ones, until ``need_mb`` fits."""
        evict = list(clash)
        room = free_mb + sum(self._size(m) for m in clash)
        if room >= need_mb:
            return PreloadPlan(Verdict.ok(_evicting(evict)), tuple(evict))
        evictable = (m for m in others if m not in clash and not self._pinned(m))
        for m in sorted(evictable, key=self._size, reverse=True):
            evict.append(m)
            room += self._size(m)
            if room >= need_mb:
                return PreloadPlan(Verdict.ok(_evicting(evict)), tuple(evict))
        blocking = [m for m in others if self._pinned(m)]
        need = f"need {need_mb} MiB, free {free_mb} MiB"
        if blocking and room + sum(self._size(m) for m in blocking) >= need_mb:
            return PreloadPlan(
                Verdict.no(
                    f"would evict never-evict model: {', '.join(blocking)} ({need}, "
                    f"{room} MiB even after unloading every evictable model)"
                )
            )
        return PreloadPlan(Verdict.no(f"not enough free VRAM: {need}"))

    def _size(self, model: str) -> int:
        r = self.residents.get(model)
        return r.vram_mb if r else 0

    def _pinned(self, model: str) -> bool:
        r = self.residents.get(model)
        return bool(r and r.never_evict)

    def preload_check(self, model: str, free_mb: int, *, need_mb: int | None = None) -> Verdict:
        """The verdict of :meth:`plan`: refuses when the only way to make room would evict
        a never-evict model (naming it), or when there is no room at all."""
        return self.plan(model, free_mb, need_mb=need_mb).verdict

    def _group(self, model: str) -> str:
        r = self.residents.get(model)
        return (r.co_residency_group if r else None) or "none"


def _evicting(models: Sequence[str]) -> str:
    return f"evicts {', '.join(models)}" if models else ""


class LocalGpu(ShapeBase):
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
# A worker's a(t), from its card


class Probes(Plain, frozen=False):
    """Probes to use instead of the real ones (tests, or a worker sharing one residency
    registry across its GPU models). None means the default for the card."""

    health: HealthProbe | None = None
    wake: WakeHook | None = None
    gpu_free: GpuProbe | None = None
    gpu_loaded: Callable[[], Iterable[str]] | None = None
    residents: GpuResidents | None = None


def worker_shape(card: Card, spec: AvailabilitySpec, probes: Probes) -> Shape | None:
    """The shape of any availability entry, with ``probes`` (or the real ones)."""
    if isinstance(spec, QuotaSpec):
        return QuotaWindow.from_spec(spec)
    if isinstance(spec, BudgetSpec):
        return CostBudget.from_spec(spec)
    if isinstance(spec, OnDemandSpec):
        return OnDemand.from_spec(spec, probe=probes.health, wake=probes.wake)
    if isinstance(spec, GpuSpec):
        residents = probes.residents
        if residents is None and card.gpu is not None:
            residents = GpuResidents({card.id: card.gpu})
        return LocalGpu.from_spec(
            spec,
            model=card.id,
            probe=probes.gpu_free,
            residents=residents,
            loaded_probe=probes.gpu_loaded,
        )
    return calendar_shape(card, spec)


def card_availability(
    card: Card,
    *,
    probes: Probes | None = None,
    cards: CardSet | None = None,
    ledger_dir: Path | None = None,
    skip: frozenset[str] = frozenset(),
    across: Across | None = None,
) -> Availability:
    """A worker's composed a(t) for ``card``: every shape on it, probes included.

    With ``ledger_dir``, the counters are the model endpoint's, shared by every caller on
    the host (:mod:`workers.endpoint`): the shapes of the card serving ``card``'s model
    come first, then ``card``'s own. Shapes named in ``skip`` are left out. With
    ``across``, quotas declared ``across_hosts`` are kept on the board too.
    """
    p = probes or Probes()

    def make(c: Card, spec: AvailabilitySpec) -> Shape | None:
        return None if spec.shape in skip else worker_shape(c, spec, p)

    if ledger_dir is None:
        return Availability.from_card(card, shape_of=make)
    backbones = persona_backbones(card, cards, ledger_dir, make, across)
    if backbones is not None:
        own = endpoint_shapes(card, ledger_dir, make, park_429=False, across=across)
        return Availability([*own, backbones], queue=card.queue_name)
    endpoint = endpoint_card(card, cards)
    shapes = endpoint_shapes(endpoint, ledger_dir, make, across=across)
    if endpoint is not card:
        shapes += endpoint_shapes(card, ledger_dir, make, park_429=False, across=across)
    return Availability(shapes, queue=card.queue_name)


def persona_backbones(
    card: Card,
    cards: CardSet | None,
    ledger_dir: Path,
    make: Callable[[Card, AvailabilitySpec], Shape | None],
    across: Across | None = None,
) -> Backbones | None:
    """A persona's backbones from its constraints, each with its endpoint's shared a(t);
    None when its backbone is pinned (``backbone.model``) or it has none."""
    if cards is None or card.backbone is None or card.backbone.constraints is None:
        return None
    endpoints = []
    for choice in backbone_choices(card, cards):
        if not choice.eligible or not choice.card.runtime.model:
            continue
        model = choice.card
        runtime = replace(
            card.runtime,
            model=model.runtime.model,
            api_base=model.runtime.api_base,
            api_key_env=model.runtime.api_key_env,
        )
        av = Availability(endpoint_shapes(model, ledger_dir, make, across=across), queue=card.queue_name)
        endpoints.append(Endpoint(replace(card, runtime=runtime), model, av, choice.why))
    # The card's own model (the one the eval gate last passed, see fabric.cards.backbone)
    # goes first; the others fit too and run when it is parked.
    endpoints.sort(key=lambda e: e.card.runtime.model != card.runtime.model)
    if endpoints and endpoints[0].why != "closest fit":
        endpoints[0] = replace(endpoints[0], why="gated by the eval (a closer fit is not yet)")
    return Backbones(endpoints) if endpoints else None
