"""What signing in as a board user costs per call, against the application token.

A confined agent's worker signs in as its own Kanboard user (README, "Least privilege on
the board"): every request then carries a username and password that Kanboard checks
(its password hash) and a project role it looks up for each call, where the application
token is one string comparison. Measured on the embedded board and on every real Kanboard
the environment names (:mod:`bench.env`), with the calls a worker makes: a read
(``getTask``), a write (``saveTaskMetadata``) and a poll-and-read batch (``searchTasks``
and two reads, one round trip). App-token and user calls alternate, on kept-alive
connections, so both see the same board and the same load.

Each board gets a project and a user of its own (``lp-bench-<run>``), removed afterwards.
Run alone: ``python -m bench.auth [--quick]``.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.env import latency_ms, real_targets
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardError, Call

Op = Callable[[KanboardClient], object]


def run(quick: bool) -> dict[str, Any]:
    n = 20 if quick else 150
    boards: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        boards["embedded board"] = _measure(board.url, board.token, n)
    for target in real_targets():
        try:
            boards[target.label] = _measure(target.url, target.token, n)
        except (BoardError, OSError) as exc:  # one board away must not lose the others
            boards[target.label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return _report(n, boards)


def _measure(url: str, token: str, n: int) -> dict[str, Any]:
    name = f"lp-bench-{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(24)
    app = KanboardClient(url, token)
    pid = uid = 0
    try:
        pid = int(app.call("createProject", {"name": name}))
        uid = int(app.call("createUser", {"username": name, "password": password}))
        app.call("addProjectUser", {"project_id": pid, "user_id": uid, "role": "project-member"})
        tid = int(app.call("createTask", {"project_id": pid, "title": "bench"}))
        user = KanboardClient(url, password, user=name)
        try:
            return {label: _pair(app, user, op, n) for label, op in _ops(pid, tid).items()}
        finally:
            user.close()
    finally:
        with contextlib.suppress(BoardError):
            if pid:
                app.call("removeProject", {"project_id": pid})
            if uid:
                app.call("removeUser", {"user_id": uid})
        app.close()


def _ops(pid: int, tid: int) -> dict[str, Op]:
    poll = [
        Call("searchTasks", {"project_id": pid, "query": "status:open"}),
        Call("getTask", {"task_id": tid}),
        Call("getTaskMetadata", {"task_id": tid}),
    ]
    return {
        "read (getTask)": lambda c: c.call("getTask", {"task_id": tid}),
        "write (saveTaskMetadata)": lambda c: c.call(
            "saveTaskMetadata", {"task_id": tid, "values": {"bench": str(time.time())}}
        ),
        "poll + reads (one batch of 3)": lambda c: c.batch(poll),
    }


def _pair(app: KanboardClient, user: KanboardClient, op: Op, n: int) -> dict[str, Any]:
    """``op`` ``n`` times each way, alternating; medians, p95 and the ratio."""
    op(app), op(user)  # warm: connections and caches
    times: dict[str, list[float]] = {"app": [], "user": []}
    for _ in range(n):
        for side, client in (("app", app), ("user", user)):
            t0 = time.perf_counter()
            op(client)
            times[side].append(time.perf_counter() - t0)
    a, u = latency_ms(times["app"]), latency_ms(times["user"])
    ratio = u["median_ms"] / a["median_ms"] if a["median_ms"] else float("nan")
    extra = statistics.median(times["user"]) - statistics.median(times["app"])
    return {"app": a, "user": u, "ratio": round(ratio, 2), "extra_ms": round(extra * 1000, 2)}


def _report(n: int, boards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows: list[list[Any]] = [["calls per side and operation", n]]
    for label, ops in boards.items():
        if "error" in ops:
            rows.append([f"{label}: failed", ops["error"]])
            continue
        for op, r in ops.items():
            figures = f"{r['app']['median_ms']} / {r['user']['median_ms']}"
            rows.append(
                [
                    f"{label}: {op}, app token / user median ms (user ÷ app)",
                    f"{figures} ({r['ratio']}x, +{r['extra_ms']} ms)",
                ]
            )
    return {
        "title": "Signing in as a board user vs the application token, per call (loopback)",
        "rows": rows,
        "data": boards,
    }


def table(result: dict[str, Any]) -> str:
    """The README's table: one row per board and operation."""
    lines = [
        "| board | call | app token, median ms | board user, median ms | user ÷ app |",
        "|---|---|---|---|---|",
    ]
    for label, ops in result["data"].items():
        for op, r in ({} if "error" in ops else ops).items():
            lines.append(
                f"| {label} | {op} | {r['app']['median_ms']} | {r['user']['median_ms']} | {r['ratio']}x |"
            )
    return "\n".join(lines)


__all__ = ["run", "table"]

if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    print(json.dumps(result["data"], indent=2))
    print(table(result))
