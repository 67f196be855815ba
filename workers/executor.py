"""The model executor: how a model agent's worker does one task.

resolve refs → build the prompt → check ownership and get the call's stable key →
call the model through LiteLLM (or the demo model) → store the result → keep the
receipt → return the result's ref. The prompt, the call and reading the answer are
the shared model path (:mod:`workers.answer`); leases, receipts and results are here.

A model may need a human: if its answer starts with ``QUESTION FOR HUMAN:`` the task
goes to a human's inbox (input required) with that question, and comes back with the
answer in the prompt once the human has answered.

Availability is fed from here: each accepted call is recorded (quota, cost), a 429
parks the queue until the announced reset, and an unreachable model plane parks it
for a growing while. Neither is the task's fault: the task is released, not failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fabric.availability import Availability, Verdict
from fabric.cards import Card
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError
from fabric.ledger import Effect, Fenced
from workers.answer import Reply, ask, task_messages
from workers.job import Job, JobOutcome
from workers.llm import (
    BadModelResponse,
    ModelClient,
    ModelRejected,
    ModelUnavailable,
    RateLimited,
)
from workers.refs import RefResolver, RefUnavailable, UnresolvableRef
from workers.results import ResultStore

log = logging.getLogger("agap.worker")


class Outage:
    """An a(t) shape for a model plane that is down: parked for a growing while.

    Reported by the executor (connection refused, timeout, 5xx, a refused key); cleared
    by the next accepted call.
    """

    def __init__(self, *, first: float = 15.0, cap: float = 600.0) -> None:
        self.first = first
        self.cap = cap
        self.until = 0.0
        self.reason = ""
        self._streak = 0

    def report(self, now: float, reason: str) -> None:
        self._streak += 1
        self.until = now + min(self.cap, self.first * 2 ** (self._streak - 1))
        self.reason = reason

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        if now < self.until:
            return Verdict.no(f"model plane unavailable: {self.reason}", self.until)
        return Verdict.ok()

    def record(self, now: float, *, cost_usd: float = 0.0) -> None:
        self._streak = 0
        self.until = 0.0

    def on_rate_limited(self, now: float, retry_after: float | None, reset_at: float | None) -> None:
        return None


@dataclass
class ModelExecutor:
    """Runs a model agent's tasks; see the module docstring for the steps."""

    card: Card
    client: ModelClient
    results: ResultStore
    refs: RefResolver
    availability: Availability
    outage: Outage
    persona: str | None = None
    human_for: Callable[[Job], str | None] = lambda job: None
    clock: Callable[[], float] = time.time

    def __call__(self, job: Job) -> JobOutcome:
        messages = self._messages(job)
        if isinstance(messages, JobOutcome):
            return messages
        if job.should_stop:
            return JobOutcome.released("stopping before the model call")
        effect = self._own(job)
        if isinstance(effect, JobOutcome):
            return effect
        if effect.done and effect.receipt:
            # An earlier owner made this call and stored its result: do not pay twice.
            return JobOutcome.done(effect.receipt, evidence=f"reused {effect.receipt}")
        reply = self._ask(job, messages, effect)
        if isinstance(reply, JobOutcome):
            return reply
        if reply.kind == "ask":
            return JobOutcome.ask(reply.text, self.human_for(job))
        return self._finish(job, effect, reply)

    def _messages(self, job: Job) -> list[dict[str, str]] | JobOutcome:
        """The prompt (refs resolved); a ref that cannot be read fails the attempt."""
        spec = job.lease.spec
        try:
            return task_messages(self.refs, spec.intent, spec.refs, self.persona, job.lease.conversation)
        except UnresolvableRef as exc:
            return JobOutcome.failed(exc.line(), poison=True)
        except RefUnavailable as exc:
            return JobOutcome.failed(exc.line())

    @staticmethod
    def _own(job: Job) -> Effect | JobOutcome:
        """The ownership check: no paid, externally visible call without a current lease."""
        try:
            return job.effect("model-call")
        except Fenced:
            return JobOutcome.failed("fenced before the model call")
        except BoardError as exc:
            return JobOutcome.released(f"board unreachable before the model call ({exc.what})")

    def _ask(self, job: Job, messages: list[dict[str, str]], effect: Effect) -> Reply | JobOutcome:
        """The model call under the effect's stable key; a failure feeds a(t) or fails the attempt."""
        metadata = {
            "agent": self.card.id,
            "task_id": job.lease.task_id,
            "queue": self.card.queue_name,
            "task_uid": job.lease.uid,
            "epoch": job.lease.epoch,
        }
        try:
            reply = ask(self.card, self.client, messages, metadata=metadata, key=effect.key)
        except RateLimited as exc:
            now = self.clock()
            if exc.headers:
                self.availability.on_rate_limited_headers(now, exc.headers)
            else:
                self.availability.on_rate_limited(now, exc.retry_after, exc.reset_at)
            return JobOutcome.released(f"rate limited by the provider ({exc.hint})")
        except ModelUnavailable as exc:
            self.outage.report(self.clock(), exc.what)
            return JobOutcome.released(f"model plane unavailable: {exc.what}")
        except ModelRejected as exc:
            return JobOutcome.failed(f"the model plane refused the request: {exc.what}", poison=True)
        except BadModelResponse as exc:
            return JobOutcome.failed(f"bad model response: {exc.what}")
        now = self.clock()
        self.availability.record(now, cost_usd=reply.cost_usd)
        self.outage.record(now)
        return reply

    def _finish(self, job: Job, effect: Effect, reply: Reply) -> JobOutcome:
        """Store the result and keep the receipt, so no later owner pays for the call again."""
        ref = self._store(job, reply.text)
        if isinstance(ref, JobOutcome):
            return ref
        try:
            job.effect_done(effect, ref)
        except Fenced:
            return JobOutcome.failed("fenced after the model call")
        except BoardError as exc:
            # The receipt only saves a later owner a call; the completion still records it.
            log.warning("task #%s: receipt not recorded (%s)", job.lease.task_id, exc)
        log.info("task #%s done: %s (cost $%.4f)", job.lease.task_id, ref, reply.cost_usd)
        return JobOutcome.done(ref, evidence=reply.text[:4000], cost_usd=reply.cost_usd)

    def _store(self, job: Job, text: str) -> str | JobOutcome:
        """Store the result; while the board is away, hold it and keep trying.

        Past the outage grace (``job.outage``) or once fenced, give the task back: the
        next owner repeats the call under the same idempotency key.
        """
        delay = 0.25
        while True:
            try:
                return self.results.put(job.lease, text)
            except BoardError as exc:
                if job.outage.is_set() or job.fenced.is_set():
                    return JobOutcome(
                        kind="released",
                        reason=f"board unreachable, result not stored ({exc.what})",
                        evidence=text[:4000],
                    )
                time.sleep(delay)
                delay = min(5.0, delay * 2)
            except FabricError as exc:
                return JobOutcome.failed(f"could not store the result: {exc.line()}")
