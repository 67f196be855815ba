"""A long queue: the keeper keeps each lane's Queued cell short, the rest in Backlog.

The policy (keeper.backlog.plan) on rows; then on the in-process board: the keeper's
balancing, a worker draining in order through it, a worker reading Backlog when the
keeper is away, a person's drag between the two meaning nothing, the keeper's figures
and deadlines counting Backlog, and `agap init` adding the column to an older board.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard import taskboard
from fabric.kanboard.bootstrap import load_layout
from fabric.kanboard.layout import QUEUED_CELL, Column
from fabric.kanboard.moves import MOVE
from fabric.kanboard.port import Call
from fabric.kanboard.rows import BoardTask
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper import backlog
from keeper.daemon import Keeper
from tests.conftest import FakeClock, make_fabric
from workers.queue import QueueReader

LEASE = 300.0
NOW = 1_800_000_000.0


def row(tid: int, *, priority: int = 0, created: int = 0, due: int = 0, start: int = 0) -> BoardTask:
    return BoardTask(id=tid, priority=priority, created_at=created or tid, due_at=due, start_at=start)


def ids(rows: Iterable[BoardTask]) -> list[int]:
    return sorted(r.id for r in rows)


# -- the policy ---------------------------------------------------------------------------


def test_a_cell_within_its_band_and_in_order_moves_nothing() -> None:
    queued = [row(i) for i in range(1, 21)]
    later = [row(i) for i in range(21, 40)]
    assert backlog.plan(queued, later, NOW, cell=32) == ([], [])


def test_a_full_cell_keeps_the_best_and_sends_the_rest_to_backlog() -> None:
    queued = [row(i) for i in range(1, 41)]
    demote, promote = backlog.plan(queued, [], NOW, cell=32)
    assert ids(demote) == list(range(33, 41)) and promote == []


def test_a_short_cell_is_topped_up_with_the_best_of_backlog() -> None:
    queued = [row(i) for i in range(1, 5)]
    later = [row(i, priority=p) for i, p in ((10, 0), (11, 2), (12, 0), (13, 1))]
    demote, promote = backlog.plan(queued, later, NOW, cell=6)
    # The cell becomes the best six: both higher-priority cards first, then the oldest.
    assert demote == [] and ids(promote) == [11, 13]


def test_a_backlog_card_that_outranks_one_in_queued_swaps_with_it() -> None:
    """A new submit lands in Queued; an older task of its priority waits in Backlog."""
    queued = [row(i) for i in range(1, 4)] + [row(100, created=500)]
    later = [row(50, created=50)]
    demote, promote = backlog.plan(queued, later, NOW, cell=4)
    assert ids(demote) == [100] and ids(promote) == [50]


def test_urgent_work_stays_in_queued_and_cards_not_due_rank_last() -> None:
    queued = [row(1, priority=3), row(2, start=int(NOW) + 3600), row(3)]
    demote, _ = backlog.plan(queued, [], NOW, cell=2)
    assert ids(demote) == [2], "the delayed card goes, not the urgent one"
    deadline = row(9, due=int(NOW) + 60, created=9)
    _, promote = backlog.plan([row(1)], [row(5), deadline], NOW, cell=2)
    assert ids(promote) == [9], "a deadline first among equal priorities"


# -- on the board -------------------------------------------------------------------------


def fill(fab: Fabric, n: int, target: str = "kimi", **kw: Any) -> list[int]:
    return [fab.submit(f"task {i}", target=target, **kw).task_id for i in range(n)]


def cell(fab: Fabric, column: Column, queue: str = "kimi") -> list[int]:
    return sorted(r.id for r in fab.board.open_in([column], queue))


def keeper(fab: Fabric) -> Keeper:
    return Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))


def test_the_keeper_keeps_the_cell_short_and_a_worker_drains_in_order(local_fabric: Fabric) -> None:
    fab = local_fabric
    tasks = fill(fab, QUEUED_CELL + 20)
    k = keeper(fab)
    assert k.run_job("backlog")
    assert cell(fab, Column.QUEUED) == tasks[:QUEUED_CELL]
    assert cell(fab, Column.BACKLOG) == tasks[QUEUED_CELL:]
    assert k.last["backlog"].demoted and not k.last["backlog"].skipped
    # Balanced: the next run reads Queued only and moves nothing.
    assert k.run_job("backlog") and k.last["backlog"].trips == 1
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"))
    order = []
    for _ in tasks:
        lease = reader.claim_next("w1", lease_seconds=LEASE)
        assert lease is not None
        order.append(lease.task_id)
        fab.ledger.complete(lease, "file:///r")
        reader.invalidate()
        k.run_job("backlog")
    assert order == tasks, "oldest first, across Queued and Backlog"
    assert cell(fab, Column.BACKLOG) == [] and cell(fab, Column.QUEUED) == []


def test_a_burst_is_balanced_over_several_runs_in_requests_of_bounded_size(
    local_fabric: Fabric, monkeypatch: Any
) -> None:
    fab = local_fabric
    monkeypatch.setattr(backlog, "MOVES_PER_RUN", 12)
    monkeypatch.setattr(taskboard, "MOVE_CHUNK", 5)
    tasks = fill(fab, QUEUED_CELL + 30)
    sizes: list[int] = []
    batch = fab.port.batch

    def counted(calls: Any) -> Any:
        sizes.append(sum(1 for c in calls if c.method == MOVE))
        return batch(calls)

    monkeypatch.setattr(fab.port, "batch", counted)
    k = keeper(fab)
    runs = 0
    while cell(fab, Column.BACKLOG) != tasks[QUEUED_CELL:]:
        assert k.run_job("backlog")
        runs += 1
        assert len(k.last["backlog"].demoted) <= 12 and runs <= 5
    assert runs == 3, "30 cards to demote, 12 a run"
    assert cell(fab, Column.QUEUED) == tasks[:QUEUED_CELL]
    assert max(sizes) == 5, sizes


def test_a_new_submit_does_not_overtake_older_work_waiting_in_backlog(local_fabric: Fabric) -> None:
    fab = local_fabric
    tasks = fill(fab, QUEUED_CELL + 5)
    k = keeper(fab)
    k.run_job("backlog")
    # A full cell: the newest is the one sent to Backlog.
    newest = fab.submit("the newest", target="kimi").task_id
    k.run_job("backlog")
    assert newest in cell(fab, Column.BACKLOG) and cell(fab, Column.QUEUED) == tasks[:QUEUED_CELL]
    # Room in the cell: a newer submit lands there, and swaps with the oldest in Backlog.
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"))
    lease = reader.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None and lease.task_id == tasks[0]
    newer = fab.submit("newer still", target="kimi").task_id
    assert newer in cell(fab, Column.QUEUED)
    k.run_job("backlog")
    assert newer in cell(fab, Column.BACKLOG) and tasks[QUEUED_CELL] in cell(fab, Column.QUEUED)
    urgent = fab.submit("urgent", target="kimi", priority="urgent").task_id
    k.run_job("backlog")
    assert urgent in cell(fab, Column.QUEUED)


def test_a_worker_reads_backlog_itself_when_the_keeper_is_away(local_fabric: Fabric) -> None:
    fab = local_fabric
    tasks = fill(fab, QUEUED_CELL + 3)
    keeper(fab).run_job("backlog")  # then the keeper stops
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"))
    done = []
    while (lease := reader.claim_next("w1", lease_seconds=LEASE)) is not None:
        done.append(lease.task_id)
        fab.ledger.complete(lease, "file:///r")
    assert sorted(done) == tasks, "nothing is stranded in Backlog"
    assert fab.board.read(tasks[-1]).current.state == State.DONE  # type: ignore[union-attr]


def test_an_idle_worker_polls_queued_only(local_fabric: Fabric) -> None:
    fab = local_fabric
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"))
    reader.poll()  # the first poll looks at Backlog too (it may hold cards at start)
    seen: list[str] = []
    inner = fab.board.port
    batch = inner.batch

    def counted(calls: Any, *a: Any, **kw: Any) -> Any:
        seen.extend(str(c.params.get("query", "")) for c in calls if c.method == "searchTasks")
        return batch(calls, *a, **kw)

    inner.batch = counted  # type: ignore[method-assign]
    for _ in range(3):
        assert reader.poll() == []
    assert len(seen) == 3 and all('"Backlog"' not in q for q in seen), seen


def test_a_persons_drag_between_backlog_and_queued_means_nothing(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tasks = fill(fab, 3)
    k = keeper(fab)
    layout = fab.board.layout
    port = getattr(fab.port, "inner", fab.port)  # under the storage port's fitting
    assert isinstance(port, LocalPort)
    alvis = LocalPort(port.api, user_id=layout.users["alvis"])
    move = {"project_id": layout.project_id, "task_id": tasks[0], "position": 1}
    lane = layout.swimlanes["kimi"]
    assert alvis.call(
        "moveTaskPosition", {**move, "column_id": layout.columns[Column.BACKLOG], "swimlane_id": lane}
    )
    clock.advance(60)
    assert k.run_job("gestures")
    report = k.last["gestures"]
    assert not report.acted and not report.explained and not report.repaired
    assert tasks[0] in cell(fab, Column.BACKLOG)
    assert fab.board.comments(tasks[0]) == []
    k.run_job("backlog")  # a short cell: the keeper brings it back
    assert tasks[0] in cell(fab, Column.QUEUED)


def test_a_working_card_a_person_drags_into_backlog_is_put_back(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    """Backlog is not an active column the keeper searches: the activity names the card."""
    fab = local_fabric
    (tid,) = fill(fab, 1)
    assert QueueReader.for_agent(fab, fab.cards.get("kimi")).claim_next("w1", lease_seconds=LEASE)
    layout = fab.board.layout
    port = getattr(fab.port, "inner", fab.port)
    assert isinstance(port, LocalPort)
    alvis = LocalPort(port.api, user_id=layout.users["alvis"])
    move = {"project_id": layout.project_id, "task_id": tid, "position": 1}
    lane = layout.swimlanes["kimi"]
    assert alvis.call(
        "moveTaskPosition", {**move, "column_id": layout.columns[Column.BACKLOG], "swimlane_id": lane}
    )
    clock.advance(60)
    k = keeper(fab)
    assert k.run_job("gestures")
    assert tid in k.last["gestures"].explained
    assert tid not in cell(fab, Column.BACKLOG), "back in Working, where its record says"


def test_the_keepers_figures_and_deadlines_count_backlog(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    fill(fab, QUEUED_CELL + 4)
    late = fab.submit("due soon", target="kimi", priority="low", deadline="1h").task_id
    k = keeper(fab)
    k.run_job("backlog")
    assert late in cell(fab, Column.BACKLOG)
    assert k.run_job("leases")
    assert k.metrics.queues["kimi"].depth == QUEUED_CELL + 5
    clock.advance(7200)
    assert k.run_job("deadlines")
    assert late in k.last["deadlines"].escalated


def test_init_adds_backlog_first_to_a_board_made_before_it(cards: Any, clock: FakeClock) -> None:
    port = LocalPort(clock=clock)
    fab = make_fabric(port, cards, clock)
    pid = fab.board.layout.project_id
    backlog_id = fab.board.layout.columns[Column.BACKLOG]
    columns = port.call("getColumns", {"project_id": pid})
    assert [c["title"] for c in columns][:2] == ["Backlog", "Queued"]
    # A board from before: no Backlog. The fabric runs on it (a long queue stays in Queued).
    port.call("removeColumn", {"column_id": backlog_id})
    old = make_fabric(port, cards, clock)
    assert [c["title"] for c in port.call("getColumns", {"project_id": pid})][:2] == ["Backlog", "Queued"]
    assert Column.BACKLOG in old.board.layout.columns
    port.batch([Call("removeColumn", {"column_id": old.board.layout.columns[Column.BACKLOG]})])
    layout = load_layout(port, fab.settings)
    assert (
        Column.BACKLOG not in layout.columns
        and layout.column_id(Column.BACKLOG) == layout.columns[Column.QUEUED]
    )
