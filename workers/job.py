"""What an executor receives (a :class:`Job`) and returns (a :class:`JobOutcome`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import field, replace
from typing import Literal, Protocol

from fabric.ledger import Effect, Fenced, Lease, Ledger
from fabric.plain import Plain


class Job(Plain, frozen=False):
    """A claimed task handed to an executor, with the hooks it may need while running."""

    lease: Lease
    ledger: Ledger
    fenced: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    # The board has been unreachable past the outage grace: finish only what is running
    # and reversible, start no side effect (it could not be checked against the lease).
    outage: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[str], None] = lambda detail: None
    # Renewals (heartbeat thread) and checkpoints (executor) both rewrite the owner's
    # record: one at a time, always from the latest lease, so neither erases the other.
    lease_lock: threading.Lock = field(default_factory=threading.Lock)

    def progress(self, detail: str) -> None:
        """Report progress (published as a live event; never written to the board)."""
        self.on_progress(detail)

    @property
    def should_stop(self) -> bool:
        """True when the executor should wind down (fenced, or the worker is stopping)."""
        return self.fenced.is_set() or self.stopping.is_set() or self.outage.is_set()

    def checkpoint(self, ref: str) -> None:
        """Record how far the work got (a ref); a new owner after a requeue resumes there.

        Raises :class:`~fabric.ledger.Fenced` (and sets ``fenced``) when the task has moved on.
        """
        try:
            with self.lease_lock:
                self.lease = self.ledger.checkpoint(self.lease, ref)
        except Fenced:
            self.fenced.set()
            raise

    @property
    def resume_from(self) -> str | None:
        """The checkpoint this epoch starts from (None: from scratch)."""
        return self.lease.checkpoint

    def effect(self, op: str) -> Effect:
        """Check ownership and record the intent of side effect ``op``; get its stable key.

        Under the lease lock: a claim whose record is not written yet has it written by
        this check (Ledger.check), which must not race the heartbeat's own first write
        of that record (two inserts of one metadata key: one fails on a real Kanboard).
        Raises :class:`~fabric.ledger.Fenced` (and sets ``fenced``) when the task has
        moved on: the effect must not happen.
        """
        try:
            with self.lease_lock:
                effect = self.ledger.effect(self.lease, op)
                if not self.lease.recorded:
                    self.lease = replace(self.lease, recorded=True)
        except Fenced:
            self.fenced.set()
            raise
        return effect

    def effect_done(self, effect: Effect, receipt: str) -> None:
        """Record the receipt of a side effect so no later owner repeats it.

        It goes into the owner's record, as renewals do (hence the lock). Raises
        :class:`~fabric.ledger.Fenced` (and sets ``fenced``) when the epoch has ended:
        then the receipt does not count, and a new owner repeats the effect.
        """
        try:
            with self.lease_lock:
                self.lease = self.ledger.effect_done(self.lease, effect, receipt)
        except Fenced:
            self.fenced.set()
            raise


class JobOutcome(Plain):
    """How an execution ended."""

    kind: Literal["done", "failed", "poison", "ask", "released"]
    result_ref: str | None = None
    reason: str = ""
    question: str = ""
    human: str | None = None
    evidence: str = ""  # what to keep if the owner turns out fenced
    stored: str | None = None  # a copy of that output already stored (named in the evidence)
    cost_usd: float = 0.0  # model spend of this execution
    note: str = ""  # recorded with the completion (which backbone ran it, and why)

    @classmethod
    def done(cls, result_ref: str, evidence: str = "", cost_usd: float = 0.0, note: str = "") -> JobOutcome:
        evidence = evidence or result_ref
        return cls("done", result_ref=result_ref, evidence=evidence, cost_usd=cost_usd, note=note)

    @classmethod
    def failed(cls, reason: str, *, poison: bool = False) -> JobOutcome:
        return cls("poison" if poison else "failed", reason=reason)

    @classmethod
    def ask(cls, question: str, human: str | None = None) -> JobOutcome:
        return cls("ask", question=question, human=human)

    @classmethod
    def released(cls, reason: str = "worker stopping") -> JobOutcome:
        return cls("released", reason=reason)


class Executor(Protocol):
    """Runs one job. Must return (not raise) for expected failures; may raise for bugs."""

    def __call__(self, job: Job) -> JobOutcome: ...
