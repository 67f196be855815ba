"""Human gestures in the Kanboard UI vs the fabric's own lagging projection."""

from __future__ import annotations

from typing import Any

from fabric.core import Fabric
from fabric.kanboard.layout import Column, State
from fabric.ledger import Lease
from fabric.settings.keeper import KeeperConfig
from keeper.daemon import Keeper
from keeper.gestures import HUMAN
from tests.conftest import FakeClock
from tests.helpers import wait_until

LEASE = 300.0


def setup(fab: Fabric, target: str = "kimi") -> tuple[int, Keeper]:
    tid = fab.submit("a task a human will touch", target=target).task_id
    return tid, Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))


def claim(fab: Fabric, tid: int) -> Lease:
    return fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=LEASE)


def move(fab: Fabric, tid: int, column: Column) -> None:
    """What Kanboard does when a human drags a card."""
    layout = fab.board.layout
    row = fab.port.call("getTask", {"task_id": tid})
    assert fab.port.call(
        "moveTaskPosition",
        {
            "project_id": layout.project_id,
            "task_id": tid,
            "column_id": layout.columns[column],
            "position": 1,
            "swimlane_id": int(row["swimlane_id"]),
        },
    )


def human_comment(fab: Fabric, tid: int, text: str, user: str = "alvis") -> None:
    assert fab.port.call(
        "createComment", {"task_id": tid, "user_id": fab.board.layout.users[user], "content": text}
    )


def row(fab: Fabric, tid: int) -> dict[str, Any]:
    r = fab.port.call("getTask", {"task_id": tid})
    assert isinstance(r, dict)
    return r


def col(fab: Fabric, tid: int) -> Column:
    cid = int(row(fab, tid)["column_id"])
    return next(c for c, i in fab.board.layout.columns.items() if i == cid)


def rec(fab: Fabric, tid: int) -> tuple[State, str, str | None, str]:
    cur = fab.board.read(tid).current
    assert cur is not None
    return cur.state, cur.op, cur.reason, cur.by


def gestures(k: Keeper) -> Any:
    assert k.run_job("gestures")
    return k.last["gestures"]


def test_an_answer_and_a_move_to_queued_resumes_with_the_answer(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    tid, k = setup(local_fabric)
    local_fabric.ledger.ask(claim(local_fabric, tid), "Which repo?", "alvis")
    clock.advance(600)
    human_comment(local_fabric, tid, "the homelab one")
    move(local_fabric, tid, Column.QUEUED)
    assert gestures(k).acted == {tid: "resume"}
    assert rec(local_fabric, tid) == (State.QUEUED, "resume", "the homelab one", HUMAN)
    assert gestures(k).acted == {}, "acted on once"
    assert k.metrics.gestures_total == 1


def test_closing_a_done_card_verifies_it(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    local_fabric.ledger.complete(claim(local_fabric, tid), "file:///result.md")
    gestures(k)  # the keeper sees it open in Done and watches it
    clock.advance(600)
    assert local_fabric.port.call("closeTask", {"task_id": tid})
    assert gestures(k).acted == {tid: "verify"}
    state, op, _, by = rec(local_fabric, tid)
    assert (state, op, by) == (State.CLOSED, "verify", HUMAN)
    assert not int(row(local_fabric, tid)["is_active"])


def test_moving_a_done_card_back_to_queued_reopens_it(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    local_fabric.ledger.complete(claim(local_fabric, tid), "file:///result.md")
    clock.advance(600)
    human_comment(local_fabric, tid, "wrong file, redo")
    move(local_fabric, tid, Column.QUEUED)
    assert gestures(k).acted == {tid: "reopen"}
    assert rec(local_fabric, tid)[:3] == (State.QUEUED, "reopen", "wrong file, redo")


def test_closing_an_active_card_cancels_it(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    working, _ = setup(local_fabric)
    claim(local_fabric, working)
    clock.advance(600)
    for t in (tid, working):
        assert local_fabric.port.call("closeTask", {"task_id": t})
    assert gestures(k).acted == {tid: "cancel", working: "cancel"}
    assert rec(local_fabric, tid)[:2] == (State.CANCELED, "cancel")
    assert col(local_fabric, tid) == Column.DONE


def test_moving_a_dead_letter_to_queued_revives_it(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    local_fabric.ledger.fail(claim(local_fabric, tid), "poison", poison=True)
    clock.advance(600)
    move(local_fabric, tid, Column.QUEUED)
    assert gestures(k).acted == {tid: "revive"}
    view = local_fabric.board.read(tid)
    assert view.current is not None and view.current.state == State.QUEUED
    assert view.current.attempt == 0


def test_moving_a_gate_to_done_approves_it(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric, target="alvis")
    # A task for a person is created in their inbox: nothing for the keeper to repair.
    assert col(local_fabric, tid) == Column.WAITING
    assert gestures(k).repaired == []
    clock.advance(600)
    move(local_fabric, tid, Column.DONE)
    assert gestures(k).acted == {tid: "approve"}
    state, op, _, by = rec(local_fabric, tid)
    assert (state, op, by) == (State.DONE, "complete", HUMAN)
    assert col(local_fabric, tid) == Column.DONE


def test_a_meaningless_move_is_put_back_with_one_comment(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    claim(local_fabric, tid)
    clock.advance(600)
    move(local_fabric, tid, Column.DONE)  # a worker owns it: dragging it means nothing
    rep = gestures(k)
    assert rep.acted == {} and rep.explained == [tid]
    assert col(local_fabric, tid) == Column.WORKING
    assert rec(local_fabric, tid)[0] == State.WORKING, "the record is untouched"
    notes = [c for c in local_fabric.board.comments(tid) if "put this card back" in c.text]
    assert len(notes) == 1
    assert gestures(k).explained == [], "repaired: nothing to say twice"


def test_a_lagging_projection_is_repaired_without_acting(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    claim(local_fabric, tid)
    # The record says working, but its card move "failed": the card still shows Queued,
    # moved no later than the record was written.
    move(local_fabric, tid, Column.QUEUED)
    clock.advance(600)
    comments = len(local_fabric.board.comments(tid))
    rep = gestures(k)
    assert rep.acted == {} and rep.repaired == [tid]
    assert col(local_fabric, tid) == Column.WORKING
    view = local_fabric.board.read(tid)
    assert view.epoch == 1 and view.current is not None and view.current.state == State.WORKING
    assert len(local_fabric.board.comments(tid)) == comments, "no comment spam"


def test_a_reopened_closed_card_is_closed_again(local_fabric: Fabric, clock: FakeClock) -> None:
    tid, k = setup(local_fabric)
    local_fabric.ledger.cancel(tid, "alvis", "no longer needed")
    clock.advance(600)
    assert local_fabric.port.call("openTask", {"task_id": tid})
    # It is now open in Done, outside the active columns: the gesture sweep reads Done.
    rep = gestures(k)
    assert rep.explained == [tid]
    assert not int(row(local_fabric, tid)["is_active"])


def test_a_lost_re_sent_move_is_repaired_not_read_as_a_reopen(local_fabric: Fabric, clock: FakeClock) -> None:
    """PostgreSQL: a move the fabric re-sent late, then lost to a concurrent one."""
    fab = local_fabric
    tid, keeper = setup(fab)
    fab.ledger.complete(claim(fab, tid), "file:///r")
    done = fab.board.read(tid)
    clock.advance(20)  # the write batch's own re-sends (deadlocks) took this long
    fab.port.batch([fab.board.stamp_call(tid, done.epoch)])
    move(fab, tid, Column.QUEUED)  # where another mover's position rewrite put it back
    assert keeper.run_job("gestures")
    report = keeper.last["gestures"]
    assert report.acted == {} and report.repaired == [tid]
    view = fab.board.read(tid)
    assert view.epoch == done.epoch and view.current.state == State.DONE  # type: ignore[union-attr]
    assert view.row["column_id"] == fab.board.layout.columns[Column.DONE]


def test_without_the_stamp_the_same_late_move_is_a_persons_reopen(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid, keeper = setup(fab)
    fab.ledger.complete(claim(fab, tid), "file:///r")
    clock.advance(20)
    move(fab, tid, Column.QUEUED)
    assert keeper.run_job("gestures")
    assert keeper.last["gestures"].acted == {tid: "reopen"}


def test_a_worker_re_sends_its_own_lost_move_on_its_next_poll(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid, _ = setup(fab)
    fab.ledger.complete(claim(fab, tid), "file:///r")
    move(fab, tid, Column.WORKING)  # lost: a concurrent rewrite of the Working column
    wait_until(
        lambda: (
            fab.board.open_in([Column.QUEUED], "kimi") is not None
            and fab.board.read(tid).row["column_id"] == fab.board.layout.columns[Column.DONE]
        ),
        timeout=10,
        what="the worker's next poll to re-send its move",
    )
