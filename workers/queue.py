"""Reading one queue: poll, order, and claim the next due task.

A poll is one ``searchTasks`` query for the queue's open cards in its Queued cell, which
the keeper keeps short (:mod:`keeper.backlog`): a long queue's other cards wait in
Backlog, so a poll never carries the backlog. Only when Queued has nothing due and
Backlog may hold something (the keeper is behind or away) is Backlog read too. Ordering is
priority (high first), then deadline (soonest first, none last), then age (oldest
first). Tasks whose start hint (Kanboard's start date, set from a delayed start or a
retry backoff) is in the future are skipped without reading their records.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fabric.cards import Card
from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.layout import QUEUED_CELL, Column
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.taskboard import TaskBoard, TaskView
from fabric.ledger import IllegalTransition, Lease, Ledger, LostRace
from fabric.task import State


# How many of the best candidates one poll reads records for. Contending workers
# spread over them instead of all racing for the single best task.
class WakeHints:
    """The tasks live submit events named (task id, uid), newest last, for the worker's
    slots to try before polling: a woken worker claims a new task in two round trips."""

    def __init__(self, size: int = 64) -> None:
        self._lock = threading.Lock()
        self._items: deque[tuple[int, str]] = deque(maxlen=size)

    def add(self, task_id: int, uid: str) -> None:
        with self._lock:
            self._items.append((task_id, uid))

    def take(self) -> tuple[int, str] | None:
        """The oldest hint not yet taken (each is tried by one slot), or None."""
        with self._lock:
            return self._items.popleft() if self._items else None


# The claim policy: raises (a FabricError) to refuse a task (Fabric.claim_check).
ClaimCheck = Callable[[TaskView], None]

CANDIDATES = 8
# Cards tried one read-and-lock at a time before the rest of the candidates' records are
# read in one round trip: contending workers spread over a cell, so a second try
# mostly wins, and each try costs two calls where a bulk read costs one per candidate.
FIRST_TRIES = 3
# A reader that lost a race on rows polled longer ago than this polls again rather than
# trying more of them: under contention most of an older poll's rows are claimed already,
# and each costs a read to find that out, where a poll costs one call for them all.
REPOLL_AFTER_LOSS = 0.25
# A reader that lost a claim race this recently spreads over the candidates of a
# priority (at random); one that has not (a single worker) keeps the strict order.
CONTENDED_SECONDS = 5.0
# A card in Queued whose record says otherwise (a lost move not yet put right, a
# person's gesture the keeper has not read) is left out of polls this long, so it
# neither costs a metadata read per poll nor keeps a draining worker from seeing an
# empty queue.
SKIP_SECONDS = 10.0
# ... but a claim whose record and move its claimer makes late (record_later: this
# reader's own, or another's whose card was moved late) only this long: by then
# the claimer has shown it or recorded its outcome, and a task it gave back (released,
# retried) is to be seen again at once.
IN_FLIGHT_SKIP = 2.0
# An empty Queued cell's Backlog is read at most this often unless the reader has reason
# to think it holds cards (see QueueReader._backlog_maybe): a person may drag cards there
# while the keeper is away.
BACKLOG_CHECK = 60.0


def order_key(row: BoardTask) -> tuple[int, float, int, int]:
    """Sort key: priority desc, deadline asc (none last), created asc, id asc."""
    return (-row.priority, float(row.due_at) if row.due_at else float("inf"), row.created_at, row.id)


class QueueReader:
    """Finds and claims due tasks in one queue.

    One poll serves several claims: the sorted result is kept and worked down, and the
    queue is polled again only when that list is used up or older than ``max_age``
    (otherwise draining N tasks would cost N polls of N rows). Rows claimed by others in
    the meantime cost a metadata read, never a lock attempt.
    """

    def __init__(
        self,
        board: TaskBoard,
        ledger: Ledger,
        queue: str,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        claim_check: ClaimCheck,
        max_age: float = 2.0,
        hints: WakeHints | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        record_later: bool = False,
    ):
        self.board = board
        # Policy at claim time (privacy domains, trust, taint): raises PolicyRefused.
        # Required: no claim path may leave it out (Fabric.claim_check builds it).
        self.claim_check = claim_check
        self.ledger = ledger
        self.queue = queue
        self.clock = clock
        self.rng = rng or random.Random()
        self.max_age = max_age
        self.hints = hints
        self.monotonic = monotonic  # the ages of polls, races and skips (a test's clock)
        # Claims win their lock and write nothing (Ledger.claim, record_later): the
        # worker writes the record and moves the card only for work that outlasts a
        # moment (workers.loop.RECORD_AFTER, SHOW_AFTER), else its outcome's write
        # carries the record.
        self.record_later = record_later
        self.last_poll_size = 0
        self._rows: list[BoardTask] = []
        self._polled_at = float("-inf")
        self._skip: dict[int, float] = {}  # task id -> self.monotonic() it is polled again
        self._lost_at = float("-inf")  # self.monotonic() of the last claim race lost
        # Backlog may hold cards: at start, and after a poll found the Queued cell full
        # (the keeper moves the rest of a long queue there).
        self._backlog_maybe = True
        self._backlog_read = float("-inf")  # self.monotonic() Backlog was last read

    @classmethod
    def for_agent(cls, fab: Fabric, card: Card, **kw: Any) -> QueueReader:
        """The reader of ``card``'s queue on ``fab`` (its home, for a confined agent),
        under the claim policy: the one way every claimer gets one."""
        home = fab.home_fabric(card)
        kw.setdefault("clock", home.clock)
        return cls(home.board, home.ledger, card.queue_name, claim_check=home.claim_check(card), **kw)

    def poll(self) -> list[BoardTask]:
        """The queue's queued open tasks that may be due, best first (one round trip; two
        when Queued has none and Backlog may)."""
        rows = self.board.open_in([Column.QUEUED], self.queue)
        now, mono = self.clock(), self.monotonic()
        self._skip = {tid: until for tid, until in self._skip.items() if until > mono}
        due = [r for r in rows if r.start_at <= now and r.id not in self._skip]
        if len(rows) >= QUEUED_CELL:
            self._backlog_maybe = True
        elif not due and self._backlog_due(mono):
            rows = self.board.open_in([Column.BACKLOG], self.queue)
            due = [r for r in rows if r.start_at <= now and r.id not in self._skip]
            self._backlog_maybe, self._backlog_read = bool(due), mono
        due.sort(key=order_key)
        self.last_poll_size = len(due)
        self._rows, self._polled_at = list(due), self.monotonic()
        return due

    def _backlog_due(self, mono: float) -> bool:
        if Column.BACKLOG not in self.board.layout.columns:
            return False
        return self._backlog_maybe or mono - self._backlog_read >= BACKLOG_CHECK

    def invalidate(self) -> None:
        """Forget the kept poll (a wake-up hint: something new may be first in line)."""
        self._rows = []

    def candidates(self, rows: list[BoardTask]) -> list[BoardTask]:
        """The best few rows, in the order to try them.

        Only a reader that has just lost a race to another worker shuffles, within each
        priority (never a lower priority before a higher one) and over every row it keeps
        (a Queued cell holds up to 32), so contending workers spread out over the cell
        while a worker alone takes the soonest deadline, then the oldest task, first.
        """
        if self.monotonic() - self._lost_at > CONTENDED_SECONDS:
            return rows[:CANDIDATES]
        groups: dict[int, list[BoardTask]] = {}
        for r in rows:
            groups.setdefault(r.priority, []).append(r)
        spread: list[BoardTask] = []
        for prio in sorted(groups, reverse=True):
            # A random few of the priority, in random order: what shuffling it all and
            # taking the first few gives, without shuffling a long cell on every claim.
            g = groups[prio]
            spread.extend(self.rng.sample(g, min(len(g), CANDIDATES - len(spread))))
            if len(spread) == CANDIDATES:
                break
        return spread

    def claim_next(self, owner: str, *, lease_seconds: float, min_priority: int = 0) -> Lease | None:
        """Claim the best due task, or None when there is nothing this worker can take.

        ``min_priority`` skips lower priorities (the budget governor: near the end of a
        quota, only interactive work runs). ``last_poll_size`` tells "the queue is empty"
        apart from "others were faster".
        """
        while self.hints is not None and (hint := self.hints.take()) is not None:
            lease = self._hinted(*hint, owner, lease_seconds, min_priority)
            if lease is not None:
                return lease
        fresh = False
        if not self._rows or self.monotonic() - self._polled_at > self.max_age:
            self.poll()
            fresh = True
        while True:
            lease = self._claim_from(
                [r for r in self._rows if r.priority >= min_priority], owner, lease_seconds, fresh=fresh
            )
            if lease is not None or fresh:
                return lease
            self.poll()
            fresh = True

    def _claim_from(
        self, rows: list[BoardTask], owner: str, lease_seconds: float, *, fresh: bool = True
    ) -> Lease | None:
        """Claim one of the kept ``rows`` (best first, or spread when contended), or None;
        None also when a race is lost on rows not ``fresh`` and older than
        REPOLL_AFTER_LOSS (the caller polls again)."""
        firsts = 0
        while rows:
            order = self.candidates(rows)
            # Whatever happens to a row tried (ours, someone else's, not claimable now),
            # it leaves the kept list; the next poll brings back what is still queued.
            # Rows not tried stay for the next claim.
            self._forget(order[:1])
            tried, lease = self._first(order[0], owner, lease_seconds)
            if lease is not None:
                return lease
            if tried and not fresh and self.monotonic() - self._polled_at > REPOLL_AFTER_LOSS:
                return None
            firsts += tried
            if tried and firsts < FIRST_TRIES and len(order) > 1:
                # Lost to another worker: the next card the same way (two calls, where
                # reading every candidate's records costs one call each).
                rows = [r for r in rows if r.id != order[0].id]
                continue
            rest = order[1:] if tried else order
            self._forget(rest)
            for view in self.board.read_meta_many(rest):
                lease = self._try(view, owner, lease_seconds)
                if lease is not None:
                    return lease
            seen = {r.id for r in order}
            rows = [r for r in rows if r.id not in seen]
        return None

    def _forget(self, rows: list[BoardTask]) -> None:
        gone = {r.id for r in rows}
        self._rows = [r for r in self._rows if r.id not in gone]

    def _hinted(
        self, task_id: int, uid: str, owner: str, lease_seconds: float, min_priority: int
    ) -> Lease | None:
        """Claim the task a submit event named: its row and records read and its first
        claim's lock tried in one round trip (no poll); the read decides, as in :meth:`_first`."""
        view, won = self.board.read_and_lock(task_id, uid, 1)
        return self._after_lock(view, uid, won, owner, lease_seconds, min_priority)

    def _first(self, row: BoardTask, owner: str, lease_seconds: float) -> tuple[bool, Lease | None]:
        """Claim a card never claimed before in one round trip less: (tried, lease).

        The uid a card's sealed description names (a fabric process with the seal key
        wrote it) gives the lock of its first claim, epoch 1, so its records are read and
        that lock tried in one batch, the read first (TaskBoard.read_and_lock). Not tried
        (False) for a card without a seal this fabric can verify. A card claimed before
        shows its real epoch in the same read, and is claimed the usual way from it.
        """
        sealed = self.board.sealed(row.description)
        if sealed is None or sealed.assignee or sealed.spec.queue != self.queue:
            return False, None
        view, won = self.board.read_and_lock(row, sealed.uid, 1)
        return True, self._after_lock(view, sealed.uid, won, owner, lease_seconds)

    def _after_lock(
        self, view: TaskView, uid: str, won: bool, owner: str, lease_seconds: float, min_priority: int = 0
    ) -> Lease | None:
        """What a read-and-lock of epoch 1 of task ``uid`` (through ``view``'s card) means."""
        cur = view.current
        if not won:
            its = cur is not None and view.uid == uid  # the read is of the task uid names
            if its and cur is not None and cur.state != State.QUEUED:
                # Taken since this reader's poll (or still on its way out of Queued):
                # other workers are claiming from these rows too, so spread from now on.
                self._lost_at = self.monotonic()
            if its and view.task.priority >= min_priority and (view.epoch >= 1 or self.ledger.gap_due(view)):
                # Claimed before, or a gap old enough to step over: the usual way.
                return self._try(view, owner, lease_seconds)
            self._lost_at = self.monotonic()
            if its:
                # Epoch 1 taken by another worker just now (a worker writes its claim's
                # record late, Ledger.claim's record_later), or by one that died before
                # its record (a gap, noted once it stays so): this read is the basis, no
                # other. Not skipped: a second loss gap_grace on is what notes a gap.
                with contextlib.suppress(LostRace):
                    self.ledger.lost(view, 1)
            return None
        if cur is None or view.uid != uid or cur.epoch != 0:
            self._give_back(view.task, uid, owner)
            return None
        if view.task.priority < min_priority:
            self._give_up(view, owner, 1, "below the priority the worker takes now")
            return None
        return self._try(view, owner, lease_seconds, held=1)

    def _give_back(self, row: BoardTask, uid: str, owner: str) -> None:
        """Epoch 1 of task ``uid`` was won through a card that is not that task: a copy
        (Kanboard's "Duplicate" copies the description and the reference), or a task whose
        submit is still in flight. The task the uid names gets that epoch as its state
        again; one still in flight resolves it as a gap, as any lock without a record."""
        found = self.board.find_by_reference(row.reference) if row.reference else None
        if found is None:
            return  # its task is gone: the tag is an orphan, collected like any other
        with contextlib.suppress(FabricError):
            view = self.board.read(found.id)
            if view.uid == uid and view.current is not None and view.current.epoch == 0:
                self.ledger.restate(view, 1, owner, "epoch 1 was taken through a copy of this card")

    def _not_mine(self, view: TaskView, state: State) -> None:
        """A card in this queue's Queued cell that is not a queued task of this queue."""
        cur = view.current
        if state == State.WORKING and cur is not None and self.board.writer_first(cur):
            self._in_flight(view.id)  # its claimer moves it late (or a move not yet checked)
            return
        if state == State.WORKING:
            # The card lags its record (a claim's move did not land): storage puts it
            # right now rather than at the keeper's next sweep, if it is the fabric's to fix.
            with contextlib.suppress(FabricError):
                self.board.repair_projection(view)
        # Anything else may be a person's gesture (an answer, a reopen, a revive, a move to
        # this lane): the keeper tells those from lost moves, by the board's activity.
        self._skip[view.id] = self.monotonic() + SKIP_SECONDS

    def _try(self, view: TaskView, owner: str, lease_seconds: float, held: int | None = None) -> Lease | None:
        """Claim ``view``'s task if this queue may (``held``: its next epoch's lock is
        already won; a task that turns out not claimable gets its state back in it)."""
        cur = view.current
        if cur is None:
            return None  # submit in flight (or a repair for the keeper)
        note = view.gap
        if held is None and note is not None and note.epoch == view.epoch + 1:
            if self.ledger.gap_due(view):
                with contextlib.suppress(LostRace, IllegalTransition):
                    self.ledger.resolve_gap(view, by=owner)
            return None  # a young gap is its winner's; an old one is claimed next poll
        if cur.state != State.QUEUED or (view.spec is not None and view.spec.queue != self.queue):
            self._not_mine(view, cur.state)
            self._give_up(view, owner, held, f"not this queue's to claim ({cur.state.value})")
            return None
        if cur.not_before and cur.not_before > self.clock():
            self._give_up(view, owner, held, "not due yet")
            return None
        try:
            self.claim_check(view)
        except FabricError as exc:
            # Refused by policy: retrying cannot help. Dead letter, with the reason;
            # the keeper turns it into a decision for a person.
            with contextlib.suppress(LostRace, IllegalTransition):
                self.ledger.dead_letter(
                    view.id, owner, f"refused at claim: {exc.line()}", view=view, held=held
                )
            return None
        try:
            lease = self.ledger.claim(
                view, owner, lease_seconds=lease_seconds, held=held, record_later=self.record_later
            )
        except LostRace:
            self._lost_at = self.monotonic()  # others are claiming too: spread from now on
            return None
        except IllegalTransition as exc:
            self._give_up(view, owner, held, exc.line())
            return None
        if self.record_later:
            self._in_flight(lease.task_id)  # in Queued until shown or done: not to try again
        return lease

    def _in_flight(self, task_id: int) -> None:
        """Leave a claimed card still in Queued out of polls for IN_FLIGHT_SKIP."""
        self._skip[task_id] = self.monotonic() + IN_FLIGHT_SKIP

    def _give_up(self, view: TaskView, owner: str, held: int | None, why: str) -> None:
        """Not claimed: an epoch lock already won for it is written as its state again."""
        if held is not None:
            with contextlib.suppress(LostRace, IllegalTransition, FabricError):
                self.ledger.restate(view, held, owner, f"claim not made: {why}")
