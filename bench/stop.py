"""How long each daemon takes to be gone after SIGTERM/SIGINT (the promise: 3 s).

Each row is a real ``agap`` process signalled at random moments of its start-up and its
work (a worker inside a slow model call, servers holding a half-sent request; see
:mod:`tests.stopping`), timed from the signal to its exit: p50, p99 and the worst over the
trials, and how many the watchdog had to end. The baseline, measured in the same run, is
a bare ``python -c`` that only sleeps, killed by the same signal.

Run alone: ``python -m bench.stop [--quick]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from fabric.signals import STOP_BOUND
from tests import stopping
from tests.stopping import Daemon, Results, percentile, run_trials


def _row(name: str, results: Results, baseline: float) -> list[str]:
    secs = results.seconds()
    p50 = percentile(secs, 0.5)
    vs = f", p50 {p50 / baseline:.0f}x bare" if baseline > 0 else ""
    return [
        f"{name}: p50 / p99 / max",
        f"{p50 * 1000:.0f} / {percentile(secs, 0.99) * 1000:.0f} / {secs[-1] * 1000:.0f} ms "
        f"({len(secs)} stops{vs}; watchdog {len(results.forced())}, over the bound {len(results.over())})",
    ]


def run(quick: bool) -> dict[str, Any]:
    per = 4 if quick else 20
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        bare = Daemon(
            "bare python (baseline)",
            [sys.executable, "-c", "import time; time.sleep(60)"],
            {},
            max_delay=1.0,
        )
        baseline = run_trials([bare], per, seed=3)
        b50 = percentile(baseline.seconds(), 0.5)
        rows.append(_row(bare.name, baseline, 0.0))
        all_results = Results()
        with (
            stopping.household(base / "h") as env,
            stopping.slow_model() as model,
            stopping.worker_queue(base / "w", model) as queue,
        ):
            for daemon in stopping.daemons(env, queue):
                results = run_trials([daemon], per, seed=11)
                all_results.trials += results.trials
                rows.append(_row(daemon.name, results, b50))
        up_dir = base / "up"
        up_dir.mkdir()
        up = run_trials([stopping.agap_up(up_dir)], max(2, per // 4), seed=5)
        all_results.trials += up.trials
        rows.append(_row("agap up (every process)", up, b50))
    return {
        "title": f"Stop latency: signal to exit, the bound is {STOP_BOUND:.0f} s (bench.stop)",
        "rows": rows,
        "over_bound": len(all_results.over()),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run("--quick" in sys.argv), indent=2))
