"""a(t) for sync calls: the worker's availability, checked before and counted for every call.

A sync ``SendMessage`` spends the same quota, budget and 429 park as the agent's worker:
the counters are the model endpoint's ledger under ``$AGAP_STATE_DIR/endpoints/``
(:mod:`workers.endpoint`), built by the worker's own :func:`workers.assembly.availability_for`,
so a call made here is one call fewer for the worker, and a 429 met here parks the worker.

* :meth:`Admission.parked` is the early answer: when a(t) says no, ``SendMessage`` fails at
  once with what parks the agent and when it frees (nothing is counted, no task is made);
* :meth:`Admission.call` admits the call through the workers' own path
  (:func:`workers.admission.admit_call`: checked and counted in one step under the
  ledger's lock, so a worker and this server cannot both take the last call of a window;
  a persona's backbone chosen per call), makes it, then settles its cost, or gives the
  slot back when the provider never ran it.

Sync calls are interactive (a caller is waiting): they may use the ``reserve_interactive``
tail of a quota or budget that background work may not.

A quota the card declares ``across_hosts`` is counted on the board too, as the workers
count it (:mod:`workers.shared_quota`): a sync call takes a slot there after the host's
own ledger, so the server's calls and every host's workers meet one limit. A sync call
runs under no task lease, so its slot is tied to none (:mod:`fabric.kanboard.quotas`:
the ``<nonce>.<ms>`` colour): the server gives it back itself when the provider never ran
the call; if the server dies during the call, the keeper cannot tell whether it ran, so
the slot stays busy until its window ends (one call short, never one over).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from fabric.availability import Availability, Verdict, fmt_duration, fmt_time
from fabric.cards import Card, CardSet
from fabric.errors import FabricError
from workers.admission import admit_call
from workers.answer import Reply
from workers.assembly import availability_for
from workers.shared_quota import Across

R = TypeVar("R", bound=Reply)


class Parked(FabricError):
    """The agent's a(t) is 0: its quota or budget is spent, its provider said wait, it sleeps."""

    def __init__(self, agent: str, verdict: Verdict, now: float) -> None:
        self.agent, self.verdict, self.now = agent, verdict, now
        super().__init__(
            f"{agent} is parked ({verdict.reason}); {self.frees()}",
            hint="send with returnImmediately: true to queue the task until it frees",
        )

    def frees(self) -> str:
        until = self.verdict.until
        if until is None:
            return "when it frees is not known"
        return f"it frees at {fmt_time(until)} (in {fmt_duration(until - self.now)})"

    def data(self) -> dict[str, str]:
        """Machine-readable details for the A2A error (strings: they travel as ErrorInfo metadata)."""
        out = {"agent": self.agent, "reason": self.verdict.reason}
        if self.verdict.until is not None:
            out["availableAt"] = fmt_time(self.verdict.until)
            out["retryAfterSeconds"] = str(max(1, math.ceil(self.verdict.until - self.now)))
        return out


class Admission:
    """Each sync agent's a(t), built once; thread-safe (the ledger files are locked)."""

    def __init__(
        self,
        cards: CardSet,
        env: Mapping[str, str],
        state_dir: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        across: Across | None = None,
    ) -> None:
        self.cards = cards
        self.across = across  # the board's quota slots (None: local ledgers only)
        self.env = env
        self.state_dir = state_dir
        self.clock = clock
        self._by_agent: dict[str, Availability] = {}
        self._lock = threading.Lock()

    def availability(self, card: Card) -> Availability:
        with self._lock:
            av = self._by_agent.get(card.id)
            if av is None:
                av = self._by_agent[card.id] = availability_for(
                    card, self.env, self.cards, self.state_dir, self.across
                )
            return av

    def parked(self, card: Card) -> Parked | None:
        """Why ``card`` cannot take a sync call now (nothing is counted), or None."""
        now = self.clock()
        verdict = self.availability(card).check(now, interactive=True)
        return None if verdict.available else Parked(card.id, verdict, now)

    def call(self, card: Card, make: Callable[[Card], R]) -> R:
        """``make(card)`` (one model call, with the card to call: a persona's backbone is
        chosen per call) once a(t) admits it; raises :class:`Parked` if not."""
        now = self.clock()
        admitted = admit_call(self.availability(card), now, interactive=True)
        if isinstance(admitted, Verdict):  # a worker took the last call since parked() said yes
            raise Parked(card.id, admitted, now)
        try:
            reply = make(admitted.card(card))
        except BaseException as exc:
            admitted.failed(exc, self.clock(), charge_usd=card.max_cost_usd or 0.0)
            raise
        admitted.settle(self.clock(), cost_usd=reply.cost_usd)
        return reply
