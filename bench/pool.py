"""A pool of spawned worker processes, reused across measurements.

Spawning (and importing the fabric) costs about a second of CPU a process; a 2-core
machine cannot afford that 45 times a run. Each pool process waits for a job, sets it
up, reports ready, waits for ``go``, runs it and reports the result, so the clock
covers only the work and every process starts at (almost) the same moment.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

Runner = Callable[[], dict[str, Any]]
Setup = Callable[[dict[str, Any]], Runner]


def _jobs() -> dict[str, Setup]:
    from bench.jobs import fabric_job, raw_job, settle_job
    from bench.naive import naive_job

    return {"fabric": fabric_job, "naive": naive_job, "raw": raw_job, "settle": settle_job}


def serve(index: int, commands: Any, results: Any, cache_dir: str) -> None:
    """A pool process: run jobs until told ``None``."""
    os.environ["XDG_CACHE_HOME"] = cache_dir
    logging.basicConfig(level=logging.ERROR)
    jobs = _jobs()
    while True:
        msg = commands.get()
        if msg is None:
            return
        kind, params = msg
        try:
            runner = jobs[kind](params)
        except Exception:
            results.put(("error", index, traceback.format_exc()))
            continue
        results.put(("ready", index, None))
        if commands.get() != "go":
            continue  # aborted: another process failed to set up
        started = time.time()
        try:
            result = runner()
        except Exception:
            results.put(("error", index, traceback.format_exc()))
            continue
        result["t_start"] = started
        result["t_end"] = time.time()
        results.put(("done", index, result))


class PoolError(RuntimeError):
    pass


class Pool:
    """``size`` spawned processes; :meth:`run` gives a job to the first ``n`` of them."""

    def __init__(self, size: int, cache_dir: str) -> None:
        ctx = mp.get_context("spawn")
        self.results: Any = ctx.Queue()
        self.commands: list[Any] = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(
                target=serve,
                args=(i, self.commands[i], self.results, cache_dir),
                name=f"bench-{i}",
                daemon=True,
            )
            for i in range(size)
        ]
        for p in self.procs:
            p.start()

    def run(
        self, kind: str, params: list[dict[str, Any]], *, timeout: float
    ) -> tuple[float, list[dict[str, Any]]]:
        """Run one job per params entry in parallel; returns (t0, results)."""
        n = len(params)
        for i, p in enumerate(params):
            self.commands[i].put((kind, p))
        ready, errors = self._collect("ready", n, 120.0)
        if errors:
            for i in ready:
                self.commands[i].put("abort")
            raise PoolError("\n".join(errors))
        t0 = time.time()
        for i in range(n):
            self.commands[i].put("go")
        done, errors = self._collect("done", n, timeout)
        if errors:
            raise PoolError("\n".join(errors))
        return t0, [done[i] for i in sorted(done)]

    def _collect(self, kind: str, n: int, timeout: float) -> tuple[dict[int, Any], list[str]]:
        got: dict[int, Any] = {}
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        while len(got) + len(errors) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolError(f"timed out waiting for {n - len(got)} process(es) to be {kind}")
            try:
                what, index, payload = self.results.get(timeout=min(left, 5.0))
            except queue.Empty:
                if not all(p.is_alive() for p in self.procs):
                    raise PoolError("a pool process died") from None
                continue
            if what == "error":
                errors.append(f"process {index}: {payload}")
            else:
                got[index] = payload
        return got, errors

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
