"""A quota kept on the board, so that every host draining one model meets one limit.

A card declares it (``across_hosts: true`` on a ``quota`` entry); its worker then counts
each call twice: first in the host's own endpoint ledger (:mod:`workers.endpoint`, the
fast path: a host that has spent the quota by itself never asks the board), then by
taking a slot on the board (:mod:`fabric.sharedquota`, stored by
:mod:`fabric.kanboard.quotas`), which is what holds the limit across hosts.

Round trips per call: admitting takes one (a batch of one ``createTag`` per cap) when the
host's view of the slots is fresh and right; a lost race or a view older than
:data:`~fabric.sharedquota.VIEW_MAX_AGE` adds one read and a retry. Settling a call costs
nothing; giving a slot back (a 429, an unreachable model) costs one. While the view says
the quota is spent, :meth:`BoardQuota.check` reads the board again at most once per
``refresh`` seconds (to see slots the keeper gave back); the rest of the time a(t) is
answered from memory.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fabric.availability import ShapeBase, Verdict
from fabric.cards import Card, QuotaSpec
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError
from fabric.kanboard.quotas import QuotaStore, SlotRef, SlotTag, model_key
from fabric.sharedquota import HOLDER, VIEW_MAX_AGE, Cap, SlotTable

__all__ = ["Across", "BoardQuota"]

log = logging.getLogger("agap.worker")


def _reserve(limit: int, fraction: float) -> int:
    return max(0, math.ceil(limit * fraction - 1e-9))


class BoardQuota(ShapeBase):
    """The across-hosts half of a quota entry: slots on the board (see the module doc)."""

    kind = "shared_quota"
    #: It may read the board, so it is asked only when every local shape allows: a host
    #: that spent the quota by itself (its own ledger says so) never asks the board.
    probing = True

    def __init__(
        self,
        key: str,
        caps: Sequence[Cap],
        store: Callable[[], QuotaStore],
        *,
        reserve_interactive: float = 0.0,
        refresh: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        tries: int = 4,
    ) -> None:
        self.key = key
        self.caps = list(caps)
        self._store_of = store
        self._store: QuotaStore | None = None
        self.reserve_interactive = reserve_interactive
        self.refresh = refresh
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.tries = tries
        self._table: SlotTable | None = None
        self._read_at = -math.inf
        self._held: dict[float, list[SlotRef]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # board reads made (what the bench reports)

    # -- the view ---------------------------------------------------------------------------

    def _store_now(self) -> QuotaStore:
        if self._store is None:
            self._store = self._store_of()
        return self._store

    def _read(self) -> SlotTable:
        tags = self._store_now().read().get(self.key, [])
        self.reads += 1
        self._table = SlotTable.of(self.caps, tags)
        self._read_at = self.monotonic()
        return self._table

    def _age(self) -> float:
        return self.monotonic() - self._read_at

    def _view(self) -> SlotTable:
        if self._table is None or self._age() > VIEW_MAX_AGE:
            return self._read()
        return self._table

    def _reserves(self, interactive: bool) -> list[int]:
        if interactive:
            return [0] * len(self.caps)
        return [_reserve(c.limit, self.reserve_interactive) for c in self.caps]

    def _refusal(self, table: SlotTable, now: float, interactive: bool) -> Verdict | None:
        picks, why, until = table.pick(now, self._reserves(interactive), self.rng)
        if picks:
            return None
        # Look again when the view may have gone stale: a slot may have been given back.
        again = now + max(0.0, self.refresh - self._age())
        return Verdict.no(why, again if until is None else min(until, again))

    def _unreachable(self, exc: Exception, now: float) -> Verdict:
        what = exc.line() if isinstance(exc, FabricError) else str(exc)
        log.warning("%s: shared quota not readable: %s", self.key, what)
        return Verdict.no(f"shared quota unreadable: {what}", now + max(1.0, self.refresh))

    # -- the shape ----------------------------------------------------------------------------

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        with self._lock:
            try:
                table = self._view()
                refusal = self._refusal(table, now, interactive)
                if refusal is not None and self._age() >= self.refresh:
                    refusal = self._refusal(self._read(), now, interactive)
            except (BoardError, FabricError) as exc:
                return self._unreachable(exc, now)
            return refusal or Verdict.ok()

    def admit(self, now: float, *, interactive: bool = False) -> Verdict:
        with self._lock:
            try:
                return self._admit(now, interactive)
            except (BoardError, FabricError) as exc:
                return self._unreachable(exc, now)

    def _admit(self, now: float, interactive: bool) -> Verdict:
        table = self._view()
        fresh = self._age() < self.refresh
        for _ in range(self.tries):
            picks, _, _ = table.pick(now, self._reserves(interactive), self.rng)
            if not picks:
                if not fresh:  # spent as far as an old view knows: look once more
                    table, fresh = self._read(), True
                    continue
                refusal = self._refusal(table, now, interactive)
                assert refusal is not None
                return refusal
            won = self._store_now().take(self.key, picks, HOLDER.get(), now)
            for tag in won:
                if tag is not None:
                    table.put(tag)
            if all(t is not None for t in won):
                self._forget_old(now)
                self._held.setdefault(now, []).extend(picks)
                return Verdict.ok()
            self._give_back([t.ref for t in won if t is not None], now)
            table, fresh = self._read(), True  # lost a race: see who took what
        return Verdict.no("quota contended across hosts: no slot won, trying again", now + 1.0)

    def _give_back(self, refs: list[SlotRef], now: float) -> None:
        if not refs:
            return
        try:
            self._store_now().give_back(self.key, refs, "r", now)
        except BoardError as exc:  # the slots stay busy for their window: the safe side
            log.warning("%s: %d shared quota slots not given back (%s)", self.key, len(refs), exc)
            return
        if self._table is not None:
            for ref in refs:
                self._table.given_back(ref)

    def refund(self, at: float) -> None:
        with self._lock:
            refs = self._held.pop(at, [])
            self._give_back(refs, at)

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        return None  # the call ran: its slots stay taken for their window, nothing to write

    def _forget_old(self, now: float) -> None:
        """Held slots outside every window can no longer be given back usefully."""
        longest = max(c.window for c in self.caps)
        for at in [a for a in self._held if a <= now - longest]:
            del self._held[at]

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        return {}  # the board is the state

    def seen(self) -> list[SlotTag]:
        """The reservations in this host's view (for tests and ``agap doctor``)."""
        return [] if self._table is None else list(self._table.heads.values())


class Across:
    """How a worker reaches the shared quotas: the board's quota store (made on first use)
    and the refresh interval. One per process: every quota shape of a model shares it."""

    def __init__(self, store: Callable[[], QuotaStore], *, refresh: float = 30.0) -> None:
        self._make = store
        self._store: QuotaStore | None = None
        self._lock = threading.Lock()
        self.refresh = refresh

    def store(self) -> QuotaStore:
        with self._lock:
            if self._store is None:
                self._store = self._make()
            return self._store

    def shape(self, card: Card, spec: QuotaSpec) -> BoardQuota:
        caps = [Cap(spec.limit, spec.window_seconds)]
        if spec.second_limit is not None and spec.second_window_seconds is not None:
            caps.append(Cap(spec.second_limit, spec.second_window_seconds))
        return BoardQuota(
            model_key(card.id),
            caps,
            self.store,
            reserve_interactive=spec.reserve_interactive,
            refresh=self.refresh,
        )
