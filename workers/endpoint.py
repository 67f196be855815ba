"""a(t) belongs to the model endpoint: one ledger per model, shared by every caller on the host.

A quota, a budget and a provider's 429 are facts about a model endpoint, not about the
queue that happens to call it. The kimi queue's worker, the adolf persona's worker (whose
backbone is the same ``openai/kimi-k2``), a second worker process and a sync A2A call all
spend the same 60 calls per 5 hours. So the counters of the endpoint's card (the model
card whose ``runtime.model`` a caller uses) live in one file per shape under
``$AGAP_STATE_DIR/endpoints/``, and every operation on them runs under an exclusive
``flock``: :meth:`~fabric.availability.Availability.admit` checks and counts a call in
one step, so neither two slots of one worker nor two processes can both take the last
call of a window, and a 429 parks the model for every caller at once.

The endpoint's probing shapes (a node's health and wake, a GPU) come along too, so any
queue whose work runs on a sleeping node wakes it. Workers on other hosts keep their own
files: they share the provider's quota only through its 429s (a restart, likewise, loses
nothing: the file is the state) — unless the quota is declared ``across_hosts``, which
keeps it on the board as well (:mod:`workers.shared_quota`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fabric.availability import Admitting, RateLimitBackoff, Shape, Verdict
from fabric.cards import BudgetSpec, Card, CardSet, QuotaSpec
from workers.shared_quota import Across

__all__ = ["SharedShape", "endpoint_card", "endpoint_shapes"]

log = logging.getLogger("agap.worker")

T = TypeVar("T")


class SharedShape:
    """One counting shape whose state is a file every process on this host shares.

    Each call loads the state under an exclusive lock, runs the inner shape's own logic,
    and writes the state back before letting go, so the inner shape never works on a
    stale copy. A file that does not parse is a fresh start (the provider's 429 corrects
    any call over quota that this may allow).
    """

    probing = False

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner = inner
        self.path = path
        self.kind: str = inner.kind
        self.handles_429: bool = bool(getattr(inner, "handles_429", False))
        self._fresh: dict[str, Any] = inner.snapshot()
        self._lock = threading.Lock()  # flock is per open file: threads need their own lock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path.with_suffix(".lock"), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                self._load()
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _load(self) -> None:
        try:
            state = json.loads(self.path.read_text())
            self.inner.restore(state)
        except FileNotFoundError:
            self.inner.restore(self._fresh)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable, starting fresh (%s)", self.path, exc)
            self.inner.restore(self._fresh)

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.inner.snapshot()))
        tmp.replace(self.path)

    def _run(self, fn: Callable[[], T], *, write: bool) -> T:
        with self._locked():
            out = fn()
            if write:
                self._save()
            return out

    # -- the shape ----------------------------------------------------------------------

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        return self._run(lambda: self.inner.check(now, interactive=interactive), write=False)  # type: ignore[no-any-return]

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        self._run(lambda: self.inner.record(now, cost_usd=cost_usd), write=True)

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        self._run(lambda: self.inner.on_rate_limited(now, retry_after, reset_at), write=True)

    # A wrapped shape that does not count at admission (a 429 park) only checks, and
    # records when the call is settled.
    def admit(self, now: float, *, interactive: bool = False) -> Verdict:
        inner = self.inner
        if isinstance(inner, Admitting):
            return self._run(lambda: inner.admit(now, interactive=interactive), write=True)
        return self.check(now, interactive=interactive)

    def refund(self, at: float) -> None:
        inner = self.inner
        if isinstance(inner, Admitting):
            self._run(lambda: inner.refund(at), write=True)

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        inner = self.inner
        if isinstance(inner, Admitting):
            self._run(lambda: inner.settle(now, cost_usd=cost_usd), write=True)
        else:
            self.record(now, cost_usd=cost_usd)

    # The file is the state: a worker's own snapshot carries nothing for this shape.
    def snapshot(self) -> dict[str, Any]:
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        return None


def endpoint_card(card: Card, cards: CardSet | None) -> Card:
    """The card whose a(t) governs ``card``'s model calls: itself for a model card, else
    the one model card with the same ``runtime.model`` (a persona's backbone), else itself."""
    if card.kind == "model" or cards is None or not card.runtime.model:
        return card
    same = [c for c in cards.models() if c.runtime.model == card.runtime.model]
    if len(same) > 1:
        log.warning(
            "%s: model %s is served by several cards (%s); its a(t) follows %s",
            card.id,
            card.runtime.model,
            ", ".join(c.id for c in same),
            same[0].id,
        )
    return same[0] if same else card


def _file_name(endpoint: Card, kind: str, index: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", endpoint.id)
    return f"{safe}.{kind}{index}.json"


def endpoint_shapes(
    card: Card,
    directory: Path,
    make: Callable[[Card, Any], Shape | None],
    *,
    park_429: bool = True,
    across: Across | None = None,
) -> list[Shape]:
    """``card``'s shapes: its quotas and budgets kept in ``directory`` and shared (and,
    with ``park_429``, a shared 429 park if no quota carries one); the others as ``make``
    builds them. A quota declared ``across_hosts`` is also kept on the board when
    ``across`` gives the way there (:mod:`workers.shared_quota`), after the host's own
    ledger: a host that spent the quota by itself never asks the board."""
    shapes: list[Shape] = []
    for i, spec in enumerate(card.availability):
        shape = make(card, spec)
        if shape is None:
            continue
        if isinstance(spec, QuotaSpec | BudgetSpec):
            shape = SharedShape(shape, directory / _file_name(card, spec.shape, i))
        shapes.append(shape)
        if isinstance(spec, QuotaSpec) and spec.across_hosts and across is not None:
            shapes.append(across.shape(card, spec))
    if park_429 and not any(getattr(s, "handles_429", False) for s in shapes):
        shapes.append(SharedShape(RateLimitBackoff(), directory / _file_name(card, "rate_limit", 0)))
    return shapes
