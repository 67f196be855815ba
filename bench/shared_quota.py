"""Admit cost of a quota kept across hosts vs one kept on the host alone.

A quota declared ``across_hosts`` is counted in the host's own endpoint ledger first (the
fast path) and then by taking a slot on the board (docs/DESIGN.md, "One quota across
hosts"). What each admission costs, with the a(t) a worker builds
(:func:`workers.assembly.availability_for`), on the embedded board over loopback HTTP:

* local only: the endpoint ledger (its file lock), no board;
* shared, taking a slot: the ledger, then one batched ``createTag``;
* shared, refused by the host's own ledger (it spent the quota by itself): no board;
* shared, refused by the board's count (another host spent it; the view is fresh): no board;
* two hosts racing for the same slots: round trips per admission won.

Run alone: ``python -m bench.shared_quota [--quick]``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric.availability import Availability
from fabric.cards import CardSet, load_cards
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.quotas import QuotaStore
from fabric.settings.resolve import Settings
from workers.assembly import availability_for
from workers.shared_quota import Across

MODEL = """
id: {id}
kind: model
name: {id}
tier: medium
trust: trusted
capabilities: [chat]
availability:
  - shape: quota
    limit: {limit}
    window: 1h
    across_hosts: {shared}
runtime:
  mode: gateway
  model: openai/{id}
"""
ENV = {"AGAP_MODEL_MODE": "gateway"}  # the demo mode would leave the endpoint probes out


def _cards(tmp: Path, limit: int, spent: int, race: int) -> CardSet:
    d = tmp / "cards"
    d.mkdir()
    for cid, lim, shared in (
        ("local", limit, "false"),
        ("shared", limit, "true"),
        ("spent", spent, "true"),
        ("race", race, "true"),
    ):
        (d / f"{cid}.yaml").write_text(MODEL.format(id=cid, limit=lim, shared=shared))
    return load_cards(d, base_dir=tmp)


class Host:
    """One host: its own state dir (endpoint ledger) and board connection."""

    def __init__(self, board: EmbeddedBoard, cards: CardSet, state: Path, project: str) -> None:
        self.port = KanboardClient(board.url, board.token)
        self.across = Across(lambda: QuotaStore(self.port, project), refresh=30.0)
        self.cards, self.state = cards, state
        self._av: dict[str, Availability] = {}

    def av(self, cid: str) -> Availability:
        if cid not in self._av:
            self._av[cid] = availability_for(self.cards.get(cid), ENV, self.cards, self.state, self.across)
        return self._av[cid]


def _timed(host: Host, fn: Callable[[], bool], runs: int) -> dict[str, Any]:
    times, trips, ok = [], [], 0
    for _ in range(runs):
        before = host.port.stats.trips
        t0 = time.perf_counter()
        ok += fn()
        times.append(time.perf_counter() - t0)
        trips.append(host.port.stats.trips - before)
    return {
        "median_us": round(statistics.median(times) * 1e6, 1),
        "p95_us": round(sorted(times)[int(len(times) * 0.95) - 1] * 1e6, 1),
        "round_trips": round(sum(trips) / runs, 3),
        "admitted": ok,
        "runs": runs,
    }


def _admit(host: Host, cid: str) -> Callable[[], bool]:
    av = host.av(cid)

    def one() -> bool:
        v = av.admit(time.time())
        if v.available:
            av.settle(time.time())
        return v.available

    return one


def _race(board: EmbeddedBoard, cards: CardSet, tmp: Path, project: str, limit: int) -> dict[str, Any]:
    """Two hosts (threads, each its own ledger and connection) admit until the quota of
    ``limit`` is spent between them: how many won, and trips per admission won."""
    hosts = [Host(board, cards, tmp / f"race-{i}", project) for i in range(2)]
    won = [0, 0]
    start = threading.Barrier(2)

    def drain(i: int) -> None:
        av = hosts[i].av("race")
        start.wait()
        misses = 0
        while misses < 10:  # spent as far as this host can tell, ten times running
            if av.admit(time.time()).available:
                won[i] += 1
                misses = 0
            else:
                misses += 1
                time.sleep(random.uniform(0, 0.001))  # let the other host's race go on

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    trips = sum(h.port.stats.trips for h in hosts)
    slots = [s for s in QuotaStore(hosts[0].port, project).read().get("race", []) if not s.returned]
    return {
        "limit": limit,
        "won": won,
        "slots_on_board": len(slots),
        "trips_per_win": round(trips / max(1, sum(won)), 2),
        "seconds": round(seconds, 3),
    }


def run(quick: bool) -> dict[str, Any]:
    runs = 200 if quick else 2000
    spent = 5
    race_limit = 50 if quick else 300
    with tempfile.TemporaryDirectory() as tmp_s, EmbeddedBoard(Path(tmp_s) / "board.sqlite3") as board:
        tmp = Path(tmp_s)
        cards = _cards(tmp, runs * 2, spent, race_limit)
        settings = Settings(board_url=board.url, board_token=board.token, cards_dir=tmp / "cards")
        init_board(KanboardClient(board.url, board.token), settings, cards)
        project = settings.quota_project
        a = Host(board, cards, tmp / "host-a", project)
        b = Host(board, cards, tmp / "host-b", project)
        local = _timed(a, _admit(a, "local"), runs)
        shared = _timed(a, _admit(a, "shared"), runs)
        # Host a spends the small quota by itself; then its own ledger refuses, no board.
        _timed(a, _admit(a, "spent"), spent)
        own = _timed(a, _admit(a, "spent"), runs)
        # Host b's ledger is empty: only the board's count (read once, then held) refuses.
        _timed(b, _admit(b, "spent"), 1)
        board_spent = _timed(b, _admit(b, "spent"), runs)
        race = _race(board, cards, tmp, project, race_limit)
    result: dict[str, Any] = {
        "name": "shared_quota",
        "runs": runs,
        "local": local,
        "shared_take": shared,
        "shared_spent_own_ledger": own,
        "shared_spent_on_board": board_spent,
        "race": race,
        "title": "One quota across hosts: admit cost (embedded board, loopback HTTP)",
    }
    result["rows"] = rows(result)
    return result


def rows(r: dict[str, Any]) -> list[list[str]]:
    def cell(x: dict[str, Any]) -> str:
        return f"{x['median_us']} µs median, {x['p95_us']} µs p95, {x['round_trips']} board trips"

    race = r["race"]
    return [
        ["admit + settle, quota on this host only", cell(r["local"])],
        ["admit + settle, quota across hosts (takes a slot)", cell(r["shared_take"])],
        ["refused, across hosts, this host's ledger spent (fast path)", cell(r["shared_spent_own_ledger"])],
        ["refused, across hosts, spent by another host (fresh view)", cell(r["shared_spent_on_board"])],
        [
            f"two hosts racing for a quota of {race['limit']}",
            f"{race['won'][0]} + {race['won'][1]} admitted, {race['slots_on_board']} slots on the board, "
            f"{race['trips_per_win']} trips per admission",
        ],
    ]


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2, default=str))
