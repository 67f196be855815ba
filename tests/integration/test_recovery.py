"""Recovery drills with real processes dying at the worst moments (embedded board, HTTP)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path

from fabric.cards import CardSet
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import epoch_lock, record_key
from fabric.task import Record, State
from keeper.sweeps import sweep_leases_and_gaps
from tests.conftest import ROOT, FakeClock, make_fabric
from tests.integration.procs import drill_worker, win_lock_and_die
from workers.queue import QueueReader


def _drain(
    board: EmbeddedBoard, log: Path, tmp: Path, name: str, lease: float, crash_marker: Path | None = None
) -> int | None:
    ctx = mp.get_context("spawn")
    p = ctx.Process(
        target=drill_worker,
        args=(
            board.url,
            board.token,
            str(ROOT / "cards"),
            "gemma-local",
            name,
            str(log),
            lease,
            0.0,
            0.0,
            True,
            str(tmp / f"cache-{name}"),
            str(crash_marker) if crash_marker else None,
        ),
    )
    p.start()
    p.join(60)
    return p.exitcode


def test_a_worker_dying_after_delivery_does_not_apply_the_effect_twice(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards)
    tid = fab.submit("deliver exactly once", target="gemma-local").task_id
    log, marker = tmp_path / "drill.sqlite3", tmp_path / "crashed"
    assert _drain(embedded_board, log, tmp_path, "first", 1.0, marker) == 137
    assert marker.exists()
    # The first owner delivered and died before its receipt: its lease expires.
    deadline = time.monotonic() + 30
    while not sweep_leases_and_gaps(fab).requeued:
        assert time.monotonic() < deadline, "the expired lease was never requeued"
        time.sleep(0.2)
    assert _drain(embedded_board, log, tmp_path, "second", 1.0, marker) == 0
    view = fab.board.read(tid)
    assert view.current is not None and view.current.state == State.DONE
    db = sqlite3.connect(log)
    keys = db.execute("SELECT key FROM deliveries").fetchall()
    assert len(keys) == 2 and keys[0] == keys[1], "both owners must use the same key"
    assert db.execute("SELECT COUNT(*) FROM applied").fetchone() == (1,)


def test_a_winner_dying_between_tag_and_record_leaves_a_gap_that_is_resolved(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    clock = FakeClock(time.time())  # the gap's grace and timeout pass when the test says so
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, clock)
    fab.ledger.gap_timeout = 0.5
    tid = fab.submit("gap drill", target="gemma-local").task_id
    view = fab.board.read(tid)
    assert view.uid is not None
    p = mp.get_context("spawn").Process(
        target=win_lock_and_die,
        args=(
            embedded_board.url,
            embedded_board.token,
            fab.board.layout.locks_project_id,
            epoch_lock(view.uid, 1),
        ),
    )
    p.start()
    p.join(30)
    assert p.exitcode == 9
    fab.ledger.gap_grace = 0.2
    reader = QueueReader.for_agent(fab, fab.cards.get("gemma-local"), max_age=0, clock=clock)
    assert reader.claim_next("w1", lease_seconds=30) is None, "epoch 1 is held by the dead"
    clock.advance(0.25)
    assert reader.claim_next("w1", lease_seconds=30) is None
    assert fab.board.read(tid).gap is not None, "a loser must note the persisting gap"
    report = sweep_leases_and_gaps(fab)
    assert report.gaps_resolved == [], "a gap younger than the timeout is left alone"
    clock.advance(0.6)
    report = sweep_leases_and_gaps(fab)
    assert report.gaps_resolved == [tid]
    lease = reader.claim_next("w1", lease_seconds=30)
    assert lease is not None and lease.task_id == tid and lease.epoch == 3
    fab.ledger.complete(lease, "file:///done")
    assert fab.board.read(tid).current.state == State.DONE  # type: ignore[union-attr]


def test_a_delayed_stale_write_never_changes_the_current_state(
    embedded_board: EmbeddedBoard, cards: CardSet
) -> None:
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards)
    tid = fab.submit("stale write drill", target="gemma-local").task_id
    reader = QueueReader.for_agent(fab, fab.cards.get("gemma-local"))
    lease = reader.claim_next("w1", lease_seconds=30)
    assert lease is not None
    # A renewal from epoch 1 was sent, stalled in the network, and arrives after the
    # task completed: it rewrites record e1 only, and e2 stays the current state.
    stale = Record(
        epoch=1,
        state=State.WORKING,
        op="claim",
        by="w1",
        at=time.time(),
        owner="w1",
        lease_until=time.time() + 3600,
        attempt=1,
    )
    fab.ledger.complete(lease, "file:///result")
    other = KanboardClient(embedded_board.url, embedded_board.token)
    assert other.call("saveTaskMetadata", {"task_id": tid, "values": {record_key(1): stale.to_meta()}})
    view = fab.board.read(tid)
    assert view.epoch == 2 and view.current is not None
    assert view.current.state == State.DONE and view.current.result_ref == "file:///result"
    assert sweep_leases_and_gaps(fab).requeued == []
