"""How the fabric moves a card: one row (``moveTaskToProject`` to its own project).

Kanboard's ``moveTaskPosition`` rewrites every open card of both cells, so a move cost what
a column held; the fabric's move updates the card alone. That move reopens a closed card,
so a batch that moves a closed card closes it again, and a lost move is never re-sent to
a card closed since (a close is a transition or a person's gesture).
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric.core import Fabric
from fabric.kanboard import taskboard
from fabric.kanboard.layout import Column
from fabric.kanboard.moves import MOVE
from fabric.kanboard.port import Call
from fabric.task import State
from tests.conftest import FakeClock
from tests.helpers import card_column, card_row

LEASE = 300.0


class Recording:
    """The storage port with every call it sent, by method."""

    def __init__(self, fab: Fabric) -> None:
        self.methods: list[str] = []
        inner = fab.board.port
        batch = inner.batch

        def recorded(calls: Any, *a: Any, **kw: Any) -> Any:
            self.methods += [c.method for c in calls]
            return batch(calls, *a, **kw)

        inner.batch = recorded  # type: ignore[method-assign]


def test_a_claim_and_a_completion_move_one_row_each(local_fabric: Fabric) -> None:
    fab = local_fabric
    others = [fab.submit(f"backlog {i}", target="kimi").task_id for i in range(5)]
    tid = fab.submit("the one that runs", target="kimi").task_id
    positions = {t: card_row(fab, t)["position"] for t in others}
    seen = Recording(fab)
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=LEASE)
    assert card_column(fab, tid) == Column.WORKING
    fab.ledger.complete(lease, "file:///r")
    assert card_column(fab, tid) == Column.DONE
    assert seen.methods.count(MOVE) == 2 and "moveTaskPosition" not in seen.methods
    # Nothing else in the Queued cell was renumbered.
    assert {t: card_row(fab, t)["position"] for t in others} == positions


def test_a_closed_card_moved_by_the_fabric_stays_closed(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("closed, then put back", target="kimi").task_id
    fab.ledger.cancel(tid, "alvis", "no longer needed")
    view = fab.board.read(tid)
    assert not view.is_open and view.current is not None and view.current.state == State.CANCELED
    fab.board.put_back(view, view.epoch, Column.DEAD, is_open=False)
    assert card_column(fab, tid) == Column.DEAD
    assert not int(card_row(fab, tid)["is_active"]), "the move reopened it and the batch closed it again"
    # And a record written on a closed card (no reopen asked) leaves it closed too.
    fab.board.put_back(fab.board.read(tid), view.epoch, Column.DONE, is_open=False)
    assert card_column(fab, tid) == Column.DONE and not int(card_row(fab, tid)["is_active"])


def test_a_lost_move_is_not_sent_again_to_a_card_closed_since(local_fabric: Fabric, clock: FakeClock) -> None:
    """A claim's move lost to a person's drag, and the card then closed: the close is theirs."""
    fab = local_fabric
    tid = fab.submit("claimed, dragged, closed", target="kimi").task_id
    fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=LEASE)
    layout = fab.board.layout
    # Where a concurrent position rewrite put the card back, then closed by someone.
    fab.port.batch(
        [
            Call(
                "moveTaskPosition",
                {
                    "project_id": layout.project_id,
                    "task_id": tid,
                    "column_id": layout.columns[Column.QUEUED],
                    "position": 1,
                    "swimlane_id": int(card_row(fab, tid)["swimlane_id"]),
                },
            ),
            Call("closeTask", {"task_id": tid}),
        ]
    )
    fab.board.close()  # settles this connection's moves: reads them back
    assert card_column(fab, tid) == Column.QUEUED and not int(card_row(fab, tid)["is_active"])


def test_a_leaving_connection_checks_moves_already_due_at_once(
    local_fabric: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No jitter on top of a move's due time: the fabric's moves are one row each, so
    connections leaving together cannot lose each other's moves."""
    fab = local_fabric
    tid = fab.submit("claimed, then the worker leaves", target="kimi").task_id
    fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=LEASE)
    for move in fab.board._moves._moved.values():
        move.due = 0.0  # VERIFY_AFTER has passed: a person's drag in flight has committed
    waits: list[float] = []

    def pause(seconds: float) -> bool:
        waits.append(seconds)
        return False  # not stopping

    monkeypatch.setattr(taskboard, "pause", pause)
    fab.board.close()
    assert waits == [0.0]
    assert card_column(fab, tid) == Column.WORKING
