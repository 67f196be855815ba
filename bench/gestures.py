"""A person's gesture → the fabric's reaction, with and without Kanboard's webhook.

A person (a board user signed in with a password, as Kanboard's UI is) moves a dead
letter to Queued; the reaction is the keeper's revive record on the board. Without the
webhook only the gesture sweep sees it (on average half its interval later); with it, the
board POSTs the event to the keeper's receiver, which pokes the sweep at once. Gestures are
spread at random over the sweep's phase. Embedded board over HTTP, keeper daemon in process.

Run alone: ``python -m bench.gestures [--quick]``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.keeper_sweep import fabric_on
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from keeper.hook import HookServer

SWEEP = 4.0  # the gesture job's interval here (20 s by default)
TOKEN = "bench-hook-token"
PASSWORD = "bench-person"


def _person(fab: Fabric, board: EmbeddedBoard) -> KanboardClient:
    uid = fab.port.call("createUser", {"username": "bench_person", "password": PASSWORD, "name": "B"})
    fab.port.call("addProjectUser", {"project_id": fab.board.layout.project_id, "user_id": uid})
    return KanboardClient(board.url, PASSWORD, user="bench_person")


def _dead_letter(fab: Fabric) -> int:
    tid = fab.submit("a task that died", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "bench", lease_seconds=300)
    fab.ledger.fail(lease, "poison", poison=True)
    return tid


def _one(fab: Fabric, person: KanboardClient, rng: random.Random) -> float:
    """Seconds from a person's move of a dead letter to Queued to its revive record."""
    tid = _dead_letter(fab)
    time.sleep(rng.uniform(0, SWEEP))  # a person acts at any phase of the sweep
    layout = fab.board.layout
    start = time.monotonic()
    person.call(
        "moveTaskPosition",
        {
            "project_id": layout.project_id,
            "task_id": tid,
            "column_id": layout.columns[Column.QUEUED],
            "position": 1,
            "swimlane_id": layout.swimlanes["kimi"],
        },
    )
    deadline = start + 3 * SWEEP
    while time.monotonic() < deadline:
        cur = fab.board.read(tid).current
        if cur is not None and cur.state == State.QUEUED and cur.op == "revive":
            return time.monotonic() - start
        time.sleep(0.005)
    raise RuntimeError(f"task #{tid}: no reaction within {3 * SWEEP:.0f} s")


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
        "n": len(ordered),
    }


def run(quick: bool) -> dict[str, Any]:
    n = 4 if quick else 12
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        fab = fabric_on(board)
        person = _person(fab, board)
        cfg = KeeperConfig()
        intervals = {job: 3600.0 for job in cfg.intervals} | {"gestures": SWEEP}
        keeper = Keeper.for_fabric(fabric_on(board), replace(cfg, intervals=intervals))
        stop = threading.Event()
        with HookServer(keeper.poke, token=TOKEN) as hook:
            thread = threading.Thread(target=keeper.serve, args=(stop,), daemon=True)
            thread.start()
            sweep_only = [_one(fab, person, rng) for _ in range(n)]
            board.set_webhook(hook.url, TOKEN)
            webhook = [_one(fab, person, rng) for _ in range(n)]
            stop.set()
            thread.join(10)
    without, with_hook = _stats(sweep_only), _stats(webhook)
    return {
        "name": "gestures",
        "sweep_seconds": SWEEP,
        "without_webhook": without,
        "with_webhook": with_hook,
        "title": f"A person's gesture → the fabric's reaction (gesture sweep every {SWEEP:g} s)",
        "rows": _rows(without, with_hook),
    }


def _rows(without: dict[str, float], with_hook: dict[str, float]) -> list[list[str]]:
    per = SWEEP * 1000
    rows = []
    for label, s in (("sweep only", without), ("with Kanboard's webhook", with_hook)):
        rows.append(
            [
                f"{label}: p50 / p95 / max ms (x sweep interval), {s['n']} gestures",
                f"{s['p50_ms']:g} / {s['p95_ms']:g} / {s['max_ms']:g} "
                f"({s['p50_ms'] / per:.3f}x / {s['p95_ms'] / per:.3f}x / {s['max_ms'] / per:.3f}x)",
            ]
        )
    rows.append(["webhook speed-up, p50", f"{without['p50_ms'] / with_hook['p50_ms']:.0f}x"])
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
