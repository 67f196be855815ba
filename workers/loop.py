"""The worker loop: one daemon per queue.

Read it top to bottom::

    run()                 start ``concurrency`` slots, wait for stop
      _slot()             loop: fetch → process, sleeping a poll interval when idle
        _fetch()          claim the next due task (one query, then the ledger's claim)
        _process()        execute under a heartbeat; the outcome's transition is made
                          beside the next fetch (_fetch_beside), or before the slot ends
          Heartbeat       side task: renews the lease; sets ``job.fenced`` when it is gone

Every slot has its own board connection (a ``requests.Session`` is not for sharing
between threads). SIGTERM sets ``stop``: the current task finishes, or the executor
returns ``released`` and the task goes back to its queue; then the worker exits 0.

A board that does not answer when the worker starts is waited for (capped, jittered
backoff, said once: :mod:`fabric.degraded`); a stop during that wait ends the run at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import field

from fabric.availability import Availability, ParkTracker, Verdict, reason_key
from fabric.core import Fabric
from fabric.degraded import DEFAULT_CAP, Backoff, BoardWait
from fabric.kanboard.layout import META_COST
from fabric.kanboard.port import BoardError, BoardUnavailable
from fabric.ledger import Fenced, Lease, LedgerError
from fabric.plain import Plain
from fabric.results import result_url
from fabric.signals import stop_requested
from workers.job import Executor, Job, JobOutcome
from workers.queue import ClaimCheck, QueueReader, WakeHints

INTERACTIVE_PRIORITY = 2  # high and urgent tasks count as interactive work
# A claimed card moves to Working once its work has run this long: a person sees what is
# being worked on within a second, and work done sooner (a tool call, a quick check)
# goes from Queued straight to its outcome's column, one move (one of Kanboard's
# costliest calls) instead of two.
SHOW_AFTER = 0.5
# A claim writes only its lock (Ledger.claim's record_later); its record, which carries
# the lease the keeper expires, is written once the work has run this long. So a worker
# that dies mid-job leaves a lease, as an eager claim does, unless it dies within this
# moment (a lock without a record: a gap, resolved after the ledger's gap timeout); and
# work done sooner writes the claim's record in its outcome's own write.
RECORD_AFTER = 0.1

# Called after each change a worker makes or sees: (event, lease, detail). Events:
# started, progress, completed, failed, input_required, released, fenced. Listeners
# (live event publishers) must not raise: the board stays the authority.
Listener = Callable[[str, Lease, str], None]

log = logging.getLogger("agap.worker")


class WorkerConfig(Plain, frozen=False):
    """How one worker drains its queue."""

    queue: str
    owner: str
    lease_seconds: float = 60.0
    poll_seconds: float = 2.0
    concurrency: int = 1
    backoff_seconds: float = 5.0
    exit_when_idle: bool = False  # drain mode (tests, batch runs): stop at the first empty poll
    default_human: str | None = None
    interactive: bool = False  # the card's work is interactive (outranks background work)
    # How long running work may go on while the board is unreachable (None = one lease).
    outage_grace: float | None = None
    board_url: str = ""  # named in the line a worker says when its board is away at start
    board_wait_cap: float = DEFAULT_CAP  # the longest wait between tries for that board
    # When a claimed card moves to Working (SHOW_AFTER); 0: in the claim's own batch.
    show_after: float = SHOW_AFTER


class WorkerStats(Plain, frozen=False):
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    fenced: int = 0
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


def card_policy(fab: Fabric, queue: str) -> ClaimCheck:
    """The claim policy of the card whose queue this is (:meth:`Fabric.claim_check`)."""
    return fab.claim_check(fab.cards.by_queue(queue))


def no_claim_policy(fab: Fabric, queue: str) -> ClaimCheck:
    """No claim-time check: only for tests of the guards behind it (the read-time one)."""
    return lambda view: None


class WorkerHooks(Plain, frozen=False):
    """What a worker is given beyond its connection, executor and config."""

    #: a(t): checked before each claim (None: always available).
    availability: Availability | None = None
    #: The policy re-checked at claim (a task may predate a card's change); a refused
    #: task is dead-lettered with the reason. Built per connection, from the queue.
    claim_policy: Callable[[Fabric, str], ClaimCheck] = card_policy
    #: Told of every change the worker makes or sees (live event publishers).
    listeners: list[Listener] = field(default_factory=list)
    #: The model endpoints a refusal of a(t) parks (named in the published park state,
    #: so `agap ls` and the metrics show parks per model as well as per queue).
    models_parked: Callable[[], list[str]] = list


class Worker:
    """Drains one queue with ``concurrency`` slots."""

    def __init__(
        self,
        connect: Callable[[], Fabric],
        executor: Executor,
        config: WorkerConfig,
        hooks: WorkerHooks | None = None,
    ) -> None:
        hooks = hooks or WorkerHooks()
        self.connect = connect
        self.executor = executor
        self.config = config
        self.stop = threading.Event()
        self.stats = WorkerStats()
        self.availability = hooks.availability
        self.park = ParkTracker(config.queue)
        self._park_lock = threading.Lock()
        self.listeners = list(hooks.listeners)
        self.claim_policy = hooks.claim_policy
        self.models_parked = hooks.models_parked
        # Set by a wake-up hint (a submit event, a webhook): an idle slot polls at once.
        # The poll interval stays as the safety net.
        self.wake = threading.Event()
        # The tasks submit events named: a slot tries these first, without a poll.
        self.hints = WakeHints()
        # Waiting for a board that is away at start: the sleep returns True once stopped.
        self.sleep: Callable[[float], bool] = self.stop.wait
        self.backoff = Backoff(cap=config.board_wait_cap)

    # -- run → slots ----------------------------------------------------------------

    def run(self) -> None:
        """Run until :attr:`stop` is set (or, in drain mode, until the queue is empty).

        First the board must answer (one read): until it does the worker waits, and a
        stop meanwhile returns at once. A rejected token or a missing project raises.
        """
        first = self.reach_board(self._probe)
        if first is None:
            return
        slots = [
            threading.Thread(
                target=self._slot, args=(i, first if i == 0 else None), name=f"slot-{i}", daemon=True
            )
            for i in range(self.config.concurrency)
        ]
        for t in slots:
            t.start()
        for t in slots:
            t.join()

    def reach_board(self, attempt: Callable[[], Fabric]) -> Fabric | None:
        """``attempt()`` once the board answers (None when stopped first); see :mod:`fabric.degraded`."""
        wait = BoardWait(self.config.board_url, f"worker {self.config.queue}", self.sleep, self.backoff)
        return wait.until(attempt)

    def _probe(self) -> Fabric:
        fab = self.connect()
        fab.board.park_states()  # one read: a cached layout alone does not prove the board is there
        return fab

    def _slot(self, index: int, fab: Fabric | None = None) -> None:
        if fab is None:
            fab = self.reach_board(self.connect)
            if fab is None:
                return
        try:
            self._drain(index, fab)
        finally:
            fab.close()  # the connection settles what it owes the board (fabric.kanboard)

    def _drain(self, index: int, fab: Fabric) -> None:
        beat_fab = self.reach_board(self.connect)  # the heartbeat thread's own connection
        if beat_fab is None:
            return
        reader = QueueReader(
            fab.board,
            fab.ledger,
            self.config.queue,
            clock=fab.clock,
            claim_check=self.claim_policy(fab, self.config.queue),
            hints=self.hints,
            record_later=self.config.show_after > 0,
        )
        owner = self.config.owner if self.config.concurrency == 1 else f"{self.config.owner}/{index}"
        record: Callable[[], None] | None = None  # the last task's outcome, not yet recorded
        try:
            while not self.stop.is_set():
                min_priority, wait = self._gate(fab)
                if min_priority is None:
                    if record is not None:
                        record()  # before a wait, not after it
                        record = None
                    self.stop.wait(wait)  # parked
                    continue
                lease = self._fetch_beside(fab, reader, owner, min_priority, record)
                record = None
                if lease is None:
                    if self.config.exit_when_idle and reader.last_poll_size == 0:
                        return
                    # Nothing claimable (others were faster, or a gap not yet due): wait a
                    # little in drain mode, a poll interval otherwise.
                    if self._idle(
                        min(0.2, self.config.poll_seconds)
                        if self.config.exit_when_idle
                        else self.config.poll_seconds
                    ):
                        reader.invalidate()  # woken by a hint: poll afresh at once
                    continue
                record = self._process(fab, beat_fab, lease)
        finally:
            if record is not None:
                record()

    def hinted(self, task_id: int | None, uid: str | None) -> None:
        """A submit event (QueueWaker): remember the task it names, and wake a slot."""
        if task_id is not None and uid:
            self.hints.add(task_id, uid)
        self.wake.set()

    def _idle(self, seconds: float) -> bool:
        """Sleep a poll interval, cut short by a stop or a wake-up hint (returns True)."""
        end = time.monotonic() + seconds
        while not self.stop.is_set() and (left := end - time.monotonic()) > 0:
            if self.wake.wait(min(left, 0.1)):
                self.wake.clear()
                return True
        return False

    def add_listener(self, listener: Listener) -> None:
        """Tell ``listener`` of every change from now on (a live event publisher)."""
        self.listeners.append(listener)

    def emit(self, event: str, lease: Lease, detail: str = "") -> None:
        """Tell the listeners (never raises: publishing is not on the correctness path)."""
        for listener in self.listeners:
            try:
                listener(event, lease, detail)
            except Exception:
                log.exception("event listener failed on %s for task #%s", event, lease.task_id)

    # -- a(t) -----------------------------------------------------------------------

    def _gate(self, fab: Fabric) -> tuple[int | None, float]:
        """Check a(t): the lowest priority to claim now, or None (parked) and how long
        to wait before checking again.

        When the only refusal is the budget governor's reserve, interactive work (high
        and urgent) still runs. Park changes are published to the board, not every poll.
        """
        if self.availability is None:
            return 0, 0.0
        now = fab.clock()
        verdict = self.availability.check(now, interactive=self.config.interactive)
        if not verdict.available and reason_key(verdict.reason) == "reserved for interactive work":
            self._publish(fab, verdict, now)
            return INTERACTIVE_PRIORITY, 0.0
        self._publish(fab, verdict, now)
        if verdict.available:
            return 0, 0.0
        wait = (
            self.config.poll_seconds
            if verdict.until is None
            else max(0.05, min(verdict.until - now, self.config.poll_seconds * 5))
        )
        return None, wait

    def _publish(self, fab: Fabric, verdict: Verdict, now: float) -> None:
        with self._park_lock:
            change = self.park.update(verdict, now)
        if change is None:
            return
        log.info(
            "queue %s %s", self.config.queue, f"parked: {change.reason}" if change.parked else "available"
        )
        state = change.to_dict()
        state["models"] = self.models_parked() if change.parked else []
        try:
            fab.board.publish_park(self.config.queue, state)
        except BoardError as exc:
            log.warning("could not publish the park state: %s", exc)

    # -- fetch ----------------------------------------------------------------------

    def _fetch(self, reader: QueueReader, owner: str, min_priority: int = 0) -> Lease | None:
        self.stats.bump("polls")
        try:
            lease = reader.claim_next(
                owner, lease_seconds=self.config.lease_seconds, min_priority=min_priority
            )
        except BoardError as exc:
            # The board is the authority: when it is away we wait, we never guess.
            log.warning("queue %s: board unavailable (%s); retrying", self.config.queue, exc)
            self.stop.wait(min(30.0, self.config.poll_seconds * 2))
            return None
        if lease is not None:
            self.stats.bump("claimed")
            log.info("claimed task #%s epoch %s", lease.task_id, lease.epoch)
            self.emit("started", lease, f"attempt {lease.attempt}")
        return lease

    def _fetch_beside(
        self,
        fab: Fabric,
        reader: QueueReader,
        owner: str,
        min_priority: int,
        record: Callable[[], None] | None,
    ) -> Lease | None:
        """Claim the next task while the last one's outcome is recorded.

        The two touch different tasks, and each makes its round trips in the order it
        would alone (the outcome's lock before its write, the claim's read before its
        lock), so their trips ride together (Fabric.together): a worker draining a queue
        pays two round trips a task instead of four.
        """
        if record is None:
            return self._fetch(reader, owner, min_priority)
        lease: Lease | None = fab.together(lambda: self._fetch(reader, owner, min_priority), record)[0]
        return lease

    # -- process --------------------------------------------------------------------

    def _process(self, fab: Fabric, beat_fab: Fabric, lease: Lease) -> Callable[[], None]:
        job = Job(
            lease,
            fab.ledger,
            stopping=self.stop,
            on_progress=lambda detail: self.emit("progress", job.lease, detail),
        )
        beat = Heartbeat(
            beat_fab,
            job,
            self.config.lease_seconds,
            self.config.outage_grace,
            show_after=self.config.show_after if self.config.show_after > 0 else None,
        )
        beat.start()
        try:
            try:
                outcome = self.executor(job)
            except Exception as exc:  # an executor bug: a failed attempt, not a dead worker
                log.exception("task #%s: executor raised", lease.task_id)
                outcome = JobOutcome.failed(f"executor error: {type(exc).__name__}: {exc}")
        finally:
            beat.stop()
        lease = job.lease
        if job.fenced.is_set():
            return lambda: self._fenced(fab, lease, outcome)
        return lambda: self._record_outcome(fab, lease, outcome)

    def _record_outcome(self, fab: Fabric, lease: Lease, outcome: JobOutcome) -> None:
        """Make the outcome's transition, waiting out a board that is away.

        The result is ready and the lock decides who wins, so recording it late is safe:
        if the keeper requeued the task meanwhile, our transition simply loses (fenced).
        We keep trying for a bounded time, then leave the task to lease expiry.
        """
        give_up = time.monotonic() + max(60.0, 5 * self.config.lease_seconds)
        delay = 0.5
        while True:
            try:
                self._transition(fab, lease, outcome)
                return
            except Fenced:
                self._fenced(fab, lease, outcome)
                return
            except BoardUnavailable as exc:
                if time.monotonic() > give_up:
                    log.warning(
                        "task #%s: board away too long (%s); leaving the task to lease expiry",
                        lease.task_id,
                        exc,
                    )
                    return
                if self.stop.is_set() or stop_requested():
                    log.warning(
                        "task #%s: board away while stopping (%s); leaving the task to lease expiry",
                        lease.task_id,
                        exc,
                    )
                    return
                log.warning("task #%s: board away (%s); retrying in %.1fs", lease.task_id, exc, delay)
                self.stop.wait(delay)
                delay = min(10.0, delay * 2)
            except (LedgerError, BoardError) as exc:
                log.warning(
                    "task #%s: could not record the outcome (%s); the lease will "
                    "expire and the keeper requeues it",
                    lease.task_id,
                    exc,
                )
                return

    def _transition(self, fab: Fabric, lease: Lease, outcome: JobOutcome) -> None:
        ledger = fab.ledger
        if outcome.kind == "done":
            assert outcome.result_ref is not None
            ledger.complete(
                lease,
                outcome.result_ref,
                note=outcome.note or None,
                result_url=result_url(fab.board, outcome.result_ref),
                extra_meta={META_COST: f"{outcome.cost_usd:.6f}"} if outcome.cost_usd else None,
            )
            self.stats.bump("completed")
            self.emit("completed", lease, outcome.result_ref)
        elif outcome.kind in ("failed", "poison"):
            rec = ledger.fail(
                lease,
                outcome.reason,
                poison=outcome.kind == "poison",
                backoff_base=self.config.backoff_seconds,
            )
            self.stats.bump("failed")
            self.emit("failed" if rec.state.value == "dead" else "released", lease, outcome.reason)
        elif outcome.kind == "ask":
            human = outcome.human or self.config.default_human
            if human is None:
                ledger.fail(
                    lease, f"asked a question but no human is configured: {outcome.question}", poison=True
                )
                self.emit("failed", lease, "asked a question but no human is configured")
            else:
                ledger.ask(lease, outcome.question, human)
                self.emit("input_required", lease, outcome.question)
        else:
            ledger.release(lease, outcome.reason)
            self.emit("released", lease, outcome.reason)

    def _fenced(self, fab: Fabric, lease: Lease, outcome: JobOutcome) -> None:
        self.stats.bump("fenced")
        self.emit("fenced", lease, "a newer epoch exists; output kept as evidence")
        log.warning("task #%s: fenced at epoch %s; keeping output as evidence", lease.task_id, lease.epoch)
        with contextlib.suppress(BoardError):
            fab.ledger.keep_evidence(
                lease, outcome.evidence or outcome.reason or outcome.kind, stored=outcome.stored
            )


class Heartbeat:
    """Renews a job's lease every third of its length; flags the job when fenced.

    While the board is unreachable it keeps trying. Past the outage grace it asks the
    job to wind down (``stopping``): work may finish, but nothing new and nothing
    externally visible starts without a current lease (bounded outage rules).

    With ``show_after``, the claim won its lock and wrote nothing (Ledger.claim's
    ``record_later``): once the job has run RECORD_AFTER (at most ``show_after``), the
    heartbeat writes the claim's record, as a renewal; once it has run ``show_after``,
    it moves the card to Working (Ledger.show). A job done sooner leaves both to its
    outcome's batch. :meth:`stop` waits for a write under way, so it lands before the
    outcome's.
    """

    def __init__(
        self,
        fab: Fabric,
        job: Job,
        lease_seconds: float,
        outage_grace: float | None = None,
        *,
        show_after: float | None = None,
    ) -> None:
        self.job = job
        self.lease_seconds = lease_seconds
        self.outage_grace = lease_seconds if outage_grace is None else outage_grace
        self.show_after = show_after
        self._fab = fab
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _show(self) -> None:
        """Move the job's card to Working, writing the claim's record first if it is not
        written yet (its claim left both to us). Under the lease lock, as a renewal: the
        job's own writes (a checkpoint, a receipt) go through the same lease. A failed
        write is retried by the next renewal or the outcome; a failed move is the
        keeper's to repair (the record says Working); neither is the job's end."""
        if self.job.fenced.is_set():
            return
        try:
            with self.job.lease_lock:
                self.job.lease = self._fab.ledger.show(self.job.lease)
        except Fenced:
            self.job.fenced.set()
        except BoardError as exc:
            log.warning("task #%s: could not show it in Working: %s", self.job.lease.task_id, exc)

    def _run(self) -> None:
        interval = self.lease_seconds / 3
        last_contact = time.monotonic()
        show_at = record_at = None
        if self.show_after is not None:
            show_at = last_contact + self.show_after
            record_at = last_contact + min(RECORD_AFTER, self.show_after)
        renew_at = last_contact + interval
        while True:
            due = min(t for t in (record_at, show_at, renew_at) if t is not None)
            if self._done.wait(max(0.0, due - time.monotonic())):
                return
            if show_at is not None and show_at <= due:
                show_at = record_at = None
                self._show()
                continue
            if record_at is not None and record_at <= due:
                record_at = None
                if self.job.lease.recorded:
                    continue  # the job's own write carried it (a checkpoint, an effect)
            try:
                with self.job.lease_lock:
                    self.job.lease = self._fab.ledger.renew(self.job.lease, lease_seconds=self.lease_seconds)
                last_contact = time.monotonic()
            except Fenced:
                self.job.fenced.set()
                return
            except BoardError as exc:
                log.warning("heartbeat for task #%s failed: %s", self.job.lease.task_id, exc)
                if time.monotonic() - last_contact > self.outage_grace:
                    log.warning(
                        "task #%s: board away past the outage grace (%.0fs): winding down",
                        self.job.lease.task_id,
                        self.outage_grace,
                    )
                    self.job.outage.set()
            renew_at = time.monotonic() + interval
