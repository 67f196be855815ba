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

from bench.env import with_bytecode
from fabric import cardcache
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parent.parent

_CARD = """
id: bench
kind: model
name: Bench model
tier: medium
trust: trusted
capabilities: [chat]
runtime:
  mode: {mode}
  model: openai/stub
  api_base: {api_base}
  api_key_env: BENCH_PROVIDER_KEY
  poll_seconds: 0.05
"""


def _peak_rss_mb(pid: int) -> float:
    # VmHWM (peak RSS) starts afresh at exec; ru_maxrss would carry the parent's.
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]) / 1024


def _bare_python() -> dict[str, float]:
    """A bare interpreter with the workers' flags (-X importtime lists every import)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], stderr=subprocess.DEVNULL, check=True)
    start = time.perf_counter() - t0
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-c", "import sys; print(flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # it has started and is waiting
    rss = _peak_rss_mb(proc.pid)
    proc.communicate("\n", timeout=60)
    return {"start_s": start, "maxrss_mb": rss}


def _real_worker(mode: str, stub_url: str, stub_key: str) -> dict[str, Any]:
    """One real `agap worker` process on the embedded board: start → first task done,
    its peak RSS, and whether it imported litellm (from -X importtime)."""
    tmp = Path(tempfile.mkdtemp(prefix="agap-bench-cold-"))
    cards_dir = tmp / "cards"
    cards_dir.mkdir()
    (cards_dir / "bench.yaml").write_text(_CARD.format(mode=mode, api_base=stub_url + "/v1"))
    with EmbeddedBoard(tmp / "b.sqlite3") as board:
        settings = Settings(board_url=board.url, board_token=board.token, cards_dir=cards_dir, state_dir=tmp)
        # Loaded as `agap up` loads them before it starts its workers: clean cards are
        # remembered in the cache the worker uses (fabric.cardcache), as in `make run`.
        cards = _remembered_cards(cards_dir, tmp / "cache")
        from fabric.kanboard.bootstrap import init_board  # here: only this bench bootstraps

        init_board(KanboardClient(board.url, board.token), settings, cards)
        fab = Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))
        tid = fab.submit("cold start probe", target="bench").task_id
        env = {
            **os.environ,
            "KANBOARD_URL": board.url,
            "KANBOARD_API_TOKEN": board.token,
            "AGAP_CARDS_DIR": str(cards_dir),
            "AGAP_STATE_DIR": str(tmp / "state"),
            "XDG_CACHE_HOME": str(tmp / "cache"),
            "AGAP_MODEL_MODE": mode,
            "AGAP_LITELLM_URL": stub_url,
            "AGAP_LITELLM_KEY": stub_key,
            "BENCH_PROVIDER_KEY": stub_key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        err = tmp / "worker.err"
        t0 = time.perf_counter()
        with err.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "fabric.apps.cli", "worker", "--agent", "bench"],
                cwd=ROOT,
                env=env,
                stderr=log,
                stdout=subprocess.DEVNULL,
            )
            try:
                while not _done(fab, tid):
                    if proc.poll() is not None or time.perf_counter() - t0 > 120:
                        raise RuntimeError(f"the {mode} worker did not finish: {err.read_text()[-2000:]}")
                    time.sleep(0.01)
                first = time.perf_counter() - t0
                rss = _peak_rss_mb(proc.pid)
            finally:
                proc.terminate()
                proc.wait(60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.read_text().splitlines() if "|" in line}
    return {
        "first_answer_s": first,
        "maxrss_mb": rss,
        "litellm_imported": any(m.split(".")[0] == "litellm" for m in imported),
    }


def _remembered_cards(cards_dir: Path, cache: Path) -> CardSet:
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        return cardcache.daemon_cards(cards_dir)[0]
    finally:
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before


def _done(fab: Fabric, tid: int) -> bool:
    cur = fab.board.read(tid).current
    return cur is not None and cur.state == State.DONE


def cold_start(repeats: int) -> dict[str, Any]:
    """A real `agap worker` per model mode: start → first task done and peak RSS."""
    sys.path.insert(0, str(ROOT))
    from tests.fakes.openai_stub import OpenAIStub

    bare = min((_bare_python() for _ in range(repeats)), key=lambda d: d["start_s"])
    res: dict[str, Any] = {"bare_python": bare}
    with OpenAIStub() as stub:
        for mode in ("gateway", "sdk"):
            runs = [_real_worker(mode, stub.url, stub.api_key) for _ in range(repeats)]
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
    with_bytecode()
    cold = cold_start(1 if quick else 3)
    idle = idle_and_latency(6.0 if quick else 20.0, 6 if quick else 12, 2.0)
    bare = cold["bare_python"]
    rows = [
        [
            "bare `python -c pass`: start / peak RSS (baseline, same -X importtime flag)",
            f"{bare['start_s']:.3f} s / {bare['maxrss_mb']:.0f} MB",
        ],
    ]
    for mode in ("gateway", "sdk"):
        m = cold[mode]
        rows.append(
            [
                f"`agap worker`, {mode} mode: start → first task done (x baseline)",
                f"{m['first_answer_s']:.2f} s ({m['first_answer_s'] / bare['start_s']:.0f}x)",
            ]
        )
        rows.append(
            [
                f"`agap worker`, {mode} mode: peak RSS (x baseline); litellm imported",
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
