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

**People signing in** (``AGAP_USER``, ``AGAP_USER_PASSWORD``): a person's CLI gesture runs
on the application token and adds one sign-in, Kanboard's ``getMe`` over the person's own
credentials, once per process. Measured per board: that sign-in on a fresh connection (as
a one-off ``agap`` process makes it, with a password and, on the embedded board, a
personal API token) against an app-token call on a fresh connection; and on the embedded
board the wall time of whole ``agap`` processes: ``agap approve`` signed in, and ``agap
cancel`` of a gate by the operator (``cli``, no sign-in) against the same cancel signed
in, so the difference is the sign-in's.

Run alone: ``python -m bench.auth [--quick]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cli_start import _timed
from bench.env import CARDS_DIR, latency_ms, load_bench_cards, real_targets
from bench.trips import agap_command
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.embedded.store import new_api_token
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardError, Call
from fabric.kanboard.principals import sign_in
from fabric.settings.resolve import Settings

Op = Callable[[KanboardClient], object]


def run(quick: bool) -> dict[str, Any]:
    n = 20 if quick else 150
    boards: dict[str, dict[str, Any]] = {}
    people: dict[str, dict[str, Any]] = {}
    processes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        boards["embedded board"] = _measure(board.url, board.token, n)
        people["embedded board"] = _sign_ins(board.url, board.token, n, board=board)
        processes = _processes(board, Path(tmp), 3 if quick else 10)
    for target in real_targets():
        try:
            boards[target.label] = _measure(target.url, target.token, n)
            people[target.label] = _sign_ins(target.url, target.token, n)
        except (BoardError, OSError) as exc:  # one board away must not lose the others
            boards[target.label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return _report(n, boards, people, processes)


def _sign_ins(url: str, token: str, n: int, board: EmbeddedBoard | None = None) -> dict[str, Any]:
    """A person's sign-in (getMe as them, a fresh connection each, as one ``agap`` process
    makes it) against an app-token call on a fresh connection, alternating."""
    name = f"lp-person-{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(24)
    app = KanboardClient(url, token)
    uid = 0
    try:
        uid = int(app.call("createUser", {"username": name, "password": password}))
        secrets_by_kind = {"password": password}
        if board is not None:  # Kanboard makes personal tokens only in its UI
            made = new_api_token(board.store, name)
            assert made is not None
            secrets_by_kind["personal token"] = made

        def app_call() -> None:
            fresh = KanboardClient(url, token)
            try:
                fresh.call("getVersion")
            finally:
                fresh.close()

        times: dict[str, list[float]] = {"app token": [], **{k: [] for k in secrets_by_kind}}
        for _ in range(n):
            t0 = time.perf_counter()
            app_call()
            times["app token"].append(time.perf_counter() - t0)
            for kind, secret in secrets_by_kind.items():
                t0 = time.perf_counter()
                sign_in(url, name, secret)
                times[kind].append(time.perf_counter() - t0)
        return {kind: latency_ms(xs) for kind, xs in times.items()}
    finally:
        with contextlib.suppress(BoardError):
            if uid:
                app.call("removeUser", {"user_id": uid})
        app.close()


def _processes(board: EmbeddedBoard, tmp: Path, n: int) -> dict[str, Any]:
    """Wall time of whole ``agap`` processes on the embedded board: approve signed in, and a
    gate's cancel by the operator and signed in (the difference: the sign-in)."""
    settings = Settings(board_url=board.url, board_token=board.token, cards_dir=CARDS_DIR)
    cards = load_bench_cards()
    person = cards.get("alvis")
    assert person.human is not None
    username, password = person.human.username, secrets.token_urlsafe(24)
    app = KanboardClient(board.url, board.token)
    assert app.call("createUser", {"username": username, "password": password})
    init_board(app, settings, cards)
    fab = Fabric.connect(settings, cards=cards, port=app)
    agap = agap_command()
    env = {
        **os.environ,
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_CARDS_DIR": str(CARDS_DIR),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "AGAP_EVENTS_URL": "",
        "AGAP_ACTOR": "",
        "AGAP_USER": "",
    }
    person_env = {**env, "AGAP_USER": username, "AGAP_USER_PASSWORD": password}
    _timed([*agap, "ls"], env)  # the layout cache, as a person's shell has it
    runs: dict[str, list[tuple[float, float]]] = {
        k: [] for k in ("python", "approve", "cancel_cli", "cancel_signed")
    }
    for _ in range(n):  # interleaved, so a busy moment touches each alike
        runs["python"].append(_timed([sys.executable, "-c", "pass"], env))  # the machine's load
        for kind, use in (("approve", person_env), ("cancel_cli", env), ("cancel_signed", person_env)):
            gate = fab.submit(f"bench gate {secrets.token_hex(3)}", target=person.id).task_id
            verb = ["approve", str(gate)] if kind == "approve" else ["cancel", str(gate), "--reason", "bench"]
            runs[kind].append(_timed([*agap, *verb], use))
    app.close()
    return {
        kind: {
            "wall_median_s": round(statistics.median(w for w, _ in xs), 3),
            "wall_max_s": round(max(w for w, _ in xs), 3),
            "cpu_median_s": round(statistics.median(c for _, c in xs), 3),
        }
        for kind, xs in runs.items()
    } | {"runs": n}


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


def _report(
    n: int, boards: dict[str, dict[str, Any]], people: dict[str, dict[str, Any]], processes: dict[str, Any]
) -> dict[str, Any]:
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
    for label, kinds in people.items():
        figures = ", ".join(f"{k} {v['median_ms']}" for k, v in kinds.items())
        rows.append([f"{label}: a person's sign-in on a fresh connection, median ms", figures])
    for kind, what in (
        ("python", "bare `python -c pass` (the machine's baseline)"),
        ("approve", "`agap approve`, signed in"),
        ("cancel_cli", "`agap cancel` of a gate by the operator (no sign-in)"),
        ("cancel_signed", "`agap cancel` of a gate, signed in"),
    ):
        if kind in processes:
            r = processes[kind]
            rows.append(
                [
                    f"embedded board: {what}, whole process, median / max s",
                    f"{r['wall_median_s']} / {r['wall_max_s']} (cpu {r['cpu_median_s']})",
                ]
            )
    return {
        "title": "Signing in as a board user vs the application token, per call (loopback)",
        "rows": rows,
        "data": boards,
        "people": people,
        "processes": processes,
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
    for label, figures in result["rows"]:
        print(f"{label}: {figures}")
