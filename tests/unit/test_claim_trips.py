"""A first claim in two round trips: the card's sealed uid names the lock of epoch 1.

From a poll, a card never claimed is read and its epoch-1 lock tried in one batch, the
read first; a submit event (signed, naming the task and its uid) lets a woken worker do
the same without a poll. What the read then shows decides: claimed, claimed the usual
way (a retried task), dead-lettered by policy, or the epoch given back (a copy of a card,
made by Kanboard's "Duplicate", names another task's uid).
"""

from __future__ import annotations

import random
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.layout import Column
from fabric.kanboard.port import Call
from fabric.refusals import PolicyRefused
from fabric.task import State
from workers.queue import CANDIDATES, REPOLL_AFTER_LOSS, QueueReader, WakeHints

LEASE = 300.0


def trips(fab: Fabric) -> int:
    return int(fab.port.stats.trips)


def reader(fab: Fabric, **kw: Any) -> QueueReader:
    return QueueReader.for_agent(fab, fab.cards.get("kimi"), **kw)


def test_a_first_claim_after_a_poll_is_two_round_trips(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("first claim", target="kimi").task_id
    r = reader(fab)
    r.poll()
    before = trips(fab)
    lease = r.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id == tid and lease.epoch == 1
    assert trips(fab) - before == 2, "read-and-lock, then the record"
    assert fab.board.read(tid).current.state == State.WORKING  # type: ignore[union-attr]


def test_a_retried_task_is_claimed_from_the_same_read(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("fails once", target="kimi").task_id
    r = reader(fab)
    first = r.claim_next("w1", lease_seconds=LEASE)
    assert first is not None
    fab.ledger.fail(first, "flaky", backoff_base=0.0)
    r.invalidate()
    again = r.claim_next("w1", lease_seconds=LEASE)
    assert again is not None and again.task_id == tid and again.epoch == 3 and again.attempt == 2


def test_a_submit_event_lets_a_worker_claim_without_a_poll(local_fabric: Fabric) -> None:
    fab = local_fabric
    receipt = fab.submit("woken", target="kimi")
    hints = WakeHints()
    hints.add(receipt.task_id, receipt.uid)
    r = reader(fab, hints=hints)
    seen: list[str] = []
    inner = fab.board.port
    batch = inner.batch

    def recorded(calls: Any, *a: Any, **kw: Any) -> Any:
        seen.extend(c.method for c in calls)
        return batch(calls, *a, **kw)

    inner.batch = recorded  # type: ignore[method-assign]
    before = trips(fab)
    lease = r.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id == receipt.task_id
    assert trips(fab) - before == 2 and "searchTasks" not in seen
    assert hints.take() is None, "each hint is tried once"


def test_a_hint_naming_a_task_already_taken_costs_no_claim(local_fabric: Fabric) -> None:
    fab = local_fabric
    receipt = fab.submit("taken", target="kimi")
    assert reader(fab).claim_next("w1", lease_seconds=LEASE) is not None
    hints = WakeHints()
    hints.add(receipt.task_id, receipt.uid)
    assert reader(fab, hints=hints).claim_next("w2", lease_seconds=LEASE) is None
    view = fab.board.read(receipt.task_id)
    assert view.epoch == 1 and view.current is not None and view.current.owner == "w1"


def test_a_copy_of_a_card_gives_the_epoch_it_took_back_to_its_task(local_fabric: Fabric) -> None:
    """Kanboard's "Duplicate" copies the description (sealed uid) and the reference."""
    fab = local_fabric
    tid = fab.submit("the original", target="kimi").task_id
    row = fab.port.call("getTask", {"task_id": tid})
    layout = fab.board.layout
    (copy_id,) = [
        o.unwrap()
        for o in fab.port.batch(
            [
                Call(
                    "createTask",
                    {
                        "title": "[DUPLICATE] the original",
                        "project_id": layout.project_id,
                        "column_id": layout.columns[Column.QUEUED],
                        "swimlane_id": layout.swimlanes["kimi"],
                        "description": row["description"],
                        "reference": row["reference"],
                    },
                )
            ]
        )
    ]
    r = reader(fab)
    rows = r.poll()
    assert rows[0].id == tid and rows[1].id == copy_id
    r._rows = [rows[1]]  # the copy first, as a contended reader's shuffle may put it
    lease = r.claim_next("w1", lease_seconds=LEASE)
    # The copy's read showed no records: epoch 1 went back to the original (restated,
    # no gap left), which the same call then claimed at epoch 2.
    assert lease is not None and lease.task_id == tid and lease.epoch == 2
    view = fab.board.read(tid)
    assert (view.records[1].state, view.records[1].op) == (State.QUEUED, "restate")
    assert fab.board.read(copy_id).current is None, "the copy is the keeper's to answer"


def test_a_task_refused_by_policy_at_its_first_claim_is_a_dead_letter(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("refused", target="kimi").task_id

    def refuse(view: Any) -> None:
        raise PolicyRefused("test", "not for this queue today", limit="none")

    r = QueueReader.for_agent(fab, fab.cards.get("kimi"))
    r.claim_check = refuse
    assert r.claim_next("w1", lease_seconds=LEASE) is None
    view = fab.board.read(tid)
    assert view.epoch == 1 and view.current is not None and view.current.state == State.DEAD


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_that_lost_a_card_tries_the_next_one_the_same_way(local_fabric: Fabric) -> None:
    fab = local_fabric
    ids = [fab.submit(f"contended {i}", target="kimi").task_id for i in range(5)]
    slow, fast = reader(fab, monotonic=Clock()), reader(fab)
    slow.poll()  # its kept rows are stale from here: the fast worker takes the first card
    taken = fast.claim_next("w2", lease_seconds=LEASE)
    assert taken is not None and taken.task_id == ids[0]
    before = dict(fab.port.stats.by_method)
    lease = slow.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id in ids[1:]
    calls = {m: n - before.get(m, 0) for m, n in fab.port.stats.by_method.items() if n != before.get(m, 0)}
    # Lost card: read + lock; next card: read + lock; then its record and move. No read of
    # every other candidate's records.
    assert calls.get("getTaskMetadata") == 2 and calls.get("createTag") == 2, calls


def test_a_worker_that_lost_a_card_from_an_older_poll_polls_again(local_fabric: Fabric) -> None:
    fab = local_fabric
    ids = [fab.submit(f"contended {i}", target="kimi").task_id for i in range(5)]
    clock = Clock()
    slow, fast = reader(fab, monotonic=clock), reader(fab)
    slow.poll()
    taken = [fast.claim_next("w2", lease_seconds=LEASE) for _ in range(3)]
    assert [t.task_id for t in taken if t is not None] == ids[:3]
    clock.now += REPOLL_AFTER_LOSS + 0.01  # its kept rows are older than that now
    before = dict(fab.port.stats.by_method)
    lease = slow.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id in ids[3:]
    calls = {m: n - before.get(m, 0) for m, n in fab.port.stats.by_method.items() if n != before.get(m, 0)}
    # Lost card: read + lock; then a poll, which no longer holds the cards taken, and the
    # first card it gives is won: read + lock, record and move. Without the poll, the
    # worker would have tried the next two taken cards the same way first.
    assert calls.get("searchTasks") == 1, calls
    assert calls.get("getTaskMetadata") == 2 and calls.get("createTag") == 2, calls


def test_a_worker_that_finds_a_card_taken_since_its_poll_spreads_out(local_fabric: Fabric) -> None:
    """Losing to a card another worker took since this one polled is contention too: the
    reader stops taking its rows in order (where the other worker took them) and spreads."""
    fab = local_fabric
    ids = [fab.submit(f"contended {i}", target="kimi").task_id for i in range(12)]
    slow, fast = reader(fab, monotonic=Clock(), rng=random.Random(7)), reader(fab)
    rows = slow.poll()
    assert slow.candidates(rows) == rows[:CANDIDATES], "alone, in order"
    taken = fast.claim_next("w2", lease_seconds=LEASE)
    assert taken is not None and taken.task_id == ids[0]
    slow._rows = [r for r in rows if r.id == ids[0]]  # the card the other worker took, first
    slow.claim_next("w1", lease_seconds=LEASE)  # loses that card (it polls again and claims another)
    assert slow.candidates(rows[1:]) != rows[1 : 1 + CANDIDATES], "spread since it met the other worker"
