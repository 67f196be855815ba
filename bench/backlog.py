"""Claim and complete as the backlog grows (issue 31): is a queue's cost flat in its size?

Kanboard renumbers every open card of both columns on each move, and a worker's poll
reads what the queue column holds; a researcher's self-submitting loop is exactly the
agent that builds a backlog of hundreds. So one queue is filled to 10, 100, 500 and 2,000
open tasks, each size a queue of its own project, and ``samples`` lifecycles run on each,
the sizes taking turns: one submit (the backlog stays at its size), then the claim (poll +
claim, as a worker does it) and the complete are timed and their round trips counted.
The baseline is the same measurement at 10 open tasks, in the same run, on the same
board and interleaved with the others; the target is 1.5x at 2,000.

The keeper's backlog duty runs as in a fabric (keeper.backlog: each lane's Queued cell
kept short, the rest of the queue in Backlog): once the queue is filled, and once before
each lifecycle (the daemon runs it every 2 s); its own cost is reported beside.

On the embedded board and on every real Kanboard the environment names
(``AGAP_BENCH_KANBOARDS``, :mod:`bench.env`). Run alone: ``python -m bench.backlog [--quick]``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.env import QUEUE_AGENT, Target, load_bench_cards, real_targets
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.layout import QUEUED_CELL, Column
from fabric.kanboard.port import BoardError
from fabric.settings.keeper import KeeperConfig
from keeper.backlog import MOVES_PER_RUN
from keeper.daemon import Keeper
from workers.queue import QueueReader

SIZES = (10, 100, 500, 2000)
QUICK_SIZES = (10, 100)
TARGET_RATIO = 1.5


def run(quick: bool) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    samples = 5 if quick else 15
    boards: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        embedded = Target("embedded", board.url, board.token, "embedded board")
        boards[embedded.label] = _measure(embedded, sizes, samples)
    for target in real_targets():
        try:
            boards[target.label] = _measure(target, sizes, samples)
        except (BoardError, OSError) as exc:  # one board away must not lose the others
            boards[target.label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            with contextlib.suppress(Exception):
                target.cleanup()
    return _report(sizes, samples, boards)


class _Queue:
    """One queue held at one size, on its own project (so sizes can take turns)."""

    def __init__(self, target: Target, size: int) -> None:
        cards = load_bench_cards()
        settings, _ = target.fresh(f"backlog{size}", cards)
        self.size = size
        self.client = target.client()
        self.fab = Fabric.connect(settings, cards=cards, port=self.client)
        # As the worker daemon claims: the lock only, the record with the outcome's.
        self.reader = QueueReader.for_agent(self.fab, cards.get(QUEUE_AGENT), record_later=True)
        self.keeper = Keeper.for_fabric(self.fab, KeeperConfig())
        self.claim_s: list[float] = []
        self.complete_s: list[float] = []
        self.claim_trips: list[int] = []
        self.complete_trips: list[int] = []
        self.keeper_s: list[float] = []
        t0 = time.perf_counter()
        for held in range(size):
            self.fab.submit(f"backlog {held}", target=QUEUE_AGENT, priority="low")
        self.fill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        # The keeper moves the overflow to Backlog, MOVES_PER_RUN cards a run: the
        # queue is measured once the cell holds what it holds in a steady state (a cell
        # still holding most of a burst is the burst's cost, not the backlog's).
        for _ in range(size // MOVES_PER_RUN + 3):
            self.keeper.run_job("backlog")
            if len(self.fab.board.open_in([Column.QUEUED], self.reader.queue)) <= QUEUED_CELL:
                break
        self.balance_s = time.perf_counter() - t0

    def lifecycle(self, label: str, i: int) -> None:
        """One submit (the backlog stays at its size), then a timed claim and complete."""
        fab, client = self.fab, self.client
        fab.submit(f"probe {self.size}/{i}", target=QUEUE_AGENT, priority="low")
        t0 = time.perf_counter()
        self.keeper.run_job("backlog")
        self.keeper_s.append(time.perf_counter() - t0)
        client.stats.reset()
        t0 = time.perf_counter()
        lease = self.reader.claim_next("bench", lease_seconds=60.0)
        self.claim_s.append(time.perf_counter() - t0)
        self.claim_trips.append(client.stats.trips)
        if lease is None:
            raise RuntimeError(f"{label}: no task claimed with {self.size} open")
        client.stats.reset()
        t0 = time.perf_counter()
        fab.ledger.complete(lease, "bench://result")
        self.complete_s.append(time.perf_counter() - t0)
        self.complete_trips.append(client.stats.trips)

    def figures(self) -> dict[str, Any]:
        return {
            "claim_ms": round(statistics.median(self.claim_s) * 1000, 1),
            "complete_ms": round(statistics.median(self.complete_s) * 1000, 1),
            "claim_trips": round(statistics.fmean(self.claim_trips), 2),
            "complete_trips": round(statistics.fmean(self.complete_trips), 2),
            "fill_s": round(self.fill_s, 1),
            "balance_after_fill_s": round(self.balance_s, 2),
            "keeper_backlog_ms": round(statistics.median(self.keeper_s) * 1000, 1),
            "queued_cell": len(self.fab.board.open_in([Column.QUEUED], QUEUE_AGENT)),
            "errors": dict(self.client.errors),
        }


def _measure(target: Target, sizes: tuple[int, ...], samples: int) -> dict[str, Any]:
    """Every size's queue filled first, then their lifecycles in turns (10, 100, 500,
    2,000, 10, …): whatever else the machine does meanwhile weighs on every size alike,
    so the ratio to the 10-task queue is the backlog's own."""
    queues: list[_Queue] = []
    try:
        for size in sizes:
            queues.append(_Queue(target, size))
        for i in range(samples):
            for q in queues:
                q.lifecycle(target.label, i)
        return {str(q.size): q.figures() for q in queues}
    finally:
        for q in queues:
            q.client.close()


def _ratio(row: dict[str, Any], base: dict[str, Any], key: str) -> float:
    return round(row[key] / base[key], 2) if base[key] else float("nan")


def _report(sizes: tuple[int, ...], samples: int, boards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows: list[list[Any]] = [["lifecycles per size (median ms; round trips a mean)", samples]]
    first, last = str(sizes[0]), str(sizes[-1])
    for label, by_size in boards.items():
        if "error" in by_size:
            rows.append([f"{label}: failed", by_size["error"]])
            continue
        for size in sizes:
            r = by_size[str(size)]
            rows.append(
                [
                    f"{label}: {size} open, claim / complete ms (round trips); keeper's backlog run ms",
                    f"{r['claim_ms']} / {r['complete_ms']} ({r['claim_trips']} / {r['complete_trips']});"
                    f" {r['keeper_backlog_ms']}",
                ]
            )
        base, top = by_size[first], by_size[last]
        rows.append(
            [
                f"{label}: {last} vs {first} open, claim / complete (target ≤ {TARGET_RATIO}x)",
                f"{_ratio(top, base, 'claim_ms')}x / {_ratio(top, base, 'complete_ms')}x",
            ]
        )
    return {
        "title": "Claim and complete as the queue's backlog grows (loopback)",
        "rows": rows,
        "boards": boards,
    }


if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    for name, value in result["rows"]:
        print(f"{name}: {value}")
    print(json.dumps(result["boards"], indent=1))
