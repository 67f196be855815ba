"""Run every benchmark against the embedded board (and a real Kanboard when configured)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.env import Target, load_bench_cards, machine_info
from bench.pool import Pool
from bench.report import readme_block, table
from bench.throughput import run_throughput
from bench.trips import measure_trips
from fabric.board.server import EmbeddedBoard

RESULTS = Path(__file__).resolve().parent / "results"

FULL = {"procs": (1, 2, 4, 8), "embedded_tasks": 200, "real_tasks": 60, "repeats": 2,
        "raw_seconds": 1.5, "trip_samples": 10, "cli_runs": 3, "deadline": 60.0}
QUICK = {"procs": (1, 4), "embedded_tasks": 40, "real_tasks": 16, "repeats": 1,
         "raw_seconds": 0.5, "trip_samples": 4, "cli_runs": 1, "deadline": 45.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--embedded-only", action="store_true",
                    help="skip the real Kanboard even when KANBOARD_URL is set")
    ap.add_argument("--out", type=Path, default=None,
                    help="where results go (default bench/results, or bench/results/quick)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the projects and users created on a real Kanboard")
    return ap.parse_args(argv)


def bench_target(target: Target, pool: Pool, cfg: dict[str, Any], tasks: int,
                 tmp: Path) -> dict[str, Any]:
    cards = load_bench_cards()
    started = time.monotonic()
    print(f"[{target.name}] round trips …", flush=True)
    trips = measure_trips(target, cards, n=cfg["trip_samples"], cli_runs=cfg["cli_runs"], tmp=tmp)
    print(f"[{target.name}] throughput, {tasks} tasks per point …", flush=True)
    thr = run_throughput(target, cards, pool, procs=cfg["procs"], n=tasks,
                         repeats=cfg["repeats"], raw_seconds=cfg["raw_seconds"],
                         deadline=cfg["deadline"], tmp=tmp)
    return {"label": target.label, "url": target.url if target.real else "loopback (embedded)",
            "tasks": tasks, "trips": trips, "throughput": thr,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out: Path = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    tmp = Path(tempfile.mkdtemp(prefix="agap-bench-"))
    cache = tmp / "cache"
    cache.mkdir()
    os.environ["XDG_CACHE_HOME"] = str(cache)  # the layout cache; pool processes inherit it
    command = "make bench" if not args.quick else "python -m bench --quick"
    results: dict[str, Any] = {"machine": machine_info(), "command": command,
                               "config": {k: list(v) if isinstance(v, tuple) else v
                                          for k, v in cfg.items()},
                               "targets": {}}
    started = time.monotonic()
    pool = Pool(max(cfg["procs"]), str(cache))
    try:
        with EmbeddedBoard(tmp / "board.sqlite3") as board:
            target = Target("embedded", board.url, board.token, "embedded board")
            results["targets"]["embedded"] = bench_target(target, pool, cfg,
                                                          cfg["embedded_tasks"], tmp)
        url, token = os.environ.get("KANBOARD_URL"), os.environ.get("KANBOARD_API_TOKEN")
        if url and token and not args.embedded_only:
            real = Target("kanboard", url, token, "real Kanboard", real=True)
            try:
                results["targets"]["kanboard"] = bench_target(real, pool, cfg,
                                                              cfg["real_tasks"], tmp)
            finally:
                if not args.keep:
                    real.cleanup()
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    results["sections"] = run_sections(args.quick)
    results["seconds"] = round(time.monotonic() - started, 1)
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write(results, out)
    print()
    print(table(results))
    print(f"\n(total {results['seconds']} s; results in {out})")
    return 0


# Benchmarks of other parts of the fabric: each module has run(quick) -> {"title", "rows"}.
SECTIONS = ("bench.workers", "bench.keeper_sweep", "bench.events", "bench.a2a")


def run_sections(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SECTIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        print(f"[{name}] …", flush=True)
        result = module.run(quick)
        if "rows" not in result and hasattr(module, "table"):
            result["markdown"] = module.table(result)  # a module that renders itself
        out[name] = result
    return out


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if out.name == "quick":
        (out / ".gitignore").write_text("*\n")  # smoke runs are not results to commit
    (out / "latest.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    block = readme_block(results)
    (out / "README-table.md").write_text(block)
    (out / "latest.md").write_text("# Benchmark results\n\n" + block)
