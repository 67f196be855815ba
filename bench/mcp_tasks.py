"""MCP task handles (the tasks extension, SEP-2663) vs plain ``tools/call`` round trips.

One long-lived ``agap mcp serve`` (stdio, protocol 2026-07-28) on the embedded board, two
SDK clients on it: one declares the tasks extension (``submit_task`` answers a handle, the
client follows it with ``tasks/get``), one does not (``submit_task`` answers the id, the
client follows it with ``get_task`` tool calls). Measured, per side:

* ``submit_task``: latency and board round trips (the handle costs one read back: the
  board must have committed the task before the handle is given);
* one status read of a done task (``tasks/get`` vs ``tools/call get_task``);
* submit → result with a worker that completes each task 200 ms after it appears: the
  handle side polls at the server's ``pollIntervalMs``, the plain side as a naive loop
  would (every 50 ms); MCP requests per task and the latency until the client has the result.

Board round trips are counted by a proxy in front of the board. Run alone:
``python -m bench.mcp_tasks [--quick]``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import threading
import time
from typing import Any

from mcp import Client, StdioServerParameters

from bench.env import ROOT, CountingProxy, latency_ms
from bench.mcp import embedded_fabric
from fabric.apps.mcp.tasks_client import CreateTask, TasksExtension, get_task
from fabric.core import Fabric

AGENT = "claude-coder"  # mode external: no worker daemon competes for its queue
WORK_S = 0.2
NAIVE_POLL_S = 0.05


def run(quick: bool) -> dict[str, Any]:
    n = 6 if quick else 20
    with embedded_fabric() as (env, worker, proxy):
        env["AGAP_WORKER_ID"] = "bench-mcp-tasks"
        data = asyncio.run(_measure(env, worker, proxy, n))
    return _report(n, data)


def _report(n: int, d: dict[str, Any]) -> dict[str, Any]:
    def lat(xs: list[float]) -> str:
        m = latency_ms(xs)
        return f"{m['median_ms']} / {m['p95_ms']}"

    def med(xs: list[int]) -> str:
        return f"{statistics.median(xs):g}"

    rows: list[list[Any]] = [
        ["rounds per side", n],
        [
            "submit_task → handle / → plain result, median / p95 ms",
            f"{lat(d['h_submit'])} | {lat(d['p_submit'])}",
        ],
        [
            "board round trips per submit_task, handle / plain",
            f"{med(d['h_submit_trips'])} / {med(d['p_submit_trips'])}",
        ],
        [
            "status of a done task: tasks/get / tools/call get_task, median / p95 ms",
            f"{lat(d['h_get'])} | {lat(d['p_get'])}",
        ],
        [
            "board round trips per status read, tasks/get / get_task",
            f"{med(d['h_get_trips'])} / {med(d['p_get_trips'])}",
        ],
        [
            f"submit → result, worker done after {WORK_S * 1000:g} ms: handle (pollIntervalMs "
            f"{d['poll_ms']}) / get_task every {NAIVE_POLL_S * 1000:g} ms, median ms",
            f"{latency_ms(d['h_e2e'])['median_ms']} / {latency_ms(d['p_e2e'])['median_ms']}",
        ],
        [
            "MCP requests per task until the result, handle / get_task loop",
            f"{med(d['h_reqs'])} / {med(d['p_reqs'])}",
        ],
    ]
    return {
        "title": "MCP task handles vs tools/call round trips (loopback, stdio, 2026-07-28)",
        "rows": rows,
        "data": d,
    }


async def _measure(env: dict[str, str], worker: Fabric, proxy: CountingProxy, n: int) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fabric.apps.cli", "mcp", "serve", "--agent", AGENT],
        env=env,
        cwd=str(ROOT),
    )
    ext = TasksExtension()
    d: dict[str, Any] = {
        k: [] for k in ("h_submit", "p_submit", "h_submit_trips", "p_submit_trips", "h_get", "p_get")
    }
    d.update({k: [] for k in ("h_get_trips", "p_get_trips", "h_e2e", "p_e2e", "h_reqs", "p_reqs")})
    async with Client(params, extensions=[ext]) as handles, Client(params) as plain:
        await _plain(plain, "get_task", task_id=await _warm(plain))  # warm both: layout cache, schemas
        for i in range(n):
            proxy.reset()
            s = time.perf_counter()
            h = await handles.session.call_tool("submit_task", _args(f"handle {i}"), allow_claimed=True)
            d["h_submit"].append(time.perf_counter() - s)
            d["h_submit_trips"].append(proxy.posts)
            assert isinstance(h, CreateTask)
            proxy.reset()
            s = time.perf_counter()
            sub = await _plain(plain, "submit_task", **_args(f"plain {i}"))
            d["p_submit"].append(time.perf_counter() - s)
            d["p_submit_trips"].append(proxy.posts)
            tid = int(h.task_id.split("-")[1])
            _work(worker, tid)
            _work(worker, sub["task_id"])
            proxy.reset()
            s = time.perf_counter()
            got = await get_task(handles, h.task_id)
            d["h_get"].append(time.perf_counter() - s)
            d["h_get_trips"].append(proxy.posts)
            proxy.reset()
            s = time.perf_counter()
            shown = await _plain(plain, "get_task", task_id=sub["task_id"])
            d["p_get"].append(time.perf_counter() - s)
            d["p_get_trips"].append(proxy.posts)
            if got["status"] != "completed" or shown["state"] != "done":
                raise RuntimeError(f"not done: {got['status']} / {shown['state']}")
        d["poll_ms"] = got["pollIntervalMs"]
        for i in range(max(2, n // 4)):
            await _e2e_handle(handles, ext, worker, d, i)
            await _e2e_plain(plain, worker, d, i)
    return d


def _args(intent: str) -> dict[str, Any]:
    return {"intent": intent, "target": AGENT, "refs": [], "priority": "normal"}


async def _warm(client: Client) -> int:
    return int((await _plain(client, "submit_task", **_args("warm")))["task_id"])


async def _plain(client: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise RuntimeError(f"{name}: {''.join(getattr(c, 'text', '') for c in result.content)}")
    return result.structured_content


def _work(worker: Fabric, task_id: int) -> None:
    lease = worker.ledger.claim(worker.show(task_id), "bench-worker", lease_seconds=60)
    worker.ledger.complete(lease, result_ref=f"https://git.example/pr/{task_id}")


def _work_later(worker: Fabric, task_id: int) -> threading.Thread:
    def go() -> None:
        time.sleep(WORK_S)  # the work itself: a fixed duration, the same for both sides
        _work(worker, task_id)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


async def _e2e_handle(client: Client, ext: TasksExtension, worker: Fabric, d: dict[str, Any], i: int) -> None:
    s = time.perf_counter()
    polls = ext.polls
    h = await client.session.call_tool("submit_task", _args(f"e2e handle {i}"), allow_claimed=True)
    assert isinstance(h, CreateTask)
    t = _work_later(worker, int(h.task_id.split("-")[1]))
    reqs = 1
    task: dict[str, Any] = {"status": h.status, **(h.model_extra or {})}
    while task["status"] != "completed":
        await asyncio.sleep(int(task["pollIntervalMs"]) / 1000)
        task = await get_task(client, h.task_id)
        reqs += 1
    d["h_e2e"].append(time.perf_counter() - s)
    d["h_reqs"].append(reqs + ext.polls - polls)
    t.join(10)


async def _e2e_plain(client: Client, worker: Fabric, d: dict[str, Any], i: int) -> None:
    s = time.perf_counter()
    sub = await _plain(client, "submit_task", **_args(f"e2e plain {i}"))
    t = _work_later(worker, sub["task_id"])
    reqs = 1
    while (await _plain(client, "get_task", task_id=sub["task_id"]))["state"] != "done":
        reqs += 1
        await asyncio.sleep(NAIVE_POLL_S)
    d["p_e2e"].append(time.perf_counter() - s)
    d["p_reqs"].append(reqs + 1)
    t.join(10)


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2, default=str))
