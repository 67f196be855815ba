"""A worker moves a claimed card to Working only once its work outlasts a moment.

Kanboard's move is one of its costliest calls. Work done within ``show_after`` of its
claim goes from Queued straight to its outcome's column (one move, not two); longer work
shows in Working ``show_after`` after its claim, with the move stamped as the fabric's
own (never read as a person's drag). ``show_after`` 0 moves the card in the claim's batch.
"""

from __future__ import annotations

import threading
from pathlib import Path

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import META_PROJECTED, Column
from fabric.kanboard.moves import MOVE
from fabric.task import State
from tests.conftest import FakeClock, make_fabric
from tests.helpers import card_column, wait_until
from workers.drill import DrillExecutor
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig

BOUND = 30.0  # a wait that does not end by then is a hang, and fails the test


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
    before = fab.port.stats.by_method.get(MOVE, 0)
    # Each job ends long before it would show (60 s): its card never stops in Working.
    runner = run(drain(fab, DrillExecutor(tmp_path / "log.sqlite3", effect=False), show_after=60.0))
    runner.join(BOUND)
    assert not runner.is_alive()
    assert fab.port.stats.by_method.get(MOVE, 0) - before == n, "one move a task: Queued to Done"
    for tid in ids:
        view = fab.board.read(tid)
        assert view.current is not None and view.current.state == State.DONE
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
