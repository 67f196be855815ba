"""Round trips riding together: a worker records one task while it claims the next.

Each rider's calls keep their order and come back as its own outcomes; a failure reaches
each rider as its own request's would have (reads sent beside writes are sent again
alone, an ambiguous write names only the rider's own calls); a rider never waits for
one that has left. A draining worker pays two round trips a task, every task done once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.embedded.local import LocalPort
from fabric.kanboard.gather import GatheringPort, gathering, gathering_of
from fabric.kanboard.moves import MOVE, MoveTracker
from fabric.kanboard.port import BoardUnavailable, Call, MaybeDone, Outcome, RoundTrips, RpcError
from fabric.task import State
from tests.conftest import FakeClock, make_fabric
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig

PATIENT = 30.0  # riders wait for each other this long: only a rider that leaves ends it
BOUND = 30.0  # a join that does not end by then is a hang, and fails the test


class Recorder:
    """A port that answers every call with its method name, and keeps each request."""

    def __init__(self) -> None:
        self.stats = RoundTrips()
        self.requests: list[list[str]] = []
        self.fail_next: Exception | None = None
        self.busy: set[str] = set()  # methods answered with a server-side error (code 0)

    def call(self, method: str, params: object = None) -> object:
        return self.batch([Call(method, params)])[0].unwrap()  # type: ignore[arg-type]

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        self.stats.record(calls)
        self.requests.append([c.method for c in calls])
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        out = []
        for c in calls:
            if c.method in self.busy:
                self.busy.discard(c.method)
                out.append(Outcome(c, error=RpcError(0, "database is locked", method=c.method)))
            else:
                out.append(Outcome(c, value=c.method))
        return out


def _two_trips(port: GatheringPort, first: str, second: str) -> list[object]:
    return [port.call(first), port.call(second)]


def test_two_riders_share_each_request_and_get_their_own_answers() -> None:
    inner = Recorder()
    port = GatheringPort(inner, wait=PATIENT)
    a, b = port.together(
        lambda: _two_trips(port, "createTag", "saveTaskMetadata"),
        lambda: _two_trips(port, "getTaskMetadata", "moveTaskToProject"),
    )
    assert a == ["createTag", "saveTaskMetadata"]
    assert b == ["getTaskMetadata", "moveTaskToProject"]
    assert len(inner.requests) == 2, inner.requests
    assert sorted(inner.requests[0]) == ["createTag", "getTaskMetadata"]
    assert sorted(inner.requests[1]) == ["moveTaskToProject", "saveTaskMetadata"]


def test_a_rider_left_alone_goes_without_waiting() -> None:
    inner = Recorder()
    port = GatheringPort(inner, wait=PATIENT)  # were it waited for, the join below would fail
    done: list[object] = []
    t = threading.Thread(
        target=lambda: done.append(port.together(lambda: _two_trips(port, "a", "b"), lambda: None))
    )
    t.start()
    t.join(BOUND)
    assert not t.is_alive() and done == [[["a", "b"], None]]
    assert inner.requests == [["a"], ["b"]]


def test_a_thread_outside_a_ride_goes_straight_through() -> None:
    inner = Recorder()
    port = gathering(inner)
    assert gathering(port) is port and gathering_of(port) is port
    assert port.call("getVersion") == "getVersion" and inner.requests == [["getVersion"]]


def test_an_ambiguous_failure_names_each_writer_its_own_calls_and_reads_go_again() -> None:
    inner = Recorder()
    port = GatheringPort(inner, wait=PATIENT)
    inner.fail_next = MaybeDone("a write failed ambiguously", calls=[Call("x")])
    seen: dict[str, object] = {}

    def writer() -> None:
        try:
            port.call("createTag")
        except MaybeDone as exc:
            seen["writer"] = [c.method for c in exc.calls]

    def reader() -> None:
        seen["reader"] = port.call("getTaskMetadata")

    port.together(writer, reader)
    assert seen == {"writer": ["createTag"], "reader": "getTaskMetadata"}
    assert len(inner.requests) == 2 and inner.requests[1] == ["getTaskMetadata"]


def test_a_busy_read_beside_a_write_is_sent_again_alone() -> None:
    inner = Recorder()
    inner.busy = {"searchTasks"}
    port = GatheringPort(inner, wait=PATIENT)
    w, r = port.together(lambda: port.call("createTag"), lambda: port.call("searchTasks"))
    assert (w, r) == ("createTag", "searchTasks")
    assert inner.requests[-1] == ["searchTasks"] and len(inner.requests) == 2


def test_a_failure_no_rider_can_repeat_reaches_every_writer() -> None:
    inner = Recorder()
    inner.fail_next = BoardUnavailable("cannot reach the board")
    port = GatheringPort(inner, wait=PATIENT)
    raised: list[str] = []

    def write(method: str) -> None:
        try:
            port.call(method)
        except BoardUnavailable:
            raised.append(method)

    port.together(lambda: write("createTag"), lambda: write("saveTaskMetadata"))
    assert sorted(raised) == ["createTag", "saveTaskMetadata"] and len(inner.requests) == 1


def test_a_job_that_raises_is_raised_once_every_rider_has_ended() -> None:
    port = GatheringPort(Recorder(), wait=PATIENT)
    ended = threading.Event()

    def boom() -> None:
        raise ValueError("executor bug")

    with pytest.raises(ValueError, match="executor bug"):
        port.together(boom, ended.set)
    assert ended.is_set()


def test_a_check_asked_before_a_newer_move_leaves_that_move_to_its_own_check() -> None:
    tracker = MoveTracker(clock=lambda: 100.0)
    move = Call(MOVE, {"task_id": 7, "project_id": 1, "column_id": 3, "swimlane_id": 1})
    tracker.remember([move], 7, epoch=2)
    asked = 0.0  # before the move above was remembered (time.monotonic() is larger)
    row = Outcome(Call("getTask"), value={"id": 7, "column_id": 2, "is_active": 1})
    meta = Outcome(Call("getTaskMetadata"), value={})
    again = tracker.recheck(
        [7],
        [row, meta, Outcome(Call("getProjectActivity"), value=[])],
        people=set(),
        epoch_of=lambda *a: 1,
        asked=asked,
    )
    assert again == [] and tracker.due(every=True) == [7], "the newer move is still to be checked"


def test_a_draining_worker_pays_two_round_trips_a_task(
    cards: CardSet, clock: FakeClock, tmp_path: Path
) -> None:
    fab = make_fabric(gathering(LocalPort(clock=clock)), cards, clock)  # as Fabric.connect wraps a port
    n = 12
    ids = [fab.submit(f"drain {i}", target="kimi").task_id for i in range(n)]
    port = gathering_of(fab.port)
    assert port is not None
    port.wait = PATIENT  # riders always meet: the count below does not depend on timing
    before = fab.port.stats.trips
    worker = Worker(
        lambda: fab,
        DrillExecutor(tmp_path / "log.sqlite3", effect=False),
        WorkerConfig(
            queue=fab.cards.get("kimi").queue_name, owner="w", poll_seconds=0.05, exit_when_idle=True
        ),
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    runner.join(BOUND)
    assert not runner.is_alive()
    assert worker.stats.completed == n
    views = fab.board.read_many(ids)
    assert all(v.current is not None and v.current.state == State.DONE for v in views.values())
    per_task = (fab.port.stats.trips - before) / n
    # Alone: claim 2 + complete 2 a task. Riding together: 2, plus the polls and the first
    # claim and the last outcome, which have no partner.
    assert per_task < 2.6, per_task
