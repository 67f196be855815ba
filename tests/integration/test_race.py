"""Race: 8 OS processes drain one queue (300 tasks, on the embedded board and on a real Kanboard) over HTTP.

Runs against the embedded board always, and against a real Kanboard when
AGAP_TEST_KANBOARD_URL and AGAP_TEST_KANBOARD_TOKEN are set. Every task ends Done exactly once, no
epoch is executed by two owners, and with nobody dying the number of executions
equals the number of tasks.
"""

from __future__ import annotations

import multiprocessing as mp
import secrets
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import REAL_SKIP, ROOT, make_fabric, real_kanboard, scratch_board
from tests.integration.procs import drill_worker

# 300 on a real Kanboard too: the fabric's moves update one row each (moveTaskToProject),
# where moveTaskPosition rewrote every card of both cells and, on PostgreSQL, concurrent
# moves deadlocked (SQLSTATE 40P01, ~1 s each), so the real race used to run 60.
TASKS = 300
REAL_TASKS = 300
WORKERS = 8


@pytest.fixture(params=["embedded", "real-kanboard"])
def board_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    if request.param == "embedded":
        with EmbeddedBoard(tmp_path / "board.sqlite3") as board:
            yield board.url, board.token, TASKS
        return
    real = real_kanboard()
    if real is None:
        pytest.skip(REAL_SKIP)
    scratch_board(*real)
    yield real[0], real[1], REAL_TASKS


# Real Kanboard on PostgreSQL opens a database connection per request (~20 ms a call).
@pytest.mark.timeout(1200)
def test_eight_processes_drain_the_queue_exactly_once(
    board_target: tuple[str, str, int], cards: CardSet, tmp_path: Path
) -> None:
    url, token, tasks = board_target
    run = secrets.token_hex(4)
    settings = Settings(
        board_url=url,
        board_token=token,
        cards_dir=ROOT / "cards",
        project=f"race-{run}",
        locks_project=f"race-locks-{run}",
    )
    fab = make_fabric(KanboardClient(url, token), cards, settings=settings)
    task_ids = [fab.submit(f"race task {i}", target="gemma-local").task_id for i in range(tasks)]
    log = tmp_path / "drill.sqlite3"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=drill_worker,
            args=(
                url,
                token,
                str(ROOT / "cards"),
                "gemma-local",
                f"w{i}",
                str(log),
                60.0,
                0.0,
                0.0,
                True,
                str(tmp_path / f"cache{i}"),
                None,
                settings.project,
                settings.locks_project,
            ),
        )
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"worker {p.name} exited with {p.exitcode}"

    done = fab.board.layout.columns[Column.DONE]
    views = [fab.board.read(t) for t in task_ids]
    lagging = sum(int(v.row.get("column_id") or 0) != done for v in views)
    # PostgreSQL Kanboard loses some concurrent moves; workers re-send their own, and the
    # cards still wrong when the last worker left are the keeper's. It must put them
    # back, never read them as a person's gesture (a "reopen" would run a task twice:
    # the epoch count below would show it).
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("gestures")
    assert keeper.last["gestures"].acted == {}, keeper.last["gestures"].acted
    assert len(keeper.last["gestures"].repaired) == lagging
    print(f"cards left in a lost move's column when the workers exited: {lagging} of {tasks}")
    views = [fab.board.read(t) for t in task_ids]
    states = Counter(v.current.state for v in views if v.current)
    assert states == {State.DONE: tasks}, states
    # The column is only a projection, but it is what people see.
    wrong = [v for v in views if int(v.row.get("column_id") or 0) != done]
    assert wrong == [], f"{len(wrong)} done cards left in another column: " + "; ".join(
        f"#{v.id} in column {v.row.get('column_id')}, moved {v.row.get('date_moved')}, "
        f"record e{v.epoch} at {v.current.at if v.current else None}"
        for v in wrong[:10]
    )
    for v in views:
        # submit e0, claim e1, complete e2: no extra epochs when nobody dies.
        assert v.epoch == 2
        claim, completed = v.records[1], v.records[2]
        assert completed.by == claim.owner
        assert completed.result_ref == f"drill://{v.uid}/e1/{claim.owner}"

    db = sqlite3.connect(log)
    rows = db.execute("SELECT uid, epoch, owner FROM executions").fetchall()
    assert len(rows) == tasks, "executions must equal tasks when nobody dies"
    per_epoch = Counter((uid, epoch) for uid, epoch, _ in rows)
    assert max(per_epoch.values()) == 1, "an epoch was executed by two owners"
    assert len({uid for uid, _, _ in rows}) == tasks
    owners = Counter(owner for _, _, owner in rows)
    assert len(owners) >= 2, f"work was not shared: {owners}"
    applied = db.execute("SELECT COUNT(*), COUNT(DISTINCT uid) FROM applied").fetchone()
    assert applied == (tasks, tasks)
