"""Run every benchmark against the embedded board and the real Kanboards configured.

See :mod:`bench` for the environment variables (targets and sizes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import ipaddress
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bench
from bench.env import (
    FLAVOUR_NAMES,
    Target,
    TargetSpecError,
    load_bench_cards,
    machine_info,
    real_targets,
    with_bytecode,
)
from bench.pool import Pool
from bench.report import readme_block, table
from bench.throughput import run_throughput
from bench.trips import measure_trips
from fabric.embedded.server import EmbeddedBoard

RESULTS = Path(__file__).resolve().parent / "results"

# Sized so that embedded + three real Kanboards (SQLite, PostgreSQL, MariaDB) and the
# other sections take about 15 minutes on a 2-CPU machine. A real board's points are
# short (30 tasks: a few seconds, where each process's start and exit weigh heavily):
# issue 31's throughput figures come from AGAP_BENCH_REAL_TASKS=400 (README).
FULL = {
    "procs": (1, 2, 4, 8),
    "embedded_tasks": 100,
    "real_tasks": 30,
    "repeats": 2,
    "raw_seconds": 1.5,
    "trip_samples": 10,
    "cli_runs": 3,
    "deadline": 40.0,
    "settle": 1.0,
}
QUICK = {
    "procs": (1, 4),
    "embedded_tasks": 40,
    "real_tasks": 16,
    "repeats": 1,
    "raw_seconds": 0.5,
    "trip_samples": 4,
    "cli_runs": 1,
    "deadline": 45.0,
    "settle": 1.0,
}
# AGAP_BENCH_<KEY> overrides each size; every one is bounded (runs stay short).
LIMITS: dict[str, tuple[float, float]] = {
    "procs": (1, 16),
    "embedded_tasks": (1, 5000),
    "real_tasks": (1, 2000),
    "repeats": (1, 10),
    "raw_seconds": (0.1, 30),
    "trip_samples": (1, 100),
    "cli_runs": (1, 20),
    "deadline": (1, 600),
    "settle": (0, 30),
}


def config(base: dict[str, Any], environ: Any = None) -> dict[str, Any]:
    """``base`` with the ``AGAP_BENCH_<KEY>`` overrides of the environment applied."""
    env = os.environ if environ is None else environ
    cfg = dict(base)
    for key, default in base.items():
        name = f"AGAP_BENCH_{key.upper()}"
        text = (env.get(name) or "").strip()
        if not text:
            continue
        lo, hi = LIMITS[key]
        try:
            if isinstance(default, tuple):
                value: Any = tuple(sorted({int(x) for x in text.replace(" ", ",").split(",") if x}))
                ok = bool(value) and all(lo <= v <= hi for v in value)
            else:
                value = int(text) if isinstance(default, int) else float(text)
                ok = lo <= value <= hi
        except ValueError:
            ok = False
        if not ok:
            kind = (
                "a comma-separated list of integers"
                if isinstance(default, tuple)
                else "an integer"
                if isinstance(default, int)
                else "a number"
            )
            raise TargetSpecError(f"{name}={text!r}: expected {kind} in {lo:g}..{hi:g}")
        cfg[key] = value
    return cfg


def check_loopback(targets: list[Target], environ: Any = None) -> None:
    """Refuse a real Kanboard off this machine unless AGAP_BENCH_ALLOW_REMOTE=1.

    The benchmarks create and remove dozens of projects and hammer the board: a
    production instance named by a stray KANBOARD_URL must not get that by accident.
    """
    env = os.environ if environ is None else environ
    if env.get("AGAP_BENCH_ALLOW_REMOTE") == "1":
        return
    for t in targets:
        host = urlsplit(t.url).hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise TargetSpecError(
                f"{t.label} at {t.url} is not on loopback; set "
                "AGAP_BENCH_ALLOW_REMOTE=1 to benchmark it anyway"
            )


def preflight(targets: list[Target]) -> None:
    """Every real Kanboard answers, with its token, before anything is measured."""
    for t in targets:
        client = t.client()
        try:
            version = client.call("getVersion")
        except Exception as exc:
            raise TargetSpecError(f"{t.label} at {t.url} does not answer: {exc}") from None
        finally:
            client.close()
        print(f"[{t.name}] Kanboard {version} at {t.url}", flush=True)


def embedded_board(path: Path) -> EmbeddedBoard:
    """The embedded board, in AGAP_BENCH_EMBEDDED_FLAVOUR's flavour when set."""
    flavour = (os.environ.get("AGAP_BENCH_EMBEDDED_FLAVOUR") or "").strip()
    return EmbeddedBoard(path, flavour=flavour) if flavour else EmbeddedBoard(path)


def embedded_label(board: EmbeddedBoard) -> str:
    flavour = str(getattr(board, "flavour", "") or "")
    if not flavour:
        return "embedded board"
    return f"embedded board ({FLAVOUR_NAMES.get(flavour, flavour)} flavour)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument(
        "--embedded-only", action="store_true", help="skip the real Kanboards even when they are configured"
    )
    ap.add_argument(
        "--no-sections",
        action="store_true",
        help="only the board tables (skip workers, keeper, events, A2A, MCP)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where results go (default bench/results, or bench/results/quick)",
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the projects and users created on a real Kanboard"
    )
    return ap.parse_args(argv)


def bench_target(target: Target, pool: Pool, cfg: dict[str, Any], tasks: int, tmp: Path) -> dict[str, Any]:
    cards = load_bench_cards()
    started = time.monotonic()
    print(f"[{target.name}] round trips …", flush=True)
    trips = measure_trips(target, cards, n=cfg["trip_samples"], cli_runs=cfg["cli_runs"], tmp=tmp)
    trips_seconds = round(time.monotonic() - started, 1)
    print(f"[{target.name}] throughput, {tasks} tasks per point …", flush=True)
    thr = run_throughput(
        target,
        cards,
        pool,
        procs=cfg["procs"],
        n=tasks,
        repeats=cfg["repeats"],
        raw_seconds=cfg["raw_seconds"],
        deadline=cfg["deadline"],
        settle=cfg["settle"],
        tmp=tmp,
    )
    seconds = round(time.monotonic() - started, 1)
    print(f"[{target.name}] {seconds} s (round trips {trips_seconds} s)", flush=True)
    return {
        "label": target.label,
        "flavour": target.flavour,
        "url": target.url if target.real else "loopback (embedded)",
        "tasks": tasks,
        "trips": trips,
        "throughput": thr,
        "seconds": seconds,
        "trips_seconds": trips_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = config(QUICK if args.quick else FULL)
        reals = [] if args.embedded_only else real_targets()
        check_loopback(reals)
        preflight(reals)
    except TargetSpecError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    with_bytecode()  # every process it starts reads cached bytecode, as an installed fabric does
    out: Path = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    tmp = Path(tempfile.mkdtemp(prefix="agap-bench-"))
    cache = tmp / "cache"
    cache.mkdir()
    os.environ["XDG_CACHE_HOME"] = str(cache)  # the layout cache; pool processes inherit it
    command = "make bench" if not args.quick else "python -m bench --quick"
    results: dict[str, Any] = {
        "machine": machine_info(),
        "command": command,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
        "targets": {},
    }
    started = time.monotonic()
    pool = Pool(max(cfg["procs"]), str(cache))
    try:
        with embedded_board(tmp / "board.sqlite3") as board:
            target = Target(
                "embedded",
                board.url,
                board.token,
                embedded_label(board),
                flavour=str(getattr(board, "flavour", "") or ""),
            )
            results["targets"]["embedded"] = bench_target(target, pool, cfg, cfg["embedded_tasks"], tmp)
        for real in reals:
            try:
                results["targets"][real.name] = bench_target(real, pool, cfg, cfg["real_tasks"], tmp)
            except Exception as exc:
                # One backend failing must not lose the others' figures.
                traceback.print_exc()
                results["targets"][real.name] = {
                    "label": real.label,
                    "flavour": real.flavour,
                    "url": real.url,
                    "tasks": cfg["real_tasks"],
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
                pool.close()  # its processes may still be busy with the failed job
                pool = Pool(max(cfg["procs"]), str(cache))
            finally:
                if not args.keep:
                    with contextlib.suppress(Exception):
                        real.cleanup()
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    results["sections"] = {} if args.no_sections else run_sections(args.quick)
    results["seconds"] = round(time.monotonic() - started, 1)
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write(results, out)
    print()
    print(table(results))
    print(f"\n(total {results['seconds']} s; results in {out})")
    failed = [t["label"] for t in results["targets"].values() if "error" in t]
    if failed:
        print(f"bench: failed and left out of the tables: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# Benchmarks of other parts of the fabric: each module has run(quick) -> {"title", "rows"}.
SECTIONS = (
    "bench.workers",
    "bench.backlog",
    "bench.calls",
    "bench.keeper_sweep",
    "bench.shared_quota",
    "bench.gestures",
    "bench.events",
    "bench.a2a",
    "bench.a2a_bindings",
    "bench.mcp",
    "bench.mcp_tasks",
    "bench.mcp_notify",
    "bench.auth",
    "bench.hindsight",
    "bench.openclaw",
    "bench.cli_start",
    "bench.stop",
)


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
