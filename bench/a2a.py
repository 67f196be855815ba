"""A2A sync overhead: ``SendMessage`` through the SDK client and server vs the model path alone.

Both sides call the same model plane (the OpenAI-protocol stand-in, i.e. the workers'
LiteLLM gateway path) with the same prompt. The A2A side adds the SDK client, HTTP on
loopback, the bearer gate, the SDK's JSON-RPC dispatcher, the local call index and the
reply. The board is counted in round trips: from the request until the model's answer
there must be none (the journal writes after), and the journal's own cost is reported.

Run alone: ``python -m bench.a2a [--quick]``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.env import latency_ms
from fabric.apps.a2a import store as st
from fabric.apps.a2a.auth import TokenTable
from fabric.apps.a2a.client import FabricA2AClient, text_message
from fabric.apps.a2a.runner import Runner
from fabric.apps.a2a.server import ServerThread, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from tests.fakes.openai_stub import OpenAIStub

CARD = """
id: bench-model
kind: model
name: Bench model
description: The model agent the A2A benchmark calls.
tier: medium
trust: trusted
capabilities: [chat]
runtime:
  mode: gateway
  model: openai/stub
"""
TOKEN = "bench-token-" + "x" * 24


def run(quick: bool) -> dict[str, Any]:
    n = 20 if quick else 100
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBoard(Path(tmp) / "board.sqlite3") as board,
        OpenAIStub() as stub,
    ):
        gateway = {
            "AGAP_MODEL_MODE": "gateway",
            "AGAP_LITELLM_URL": stub.url,
            "AGAP_LITELLM_KEY": stub.api_key,
        }
        gw = _measure(board, Path(tmp) / "gw", gateway, n)
        demo = _measure(board, Path(tmp) / "demo", {"AGAP_MODEL_MODE": "demo"}, n)
    rows: list[list[Any]] = [["calls per model plane", n]]
    for label, m in (("gateway (OpenAI-protocol stand-in)", gw), ("demo model (no I/O)", demo)):
        d, v = m["direct"], m["a2a"]
        rows += [
            [f"{label}: model path alone, median / p95 ms", f"{d['median_ms']} / {d['p95_ms']}"],
            [
                f"{label}: A2A SendMessage (SDK client → server), median / p95 ms",
                f"{v['median_ms']} / {v['p95_ms']}",
            ],
            [f"{label}: A2A overhead, median ms", round(v["median_ms"] - d["median_ms"], 2)],
            [f"{label}: board round trips before the answer (max)", max(m["before_answer"])],
            [
                f"{label}: journal round trips after the answer (median)",
                statistics.median(m["journal_trips"]),
            ],
            [
                f"{label}: journal on the board, median ms after the reply (incl. 50 ms delay)",
                round(statistics.median(m["journal_ms"]) * 1000, 2),
            ],
        ]
    return {
        "title": "A2A sync SendMessage vs the model path alone (loopback)",
        "rows": rows,
        "data": {"gateway": gw, "demo": demo},
    }


def _measure(board: EmbeddedBoard, tmp: Path, env: dict[str, str], n: int) -> dict[str, Any]:
    cards_dir = tmp / "cards"
    cards_dir.mkdir(parents=True)
    (cards_dir / "bench-model.yaml").write_text(CARD)
    cards = load_cards(cards_dir, base_dir=cards_dir)
    settings = Settings(
        board_url=board.url, board_token=board.token, cards_dir=cards_dir, state_dir=tmp / "state"
    )
    init_board(KanboardClient(board.url, board.token), settings, cards)

    # The model path alone, exactly as the server calls it.
    direct_runner = Runner(cards, env)
    direct_runner.run("bench-model", "warm up", (), key="warm")
    direct = []
    for i in range(n):
        t0 = time.perf_counter()
        ans = direct_runner.run("bench-model", f"Say hello {i}", (), key=f"d{i}")
        direct.append(time.perf_counter() - t0)
        assert ans.kind == "done"
        time.sleep(0.06)  # the A2A loop idles while the journal writes: same TCP state here

    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))

    service = make_service(
        settings, cards, env, connect=connect, config=ServiceConfig(journal_retry_seconds=3600)
    )
    before_answer: list[int] = []
    baseline = [0]
    inner = service.runner.run
    lock = threading.Lock()

    def counted(*a: Any, **kw: Any) -> Any:
        out = inner(*a, **kw)  # trips from the request's start to the model's answer:
        with lock:
            before_answer.append(service.board.trips() + service.journal_lane.trips() - baseline[0])
        return out

    service.runner.run = counted  # type: ignore[method-assign]
    via: list[float] = []
    journal_trips: list[int] = []
    journal_ms: list[float] = []
    tokens = TokenTable.from_pairs([("bench", TOKEN)], where="bench")
    with ServerThread(service, ["bench-model"], tokens) as server:

        async def calls() -> None:
            c = await FabricA2AClient.open(f"{server.url}/bench-model", TOKEN, timeout=30)
            async with c:
                await c.send(text_message("warm up"))
                _settle(service)
                before_answer.clear()
                for i in range(n):
                    baseline[0] = service.board.trips() + service.journal_lane.trips()
                    t0 = time.perf_counter()
                    task = await c.send(text_message(f"Say hello {i}", message_id=uuid.uuid4().hex))
                    via.append(time.perf_counter() - t0)
                    t1 = time.perf_counter()
                    _settle(service, task.id)
                    journal_ms.append(time.perf_counter() - t1)
                    journal_trips.append(service.board.trips() + service.journal_lane.trips() - baseline[0])

        asyncio.run(calls())
    return {
        "direct": latency_ms(direct),
        "a2a": latency_ms(via),
        "before_answer": before_answer,
        "journal_trips": journal_trips,
        "journal_ms": journal_ms,
    }


def _settle(service: Any, task_id: str | None = None, timeout: float = 30.0) -> None:
    """Wait until the journal has written (one task, or everything pending)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if task_id is None:
            if not service.store.unjournaled() and not service._pending:
                return
        else:
            row = service.store.get(task_id)
            if row is not None and row.journal == st.J_DONE:
                return
        time.sleep(0.005)
    raise TimeoutError("the journal did not write")


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
