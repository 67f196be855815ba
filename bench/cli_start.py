"""What one ``agap`` call costs a shell loop: start-up wall time and CPU, per command.

A runtime that drains a queue from a shell (a Claude Code loop, OpenClaw) starts one
process per ``agap claim`` / ``heartbeat`` / ``complete``. Each figure is the median over
several runs of the process's wall time and CPU (user + system, from the kernel's child
accounting), next to a bare ``python -c pass`` measured in the same run. ``claim`` and
``heartbeat`` run against the embedded board (an empty queue; a held lease).

Run alone: ``python -m bench.cli_start [--quick]``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.env import CARDS_DIR, ROOT, load_bench_cards, with_bytecode
from bench.trips import agap_command
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings

AGENT = "claude-coder"  # an external runtime's queue: nothing else claims from it


def _timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd[-4:])} exited {done.returncode}: {done.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _median(samples: list[tuple[float, float]]) -> dict[str, float]:
    return {
        "wall_s": round(statistics.median(s[0] for s in samples), 3),
        "cpu_s": round(statistics.median(s[1] for s in samples), 3),
    }


def run(quick: bool) -> dict[str, Any]:
    with_bytecode()
    n = 3 if quick else 10
    agap = agap_command()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBoard(Path(tmp) / "board.sqlite3") as board:
        settings = Settings(board_url=board.url, board_token=board.token, cards_dir=CARDS_DIR)
        cards = load_bench_cards()
        init_board(KanboardClient(board.url, board.token), settings, cards)
        fab = Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))
        env = {
            **os.environ,
            "KANBOARD_URL": board.url,
            "KANBOARD_API_TOKEN": board.token,
            "AGAP_CARDS_DIR": str(CARDS_DIR),
            "XDG_CACHE_HOME": str(Path(tmp) / "cache"),
            "AGAP_WORKER_ID": "bench-loop",
            "AGAP_EVENTS_URL": "",
        }
        _timed([*agap, "init"], env)  # the layout cache, as a loop has it after its first call
        tid = fab.submit("held for the heartbeats", target=AGENT).task_id
        claimed = subprocess.run(
            [*agap, "claim", "--agent", AGENT, "--json"], env=env, capture_output=True, text=True, check=True
        )
        epoch = str(json.loads(claimed.stdout)["epoch"])
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("python", "help", "claim", "heartbeat")}
        for _ in range(n):  # interleaved, so a busy moment touches every command alike
            runs["python"].append(_timed([sys.executable, "-c", "pass"], env))
            runs["help"].append(_timed([*agap, "--help"], env))
            runs["claim"].append(_timed([*agap, "claim", "--agent", AGENT, "--json"], env, ok=(4,)))
            runs["heartbeat"].append(_timed([*agap, "heartbeat", str(tid), "--epoch", epoch], env))
    med = {k: _median(v) for k, v in runs.items()}
    base = med["python"]

    def row(label: str, key: str) -> list[Any]:
        m = med[key]
        return [
            label,
            f"{m['wall_s']:.3f} s ({m['wall_s'] / base['wall_s']:.0f}x) / "
            f"{m['cpu_s']:.3f} s ({m['cpu_s'] / max(base['cpu_s'], 0.001):.0f}x)",
        ]

    rows = [
        ["bare `python -c pass`: wall / CPU (baseline)", f"{base['wall_s']:.3f} s / {base['cpu_s']:.3f} s"],
        row("`agap --help`: wall / CPU (x baseline)", "help"),
        row("`agap claim --json`, empty queue: wall / CPU (x baseline)", "claim"),
        row("`agap heartbeat`: wall / CPU (x baseline)", "heartbeat"),
    ]
    return {"title": f"CLI start-up per call (median of {n})", "rows": rows, "data": med}


if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    for label, value in result["rows"]:
        print(f"{label}: {value}")
