"""Brokers that die: publishing stays off the correctness path, ``watch`` falls back.

Every test here starts its own broker process (Mosquitto or nats-server on a free
loopback port) and kills that one, never the machine's shared brokers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.events.brokers import open_transport
from fabric.events.publisher import Publisher
from fabric.events.schema import Event, EventType
from fabric.events.subscriber import EXIT_COMPLETED, EXIT_UNAVAILABLE
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.helpers import Running, wait_until
from tests.integration.test_events_helpers import (
    CARDS,
    QUEUE,
    Gate,
    OwnBroker,
    Watching,
    board_check,
    free_port,
    make_worker,
)
from workers.attach import attach_worker

pytest_plugins = ["tests.integration.test_events_helpers"]  # the fixtures


def state_of(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None


def test_a_dead_broker_costs_a_bounded_skip_and_never_a_transition(
    own_broker: OwnBroker, fab: Fabric
) -> None:
    broker = own_broker.broker()
    own_broker.kill()
    pub = Publisher(open_transport(broker.config), broker.config.secret, background=False)
    t0 = time.monotonic()
    assert not pub.send(Event.make(1, 1, 0, EventType.STARTED))
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert not pub.send(Event.make(1, 1, 1, EventType.PROGRESS))
    degraded = time.monotonic() - t0
    # The exact check is the attempt count (the second send did not try the broker again);
    # the times only say "no connect timeout was waited out", generously for a busy machine.
    assert pub.stats.skipped == 2 and pub.stats.attempts == 3 + 1
    assert first < 10.0 and degraded < 2.0, (first, degraded)
    # a worker whose broker is dead still does its work, at full speed
    tids = [fab.submit(f"task {i}", target=QUEUE).task_id for i in range(3)]
    worker = make_worker(fab, Gate(hold=False))
    att = attach_worker(worker, env=broker.env())
    assert att is not None
    with Running(worker):
        wait_until(lambda: all(state_of(fab, t) == State.DONE for t in tids), timeout=20, what="all done")
    att.close(timeout=5)
    assert att.publisher.stats.published == 0 and att.publisher.stats.skipped > 0


def test_watch_falls_back_to_the_board_when_the_broker_dies_mid_task(
    own_broker: OwnBroker, fab: Fabric
) -> None:
    broker = own_broker.broker()
    tid = fab.submit("outlive the broker", target=QUEUE).task_id
    gate = Gate()
    worker = make_worker(fab, gate)
    att = attach_worker(worker, env=broker.env(), wake=False)
    assert att is not None
    w = Watching(tid, board_check(fab, tid), broker.config, board_poll=0.3)
    w.wait_live()
    with Running(worker):
        assert gate.entered.wait(10)
        wait_until(lambda: "progress" in w.types(), what="live events before the kill")
        own_broker.kill()
        w.wait_polling()  # it noticed, and follows the board instead
        assert w.thread.is_alive(), "a dead broker alone must not end the watch"
        gate.release.set()
        result = w.join(20)
    att.close(timeout=5)
    assert result.code == EXIT_COMPLETED
    assert w.lines[0]["source"] == "broker" and w.lines[0]["event"] == "started"
    assert w.lines[-1]["source"] == "board" and w.lines[-1]["data"]["state"] == "done"
    assert state_of(fab, tid) == State.DONE


def test_watch_rejoins_the_broker_when_it_comes_back(own_broker: OwnBroker, fab: Fabric) -> None:
    broker = own_broker.broker()
    tid = fab.submit("see the broker return", target=QUEUE).task_id
    gate = Gate()
    worker = make_worker(fab, gate)
    att = attach_worker(worker, env=broker.env(), wake=False)
    assert att is not None
    w = Watching(tid, board_check(fab, tid), broker.config, board_poll=0.3)
    w.wait_live()
    with Running(worker):
        assert gate.entered.wait(10)
        own_broker.kill()
        w.wait_polling(1)  # the watch saw the broker go (it polls the board only then)
        own_broker.start()  # the same port
        w.wait_live(times=2, timeout=15)
        gate.release.set()
        result = w.join(20)
    att.close(timeout=5)
    assert result.code == EXIT_COMPLETED
    assert w.lines[-1]["source"] == "broker" and w.lines[-1]["event"] == "completed"


def test_exit_3_only_when_the_broker_and_the_board_are_both_away(
    own_broker: OwnBroker, wcards: CardSet, tmp_path: Path
) -> None:
    # The board runs as its own process too, so that killing it closes every connection.
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric.apps.cli",
            "board",
            "serve",
            "--db",
            str(tmp_path / "own-board.sqlite3"),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        env = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        settings = Settings(
            board_url=env["KANBOARD_URL"], board_token=env["KANBOARD_API_TOKEN"], cards_dir=CARDS
        )
        fab = make_fabric(KanboardClient(settings.board_url, settings.board_token), wcards, settings=settings)
        tid = fab.submit("lose everything", target=QUEUE).task_id
        broker = own_broker.broker()
        w = Watching(tid, board_check(fab, tid), broker.config, board_poll=0.3)
        w.wait_live()
        own_broker.kill()
        w.wait_polling()  # the broker is gone, the board answers: it keeps polling
        assert w.thread.is_alive(), "the board still answers: keep watching"
    finally:
        proc.kill()
        proc.wait(5)
    result = w.join(20)  # it ends by itself: nobody answers
    assert result.code == EXIT_UNAVAILABLE
    assert w.lines == []
