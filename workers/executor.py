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
import threading
import time
from collections.abc import Callable
from dataclasses import field, replace

from fabric.availability import Availability, Verdict, is_interactive
from fabric.cards import Card
from fabric.domains import ReadGuard
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError
from fabric.kanboard.quotas import QuotaHolder
from fabric.ledger import Effect, Fenced
from fabric.plain import Plain
from fabric.refusals import PolicyRefused
from fabric.results import ResultStore
from fabric.signals import grace, pause
from workers.admission import Admitted, admit_call
from workers.answer import Reply, ask, task_messages
from workers.job import Job, JobOutcome
from workers.llm import (
    BadModelResponse,
    DemoClient,
    ModelClient,
    ModelRejected,
    ModelTimedOut,
    ModelUnavailable,
    RateLimited,
)
from workers.refs import RefResolver, RefUnavailable, UnresolvableRef

log = logging.getLogger("agap.worker")


class Abandoned(Exception):
    """The worker stopped while a model call was in flight."""


def until_stopped(call: Callable[[], Reply], job: Job, *, finish: float | None = None) -> Reply:
    """``call()``, unless the worker stops and the call is not answered ``finish`` seconds
    later (then :class:`Abandoned`; default: the stop grace less what releasing needs).

    A model call can take minutes and a blocking socket cannot be interrupted, so the call
    runs in a thread of its own and the slot waits for it or for the stop: an answer that
    comes in the window is kept (the call is paid for), else the worker gives its task
    back instead of holding the lease past the 3 s stop bound (:mod:`fabric.signals`).
    """
    box: list[Reply] = []
    error: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed to the slot, which decides what it means
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"model-call-{job.lease.task_id}", daemon=True).start()
    while not done.wait(0.1):  # the bound on how late a stop is noticed
        if job.stopping.is_set():
            if not done.wait(max(0.0, grace() - 1.2) if finish is None else finish):
                raise Abandoned
            break
    if error:
        raise error[0]
    return box[0]


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


class ModelExecutor(Plain, frozen=False):
    """Runs a model agent's tasks; see the module docstring for the steps."""

    card: Card
    client: ModelClient
    results: ResultStore
    refs: RefResolver
    availability: Availability
    outage: Outage
    persona: str | None = None
    human_for: Callable[[Job], str | None] = lambda job: None
    #: The privacy check of the refs of a job (:func:`fabric.policy.read_guard`).
    guard_for: Callable[[Job], ReadGuard | None] = lambda job: None
    clock: Callable[[], float] = time.time
    #: Timeouts in a row on one task that count as one failed attempt (fewer only release it).
    timeouts_per_attempt: int = 2
    #: The client for a persona's backbone chosen per call (see :mod:`workers.admission`).
    client_of: Callable[[Card], ModelClient] = lambda card: DemoClient()
    _timeouts: dict[str, int] = field(default_factory=dict)  # task uid -> timeouts in a row

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
        asked = self._ask(job, messages, effect)
        if isinstance(asked, JobOutcome):
            return asked
        reply, note = asked
        if reply.kind == "ask":
            return JobOutcome.ask(reply.text, self.human_for(job))
        return self._finish(job, effect, reply, note)

    def _messages(self, job: Job) -> list[dict[str, str]] | JobOutcome:
        """The prompt (refs resolved); a ref that cannot be read fails the attempt."""
        spec = job.lease.spec
        try:
            # The privacy check where the content is read, for the people this task is for.
            guard = self.guard_for(job)
            refs = self.refs if guard is None else replace(self.refs, guard=guard)
            return task_messages(refs, spec.intent, spec.refs, self.persona, job.lease.conversation)
        except (UnresolvableRef, PolicyRefused) as exc:
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

    def _ask(
        self, job: Job, messages: list[dict[str, str]], effect: Effect
    ) -> tuple[Reply, str] | JobOutcome:
        """The model call under the effect's stable key, and what the completion records
        about it (the backbone that ran it); a failure feeds a(t) or fails the attempt."""
        metadata = {
            "agent": self.card.id,
            "task_id": job.lease.task_id,
            "queue": self.card.queue_name,
            "task_uid": job.lease.uid,
            "epoch": job.lease.epoch,
        }
        # Admission counts the call in the model endpoint's ledger before it is made, so
        # no other slot, worker or sync A2A call can take the same last call of a window.
        admitted = self._admit(job)
        if isinstance(admitted, JobOutcome):
            return admitted
        card = admitted.card(self.card)
        client = self.client_of(card) if admitted.endpoint else self.client
        try:
            reply = until_stopped(lambda: ask(card, client, messages, metadata=metadata, key=effect.key), job)
        except Abandoned:
            # Sent, and may still be charged: its slot stays spent, as a timed-out call's.
            admitted.settle(self.clock(), cost_usd=self.card.max_cost_usd or 0.0)
            return JobOutcome.released("worker stopping: the model call in flight was abandoned")
        except Exception as exc:
            return self._call_failed(job, exc, admitted)
        now = self.clock()
        self._timeouts.pop(job.lease.uid, None)
        admitted.settle(now, cost_usd=reply.cost_usd)
        self.outage.record(now)
        return reply, admitted.endpoint.note() if admitted.endpoint is not None else ""

    def _admit(self, job: Job) -> Admitted | JobOutcome:
        """Admit the call in the card's own a(t), then (a persona) in its first available backbone."""
        interactive = is_interactive(self.card.runtime.interactive, job.lease.spec.priority)
        lease = job.lease
        holder = QuotaHolder(lease.task_id, lease.uid, lease.epoch)
        admitted = admit_call(self.availability, self.clock(), interactive=interactive, holder=holder)
        if isinstance(admitted, Verdict):
            return JobOutcome.released(f"parked before the model call: {admitted.reason}")
        return admitted

    def _call_failed(self, job: Job, exc: Exception, admitted: Admitted) -> JobOutcome:
        """A failed call: feed a(t), then decide whether the attempt counts."""
        now = self.clock()
        admitted.failed(exc, now, charge_usd=self.card.max_cost_usd or 0.0)
        if isinstance(exc, ModelTimedOut):
            streak = self._timeouts[job.lease.uid] = self._timeouts.get(job.lease.uid, 0) + 1
            if streak >= self.timeouts_per_attempt:
                self._timeouts.pop(job.lease.uid, None)
                return JobOutcome.failed(f"no answer within the timeout {streak} times in a row: {exc.what}")
            of = self.timeouts_per_attempt
            return JobOutcome.released(f"model call timed out ({streak} of {of}): {exc.what}")
        if isinstance(exc, RateLimited):
            return JobOutcome.released(f"rate limited by the provider ({exc.hint})")
        if isinstance(exc, ModelUnavailable):
            self.outage.report(now, exc.what)
            return JobOutcome.released(f"model plane unavailable: {exc.what}")
        if isinstance(exc, ModelRejected):
            return JobOutcome.failed(f"the model plane refused the request: {exc.what}", poison=True)
        if isinstance(exc, BadModelResponse):
            return JobOutcome.failed(f"bad model response: {exc.what}")
        raise exc

    def _finish(self, job: Job, effect: Effect, reply: Reply, note: str = "") -> JobOutcome:
        """Store the result and keep the receipt, so no later owner pays for the call again."""
        if job.fenced.is_set():  # the heartbeat already knows: store nothing
            return JobOutcome(
                kind="failed", reason="fenced during the model call", evidence=reply.text[:4000]
            )
        ref = self._store(job, reply.text)
        if isinstance(ref, JobOutcome):
            return ref
        try:
            job.effect_done(effect, ref)
        except Fenced:
            # The epoch ended while the model thought: this answer is evidence only, and
            # its receipt does not count, so the new owner calls the model again.
            return JobOutcome(
                kind="failed", reason="fenced after the model call", evidence=reply.text[:4000], stored=ref
            )
        except BoardError as exc:
            # The receipt only saves a later owner a call; the completion still records it.
            log.warning("task #%s: receipt not recorded (%s)", job.lease.task_id, exc)
        log.info("task #%s done: %s (cost $%.4f)", job.lease.task_id, ref, reply.cost_usd)
        return JobOutcome.done(ref, evidence=reply.text[:4000], cost_usd=reply.cost_usd, note=note)

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
                if pause(delay):  # stopping: give the task back rather than wait on
                    return JobOutcome(
                        kind="released",
                        reason=f"worker stopping, result not stored ({exc.what})",
                        evidence=text[:4000],
                    )
                delay = min(5.0, delay * 2)
            except FabricError as exc:
                return JobOutcome.failed(f"could not store the result: {exc.line()}")
