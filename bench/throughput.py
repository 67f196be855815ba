"""Throughput: the fabric's workers, the naive claimer and raw ``createTask``, 1..8 processes.

Besides the rates, every fabric and naive point audits the board when its processes
have ended: double executions (from the executors' logs), tasks not done, and cards in
a column that disagrees with the task's state (a lost projection: PostgreSQL loses
some of the concurrent ``moveTaskPosition`` calls). For the fabric the truth is each
task's current record (``TaskBoard.read_many``), its column ``COLUMN_OF_STATE``; for the
naive claimer a task is done once its log shows it executed, and its card belongs in
Done. The audit is repeated after a short bounded settle: for the fabric, one more
poll by each worker connection (which reads back and re-sends its own lost moves); the
naive claimer has no such step, so its second count shows only what time alone fixes.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.env import QUEUE_AGENT, CountingClient, Target
from bench.naive import NaiveLayout, double_executions, executed_ids
from bench.naive import open_log as open_naive_log
from bench.pool import Pool
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.kanboard import moves
from fabric.kanboard.layout import COLUMN_OF_STATE, Column
from fabric.kanboard.port import BoardError, Call
from fabric.kanboard.taskboard import BoardLayout, TaskBoard, TaskView
from fabric.task import State
from workers.drill import open_log as open_drill_log

# When a mover may check its card (the competing moves have committed): the fabric's own
# VERIFY_AFTER, read at run time (the fabric is being changed under the benchmarks).
VERIFY_AFTER = float(getattr(moves, "VERIFY_AFTER", 0.5))
READ_CHUNK = 25  # tasks per read-back round trip (two calls each)


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _elapsed(t0: float, results: list[dict[str, Any]]) -> float:
    return float(max(r["t_end"] for r in results)) - t0


def _merge(results: list[dict[str, Any]], key: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.get(key) or {})
    return dict(total)


def _count_in(target: Target, layout: BoardLayout, column: Column) -> int:
    client = target.client()
    rows = (
        client.call("searchTasks", {"project_id": layout.project_id, "query": f'column:"{column.value}"'})
        or []
    )
    client.close()
    return len(rows)


def _retry(fn: Any, *args: Any, attempts: int = 4) -> Any:
    """A read after the run: "database is locked" may linger a moment on SQLite."""
    for attempt in range(attempts):
        try:
            return fn(*args)
        except BoardError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def audit_fabric(board: TaskBoard, task_ids: Sequence[int]) -> dict[str, Any]:
    """Each submitted task's current record against its card's column.

    ``not_done``: no record in state done (the task never finished). ``wrong_column``:
    the card is not in the column ``COLUMN_OF_STATE`` gives for the current record's
    state (a lost projection), as "<card's column> -> <record's column>" counts.
    """
    by_id = {cid: col for col, cid in board.layout.columns.items()}
    views: dict[int, TaskView] = {}
    for start in range(0, len(task_ids), READ_CHUNK):
        views.update(_retry(board.read_many, list(task_ids[start : start + READ_CHUNK])))
    states: Counter[str] = Counter()
    wrong: Counter[str] = Counter()
    for tid in task_ids:
        view = views.get(tid)
        rec = view.current if view is not None else None
        if view is None or rec is None:
            states["missing" if view is None else "no record"] += 1
            continue
        states[str(rec.state)] += 1
        want = COLUMN_OF_STATE[rec.state]
        column_id = int(view.row.get("column_id") or 0)
        have = by_id.get(column_id)
        if have != want:
            wrong[f"{have.value if have else f'column #{column_id}'} -> {want.value}"] += 1
    not_done = len(task_ids) - states.get(str(State.DONE), 0)
    return {
        "not_done": not_done,
        "wrong_column": sum(wrong.values()),
        "stuck": len([t for t in task_ids if _stuck(views.get(t), by_id)]),
        "states": dict(states),
        "wrong": dict(wrong),
    }


def _stuck(view: TaskView | None, by_id: dict[int, Column]) -> bool:
    """Not done, or done with its card elsewhere than Done (either way: not finished)."""
    rec = view.current if view is not None else None
    if view is None or rec is None or rec.state != State.DONE:
        return True
    return by_id.get(int(view.row.get("column_id") or 0)) != COLUMN_OF_STATE[rec.state]


def audit_naive(target: Target, layout: BoardLayout, executed: set[int]) -> dict[str, Any]:
    """The naive claimer's cards: a task its log shows executed belongs in Done.

    ``not_done``: never executed. ``wrong_column``: executed, its card not in Done (the
    final move lost or refused). ``stuck`` is both: cards that will not finish.
    """
    by_id = {cid: col for col, cid in layout.columns.items()}
    client = target.client()
    rows = _retry(client.call, "getAllTasks", {"project_id": layout.project_id, "status_id": 1})
    client.close()
    columns = {int(r["id"]): by_id.get(int(r.get("column_id") or 0)) for r in rows or []}
    where: Counter[str] = Counter(c.value if c else "?" for c in columns.values())
    wrong: Counter[str] = Counter()
    for tid, col in columns.items():
        if tid in executed and col != Column.DONE:
            wrong[f"{col.value if col else '?'} -> {Column.DONE.value}"] += 1
    not_done = sum(1 for tid in columns if tid not in executed)
    return {
        "not_done": not_done,
        "wrong_column": sum(wrong.values()),
        "stuck": not_done + sum(wrong.values()),
        "columns": dict(where),
        "wrong": dict(wrong),
    }


def _settle_wait(ended: float, settle: float) -> None:
    """Wait until ``settle`` seconds after ``ended`` (time.time()), bounded by ``settle``."""
    time.sleep(max(0.0, min(settle, ended + settle - time.time())))


def raw_point(
    target: Target, cards: CardSet, pool: Pool, *, procs: int, duration: float, tag: str
) -> dict[str, Any]:
    _, layout = target.fresh(f"raw{tag}", cards)
    params = [
        {
            "url": target.url,
            "token": target.token,
            "owner": f"r{i}",
            "duration": duration,
            "project_id": layout.project_id,
            "column_id": layout.columns[Column.QUEUED],
            "swimlane_id": layout.swimlane(QUEUE_AGENT),
        }
        for i in range(procs)
    ]
    t0, results = pool.run("raw", params, timeout=duration + 60)
    elapsed = _elapsed(t0, results)
    created = sum(r["created"] for r in results)
    return {
        "procs": procs,
        "created": created,
        "refused": sum(r["refused"] for r in results),
        "on_board": _count_in(target, layout, Column.QUEUED),
        "seconds": round(elapsed, 3),
        "per_second": round(created / elapsed, 1),
        "errors": _merge(results, "errors"),
    }


def fabric_point(
    target: Target,
    cards: CardSet,
    pool: Pool,
    *,
    procs: int,
    n: int,
    deadline: float,
    tmp: Path,
    tag: str,
    effect: bool = False,
    settle: float = 1.0,
) -> dict[str, Any]:
    settings, layout = target.fresh(f"fab{tag}", cards)
    client = target.client()
    fab = Fabric.connect(settings, cards=cards, port=client)
    queue = cards.get(QUEUE_AGENT).queue_name
    s0 = time.perf_counter()
    submit_errors = 0
    task_ids: list[int] = []
    for i in range(n):
        # Keyed, so a submit hit by "database is locked" can be retried without a duplicate
        # (the retry returns the original task, repairing it if it was left half-written).
        for attempt in range(3):
            try:
                task_ids.append(
                    fab.submit(f"bench task {i}", target=QUEUE_AGENT, key=f"tp-{tag}-{i}").task_id
                )
                break
            except BoardError:
                submit_errors += 1
                if attempt == 2:
                    raise
    submit_seconds = time.perf_counter() - s0
    log = tmp / f"drill-{target.name}-{tag}.sqlite3"
    open_drill_log(log).close()  # created once here: concurrent first opens race on WAL mode
    params = [
        {
            "url": target.url,
            "token": target.token,
            "project": settings.project,
            "locks_project": settings.locks_project,
            "queue": queue,
            "owner": f"w{i}",
            "log": str(log),
            "deadline": deadline,
            "effect": effect,
        }
        for i in range(procs)
    ]
    t0, results = pool.run("fabric", params, timeout=deadline + 60)
    elapsed = _elapsed(t0, results)
    completed = sum(r["completed"] for r in results)
    # per_second is to the processes' end; drained_per_second to the last task recorded
    # done, without the settling of moves each worker makes as it leaves (a fixed cost).
    done_at = max((r.get("t_last_done") or 0.0) for r in results)
    drained = done_at - t0 if done_at > t0 else None
    claimed = sum(r["claimed"] for r in results)
    by_method = _merge(results, "by_method")
    trips = sum(r["trips"] for r in results)
    db = sqlite3.connect(log)
    per_uid = db.execute("SELECT uid, COUNT(*) FROM executions GROUP BY uid").fetchall()
    per_epoch = db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM executions GROUP BY uid, epoch HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    db.close()
    ended = max(r["t_end"] for r in results)
    at_end = audit_fabric(fab.board, task_ids)
    settled: dict[str, Any] | None = None
    settle_run: dict[str, Any] | None = None
    if settle > 0:
        _settle_wait(ended, max(settle, VERIFY_AFTER))
        _, polls = pool.run("settle", [{"queue": queue} for _ in range(procs)], timeout=60)
        settle_run = {k: sum(r[k] for r in polls) for k in ("connections", "trips", "moves_resent", "failed")}
        settled = audit_fabric(fab.board, task_ids)
    client.close()
    wins = claimed + completed + sum(r["failed"] for r in results)
    return {
        "procs": procs,
        "tasks": n,
        "completed": completed,
        "claimed": claimed,
        "done_on_board": _count_in(target, layout, Column.DONE),
        "seconds": round(elapsed, 3),
        "per_second": round(completed / elapsed, 1),
        "drained_seconds": None if drained is None else round(drained, 3),
        "drained_per_second": None if drained is None else round(completed / drained, 1),
        "submit_per_second": round(n / submit_seconds, 1),
        "submit_errors": submit_errors,
        "executions": sum(c for _, c in per_uid),
        "double_executions": sum(1 for _, c in per_uid if c > 1),
        "double_executed_epochs": per_epoch,
        "at_end": at_end,
        "settled": settled,
        "settle": settle_run,
        "trips": trips,
        "trips_per_task": round(trips / max(1, completed), 2),
        "polls": sum(r["polls"] for r in results),
        "lost_lock_races": by_method.get("createTag", 0) - wins,
        "fenced": sum(r["fenced"] for r in results),
        "timed_out": any(r["timed_out"] for r in results),
        "by_method": by_method,
        "errors": _merge(results, "errors"),
    }


def _seed_naive(client: CountingClient, nl: NaiveLayout, n: int) -> None:
    """Create ``n`` plain tasks in Queued; top up after "database is locked" errors."""
    query = f'status:open column:"Queued" swimlane:"{nl.queue}"'
    have = 0
    for _ in range(5):
        missing = n - have
        for start in range(0, missing, 100):
            client.batch(
                [
                    Call(
                        "createTask",
                        {
                            "title": f"naive task {have + i}",
                            "project_id": nl.project_id,
                            "column_id": nl.queued,
                            "swimlane_id": nl.swimlane_id,
                        },
                    )
                    for i in range(start, min(missing, start + 100))
                ]
            )
        have = len(client.call("searchTasks", {"project_id": nl.project_id, "query": query}) or [])
        if have >= n:
            return
    raise RuntimeError(f"seeding the naive queue failed: {have}/{n} created")


def naive_point(
    target: Target,
    cards: CardSet,
    pool: Pool,
    *,
    procs: int,
    n: int,
    deadline: float,
    tmp: Path,
    tag: str,
    settle: float = 1.0,
) -> dict[str, Any]:
    _, layout = target.fresh(f"naive{tag}", cards)
    client = target.client()
    users = [
        target.add_user(client, f"bench-naive-{target.run_id}-{tag}-{i}", layout.project_id)
        for i in range(procs)
    ]
    nl = NaiveLayout(
        project_id=layout.project_id,
        swimlane_id=layout.swimlane(QUEUE_AGENT),
        queue=cards.get(QUEUE_AGENT).queue_name,
        queued=layout.columns[Column.QUEUED],
        working=layout.columns[Column.WORKING],
        done=layout.columns[Column.DONE],
    )
    _seed_naive(client, nl, n)
    client.close()
    log = tmp / f"naive-{target.name}-{tag}.sqlite3"
    open_naive_log(log).close()
    params = [
        {
            "url": target.url,
            "token": target.token,
            "layout": vars(nl),
            "owner": f"n{i}",
            "user_id": users[i],
            "log": str(log),
            "deadline": deadline,
        }
        for i in range(procs)
    ]
    t0, results = pool.run("naive", params, timeout=deadline + 60)
    elapsed = _elapsed(t0, results)
    executed, doubles, executions = double_executions(log)
    done = _count_in(target, layout, Column.DONE)
    ran = executed_ids(log)
    at_end = audit_naive(target, layout, ran)
    settled: dict[str, Any] | None = None
    if settle > 0:
        _settle_wait(max(r["t_end"] for r in results), max(settle, VERIFY_AFTER))
        settled = audit_naive(target, layout, ran)
    return {
        "procs": procs,
        "tasks": n,
        "done_on_board": done,
        "seconds": round(elapsed, 3),
        "per_second": round(done / elapsed, 1),
        "tasks_executed": executed,
        "executions": executions,
        "double_executions": doubles,
        "at_end": at_end,
        "settled": settled,
        "timed_out": any(r.get("timed_out") for r in results),
        "claim_errors": sum(r["claim_errors"] for r in results),
        "trips": sum(r["trips"] for r in results),
        "trips_per_task": round(sum(r["trips"] for r in results) / max(1, done), 2),
        "errors": _merge(results, "errors"),
    }


def run_throughput(
    target: Target,
    cards: CardSet,
    pool: Pool,
    *,
    procs: tuple[int, ...],
    n: int,
    repeats: int,
    raw_seconds: float,
    deadline: float,
    tmp: Path,
    settle: float = 1.0,
    log: Any = print,
) -> dict[str, Any]:
    """Every mode at every process count, interleaved so machine noise spreads evenly.

    Each point runs ``repeats`` times; the summary keeps the best rate of each mode (the
    least disturbed by other load on the machine) and sums correctness counts over all.
    ``settle`` > 0: audit again that many seconds after a point ends (see the module
    docstring); 0 audits only at the end.
    """
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        "raw": {p: [] for p in procs},
        "fabric": {p: [] for p in procs},
        "naive": {p: [] for p in procs},
    }
    for rep in range(repeats):
        for p in procs:
            tag = f"{p}r{rep}"
            w = time.monotonic()
            r = raw_point(target, cards, pool, procs=p, duration=raw_seconds, tag=tag)
            r["wall_seconds"] = round(time.monotonic() - w, 2)
            runs["raw"][p].append(r)
            log(f"  {target.name} #{rep + 1} p={p} raw createTask: {r['per_second']}/s")
            w = time.monotonic()
            f = fabric_point(
                target, cards, pool, procs=p, n=n, deadline=deadline, tmp=tmp, tag=tag, settle=settle
            )
            f["wall_seconds"] = round(time.monotonic() - w, 2)
            runs["fabric"][p].append(f)
            log(
                f"  {target.name} #{rep + 1} p={p} fabric:  {f['per_second']}/s "
                f"(drained {f['drained_per_second']}/s to the last task done; "
                f"{f['completed']}/{n}, {f['double_executions']} double, "
                f"{_audit_line(f)}, {f['trips_per_task']} trips/task)"
            )
            w = time.monotonic()
            v = naive_point(
                target, cards, pool, procs=p, n=n, deadline=deadline, tmp=tmp, tag=tag, settle=settle
            )
            v["wall_seconds"] = round(time.monotonic() - w, 2)
            runs["naive"][p].append(v)
            log(
                f"  {target.name} #{rep + 1} p={p} naive:   {v['per_second']}/s "
                f"({v['done_on_board']}/{n}, {v['double_executions']} double, "
                f"{_audit_line(v)})"
            )
    best = {
        mode: {p: max(rs, key=lambda r: r["per_second"]) for p, rs in per.items()}
        for mode, per in runs.items()
    }
    totals = {
        p: {
            "tasks": n * repeats,
            "fabric_double_executions": sum(r["double_executions"] for r in runs["fabric"][p]),
            "fabric_double_executed_epochs": sum(r["double_executed_epochs"] for r in runs["fabric"][p]),
            "fabric_done": sum(r["completed"] for r in runs["fabric"][p]),
            "naive_double_executions": sum(r["double_executions"] for r in runs["naive"][p]),
            "naive_done": sum(r["done_on_board"] for r in runs["naive"][p]),
            **{
                f"{mode}_{key}": _total(runs[mode][p], phase, metric)
                for mode in ("fabric", "naive")
                for key, phase, metric in (
                    ("not_done", "at_end", "not_done"),
                    ("wrong_column", "at_end", "wrong_column"),
                    ("stuck", "at_end", "stuck"),
                    ("not_done_settled", "settled", "not_done"),
                    ("wrong_column_settled", "settled", "wrong_column"),
                    ("stuck_settled", "settled", "stuck"),
                )
            },
            "fabric_moves_resent": _total(runs["fabric"][p], "settle", "moves_resent"),
            "fabric_timed_out": sum(1 for r in runs["fabric"][p] if r["timed_out"]),
            "naive_timed_out": sum(1 for r in runs["naive"][p] if r.get("timed_out")),
            "fabric_errors": sum(sum(r["errors"].values()) for r in runs["fabric"][p]),
            "naive_errors": sum(sum(r["errors"].values()) for r in runs["naive"][p]),
            "raw_errors": sum(sum(r["errors"].values()) for r in runs["raw"][p]),
        }
        for p in procs
    }
    return {"best": best, "totals": totals, "runs": runs, "settle_seconds": settle}


def _total(points: list[dict[str, Any]], phase: str, metric: str) -> int | None:
    """A count summed over runs; None when a phase was not measured (no settle)."""
    values = [(r.get(phase) or {}).get(metric) for r in points]
    if any(v is None for v in values):
        return None
    return sum(int(v or 0) for v in values)


def _audit_line(point: dict[str, Any]) -> str:
    end, settled = point["at_end"], point.get("settled")
    line = f"stuck {end['stuck']} (not done {end['not_done']}, wrong column {end['wrong_column']}"
    if settled is not None:
        line += f"; after settle: {settled['wrong_column']} wrong, {settled['stuck']} stuck"
    return line + ")"
