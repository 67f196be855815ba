"""Throughput: the fabric's workers, the naive claimer and raw ``createTask``, 1..8 processes."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.env import QUEUE_AGENT, CountingClient, Target
from bench.naive import NaiveLayout, double_executions
from bench.naive import open_log as open_naive_log
from bench.pool import Pool
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.kanboard.port import BoardError, Call
from fabric.layout import Column
from fabric.ledger import Ledger
from fabric.taskboard import BoardLayout, TaskBoard
from workers.drill import open_log as open_drill_log


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _elapsed(t0: float, results: list[dict[str, Any]]) -> float:
    return max(r["t_end"] for r in results) - t0


def _merge(results: list[dict[str, Any]], key: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.get(key) or {})
    return dict(total)


def _count_in(target: Target, layout: BoardLayout, column: Column) -> int:
    client = target.client()
    rows = client.call("searchTasks", {"project_id": layout.project_id,
                                       "query": f'column:"{column.value}"'}) or []
    client.close()
    return len(rows)


def raw_point(target: Target, cards: CardSet, pool: Pool, *, procs: int, duration: float,
              tag: str) -> dict[str, Any]:
    _, layout = target.fresh(f"raw{tag}", cards)
    params = [{"url": target.url, "token": target.token, "owner": f"r{i}", "duration": duration,
               "project_id": layout.project_id, "column_id": layout.columns[Column.QUEUED],
               "swimlane_id": layout.swimlane(QUEUE_AGENT)}
              for i in range(procs)]
    t0, results = pool.run("raw", params, timeout=duration + 60)
    elapsed = _elapsed(t0, results)
    created = sum(r["created"] for r in results)
    return {"procs": procs, "created": created,
            "refused": sum(r["refused"] for r in results),
            "on_board": _count_in(target, layout, Column.QUEUED),
            "seconds": round(elapsed, 3), "per_second": round(created / elapsed, 1),
            "errors": _merge(results, "errors")}


def fabric_point(target: Target, cards: CardSet, pool: Pool, *, procs: int, n: int,
                 deadline: float, tmp: Path, tag: str, effect: bool = False) -> dict[str, Any]:
    settings, layout = target.fresh(f"fab{tag}", cards)
    client = target.client()
    board = TaskBoard(client, layout)
    fab = Fabric(settings, cards, client, board, Ledger(board), time.time)
    queue = cards.get(QUEUE_AGENT).queue_name
    s0 = time.perf_counter()
    submit_errors = 0
    for i in range(n):
        # Keyed, so a submit hit by "database is locked" can be retried without a duplicate
        # (the retry returns the original task, repairing it if it was left half-written).
        for attempt in range(3):
            try:
                fab.submit(f"bench task {i}", target=QUEUE_AGENT, key=f"tp-{tag}-{i}")
                break
            except BoardError:
                submit_errors += 1
                if attempt == 2:
                    raise
    submit_seconds = time.perf_counter() - s0
    log = tmp / f"drill-{target.name}-{tag}.sqlite3"
    open_drill_log(log).close()  # created once here: concurrent first opens race on WAL mode
    params = [{"url": target.url, "token": target.token, "project": settings.project,
               "locks_project": settings.locks_project, "queue": queue, "owner": f"w{i}",
               "log": str(log), "deadline": deadline, "effect": effect}
              for i in range(procs)]
    t0, results = pool.run("fabric", params, timeout=deadline + 60)
    elapsed = _elapsed(t0, results)
    completed = sum(r["completed"] for r in results)
    claimed = sum(r["claimed"] for r in results)
    by_method = _merge(results, "by_method")
    trips = sum(r["trips"] for r in results)
    db = sqlite3.connect(log)
    per_uid = db.execute("SELECT uid, COUNT(*) FROM executions GROUP BY uid").fetchall()
    per_epoch = db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM executions GROUP BY uid, epoch HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    db.close()
    client.close()
    wins = claimed + completed + sum(r["failed"] for r in results)
    return {"procs": procs, "tasks": n, "completed": completed, "claimed": claimed,
            "done_on_board": _count_in(target, layout, Column.DONE),
            "seconds": round(elapsed, 3), "per_second": round(completed / elapsed, 1),
            "submit_per_second": round(n / submit_seconds, 1), "submit_errors": submit_errors,
            "executions": sum(c for _, c in per_uid),
            "double_executions": sum(1 for _, c in per_uid if c > 1),
            "double_executed_epochs": per_epoch,
            "trips": trips, "trips_per_task": round(trips / max(1, completed), 2),
            "polls": sum(r["polls"] for r in results),
            "lost_lock_races": by_method.get("createTag", 0) - wins,
            "fenced": sum(r["fenced"] for r in results),
            "timed_out": any(r["timed_out"] for r in results),
            "by_method": by_method, "errors": _merge(results, "errors")}


def _seed_naive(client: CountingClient, nl: NaiveLayout, n: int) -> None:
    """Create ``n`` plain tasks in Queued; top up after "database is locked" errors."""
    query = f'status:open column:"Queued" swimlane:"{nl.queue}"'
    have = 0
    for _ in range(5):
        missing = n - have
        for start in range(0, missing, 100):
            client.batch([Call("createTask", {
                "title": f"naive task {have + i}", "project_id": nl.project_id,
                "column_id": nl.queued, "swimlane_id": nl.swimlane_id})
                for i in range(start, min(missing, start + 100))])
        have = len(client.call("searchTasks", {"project_id": nl.project_id, "query": query}) or [])
        if have >= n:
            return
    raise RuntimeError(f"seeding the naive queue failed: {have}/{n} created")


def naive_point(target: Target, cards: CardSet, pool: Pool, *, procs: int, n: int,
                deadline: float, tmp: Path, tag: str) -> dict[str, Any]:
    _, layout = target.fresh(f"naive{tag}", cards)
    client = target.client()
    users = [target.add_user(client, f"bench-naive-{target.run_id}-{tag}-{i}", layout.project_id)
             for i in range(procs)]
    nl = NaiveLayout(project_id=layout.project_id, swimlane_id=layout.swimlane(QUEUE_AGENT),
                     queue=cards.get(QUEUE_AGENT).queue_name,
                     queued=layout.columns[Column.QUEUED], working=layout.columns[Column.WORKING],
                     done=layout.columns[Column.DONE])
    _seed_naive(client, nl, n)
    client.close()
    log = tmp / f"naive-{target.name}-{tag}.sqlite3"
    open_naive_log(log).close()
    params = [{"url": target.url, "token": target.token, "layout": vars(nl), "owner": f"n{i}",
               "user_id": users[i], "log": str(log), "deadline": deadline}
              for i in range(procs)]
    t0, results = pool.run("naive", params, timeout=deadline + 60)
    elapsed = _elapsed(t0, results)
    executed, doubles, executions = double_executions(log)
    done = _count_in(target, layout, Column.DONE)
    return {"procs": procs, "tasks": n, "done_on_board": done,
            "seconds": round(elapsed, 3), "per_second": round(done / elapsed, 1),
            "tasks_executed": executed, "executions": executions,
            "double_executions": doubles,
            "claim_errors": sum(r["claim_errors"] for r in results),
            "trips": sum(r["trips"] for r in results),
            "trips_per_task": round(sum(r["trips"] for r in results) / max(1, done), 2),
            "errors": _merge(results, "errors")}


def run_throughput(target: Target, cards: CardSet, pool: Pool, *, procs: tuple[int, ...],
                   n: int, repeats: int, raw_seconds: float, deadline: float, tmp: Path,
                   log: Any = print) -> dict[str, Any]:
    """Every mode at every process count, interleaved so machine noise spreads evenly.

    Each point runs ``repeats`` times; the summary keeps the best rate of each mode (the
    least disturbed by other load on the machine) and sums correctness counts over all.
    """
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        "raw": {p: [] for p in procs}, "fabric": {p: [] for p in procs},
        "naive": {p: [] for p in procs}}
    for rep in range(repeats):
        for p in procs:
            tag = f"{p}r{rep}"
            r = raw_point(target, cards, pool, procs=p, duration=raw_seconds, tag=tag)
            runs["raw"][p].append(r)
            log(f"  {target.name} #{rep + 1} p={p} raw createTask: {r['per_second']}/s")
            f = fabric_point(target, cards, pool, procs=p, n=n, deadline=deadline, tmp=tmp, tag=tag)
            runs["fabric"][p].append(f)
            log(f"  {target.name} #{rep + 1} p={p} fabric:  {f['per_second']}/s "
                f"({f['completed']}/{n}, {f['double_executions']} double, "
                f"{f['trips_per_task']} trips/task)")
            v = naive_point(target, cards, pool, procs=p, n=n, deadline=deadline, tmp=tmp, tag=tag)
            runs["naive"][p].append(v)
            log(f"  {target.name} #{rep + 1} p={p} naive:   {v['per_second']}/s "
                f"({v['done_on_board']}/{n}, {v['double_executions']} double)")
    best = {mode: {p: max(rs, key=lambda r: r["per_second"]) for p, rs in per.items()}
            for mode, per in runs.items()}
    totals = {p: {
        "tasks": n * repeats,
        "fabric_double_executions": sum(r["double_executions"] for r in runs["fabric"][p]),
        "fabric_double_executed_epochs": sum(r["double_executed_epochs"]
                                             for r in runs["fabric"][p]),
        "fabric_done": sum(r["completed"] for r in runs["fabric"][p]),
        "naive_double_executions": sum(r["double_executions"] for r in runs["naive"][p]),
        "naive_done": sum(r["done_on_board"] for r in runs["naive"][p]),
        "fabric_errors": sum(sum(r["errors"].values()) for r in runs["fabric"][p]),
        "naive_errors": sum(sum(r["errors"].values()) for r in runs["naive"][p]),
        "raw_errors": sum(sum(r["errors"].values()) for r in runs["raw"][p]),
    } for p in procs}
    return {"best": best, "totals": totals, "runs": runs}
