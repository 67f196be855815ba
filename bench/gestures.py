"""A person's gesture → the fabric's reaction, with and without Kanboard's webhook.

A person (a board user signed in with a password, as Kanboard's UI is) moves a dead
letter to Queued; the reaction is the keeper's revive record on the board. Without the
webhook only the gesture sweep sees it (on average half its interval later); with it, the
board POSTs the event to the keeper's receiver, which pokes the sweep at once. Gestures are
spread at random over the sweep's phase. Embedded board over HTTP, keeper daemon in process.

The same with the card in a confined agent's home (torgash's), which has a keeper of its
own: Kanboard's one webhook goes to the main keeper's receiver, which forwards the event
to the receiver the home's keeper published (keeper.hook.HomeRoutes).

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
from fabric.kanboard.keeperstore import published_hooks
from fabric.kanboard.layout import Column
from fabric.kanboard.principals import home_settings
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from keeper.hook import HomeRoutes, HookServer

SWEEP = 4.0  # the gesture job's interval here (20 s by default)
HOME = "torgash"  # a confined agent: its queue lives in its home, which has a keeper of its own
TOKEN = "bench-hook-token"
PASSWORD = "bench-person"


def _person(fab: Fabric, board: EmbeddedBoard) -> KanboardClient:
    uid = fab.port.call("createUser", {"username": "bench_person", "password": PASSWORD, "name": "B"})
    for layout in (fab.board.layout, *fab.board.layout.homes.values()):
        fab.port.call("addProjectUser", {"project_id": layout.project_id, "user_id": uid})
    return KanboardClient(board.url, PASSWORD, user="bench_person")


def _dead_letter(fab: Fabric, target: str) -> int:
    tid = fab.submit("a task that died", target=target).task_id
    lease = fab.ledger.claim(fab.board.read(tid), "bench", lease_seconds=300)
    fab.ledger.fail(lease, "poison", poison=True)
    return tid


def _one(fab: Fabric, person: KanboardClient, rng: random.Random, target: str = "kimi") -> float:
    """Seconds from a person's move of a dead letter to Queued to its revive record
    (``fab``: the fabric of the project ``target``'s queue lives in)."""
    tid = _dead_letter(fab, target)
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
            "swimlane_id": layout.swimlanes[target],
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
        config = replace(cfg, intervals=intervals)
        keeper = Keeper.for_fabric(fabric_on(board), config)
        home_settings_ = home_settings(fab.settings, fab.cards.get(HOME))
        home_keeper = Keeper(config, lambda: Fabric.connect(home_settings_, cards=fab.cards))
        home = Fabric.connect(home_settings_, cards=fab.cards)  # the bench's own (one thread each)
        lookup = KanboardClient(board.url, board.token)
        routes = HomeRoutes(
            lambda: published_hooks(lookup, fab.board.layout),
            token=TOKEN,
            main_project=lambda: fab.board.layout.project_id,
        )
        stop = threading.Event()
        with (
            HookServer(keeper.poke, token=TOKEN, route=routes) as hook,
            HookServer(home_keeper.poke, token=TOKEN) as home_hook,
        ):
            home_keeper.hook_url = home_hook.url
            threads = [
                threading.Thread(target=k.serve, args=(stop,), daemon=True) for k in (keeper, home_keeper)
            ]
            for t in threads:
                t.start()
            sweep_only = [_one(fab, person, rng) for _ in range(n)]
            board.set_webhook(hook.url, TOKEN)
            webhook = [_one(fab, person, rng) for _ in range(n)]
            at_home = [_one(home, person, rng, HOME) for _ in range(n)]
            stop.set()
            for t in threads:
                t.join(10)
        forwarded = hook.forwarded
    without, with_hook, home_hook_s = _stats(sweep_only), _stats(webhook), _stats(at_home)
    return {
        "name": "gestures",
        "sweep_seconds": SWEEP,
        "without_webhook": without,
        "with_webhook": with_hook,
        "home_with_webhook": home_hook_s,
        "home_events_forwarded": forwarded,
        "title": f"A person's gesture → the fabric's reaction (gesture sweep every {SWEEP:g} s)",
        "rows": _rows(without, with_hook, home_hook_s),
    }


def _rows(without: dict[str, float], with_hook: dict[str, float], home: dict[str, float]) -> list[list[str]]:
    per = SWEEP * 1000
    rows = []
    for label, s in (
        ("sweep only", without),
        ("with Kanboard's webhook", with_hook),
        (f"with the webhook, a card in {HOME}'s home (forwarded to its keeper)", home),
    ):
        rows.append(
            [
                f"{label}: p50 / p95 / max ms (x sweep interval), {s['n']} gestures",
                f"{s['p50_ms']:g} / {s['p95_ms']:g} / {s['max_ms']:g} "
                f"({s['p50_ms'] / per:.3f}x / {s['p95_ms'] / per:.3f}x / {s['max_ms'] / per:.3f}x)",
            ]
        )
    rows.append(["webhook speed-up, p50", f"{without['p50_ms'] / with_hook['p50_ms']:.0f}x"])
    rows.append([f"webhook speed-up, p50, {HOME}'s home", f"{without['p50_ms'] / home['p50_ms']:.0f}x"])
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
