"""Keeper sweep cost: round trips and time with 100 active tasks, 0 vs 10,000 closed.

The claim under test (docs/DESIGN.md, budgets): a keeper sweep grows with *active* tasks, never with
history. The closed tasks are written fast, straight through JSON-RPC batches on the
embedded board, with real fabric records (verified, closed, in Done), so they look like
ordinary history to every query.

Run alone: ``python -m bench.keeper_sweep [--quick]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import META_SPEC, META_UID, Column, record_key
from fabric.kanboard.port import Call
from fabric.kanboard.taskboard import TaskBoard
from fabric.ledger import Ledger
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import Record, State, TaskSpec
from keeper.daemon import Keeper

ROOT = Path(__file__).resolve().parent.parent
ACTIVE = 100
CLOSED = 10_000
BATCH = 500


def fabric_on(board: EmbeddedBoard) -> Fabric:
    """A fabric on ``board``, initialised, over HTTP (bench.gestures uses it too)."""
    from fabric.kanboard.bootstrap import init_board

    settings = Settings(board_url=board.url, board_token=board.token, cards_dir=ROOT / "cards")
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    port = KanboardClient(board.url, board.token)
    report = init_board(port, settings, cards)
    assert report.layout is not None
    tb = TaskBoard(port, report.layout)
    return Fabric(settings, cards, port, tb, Ledger(tb), time.time)


def _active(fab: Fabric, n: int) -> None:
    """n active tasks: a third queued, a third working, a third waiting on a human."""
    for i in range(n):
        kind = i % 3
        if kind == 2:
            fab.submit(f"gate {i}", target="alvis")
            continue
        tid = fab.submit(f"active {i}", target="gemma-local").task_id
        if kind == 1:
            fab.ledger.claim(fab.board.read(tid), "bench", lease_seconds=3600)


def _closed(fab: Fabric, n: int) -> float:
    """n verified, closed fabric tasks in Done, written in JSON-RPC batches."""
    layout = fab.board.layout
    start = time.perf_counter()
    now = time.time() - 86400
    done_col, lane = layout.columns[Column.DONE], layout.swimlane("gemma-local")
    made = 0
    while made < n:
        k = min(BATCH, n - made)
        out = fab.port.batch(
            [
                Call(
                    "createTask",
                    {
                        "title": f"history {made + i}",
                        "project_id": layout.project_id,
                        "column_id": done_col,
                        "swimlane_id": lane,
                        "reference": f"bench:{made + i}",
                    },
                )
                for i in range(k)
            ]
        )
        ids = [int(o.unwrap()) for o in out]
        calls = []
        for j, tid in enumerate(ids):
            uid = f"{made + j:016x}"
            spec = TaskSpec(
                intent=f"history {made + j}", target="gemma-local", queue="gemma-local", submitted_at=now
            )
            recs = {
                record_key(0): Record(epoch=0, state=State.QUEUED, op="submit", by="bench", at=now).to_meta(),
                record_key(1): Record(epoch=1, state=State.CLOSED, op="verify", by="bench", at=now).to_meta(),
            }
            calls.append(
                Call(
                    "saveTaskMetadata",
                    {"task_id": tid, "values": {META_UID: uid, META_SPEC: spec.to_meta(), **recs}},
                )
            )
            calls.append(Call("closeTask", {"task_id": tid}))
        for o in fab.port.batch(calls):
            o.unwrap()
        made += k
    return time.perf_counter() - start


def _measure(keeper: Keeper, job: str, runs: int) -> dict[str, Any]:
    fab = keeper.fab()
    keeper.run_job(job, ignore_backoff=True)  # warm-up: repairs left by the set-up
    trips, times = [], []
    for _ in range(runs):
        before = fab.port.stats.trips
        t0 = time.perf_counter()
        assert keeper.run_job(job, ignore_backoff=True), keeper.metrics.jobs[job].last_error
        times.append(time.perf_counter() - t0)
        trips.append(fab.port.stats.trips - before)
    return {
        "round_trips": max(trips),
        "median_ms": round(statistics.median(times) * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "runs": runs,
    }


def run(quick: bool) -> dict[str, Any]:
    """Sweep cost with ``ACTIVE`` active tasks and 0 vs ``CLOSED`` closed ones."""
    closed_n = 2_000 if quick else CLOSED
    runs = 5 if quick else 15
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        fab = fabric_on(board)
        _active(fab, ACTIVE)
        keeper = Keeper.for_fabric(fab, KeeperConfig())
        jobs = ("leases", "gestures", "deadlines")
        before = {job: _measure(keeper, job, runs) for job in jobs}
        write_s = _closed(fab, closed_n)
        after = {job: _measure(keeper, job, runs) for job in jobs}
        scanned = keeper.last["leases"].scanned
    return {
        "name": "keeper_sweep",
        "active_tasks": ACTIVE,
        "scanned": scanned,
        "closed_tasks": closed_n,
        "closed_write_seconds": round(write_s, 2),
        "without_history": before,
        "with_history": after,
        "trips_unchanged": all(before[j]["round_trips"] == after[j]["round_trips"] for j in jobs),
        "title": f"Keeper sweeps ({ACTIVE} active tasks)",
        "rows": keeper_rows(before, after, closed_n),
    }


def keeper_rows(before: dict[str, Any], after: dict[str, Any], closed: int) -> list[list[str]]:
    """Table rows: each job's round trips and median time, without vs with history."""
    rows = []
    for job in before:
        b, a = before[job], after[job]
        rows.append(
            [
                f"`{job}` sweep: round trips / median time, 0 vs {closed:,} closed tasks",
                f"{b['round_trips']} / {b['median_ms']} ms vs {a['round_trips']} / "
                f"{a['median_ms']} ms ({a['median_ms'] / b['median_ms']:.2f}x time)",
            ]
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
