"""MCP task status notifications (``notifications/tasks``) vs polling ``tasks/get``: how
soon after a task completes does the client know?

``agap mcp serve --transport http`` (2026-07-28) on the embedded board; per round one task
handle, one ``subscriptions/listen`` stream on it, and beside it a client polling
``tasks/get`` at the server's ``pollIntervalMs``, as the spec asks clients to. The worker
(this process, through the ledger, publishing what a worker publishes) claims the task,
works for a random part of a poll interval (so completion falls anywhere between two
polls) and completes it. Measured from the board's commit of the completion to:

* the ``completed`` notification on the listen stream, and
* the first ``tasks/get`` that says ``completed``;

with the live events on (Mosquitto on 127.0.0.1:1883, when it runs) and without (the
server reads the board every ``AGAP_MCP_WATCH_EVERY``, 1 s by default). Run alone:
``python -m bench.mcp_notify [--quick]``.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import statistics
import sys
import threading
import time
from contextlib import suppress
from typing import Any

from bench.env import latency_ms
from bench.mcp import embedded_fabric
from fabric.core import Fabric
from fabric.settings.events import EventsConfig
from tests.helpers import wait_until
from tests.mcp_wire import Listener, Server, WorkerSide, board_id, submit, tasks_get

AGENT = "claude-coder"  # mode external: no worker daemon competes for its queue
MQTT = ("127.0.0.1", 1883)


def _broker_up() -> bool:
    with suppress(OSError), socket.create_connection(MQTT, timeout=0.5):
        return True
    return False


def run(quick: bool) -> dict[str, Any]:
    n = 5 if quick else 12  # a round without a broker waits out a 10 s poll: kept short
    modes: dict[str, dict[str, Any]] = {}
    with embedded_fabric() as (env, worker, _proxy):
        env["AGAP_WORKER_ID"] = "bench-mcp-notify"
        if _broker_up():
            secret, prefix = secrets.token_hex(16), "bench" + secrets.token_hex(4)
            events = {
                "AGAP_EVENTS_URL": f"mqtt://{MQTT[0]}:{MQTT[1]}",
                "AGAP_EVENTS_SECRET": secret,
                "AGAP_EVENTS_PREFIX": prefix,
            }
            config = EventsConfig.from_env(events)
            modes["live events (MQTT)"] = _measure(env, worker, n, config, events)
        modes["no broker (the board every 1 s)"] = _measure(env, worker, n, None, {})
    return _report(n, modes)


def _measure(
    env: dict[str, str], fab: Fabric, n: int, config: EventsConfig | None, extra: dict[str, str]
) -> dict[str, Any]:
    server = Server(env, AGENT, **extra)
    worker = WorkerSide(fab, config, AGENT)
    rng = random.Random(2663)
    d: dict[str, Any] = {"notified": [], "polled": [], "gets": [], "poll_ms": 0}
    try:
        for i in range(n):
            _round(server.url, worker, rng, d, i)
    finally:
        worker.close()
        server.stop()
    return d


def _round(url: str, worker: WorkerSide, rng: random.Random, d: dict[str, Any], i: int) -> None:
    handle = submit(url, f"notify bench {i}", target=AGENT)
    listener = Listener(url, [handle])
    try:
        first = listener.wait_for("working")
        poll_s = int(first["pollIntervalMs"]) / 1000
        d["poll_ms"] = first["pollIntervalMs"]
        seen: list[float] = []
        gets = [0]

        def poll() -> None:
            while True:
                gets[0] += 1
                if tasks_get(url, handle)["status"] == "completed":
                    seen.append(time.perf_counter())
                    return
                time.sleep(poll_s)  # the client's pace: the server's pollIntervalMs

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        lease = worker.claim(board_id(handle))
        time.sleep(rng.uniform(0, poll_s))  # the work: completion lands anywhere between two polls
        worker.fab.ledger.complete(lease, result_ref=f"https://git.example/pr/{i}")
        done = time.perf_counter()
        worker.say("completed", lease, f"https://git.example/pr/{i}")
        listener.wait_for("completed", timeout=30)
        poller.join(30)
        at = next(t for t, m in zip(listener.arrived, listener.messages, strict=True) if _completed(m))
        wait_until(lambda: seen, 30, "the poller")
        d["notified"].append(at - done)
        d["polled"].append(seen[0] - done)
        d["gets"].append(gets[0])
    finally:
        listener.close()


def _completed(message: dict[str, Any]) -> bool:
    return message.get("method") == "notifications/tasks" and message["params"]["status"] == "completed"


def _report(n: int, modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def lat(xs: list[float]) -> str:
        m = latency_ms(xs)
        return f"{m['median_ms']} / {m['p95_ms']}"

    rows: list[list[Any]] = [["rounds per mode", n]]
    for mode, d in modes.items():
        rows += [
            [f"{mode}: completed → notifications/tasks, median / p95 ms", lat(d["notified"])],
            [
                f"{mode}: completed → tasks/get says so (polling every {d['poll_ms']} ms), median / p95 ms",
                lat(d["polled"]),
            ],
            [
                f"{mode}: tasks/get requests per task while polling (median)",
                f"{statistics.median(d['gets']):g}",
            ],
        ]
    return {
        "title": "MCP task status: notifications/tasks vs polling tasks/get (loopback, HTTP, 2026-07-28)",
        "rows": rows,
        "data": modes,
    }


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2, default=str))
