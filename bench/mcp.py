"""Claim → complete through one MCP session vs the same through ``agap`` CLI subprocesses.

Both sides drain the same queue (``claude-coder``, an external runtime's) on the embedded
board, one task at a time, under the same owner rules: the MCP side is one long-lived
``agap mcp serve`` process driven by the SDK's own client over stdio (``claim_task`` then
``complete_task``); the CLI side is what a shell loop pays, ``agap claim --json`` then
``agap complete`` as two subprocesses. Each task is submitted beforehand by a separate
connection, outside the measurement. Board round trips are counted by a proxy in front of
the board, so both sides are counted the same way and neither counts itself. Both complete
with a ``result_ref`` (the CLI cannot store text), so the work done is the same.

Run alone: ``python -m bench.mcp [--quick]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from bench.env import CARDS_DIR, ROOT, CountingProxy, latency_ms, load_bench_cards
from bench.trips import agap_command
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings

AGENT = "claude-coder"  # mode external: no worker daemon competes for its queue
RESULT = "https://git.example/pr/{}"


def run(quick: bool) -> dict[str, Any]:
    n = 8 if quick else 30
    with embedded_fabric() as (env, submitter, proxy):
        mcp = asyncio.run(_mcp_rounds(env, submitter, proxy, n))
        cli = _cli_rounds(env, submitter, proxy, n)
    return _report(n, mcp, cli)


@contextmanager
def embedded_fabric() -> Iterator[tuple[dict[str, str], Fabric, CountingProxy]]:
    """An initialised embedded board behind a counting proxy: the environment an ``agap``
    process needs to reach it through the proxy, and a direct connection for the bench."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        settings = Settings(board_url=board.url, board_token=board.token, cards_dir=CARDS_DIR)
        cards = load_bench_cards()
        init_board(KanboardClient(board.url, board.token), settings, cards)
        direct = Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))
        with CountingProxy(board.url) as proxy:
            env = {
                **os.environ,
                "KANBOARD_URL": proxy.url,
                "KANBOARD_API_TOKEN": board.token,
                "AGAP_CARDS_DIR": str(CARDS_DIR),
                "AGAP_STATE_DIR": str(Path(tmp) / "state"),
                "XDG_CACHE_HOME": str(Path(tmp) / "cache"),
                "AGAP_EVENTS_URL": "",
            }
            yield env, direct, proxy


def _report(n: int, mcp: dict[str, Any], cli: dict[str, Any]) -> dict[str, Any]:
    m, c = latency_ms(mcp["seconds"]), latency_ms(cli["seconds"])
    ratio = round(c["median_ms"] / m["median_ms"], 1) if m["median_ms"] else float("nan")
    rows: list[list[Any]] = [
        ["claim → complete rounds per side", n],
        ["MCP session start (spawn `agap mcp serve` + initialize), s", round(mcp["start_s"], 2)],
        ["MCP: claim_task + complete_task, median / p95 ms", f"{m['median_ms']} / {m['p95_ms']}"],
        [
            "CLI: `agap claim` + `agap complete` subprocesses, median / p95 ms",
            f"{c['median_ms']} / {c['p95_ms']}",
        ],
        ["CLI / MCP latency (median)", f"{ratio}x"],
        [
            "board round trips per claim → complete, MCP / CLI (median, proxy-counted)",
            f"{statistics.median(mcp['trips']):g} / {statistics.median(cli['trips']):g}",
        ],
    ]
    return {
        "title": "MCP: claim → complete through one session vs `agap` CLI subprocesses (loopback)",
        "rows": rows,
        "data": {"mcp": {**mcp, **m}, "cli": {**cli, **c}, "ratio": ratio},
    }


async def _call(client: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise RuntimeError(f"{name}: {''.join(getattr(c, 'text', '') for c in result.content)}")
    return result.structured_content


async def _mcp_rounds(env: dict[str, str], submitter: Fabric, proxy: CountingProxy, n: int) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fabric.apps.cli", "mcp", "serve", "--agent", AGENT],
        env={**env, "AGAP_WORKER_ID": "bench-mcp"},
        cwd=str(ROOT),
    )
    t0 = time.perf_counter()
    async with Client(params) as client:
        start = time.perf_counter() - t0
        await _call(client, "claim_task")  # warm: the layout cache and the first poll
        seconds: list[float] = []
        trips: list[int] = []
        for i in range(n):
            tid = submitter.submit(f"mcp round {i}", target=AGENT, actor="bench").task_id
            proxy.reset()
            s = time.perf_counter()
            lease = await _call(client, "claim_task")
            await _call(client, "complete_task", task_id=lease["task_id"], result_ref=RESULT.format(i))
            seconds.append(time.perf_counter() - s)
            trips.append(proxy.posts)
            if lease["task_id"] != tid:
                raise RuntimeError(f"claimed #{lease['task_id']}, expected #{tid}")
    return {"start_s": start, "seconds": seconds, "trips": trips}


def _agap(env: dict[str, str], *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*agap_command(), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode not in ok:
        raise RuntimeError(f"agap {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc


def _cli_rounds(env: dict[str, str], submitter: Fabric, proxy: CountingProxy, n: int) -> dict[str, Any]:
    owner = ("--owner", "bench-cli")
    _agap(env, "claim", "--agent", AGENT, *owner, ok=(4,))  # warm: the layout cache
    seconds: list[float] = []
    trips: list[int] = []
    for i in range(n):
        tid = submitter.submit(f"cli round {i}", target=AGENT, actor="bench").task_id
        proxy.reset()
        s = time.perf_counter()
        lease = json.loads(_agap(env, "claim", "--agent", AGENT, *owner, "--json").stdout)
        _agap(
            env,
            "complete",
            str(lease["task_id"]),
            "--epoch",
            str(lease["epoch"]),
            *owner,
            "--result-ref",
            RESULT.format(i),
        )
        seconds.append(time.perf_counter() - s)
        trips.append(proxy.posts)
        if lease["task_id"] != tid:
            raise RuntimeError(f"claimed #{lease['task_id']}, expected #{tid}")
    return {"seconds": seconds, "trips": trips}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2, default=str))
