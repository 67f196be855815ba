"""The keeper daemon: each duty is an APScheduler job with its own interval.

Jobs run one at a time on one thread (a :class:`~fabric.core.Fabric` is used from one
thread), never overlap themselves and coalesce missed runs: the keeper does not catch up
on what it missed while stopped (a missed run is Zabbix's business, not the keeper's).

A job that cannot reach the board logs, counts ``keeper_board_errors_total``, marks the
board down and backs off (exponentially, capped) before trying again; it never crashes the
daemon. The first successful run marks the board up again.

Started while the board is away, the keeper waits for it before its first job (capped,
jittered backoff, said once: :mod:`fabric.degraded`), its metrics saying ``board_up`` 0;
SIGTERM during that wait exits cleanly. A rejected token or a missing project raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor  # type: ignore[import-untyped]
from apscheduler.schedulers.background import BackgroundScheduler  # type: ignore[import-untyped]
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

from fabric.constraints import is_routed
from fabric.core import Fabric
from fabric.degraded import Backoff, BoardWait, transient
from fabric.errors import ConfigError
from fabric.hindsight import HindsightClient
from fabric.kanboard.layout import META_HOOK, Column
from fabric.kanboard.port import BoardError
from fabric.kanboard.quotas import QuotaStore
from fabric.retain import client_from_settings
from fabric.settings.keeper import JOBS, KeeperConfig
from fabric.signals import grace, set_on_signal
from keeper import backlog, decisions, duties, gc, gestures, memory, openclaw, quotas, snapshot, sweeps
from keeper.metrics import Metrics
from keeper.notify import Notifier
from keeper.replies import MatrixReplies, ReplyReport

log = logging.getLogger("agap.keeper")


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass
class _Backoff:
    failures: int = 0
    until: float = 0.0


@dataclass
class Keeper:
    """The keeper's duties over one fabric connection, made lazily (the board may be down)."""

    config: KeeperConfig
    connect: Callable[[], Fabric]
    metrics: Metrics = field(default_factory=Metrics)
    notifier: Notifier | None = None
    replies: MatrixReplies = field(default_factory=MatrixReplies)
    monotonic: Callable[[], float] = time.monotonic
    board_url: str = ""  # named in the line the keeper says when the board is away at start
    start_backoff: Backoff = field(default_factory=Backoff)  # waiting for that board
    _fab: Fabric | None = None
    _backoff: dict[str, _Backoff] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)  # job -> its last report
    # Dead letters already escalated, (task, epoch): a cache; after a restart each is
    # tried once more and the submit's receipt makes that a no-op.
    _escalated: set[tuple[int, int]] = field(default_factory=set)
    _human_parks: dict[str, Any] = field(default_factory=dict)  # queue -> ParkTracker
    # Shared quota slots found kept for good (their holder finished): not read again.
    _quota_settled: set[int] = field(default_factory=set)
    _quota_store: QuotaStore | None = None
    # What the backlog job knows of each lane's Backlog between its reads.
    _backlog: backlog.BacklogWatch = field(default_factory=backlog.BacklogWatch)
    # Set once the daemon stops: a job the scheduler had queued but not started is skipped,
    # so stopping waits for at most the one job that is running.
    _stopping: threading.Event = field(default_factory=threading.Event)
    # Set by poke() (Kanboard's webhook: a person just did something); the gesture job
    # runs again at once, also when the poke came while it was running.
    _poked: threading.Event = field(default_factory=threading.Event)
    # Cards the webhook said a person moved to another project: read by the next gesture
    # sweep wherever they are (a closed one is in no search and not watched).
    _moved: set[int] = field(default_factory=set)
    _moved_lock: threading.Lock = field(default_factory=threading.Lock)
    # Clear while a job runs (jobs never overlap: one executor thread).
    _idle: threading.Event = field(default_factory=_set_event)
    _sched: Any = None
    # A home's keeper: where its webhook receiver listens, published in the home's project
    # metadata for the main keeper's receiver to forward that home's events to (keeper.hook).
    hook_url: str = ""
    _hook_published: bool = False
    # The Hindsight API the memory duty retains into (AGAP_HINDSIGHT_URL/_KEY by default).
    hindsight: Callable[[], HindsightClient] = client_from_settings
    # OpenClaw's finished events come on the receiver's threads: a connection of their
    # own (a Fabric is used from one thread), one event at a time.
    _hook_fab: Fabric | None = None
    _hook_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_fabric(cls, fab: Fabric, config: KeeperConfig | None = None, **kw: Any) -> Keeper:
        return cls(config or KeeperConfig(), lambda: fab, **kw)

    def fab(self) -> Fabric:
        if self._fab is None:
            self._fab = self.connect()
            if self.notifier is None:
                self.notifier = Notifier(self._fab.cards, allow=self.config.notify_allow)
            self.metrics.clock = self._fab.clock
        return self._fab

    def _notifier(self) -> Notifier:
        self.fab()
        assert self.notifier is not None
        return self.notifier

    # -- the jobs ------------------------------------------------------------------------------

    def job_leases(self) -> sweeps.SweepReport:
        fab = self.fab()
        start = time.perf_counter()
        trips0 = fab.port.stats.trips
        snap = snapshot.take(fab, with_backlog=True)
        report = sweeps.SweepReport(trips=snap.trips)
        sweeps.sweep_leases(
            fab, snap, report, grace=self.config.lease_grace, repair_after=self.config.repair_after
        )
        # Slots of quotas kept across hosts that dead leases hold come back (no board
        # round trip when no card keeps a quota across hosts).
        if self._quota_store is None or self._quota_store.port is not fab.port:
            self._quota_store = QuotaStore(fab.port, fab.settings.quota_project)
        shared = self.last["quotas"] = quotas.sweep_quotas(
            fab, snap.views, store=self._quota_store, settled=self._quota_settled
        )
        m = self.metrics
        m.observe(
            fab.cards.queues(),
            snap.views,
            snap.dead_rows,
            snap.parks,
            lambda r: fab.board.layout.queue_of(r.swimlane_id),
            fab.clock(),
            models=[c.id for c in fab.cards.models()],
            backlog=snap.backlog_rows,
        )
        m.observe_schedules(snap.project_meta, fab.clock())
        with m.lock:
            m.lease_expiries_total += len(report.requeued) + len(report.dead_lettered)
            m.dead_lettered_total += len(report.dead_lettered)
            m.repairs_total += len(report.repaired)
            m.quota_slots_in_use = shared.in_use
            m.quota_slots_returned_total += len(shared.returned)
            m.corrupted_tasks = len(report.problems)
            m.sweep_trips = fab.port.stats.trips - trips0
            m.sweep_seconds = time.perf_counter() - start
        return report

    def job_backlog(self) -> backlog.BacklogReport:
        """Keep each lane's Queued cell short (keeper.backlog): one read of the Queued
        cells, of the Backlog too only when that can change something."""
        fab = self.fab()
        if Column.BACKLOG not in fab.board.layout.columns:
            return backlog.BacklogReport()
        now = fab.clock()
        queued = fab.board.open_in([Column.QUEUED])
        held = self._backlog.cached()
        reads = 1
        if self._backlog.needs_read(queued, now):
            held = fab.board.open_in([Column.BACKLOG])
            self._backlog.read(held, now)
            reads += 1
        report = backlog.balance(fab, queued, held)
        self._backlog.moved(report, {r.id: r for r in (*queued, *held)}, now)
        report.trips += reads
        return report

    def job_gaps(self) -> sweeps.SweepReport:
        fab = self.fab()
        snap = snapshot.take(fab)
        report = sweeps.SweepReport(trips=snap.trips)
        sweeps.sweep_gaps(fab, snap, report)
        with self.metrics.lock:
            self.metrics.gaps_resolved_total += len(report.gaps_resolved)
        return report

    def poke(self) -> None:
        """Run the gesture job now (from the webhook receiver's thread; returns at once)."""
        self._poked.set()
        sched = self._sched
        if sched is not None and not self._stopping.is_set():
            sched.modify_job("gestures", next_run_time=_now_dt())

    def note_moved(self, task_id: int) -> None:
        """Remember a card a person moved to another project (from the webhook receiver's
        thread); the gesture job the same event pokes reads it."""
        with self._moved_lock:
            self._moved.add(task_id)

    def openclaw_run(self, payload: Any, query: dict[str, str]) -> str:
        """Record an OpenClaw run's outcome (keeper.openclaw; from the webhook receiver)."""
        with self._hook_lock:
            if self._hook_fab is None:
                self._hook_fab = self.connect()
            return openclaw.record_run(self._hook_fab, payload, query)

    def job_gestures(self) -> gestures.GestureReport:
        """One gesture sweep, then another for each poke that came while it ran (a few)."""
        report = self._gestures_once()
        for _ in range(3):
            if not self._poked.is_set():
                break
            report = self._gestures_once()
        return report

    def publish_hook(self) -> None:
        """Tell the main keeper's receiver where this home's keeper receives (once)."""
        fab = self.fab()
        if self.hook_url and fab.home_of and not self._hook_published:
            fab.board.save_project_meta({META_HOOK: self.hook_url})
            self._hook_published = True

    def _gestures_once(self) -> gestures.GestureReport:
        self._poked.clear()
        fab = self.fab()
        self.publish_hook()  # again, when the board was away at start
        with self._moved_lock:
            moved, self._moved = self._moved, set()
        snap = snapshot.take(fab, with_done=True, with_activity=True, extra=moved)
        report = gestures.sweep_gestures(
            fab, snap, tolerance=self.config.move_tolerance, escalate_to=self.config.escalate_to
        )
        # The cards whose worker could not draw them (a confined agent's: no seal key), as
        # any other card of their state reads; the ones just acted on are read next time.
        touched = {*report.acted, *report.explained, *report.refused, *report.repaired, *report.edited}
        touched |= {*report.brought_back, *report.foreign}
        report.redrawn = fab.board.redraw(v for v in snap.views if v.id not in touched)
        snapshot.save_watch(fab, snap, skip=report.foreign)
        with self.metrics.lock:
            self.metrics.gestures_total += len(report.acted) + len(report.edited) + len(report.brought_back)
            self.metrics.repairs_total += len(report.repaired) + len(report.explained)
        return report

    def job_policy(self) -> duties.DutyReport:
        """Escalate dead letters to a human (once each); re-route tasks stuck on parked queues.

        Escalation is always-ask: a task that died on its tier becomes a decision task in
        a person's inbox, never a silent retry on a bigger model.
        """
        fab = self.fab()
        snap = snapshot.take(fab)
        report = duties.DutyReport()
        for view in fab.board.read_meta_many(snap.dead_rows):
            mark = (view.id, view.epoch)
            if mark in self._escalated:
                continue
            receipt = decisions.escalate_dead_letter(fab, view)
            self._escalated.add(mark)
            if receipt is not None:
                report.escalated[view.id] = receipt.task_id
        report.settled = decisions.settle_decisions(fab, snap.views)
        for view in snap.views:
            if view.spec is not None and is_routed(view.spec.constraints):
                receipt = decisions.reroute_parked(fab, view, parks=snap.parks)
                if receipt is not None:
                    report.requeued.append(view.id)
        return report

    def job_inbox(self) -> duties.DutyReport:
        fab = self.fab()
        n = self._notifier()
        duties.publish_human_parks(fab, self._human_parks, fab.clock())
        sent, failed = n.sent, n.failed
        report = duties.sweep_inbox(fab, snapshot.take(fab, with_done=True), self.config, n)
        self._count_notes(sent, failed)
        return report

    def job_deadlines(self) -> duties.DutyReport:
        fab = self.fab()
        n = self._notifier()
        sent, failed = n.sent, n.failed
        snap = snapshot.take(fab, with_backlog=True)
        # Backlog cards are read only when overdue (their rows carry the due date).
        overdue = [r for r in snap.backlog_rows if r.due_at and r.due_at <= fab.clock()]
        snap.views += fab.board.read_meta_many(overdue) if overdue else []
        report = duties.sweep_deadlines(fab, snap, self.config, n)
        with self.metrics.lock:
            self.metrics.escalations_total += len(report.escalated)
        self._count_notes(sent, failed)
        return report

    def job_reminders(self) -> duties.DutyReport:
        fab = self.fab()
        n = self._notifier()
        sent, failed = n.sent, n.failed
        report = duties.sweep_reminders(fab, snapshot.take(fab), self.config, n)
        with self.metrics.lock:
            self.metrics.reminders_total += len(report.reminded)
        self._count_notes(sent, failed)
        return report

    def job_matrix(self) -> ReplyReport:
        """People's replies to notifications in their Matrix rooms, as gestures."""
        fab = self.fab()
        report = self.replies.sweep(fab)
        with self.metrics.lock:
            self.metrics.gestures_total += len(report.acted)
        return report

    def job_memory(self) -> memory.MemoryReport:
        """Done results into the Hindsight banks of the cards that ask (keeper.memory);
        no board read at all while no card has ``memory.retain``."""
        fab = self.fab()
        if not any(c.memory is not None for c in fab.cards):
            return memory.MemoryReport()
        snap = snapshot.take(fab, with_done=True, with_activity=True)
        settings = memory.RetainSettings(max(1, self.config.retain_attempts), self.config.retain_backoff)
        return memory.sweep_memory(fab, snap, self.hindsight, settings)

    def job_digest(self) -> list[Any]:
        return duties.write_digests(self.fab(), self.config)

    def job_gc(self) -> gc.GcReport:
        report = gc.collect(self.fab(), retention=self.config.retention)
        with self.metrics.lock:
            self.metrics.gc_removed_total += len(report.removed)
        return report

    def _count_notes(self, sent: int, failed: int) -> None:
        n = self._notifier()
        with self.metrics.lock:
            self.metrics.notifications_total += n.sent - sent
            self.metrics.notification_failures_total += n.failed - failed

    # -- running them ---------------------------------------------------------------------------

    def run_job(self, name: str, *, ignore_backoff: bool = False) -> bool:
        """Run one job; never raises. False when it failed or was skipped (backing off)."""
        stats = self.metrics.job(name)
        if self._stopping.is_set() and not ignore_backoff:
            return False
        back = self._backoff.setdefault(name, _Backoff())
        if not ignore_backoff and self.monotonic() < back.until:
            stats.skipped_total += 1
            log.debug("%s: backing off the board for %.0f s more", name, back.until - self.monotonic())
            return False
        fn: Callable[[], Any] = getattr(self, f"job_{name}")
        start = time.perf_counter()
        stats.runs_total += 1
        stats.last_run = time.time()
        self._idle.clear()
        try:
            self.last[name] = fn()
        except (BoardError, ConfigError) as exc:
            back.failures += 1
            delay = min(self.config.backoff_cap, self.config.backoff_base * 2 ** (back.failures - 1))
            back.until = self.monotonic() + delay
            with self.metrics.lock:
                self.metrics.board_errors_total += 1
                self.metrics.board_up = 0
            stats.errors_total += 1
            stats.last_error = str(exc)[:300]
            log.warning("%s: the board failed (%s); backing off %.0f s", name, exc, delay)
            if isinstance(exc, ConfigError):
                self._fab = None  # reconnect: the layout may have changed
            return False
        except Exception as exc:
            stats.errors_total += 1
            stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
            log.exception("%s: failed", name)
            return False
        finally:
            stats.last_duration = time.perf_counter() - start
            self._idle.set()
        back.failures, back.until = 0, 0.0
        stats.last_success = self.fab().clock()
        with self.metrics.lock:
            self.metrics.board_up = 1
        return True

    def run_once(self) -> dict[str, bool]:
        """Every job once, in a sensible order (what ``agap keeper --once`` does)."""
        first = ("gaps", "leases", "gestures", "matrix", "inbox", "deadlines", "reminders", "policy")
        order = [*first, *(j for j in JOBS if j not in first)]  # no job can be left out
        return {name: self.run_job(name, ignore_backoff=True) for name in order}

    def scheduler(self) -> Any:
        """A BackgroundScheduler with every job (not started)."""
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
        )
        for name in JOBS:
            if name == "digest":
                trigger = CronTrigger(
                    hour=self.config.digest_at.hour,
                    minute=self.config.digest_at.minute,
                    timezone=self.config.digest_tz,
                )
            else:
                trigger = IntervalTrigger(seconds=self.config.interval(name))
            sched.add_job(self.run_job, trigger, args=[name], id=name, name=name)
        return sched

    def wait_for_board(self, sleep: Callable[[float], bool]) -> bool:
        """Degraded start: True once the board answers, False when stopped while waiting.

        ``sleep(seconds)`` returns True when told to stop (``threading.Event.wait``).
        """

        def probe() -> Fabric:
            try:
                fab = self.fab()
                fab.board.park_states()  # one read: a cached layout alone proves nothing
            except BoardError as exc:
                if transient(exc):
                    with self.metrics.lock:
                        self.metrics.board_up = 0
                        self.metrics.board_errors_total += 1
                raise
            return fab

        return BoardWait(self.board_url, "keeper", sleep, self.start_backoff).until(probe) is not None

    def serve(self, stop: threading.Event | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``stop`` is set); shuts the scheduler down cleanly.

        The jobs start once the board answers (:meth:`wait_for_board`).
        """
        stop = stop or threading.Event()
        set_on_signal(stop)
        if not self.wait_for_board(stop.wait):
            log.info("keeper stopping (the board never answered)")
            return
        try:
            self.publish_hook()
        except (BoardError, ConfigError) as exc:
            log.warning("keeper: could not publish the webhook receiver (%s); the gesture job retries", exc)
        sched = self._sched = self.scheduler()
        sched.start()
        for name in ("gaps", "leases"):  # first look at once, not one interval later
            sched.modify_job(name, next_run_time=_now_dt())
        log.info(
            "keeper running: %s",
            ", ".join(f"{j}/{self.config.interval(j):.0f}s" for j in JOBS if j != "digest"),
        )
        try:
            stop.wait()
        finally:
            log.info("keeper stopping")
            self._stopping.set()
            self._sched = None
            # No new job starts; the running one gives up its retries (fabric.signals) and
            # is waited for up to the stop grace. Past it the process exits anyway (the
            # watchdog): a keeper job is a run of ledger transitions, each safe to cut.
            sched.shutdown(wait=False)
            if not self._idle.wait(grace()):
                log.warning("keeper stopping with a job still running")


def _now_dt() -> Any:
    return datetime.now(UTC)
