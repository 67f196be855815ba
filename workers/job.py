"""What an executor receives (a :class:`Job`) and returns (an :class:`Outcome`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fabric.ledger import Effect, Lease, Ledger


@dataclass
class Job:
    """A claimed task handed to an executor, with the hooks it may need while running."""

    lease: Lease
    ledger: Ledger
    fenced: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[str], None] = lambda detail: None

    def progress(self, detail: str) -> None:
        """Report progress (published as a live event; never written to the board)."""
        self.on_progress(detail)

    @property
    def should_stop(self) -> bool:
        """True when the executor should wind down (fenced, or the worker is stopping)."""
        return self.fenced.is_set() or self.stopping.is_set()

    def effect(self, op: str) -> Effect:
        """Check ownership and record the intent of side effect ``op``; get its stable key."""
        return self.ledger.effect(self.lease, op)

    def effect_done(self, effect: Effect, receipt: str) -> None:
        """Record the receipt of a side effect so no later owner repeats it."""
        self.ledger.effect_done(self.lease, effect, receipt)


@dataclass(frozen=True)
class Outcome:
    """How an execution ended."""

    kind: Literal["done", "failed", "poison", "ask", "released"]
    result_ref: str | None = None
    reason: str = ""
    question: str = ""
    human: str | None = None
    evidence: str = ""  # what to keep if the owner turns out fenced
    cost_usd: float = 0.0  # model spend of this execution

    @classmethod
    def done(cls, result_ref: str, evidence: str = "", cost_usd: float = 0.0) -> Outcome:
        return cls("done", result_ref=result_ref, evidence=evidence or result_ref,
                   cost_usd=cost_usd)

    @classmethod
    def failed(cls, reason: str, *, poison: bool = False) -> Outcome:
        return cls("poison" if poison else "failed", reason=reason)

    @classmethod
    def ask(cls, question: str, human: str | None = None) -> Outcome:
        return cls("ask", question=question, human=human)

    @classmethod
    def released(cls, reason: str = "worker stopping") -> Outcome:
        return cls("released", reason=reason)


class Executor(Protocol):
    """Runs one job. Must return (not raise) for expected failures; may raise for bugs."""

    def __call__(self, job: Job) -> Outcome: ...
