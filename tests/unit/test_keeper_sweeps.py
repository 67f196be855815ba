"""The keeper's lease and gap duties on the in-process board with a fake clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fabric.core import Fabric
from fabric.kanboard.layout import Column, epoch_lock, record_key
from fabric.kanboard.port import BoardUnavailable, Call, Outcome, Params, RpcPort
from fabric.ledger import LostRace
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from keeper.sweeps import sweep_leases_and_gaps
from tests.conftest import FakeClock

LEASE = 30.0


def submit(fab: Fabric, intent: str = "sweep me", target: str = "kimi") -> int:
    return fab.submit(intent, target=target).task_id


def claim(fab: Fabric, tid: int, owner: str = "w1") -> None:
    fab.ledger.claim(fab.board.read(tid), owner, lease_seconds=LEASE)


def current(fab: Fabric, tid: int) -> tuple[State, int, int]:
    view = fab.board.read(tid)
    assert view.current is not None
    return view.current.state, view.epoch, view.current.attempt


def keeper(fab: Fabric, **cfg: object) -> Keeper:
    return Keeper.for_fabric(fab, KeeperConfig(**cfg))  # type: ignore[arg-type]


def test_an_expired_lease_is_requeued_once_after_the_grace(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    claim(local_fabric, tid)
    k = keeper(local_fabric, lease_grace=5.0)
    clock.advance(LEASE + 1)
    assert k.run_job("leases")
    assert k.last["leases"].requeued == [], "inside the clock-skew grace: not yet"
    clock.advance(5)
    assert k.run_job("leases")
    assert k.last["leases"].requeued == [tid]
    assert current(local_fabric, tid) == (State.QUEUED, 2, 1), "the attempt is counted"
    assert k.run_job("leases") and k.last["leases"].requeued == [], "once, not every sweep"
    assert k.metrics.lease_expiries_total == 1
    queues = {q.queue: q for q in k.metrics.queues.values()}
    assert queues["kimi"].depth == 1


def test_attempts_exhausted_dead_letters_the_task(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    spec = local_fabric.board.read(tid).spec
    assert spec is not None
    k = keeper(local_fabric, lease_grace=0.0)
    for n in range(spec.max_attempts):
        claim(local_fabric, tid, f"w{n}")
        clock.advance(LEASE + 1)
        assert k.run_job("leases")
    assert current(local_fabric, tid)[0] == State.DEAD
    assert k.last["leases"].dead_lettered == [tid]
    row = local_fabric.port.call("getTask", {"task_id": tid})
    assert int(row["column_id"]) == local_fabric.board.layout.columns[Column.DEAD]
    assert k.metrics.dead_lettered_total == 1
    k.run_job("leases")
    assert k.metrics.queues["kimi"].dead_letters == 1


def test_an_epoch_gap_older_than_the_timeout_is_resolved(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    view = local_fabric.board.read(tid)
    assert view.uid is not None
    assert local_fabric.board.lock(epoch_lock(view.uid, 1))  # a winner that died at once
    for _ in range(2):  # a loss is noted as a gap only when it persists past the grace
        with pytest.raises(LostRace):
            local_fabric.ledger.claim(view, "w1", lease_seconds=LEASE)
        clock.advance(local_fabric.ledger.gap_grace + 0.1)
    assert local_fabric.board.read(tid).gap is not None
    k = keeper(local_fabric)
    assert k.run_job("gaps") and k.last["gaps"].gaps_resolved == [], "younger than the timeout"
    clock.advance(local_fabric.ledger.gap_timeout + 1)
    assert k.run_job("gaps")
    assert k.last["gaps"].gaps_resolved == [tid]
    assert current(local_fabric, tid)[:2] == (State.QUEUED, 2)
    assert k.metrics.gaps_resolved_total == 1


def test_corrupted_metadata_is_reported_and_skipped(local_fabric: Fabric, clock: FakeClock) -> None:
    bad, good = submit(local_fabric, "bad"), submit(local_fabric, "good")
    claim(local_fabric, bad)
    claim(local_fabric, good)
    local_fabric.port.call(
        "saveTaskMetadata", {"task_id": bad, "values": {record_key(1): "{not json", "fabric.spec": "[]"}}
    )
    clock.advance(LEASE + 10)
    k = keeper(local_fabric)
    assert k.run_once()["leases"]
    rep = k.last["leases"]
    assert rep.requeued == [good]
    assert bad in rep.problems and any("unreadable" in p for p in rep.problems[bad])
    assert k.metrics.corrupted_tasks == 1
    assert all(k.run_once().values()), "no job crashes on the corrupted task"


def test_the_compat_function_still_requeues(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    claim(local_fabric, tid)
    clock.advance(LEASE + 1)
    report = sweep_leases_and_gaps(local_fabric)
    assert report.requeued == [tid] and report.trips == 2


class FlakyPort:
    """Wraps a port; raises BoardUnavailable while ``down``."""

    def __init__(self, inner: RpcPort) -> None:
        self.inner = inner
        self.stats = inner.stats
        self.down = False

    def call(self, method: str, params: Params = None) -> object:
        if self.down:
            raise BoardUnavailable("connection refused")
        return self.inner.call(method, params)

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        if self.down:
            raise BoardUnavailable("connection refused")
        return self.inner.batch(calls)


def test_board_down_is_logged_counted_backed_off_and_recovered(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    flaky = FlakyPort(local_fabric.port)
    local_fabric.port = flaky
    local_fabric.board.port = flaky
    tid = submit(local_fabric)
    claim(local_fabric, tid)
    mono = FakeClock(0.0)
    k = Keeper.for_fabric(
        local_fabric, KeeperConfig(backoff_base=10, backoff_cap=60, lease_grace=0), monotonic=mono
    )
    flaky.down = True
    assert not k.run_job("leases")
    assert k.metrics.board_errors_total == 1 and k.metrics.board_up == 0
    assert "connection refused" in k.metrics.jobs["leases"].last_error
    assert not k.run_job("leases") and k.metrics.jobs["leases"].skipped_total == 1, "backing off"
    assert k.metrics.board_errors_total == 1, "a skipped run does not touch the board"
    mono.advance(11)
    assert not k.run_job("leases") and k.metrics.board_errors_total == 2
    mono.advance(15)
    assert not k.run_job("leases"), "the second backoff is twice as long"
    flaky.down = False
    mono.advance(10)
    clock.advance(LEASE + 1)
    assert k.run_job("leases")
    assert k.metrics.board_up == 1 and k.last["leases"].requeued == [tid]
    assert k.metrics.to_json()["jobs"]["leases"]["last_success"] == clock.now


def test_sweep_round_trips_do_not_grow_with_closed_history(local_fabric: Fabric) -> None:
    for i in range(6):
        tid = submit(local_fabric, f"active {i}")
        if i % 2:
            claim(local_fabric, tid)
    k = keeper(local_fabric)

    def trips(job: str) -> int:
        k.run_job(job)
        before = local_fabric.port.stats.trips
        assert k.run_job(job)
        return local_fabric.port.stats.trips - before

    jobs = ("leases", "gaps", "gestures", "deadlines", "reminders", "inbox")
    empty = {job: trips(job) for job in jobs}
    for i in range(40):
        tid = submit(local_fabric, f"history {i}")
        local_fabric.ledger.cancel(tid, "alvis", "history")
    assert {job: trips(job) for job in jobs} == empty
    assert empty["leases"] == 2


def test_a_corrupted_record_is_named_in_the_fabric_s_words(local_fabric: Fabric) -> None:
    tid = submit(local_fabric, "damaged by hand")
    local_fabric.port.call(
        "saveTaskMetadata",
        {"task_id": tid, "values": {record_key(1): '{"epoch": 1, "state": "melted", "op": "claim"}'}},
    )
    problems = local_fabric.board.read(tid).problems
    assert problems and all("validation error" not in p and "pydantic" not in p for p in problems), problems
    assert any(p.startswith(f"{record_key(1)}: unreadable record (") for p in problems), problems
