"""A worker's claim wins its lock and writes nothing until its work outlasts a moment.

Kanboard's move is one of its costliest calls, and every write is a call. Work done
within ``show_after`` of its claim writes the claim's record in its outcome's batch and
goes from Queued straight to its outcome's column (one write, one move); longer work has
its record written and shows in Working ``show_after`` after its claim, with the move
stamped as the fabric's own (never read as a person's drag). Meanwhile the task reads as
a young gap, which other readers leave to its claimer. ``show_after`` 0 writes the record
and moves the card in the claim's batch.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import META_PROJECTED, Column, epoch_lock
from fabric.kanboard.moves import MOVE
from fabric.ledger import Fenced, Lease
from fabric.task import State
from tests.conftest import FakeClock, make_fabric
from tests.helpers import card_column, wait_until
from workers.drill import DrillExecutor
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig
from workers.queue import QueueReader

BOUND = 30.0  # a wait that does not end by then is a hang, and fails the test
LEASE = 300.0
SAVE_META = "saveTaskMetadata"


def drain(fab: Fabric, executor: object, show_after: float, *, own_connections: bool = False) -> Worker:
    """A draining worker on ``fab``, or (``own_connections``) on connections of its own
    to ``fab``'s board, as `agap worker` connects (the test reads beside it)."""

    def connect() -> Fabric:
        if not own_connections:
            return fab
        url, token = fab.settings.board_url, fab.settings.board_token
        return Fabric.connect(fab.settings, cards=fab.cards, port=KanboardClient(url, token))

    worker = Worker(
        connect,
        executor,  # type: ignore[arg-type]
        WorkerConfig(
            queue=fab.cards.get("kimi").queue_name,
            owner="w",
            poll_seconds=0.05,
            exit_when_idle=True,
            show_after=show_after,
        ),
    )
    return worker


def run(worker: Worker) -> threading.Thread:
    runner = threading.Thread(target=worker.run)
    runner.start()
    return runner


def test_work_done_before_it_would_show_moves_its_card_once(
    cards: CardSet, clock: FakeClock, tmp_path: Path
) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    n = 5
    ids = [fab.submit(f"quick {i}", target="kimi").task_id for i in range(n)]
    stats = fab.port.stats.by_method
    moves, writes = stats.get(MOVE, 0), stats.get(SAVE_META, 0)
    # Each job ends long before it would show (60 s): its card never stops in Working.
    runner = run(drain(fab, DrillExecutor(tmp_path / "log.sqlite3", effect=False), show_after=60.0))
    runner.join(BOUND)
    assert not runner.is_alive()
    assert stats.get(MOVE, 0) - moves == n, "one move a task: Queued to Done"
    assert stats.get(SAVE_META, 0) - writes == n, "one write a task: the claim rides with the outcome"
    for tid in ids:
        view = fab.board.read(tid)
        assert view.current is not None and view.current.state == State.DONE
        claimed = view.records[1]
        assert (claimed.state, claimed.op, claimed.owner) == (State.WORKING, "claim", "w")
        assert card_column(fab, tid) == Column.DONE


def test_longer_work_shows_in_working_while_it_runs(http_fabric: Fabric) -> None:
    fab = http_fabric
    tid = fab.submit("a longer job", target="kimi").task_id
    shown = threading.Event()

    def execute(job: Job) -> JobOutcome:
        shown.wait(BOUND)  # until the test has seen the card in Working
        return JobOutcome.done("drill://longer")

    runner = run(drain(fab, execute, show_after=0.05, own_connections=True))
    try:
        wait_until(lambda: card_column(fab, tid) == Column.WORKING, timeout=BOUND, what="the card in Working")
        view = fab.board.read(tid)
        assert view.current is not None and view.current.state == State.WORKING
        # Stamped as the fabric's own move of this record: the keeper never reads it as a drag.
        assert view.meta[META_PROJECTED].startswith(f"{view.epoch}:")
    finally:
        shown.set()
        runner.join(BOUND)
    assert not runner.is_alive()
    assert card_column(fab, tid) == Column.DONE


def test_show_after_zero_moves_the_card_in_the_claims_own_batch(cards: CardSet, clock: FakeClock) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    tid = fab.submit("shown at once", target="kimi").task_id
    seen: list[Column] = []

    def execute(job: Job) -> JobOutcome:
        seen.append(card_column(fab, job.lease.task_id))  # before any heartbeat could move it
        return JobOutcome.done("drill://at-once")

    runner = run(drain(fab, execute, show_after=0.0))
    runner.join(BOUND)
    assert not runner.is_alive()
    assert seen == [Column.WORKING]
    assert card_column(fab, tid) == Column.DONE


def reader(fab: Fabric, clock: FakeClock, **kw: object) -> QueueReader:
    return QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock, monotonic=clock, max_age=0, **kw)


def claim_unrecorded(fab: Fabric, clock: FakeClock) -> tuple[int, Lease]:
    tid = fab.submit("claimed, not yet recorded", target="kimi").task_id
    lease = reader(fab, clock, record_later=True).claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id == tid and lease.epoch == 1 and not lease.recorded
    return tid, lease


def test_a_claim_not_yet_recorded_is_left_to_its_claimer(cards: CardSet, clock: FakeClock) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    tid, lease = claim_unrecorded(fab, clock)
    view = fab.board.read(tid)
    assert view.epoch == 0 and card_column(fab, tid) == Column.QUEUED, "the lock is all the claim wrote"
    other = reader(fab, clock)
    assert other.claim_next("w2", lease_seconds=LEASE) is None  # lost to w1's lock
    clock.advance(fab.ledger.gap_grace / 2)
    assert other.claim_next("w2", lease_seconds=LEASE) is None
    assert fab.board.read(tid).gap is None, "a young lock without a record is no gap to note"
    fab.ledger.complete(lease, "drill://quick")
    view = fab.board.read(tid)
    assert view.epoch == 2 and view.current is not None and view.current.state == State.DONE
    assert view.records[1].owner == "w1" and view.records[1].state == State.WORKING


def test_an_effect_or_checkpoint_before_the_claim_shows_writes_its_record_first(
    cards: CardSet, clock: FakeClock
) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    tid, lease = claim_unrecorded(fab, clock)
    effect = fab.ledger.effect(lease, "notify")  # checks the epoch: not fenced by its own lateness
    assert effect.receipt is None
    view = fab.board.read(tid)
    assert view.epoch == 1 and view.current is not None and view.current.owner == "w1"
    tid2, lease2 = claim_unrecorded(fab, clock)
    lease2 = fab.ledger.checkpoint(lease2, "drill://half-way")
    assert lease2.recorded and fab.board.read(tid2).records[1].checkpoint == "drill://half-way"
    fab.ledger.complete(lease2, "drill://done")  # carries no second copy of the claim
    assert fab.board.read(tid2).current.state == State.DONE  # type: ignore[union-attr]


def test_a_claimer_that_dies_before_its_record_leaves_a_gap_that_resolves(
    cards: CardSet, clock: FakeClock
) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    tid, lease = claim_unrecorded(fab, clock)
    assert fab.board.read(tid).uid is not None and not fab.board.lock(epoch_lock(lease.uid, 1))
    other = reader(fab, clock)
    assert other.claim_next("w2", lease_seconds=LEASE) is None
    clock.advance(fab.ledger.gap_grace)
    assert other.claim_next("w2", lease_seconds=LEASE) is None  # still unrecorded: noted
    note = fab.board.read(tid).gap
    assert note is not None and note.epoch == 1
    clock.advance(fab.ledger.gap_timeout + 1)
    assert other.claim_next("w2", lease_seconds=LEASE) is None  # resolves the gap
    again = other.claim_next("w2", lease_seconds=LEASE)
    assert again is not None and again.task_id == tid and again.epoch == 3
    with pytest.raises(Fenced):  # the first claimer, were it only slow, is fenced
        fab.ledger.complete(lease, "drill://too-late")
    assert fab.board.read(tid).current.owner == "w2"  # type: ignore[union-attr]


def test_a_claim_is_recorded_once_its_work_outlasts_a_moment(http_fabric: Fabric) -> None:
    """Its record (and the lease the keeper expires) is written at RECORD_AFTER, before
    the card shows: a worker dying mid-job leaves a lease, not a gap."""
    fab = http_fabric
    tid = fab.submit("a job of some length", target="kimi").task_id
    recorded = threading.Event()

    def execute(job: Job) -> JobOutcome:
        recorded.wait(BOUND)  # until the test has seen the record
        return JobOutcome.done("drill://some-length")

    runner = run(drain(fab, execute, show_after=60.0, own_connections=True))
    try:
        # Well before its first renewal (a third of the default 60 s lease).
        wait_until(lambda: fab.board.read(tid).epoch == 1, timeout=10.0, what="the claim's record")
        view = fab.board.read(tid)
        assert view.current is not None and view.current.state == State.WORKING
        assert view.current.owner == "w" and view.current.lease_until is not None
        assert card_column(fab, tid) == Column.QUEUED, "shown only at show_after"
    finally:
        recorded.set()
        runner.join(BOUND)
    assert not runner.is_alive()
    assert card_column(fab, tid) == Column.DONE


def test_a_jobs_effect_writes_its_claims_record_once(cards: CardSet, clock: FakeClock) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    tid, lease = claim_unrecorded(fab, clock)
    job = Job(lease, fab.ledger)
    job.effect("notify")
    assert job.lease.recorded, "the outcome need not carry the record again"
    assert fab.board.read(tid).current.owner == "w1"  # type: ignore[union-attr]


def test_a_job_whose_effect_finds_it_fenced_knows_it(cards: CardSet, clock: FakeClock) -> None:
    fab = make_fabric(LocalPort(clock=clock), cards, clock)
    _, lease = claim_unrecorded(fab, clock)
    fab.ledger.complete(fab.ledger.renew(lease), "drill://by-another-path")  # the epoch moves on
    job = Job(lease, fab.ledger)
    with pytest.raises(Fenced):
        job.effect("notify")
    assert job.fenced.is_set(), "its outcome is kept as evidence, never tried as a transition"
