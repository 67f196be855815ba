"""Worker benchmarks (issue 4): cold start and memory by model mode, idle poll cost,
submit → start latency at the default poll interval.

Baselines measured in the same run: a bare ``python -c pass`` for start time and memory,
and the poll interval itself for latency.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parent.parent

_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
mode, url, key = sys.argv[1], sys.argv[2], sys.argv[3]
from workers.llm import GatewayClient
from workers.llm_sdk import SdkClient
if mode == "gateway":
    client = GatewayClient(url, key)
    model = "stub"
else:
    client = SdkClient(api_base=url + "/v1", api_key=key)
    model = "openai/stub"
ready = time.perf_counter() - t0
client.complete([{"role": "user", "content": "hi"}], model=model, metadata={"agent": "b"},
                idempotency_key="bench", timeout=30)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"ready_s": ready, "first_answer_s": time.perf_counter() - t0,
                  "maxrss_mb": int(status["VmHWM"].split()[0]) / 1024,
                  "litellm_imported": "litellm" in sys.modules}))
"""


def _probe(mode: str, url: str, key: str) -> dict[str, Any]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, url, key],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _bare_python() -> dict[str, float]:
    # VmHWM (peak RSS) starts afresh at exec; ru_maxrss would carry the parent's.
    code = (
        "import json; s = dict(l.split(':', 1) for l in open('/proc/self/status')); "
        "print(json.dumps({'maxrss_mb': int(s['VmHWM'].split()[0]) / 1024}))"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return {"start_s": time.perf_counter() - t0, **json.loads(out.stdout)}


def cold_start(repeats: int) -> dict[str, Any]:
    """Start to first answer and peak RSS, gateway vs sdk, against a loopback provider."""
    sys.path.insert(0, str(ROOT))
    from tests.fakes.openai_stub import OpenAIStub

    bare = min((_bare_python() for _ in range(repeats)), key=lambda d: d["start_s"])
    res: dict[str, Any] = {"bare_python": bare}
    with OpenAIStub() as stub:
        for mode in ("gateway", "sdk"):
            runs = [_probe(mode, stub.url, stub.api_key) for _ in range(repeats)]
            res[mode] = min(runs, key=lambda d: d["first_answer_s"])
    return res


def _connect(settings: Settings, clients: list[KanboardClient]) -> Fabric:
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    client = KanboardClient(settings.board_url, settings.board_token)
    clients.append(client)
    return Fabric.connect(settings, cards=cards, port=client)


def idle_and_latency(idle_seconds: float, tasks: int, poll: float) -> dict[str, Any]:
    """Round trips per minute of an idle worker, and submit → start latency."""
    tmp = Path(tempfile.mkdtemp(prefix="agap-bench-w-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    with EmbeddedBoard(tmp / "b.sqlite3") as board:
        settings = Settings(
            board_url=board.url, board_token=board.token, cards_dir=ROOT / "cards", state_dir=tmp / "state"
        )
        from fabric.kanboard.bootstrap import init_board, save_layout_cache

        cards = load_cards(ROOT / "cards", base_dir=ROOT)
        report = init_board(KanboardClient(board.url, board.token), settings, cards)
        assert report.layout is not None
        save_layout_cache(settings, report.layout)
        clients: list[KanboardClient] = []
        worker = Worker(
            lambda: _connect(settings, clients),
            DrillExecutor(tmp / "drill.sqlite3", effect=False),
            WorkerConfig(queue="gemma-local", owner="bench", poll_seconds=poll),
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        time.sleep(0.5)
        before = sum(c.stats.trips for c in clients)
        time.sleep(idle_seconds)
        idle_trips = sum(c.stats.trips for c in clients) - before
        fab = _connect(settings, [])
        ids = []
        for _ in range(tasks):
            ids.append(fab.submit("latency probe", target="gemma-local").task_id)
            # spread submits over the poll cycle
            time.sleep(poll * (0.37 + 0.5 * (len(ids) % 3)) / 1.5)
        deadline = time.monotonic() + poll * tasks + 30
        lat: list[float] = []
        while time.monotonic() < deadline and len(lat) < tasks:
            lat = []
            for tid in ids:
                view = fab.board.read(tid)
                if 1 in view.records and view.spec is not None:
                    lat.append(view.records[1].at - view.spec.submitted_at)
            time.sleep(0.2)
        worker.stop.set()
        thread.join(10)
    lat.sort()
    return {
        "idle_seconds": idle_seconds,
        "idle_trips": idle_trips,
        "idle_trips_per_minute": idle_trips * 60 / idle_seconds,
        "poll_seconds": poll,
        "latency_p50_s": statistics.median(lat) if lat else None,
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None,
        "latency_samples": len(lat),
    }


def run(quick: bool) -> dict[str, Any]:
    """Run the worker benchmarks; returns a section for the results table."""
    cold = cold_start(1 if quick else 3)
    idle = idle_and_latency(6.0 if quick else 20.0, 6 if quick else 12, 2.0)
    bare = cold["bare_python"]
    rows = [
        [
            "bare `python -c pass`: start / peak RSS (baseline)",
            f"{bare['start_s']:.3f} s / {bare['maxrss_mb']:.0f} MB",
        ],
    ]
    for mode in ("gateway", "sdk"):
        m = cold[mode]
        rows.append(
            [
                f"{mode} mode: start → first answer (x baseline)",
                f"{m['first_answer_s']:.2f} s ({m['first_answer_s'] / bare['start_s']:.0f}x)",
            ]
        )
        rows.append(
            [
                f"{mode} mode: peak RSS (x baseline); litellm imported",
                f"{m['maxrss_mb']:.0f} MB ({m['maxrss_mb'] / bare['maxrss_mb']:.1f}x); "
                f"{'yes' if m['litellm_imported'] else 'no'}",
            ]
        )
    rows.append(
        [
            f"idle worker: board round trips per minute (poll every {idle['poll_seconds']:.0f} s)",
            f"{idle['idle_trips_per_minute']:.1f}",
        ]
    )
    if idle["latency_p50_s"] is not None:
        rows.append(
            [
                f"submit → start latency p50 / p95 (x poll interval), {idle['latency_samples']} tasks",
                f"{idle['latency_p50_s']:.2f} s / {idle['latency_p95_s']:.2f} s "
                f"({idle['latency_p50_s'] / idle['poll_seconds']:.2f}x / "
                f"{idle['latency_p95_s'] / idle['poll_seconds']:.2f}x)",
            ]
        )
    return {"title": "Workers", "rows": rows, "data": {"cold_start": cold, "idle": idle}}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2, default=str))
