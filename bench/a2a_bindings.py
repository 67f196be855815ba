"""A2A over its three bindings: HTTP+JSON (REST) and gRPC overhead vs JSON-RPC.

The server is the process a user runs, ``agap a2a serve --grpc-port 0``, on the embedded
board, with the demo model (no I/O) so what is timed is the binding: the SDK client,
loopback, the bearer check, the binding's dispatcher and the same fabric handler. Per
call, round-robin over the bindings (one run, one baseline: the machine's drift lands on
all three alike):

* ``GetTask`` of a finished sync task (the local index; no board, no model);
* ``SendMessage`` blocking (the demo model answers; the journal writes afterwards).

Run alone: ``python -m bench.a2a_bindings [--quick]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from bench.a2a import CARD, TOKEN  # one bench model card and token for both A2A benches
from bench.env import latency_ms
from fabric.apps.a2a.client import FabricA2AClient, text_message
from fabric.embedded.server import EmbeddedBoard
from tests.helpers import Lines

BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
ROOT = Path(__file__).resolve().parent.parent


def run(quick: bool) -> dict[str, Any]:
    n = 30 if quick else 200
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        cards = Path(tmp) / "cards"
        cards.mkdir()
        (cards / "bench-model.yaml").write_text(CARD)
        env = dict(os.environ)
        env.update(
            {
                "KANBOARD_URL": board.url,
                "KANBOARD_API_TOKEN": board.token,
                "AGAP_CARDS_DIR": str(cards),
                "AGAP_STATE_DIR": str(Path(tmp) / "state"),
                "XDG_CACHE_HOME": str(Path(tmp) / "cache"),
                "AGAP_A2A_TOKENS": f"bench:{TOKEN}",
                "AGAP_MODEL_MODE": "demo",
                "PYTHONPATH": str(ROOT),
            }
        )
        cmd = [sys.executable, "-m", "fabric.apps.cli", "a2a", "serve", "--port", "0", "--grpc-port", "0"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            err = Lines(proc.stderr)
            err.wait_for("A2A gRPC on ", timeout=60)
            line = err.wait_for("A2A agent bench-model: ", timeout=60)[0]
            found = re.search(r"(https?://[^/\s]+)/bench-model/", line)
            assert found, line
            data = asyncio.run(_measure(found.group(1) + "/bench-model", n))
        finally:
            proc.terminate()
            proc.wait(30)
    rows: list[list[Any]] = [["calls per binding and operation", n]]
    base = data["JSONRPC"]
    for b in BINDINGS:
        m = data[b]
        for op in ("get", "send"):
            name = "GetTask" if op == "get" else "SendMessage (demo model)"
            rows.append([f"{b}: {name}, median / p95 ms", f"{m[op]['median_ms']} / {m[op]['p95_ms']}"])
        if b != "JSONRPC":
            rows.append(
                [
                    f"{b} vs JSON-RPC, median ms (GetTask; SendMessage)",
                    f"{m['get']['median_ms'] - base['get']['median_ms']:+.2f}; "
                    f"{m['send']['median_ms'] - base['send']['median_ms']:+.2f}",
                ]
            )
    return {
        "title": "A2A bindings: HTTP+JSON and gRPC vs JSON-RPC (agap a2a serve, loopback)",
        "rows": rows,
        "data": data,
    }


async def _measure(url: str, n: int) -> dict[str, Any]:
    clients = {
        b: await FabricA2AClient.open(
            url, TOKEN, timeout=30, binding=b, grpc_channel=grpc.aio.insecure_channel
        )
        for b in BINDINGS
    }
    times: dict[str, dict[str, list[float]]] = {b: {"get": [], "send": []} for b in BINDINGS}
    try:
        done = {}
        for b, c in clients.items():  # warm up each, and a finished task to read
            done[b] = (await c.send(text_message("warm up"))).id
            await c.get(done[b])
        for i in range(n):
            for b, c in clients.items():
                t0 = time.perf_counter()
                await c.get(done[b])
                times[b]["get"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                task = await c.send(text_message(f"Say hello {i}", message_id=uuid.uuid4().hex))
                times[b]["send"].append(time.perf_counter() - t0)
                assert task.status.state == 3 or task.id, task  # answered
    finally:
        for c in clients.values():
            await c.close()
    return {b: {op: latency_ms(v) for op, v in ops.items()} for b, ops in times.items()}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
