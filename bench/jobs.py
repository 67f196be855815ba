"""Jobs the pool processes run: the fabric's own worker, its settle poll, raw ``createTask``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import cache
from typing import Any

from bench.env import CARDS_DIR, CountingClient, load_bench_cards
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.kanboard.port import BoardError
from fabric.settings.resolve import Settings
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig
from workers.queue import QueueReader

Runner = Any

# The connections of this process's last fabric job: the settle job polls once more
# through them (a pool process runs the same index of every job).
_LAST: list[tuple[Fabric, CountingClient]] = []
_LAST_QUEUE: list[str] = []


@cache
def _cards() -> CardSet:
    return load_bench_cards()


def fabric_job(p: dict[str, Any]) -> Runner:
    """One worker process (drill executor, no sleep) draining a queue with the real ledger."""
    settings = Settings(
        board_url=p["url"],
        board_token=p["token"],
        cards_dir=CARDS_DIR,
        project=p["project"],
        locks_project=p["locks_project"],
    )
    cards = _cards()
    clients: list[CountingClient] = []
    for _, old in _LAST:
        old.close()
    _LAST.clear()
    _LAST_QUEUE[:] = [p["queue"]]

    def connect() -> Fabric:
        client = CountingClient(p["url"], p["token"])
        clients.append(client)
        fab = Fabric.connect(settings, cards=cards, port=client)
        _LAST.append((fab, client))
        return fab

    worker = Worker(
        connect,
        DrillExecutor(p["log"], effect=bool(p.get("effect", False))),
        WorkerConfig(
            queue=p["queue"], owner=p["owner"], lease_seconds=60.0, poll_seconds=0.05, exit_when_idle=True
        ),
    )
    # When this process's last task was recorded done: the run's end is later, by the
    # settling of its moves as each connection closes (up to about a second, whatever
    # the number of tasks).
    last_done: list[float] = []

    def on_event(event: str, _lease: object, _detail: str) -> None:
        if event == "completed":
            last_done[:] = [time.time()]

    worker.add_listener(on_event)

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
        return {
            "completed": s.completed,
            "claimed": s.claimed,
            "failed": s.failed,
            "fenced": s.fenced,
            "polls": s.polls,
            "trips": sum(c.stats.trips for c in clients),
            "calls": sum(c.stats.calls for c in clients),
            "by_method": dict(by_method),
            "errors": dict(errors),
            "timed_out": worker.stop.is_set(),
            "t_last_done": last_done[0] if last_done else None,
        }

    return run


def settle_job(p: dict[str, Any]) -> Runner:
    """One more poll on each connection of this process's last fabric job, after it ended.

    A poll also reads back the cards that connection moved a moment before and moves
    again any whose move the board lost: what a worker still running would do next.
    """
    last = list(_LAST)
    queue = _LAST_QUEUE[0] if _LAST_QUEUE else p["queue"]

    def run() -> dict[str, Any]:
        before = [(c.stats.trips, c.stats.by_method.get("moveTaskPosition", 0)) for _, c in last]
        failed = 0
        for fab, _ in last:
            try:
                QueueReader.for_agent(fab, fab.cards.by_queue(queue)).poll()
            except BoardError:
                failed += 1
        trips = sum(c.stats.trips - t for (_, c), (t, _) in zip(last, before, strict=True))
        moves = sum(
            c.stats.by_method.get("moveTaskPosition", 0) - m
            for (_, c), (_, m) in zip(last, before, strict=True)
        )
        for _, c in last:
            c.close()
        _LAST.clear()
        return {"connections": len(last), "trips": trips, "moves_resent": moves, "failed": failed}

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
                result = client.call(
                    "createTask",
                    {
                        "title": f"raw {p['owner']} {i}",
                        "project_id": p["project_id"],
                        "column_id": p["column_id"],
                        "swimlane_id": p["swimlane_id"],
                    },
                )
            except BoardError:
                continue  # counted by the client
            if result:
                created += 1
            else:
                refused += 1
        return {
            "created": created,
            "refused": refused,
            "trips": client.stats.trips,
            "errors": dict(client.errors),
        }

    return run
