"""The model executor: how a model agent's worker does one task.

resolve refs → build the prompt → check ownership and get the call's stable key →
call the model through LiteLLM (or the demo model) → store the result → keep the
receipt → return the result's ref.

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

from fabric.cards import Card
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError
from fabric.ledger import Fenced
from workers.availability import Availability, Verdict
from workers.job import Job, JobOutcome
from workers.llm import (
    BadModelResponse,
    ModelClient,
    ModelRejected,
    ModelUnavailable,
    RateLimited,
)
from workers.prompt import build_messages
from workers.refs import RefResolver, RefUnavailable, UnresolvableRef
from workers.results import ResultStore

log = logging.getLogger("agap.worker")

QUESTION_PREFIX = "QUESTION FOR HUMAN:"
ASK_RULE = (
    f"\n\nIf you cannot do the task without information only a person has, reply "
    f"with one line that starts with '{QUESTION_PREFIX}' and asks for it."
)


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
        spec = job.lease.spec
        try:
            context = self.refs.resolve_all(spec.refs)
        except UnresolvableRef as exc:
            return JobOutcome.failed(exc.line(), poison=True)
        except RefUnavailable as exc:
            return JobOutcome.failed(exc.line())
        messages = build_messages(self._intent(job), context, self.persona)
        messages[0]["content"] += ASK_RULE
        if job.should_stop:
            return JobOutcome.released("stopping before the model call")
        try:
            # The ownership check: no paid, externally visible call without a current lease.
            effect = job.effect("model-call")
        except Fenced:
            return JobOutcome.failed("fenced before the model call")
        except BoardError as exc:
            return JobOutcome.released(f"board unreachable before the model call ({exc.what})")
        if effect.done and effect.receipt:
            # An earlier owner made this call and stored its result: do not pay twice.
            return JobOutcome.done(effect.receipt, evidence=f"reused {effect.receipt}")
        metadata = {
            "agent": self.card.id,
            "task_id": job.lease.task_id,
            "queue": self.card.queue_name,
            "task_uid": job.lease.uid,
            "epoch": job.lease.epoch,
        }
        try:
            answer = self.client.complete(
                messages,
                model=self.card.runtime.model or self.card.id,
                metadata=metadata,
                idempotency_key=effect.key,
                timeout=self.card.runtime.timeout_seconds,
            )
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
        self.availability.record(now, cost_usd=answer.cost_usd)
        self.outage.record(now)
        text = answer.text.strip()
        if text.startswith(QUESTION_PREFIX):
            question = text[len(QUESTION_PREFIX) :].strip() or "(the model asked for help)"
            return JobOutcome.ask(question, self.human_for(job))
        ref = self._store(job, answer.text)
        if isinstance(ref, JobOutcome):
            return ref
        try:
            job.effect_done(effect, ref)
        except Fenced:
            return JobOutcome.failed("fenced after the model call")
        except BoardError as exc:
            # The receipt only saves a later owner a call; the completion still records it.
            log.warning("task #%s: receipt not recorded (%s)", job.lease.task_id, exc)
        log.info("task #%s done: %s (cost $%.4f)", job.lease.task_id, ref, answer.cost_usd)
        return JobOutcome.done(ref, evidence=answer.text[:4000], cost_usd=answer.cost_usd)

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

    @staticmethod
    def _intent(job: Job) -> str:
        lines = [job.lease.spec.intent]
        for kind, text in job.lease.conversation:
            lines.append(f"\n{'You asked' if kind == 'question' else 'A person answered'}: {text}")
        return "\n".join(lines)
