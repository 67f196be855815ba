"""Jobs the pool processes run: the fabric's own worker, and raw ``createTask``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import cache
from typing import Any

from bench.env import CARDS_DIR, CountingClient, load_bench_cards
from fabric.cards import CardSet
from fabric.config import Settings
from fabric.core import Fabric
from fabric.kanboard.port import BoardError
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig

Runner = Any


@cache
def _cards() -> CardSet:
    return load_bench_cards()


def fabric_job(p: dict[str, Any]) -> Runner:
    """One worker process (drill executor, no sleep) draining a queue with the real ledger."""
    settings = Settings(board_url=p["url"], board_token=p["token"], cards_dir=CARDS_DIR,
                        project=p["project"], locks_project=p["locks_project"])
    cards = _cards()
    clients: list[CountingClient] = []

    def connect() -> Fabric:
        client = CountingClient(p["url"], p["token"])
        clients.append(client)
        return Fabric.connect(settings, cards=cards, port=client)

    worker = Worker(connect, DrillExecutor(p["log"], effect=bool(p.get("effect", False))),
                    WorkerConfig(queue=p["queue"], owner=p["owner"], lease_seconds=60.0,
                                 poll_seconds=0.05, exit_when_idle=True))

    def run() -> dict[str, Any]:
        timer = threading.Timer(float(p["deadline"]), worker.stop.set)
        timer.daemon = True
        timer.start()
        worker.run()
        timer.cancel()
        by_method: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        for c in clients:
            by_method.update(c.stats.by_method)
            errors.update(c.errors)
        s = worker.stats
        return {"completed": s.completed, "claimed": s.claimed, "failed": s.failed,
                "fenced": s.fenced, "polls": s.polls,
                "trips": sum(c.stats.trips for c in clients),
                "calls": sum(c.stats.calls for c in clients),
                "by_method": dict(by_method), "errors": dict(errors),
                "timed_out": worker.stop.is_set()}

    return run


def raw_job(p: dict[str, Any]) -> Runner:
    """The board's ceiling: plain ``createTask`` calls, one per round trip, for ``duration`` s."""
    client = CountingClient(p["url"], p["token"])

    def run() -> dict[str, Any]:
        end = time.monotonic() + float(p["duration"])
        created = refused = 0
        i = 0
        while time.monotonic() < end:
            i += 1
            try:
                result = client.call("createTask", {
                    "title": f"raw {p['owner']} {i}", "project_id": p["project_id"],
                    "column_id": p["column_id"], "swimlane_id": p["swimlane_id"],
                })
            except BoardError:
                continue  # counted by the client
            if result:
                created += 1
            else:
                refused += 1
        return {"created": created, "refused": refused, "trips": client.stats.trips,
                "errors": dict(client.errors)}

    return run
