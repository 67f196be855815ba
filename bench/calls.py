"""What one of the fabric's Kanboard calls costs the board: CPU of its own processes.

A task's claim and completion are a handful of JSON-RPC calls in two requests; which of
them to make, and when, is the fabric's choice (docs/DESIGN.md: a claim shows in Working
only once its work outlasts half a second). This measures what each costs the board's
server processes on this machine (the PHP server and the database: ``/proc``, user and
system time, with the children they reaped), per request:

* a request that does nothing but sign in (``getVersion``), and a raw ``createTask``
  (the throughput benchmark's baseline);
* the completion's batch as the fabric sends it (its epoch's lock, the record, the move
  to Done, the card's description and owner, the journal line), and that batch with each
  call left out in turn: what that call adds.

Each batch runs on tasks of its own, ``n`` times, twice; the lower total is kept (other
work on the machine only adds). Only for real Kanboards on this machine
(``AGAP_BENCH_KANBOARDS``, loopback): the embedded board runs inside the client.
Run alone: ``python -m bench.calls [--quick]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.env import CountingClient, Target, real_targets
from fabric.kanboard.port import BoardError, Call

# The board's server processes, by the name the kernel gives them.
SERVERS = ("php", "php-fpm", "apache2", "httpd", "nginx", "postgres", "mariadbd", "mysqld")
RECORD = json.dumps({"epoch": 2, "state": "done", "op": "complete", "by": "w1", "at": 1.8e9, "ref": "x" * 60})
DESCRIPTION = "**Done: please verify.**\n\n" + "The intent as written. " * 60  # a card's length

Batch = Callable[[int, int], list[Call]]


def _server_cpu() -> float:
    """Seconds of CPU of the board's server processes so far (with reaped children)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            if name.startswith(SERVERS):
                f = stat[stat.rindex(")") + 2 :].split()
                total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / tick


class _Board:
    """A scratch project (and one for lock tags) with tasks to spend, on one target."""

    def __init__(self, target: Target, tasks: int) -> None:
        self.client: CountingClient = target.client()
        stamp = f"{target.run_id}-{time.time_ns() % 10**9}"
        self.project = int(self.client.call("createProject", {"name": f"agap-bench calls {stamp}"}))
        self.locks = int(self.client.call("createProject", {"name": f"agap-bench calls locks {stamp}"}))
        target.projects += [self.project, self.locks]
        columns = self.client.call("getColumns", {"project_id": self.project})
        self.columns = [int(c["id"]) for c in columns]
        self.tasks = [
            int(self.client.call("createTask", {"title": f"t{i}", "project_id": self.project}))
            for i in range(tasks)
        ]
        self.tag = 0

    def lock(self, task_id: int) -> Call:
        self.tag += 1
        tag = f"u{task_id}/e{self.tag}"
        return Call("createTag", {"project_id": self.locks, "tag": tag, "color_id": "n"})

    def completion(self, i: int, task_id: int) -> list[Call]:
        return [
            self.lock(task_id),
            Call("saveTaskMetadata", {"task_id": task_id, "values": {"fabric.e2": RECORD}}),
            Call(
                "moveTaskToProject",
                {"task_id": task_id, "project_id": self.project, "column_id": self.columns[1 + i % 3]},
            ),
            Call("updateTask", {"id": task_id, "description": f"{i} {self.tag} {DESCRIPTION}"}),
            Call("createComment", {"task_id": task_id, "user_id": 0, "content": f"Done by w1 (epoch {i})."}),
        ]

    def measure(self, batch: Batch) -> float:
        """Milliseconds of the board's CPU per request of ``batch``, the lower of two runs."""
        best = float("inf")
        for _ in range(2):
            before = _server_cpu()
            for i, task_id in enumerate(self.tasks):
                self.client.batch(batch(i, task_id))
            best = min(best, (_server_cpu() - before) / len(self.tasks) * 1000)
        return best


def _measure(target: Target, n: int) -> dict[str, Any]:
    board = _Board(target, n)
    raw = Call("createTask", {"title": "raw", "project_id": board.project})
    out: dict[str, Any] = {
        "getVersion": board.measure(lambda i, t: [Call("getVersion", {})]),
        "createTask": board.measure(lambda i, t: [raw]),
    }
    whole = board.measure(board.completion)
    out["completion"] = whole
    for left_out in ("createTag", "saveTaskMetadata", "moveTaskToProject", "updateTask", "createComment"):

        def without(i: int, t: int, m: str = left_out) -> list[Call]:
            return [c for c in board.completion(i, t) if c.method != m]

        out[f"adds:{left_out}"] = whole - board.measure(without)
    board.client.close()
    return {k: round(v, 2) for k, v in out.items()}


def run(quick: bool) -> dict[str, Any]:
    n = 20 if quick else 60
    boards: dict[str, dict[str, Any]] = {}
    for target in real_targets():
        try:
            boards[target.label] = _measure(target, n)
        except (BoardError, OSError) as exc:  # one board away must not lose the others
            boards[target.label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            with contextlib.suppress(Exception):
                target.cleanup()
    rows: list[list[Any]] = [["requests per batch (the lower of two runs)", n]]
    names = {
        "getVersion": "a request alone (getVersion)",
        "createTask": "raw createTask (the throughput baseline)",
        "completion": "the completion's batch (lock, record, move, description, journal)",
    }
    for label, got in boards.items():
        if "error" in got:
            rows.append([f"{label}: failed", got["error"]])
            continue
        raw = got["createTask"]
        for key, ms in got.items():
            what = names.get(key) or f"what {key.split(':', 1)[1]} adds to it"
            rows.append([f"{label}: {what}, ms (x createTask)", f"{ms} ({ms / raw:.2f}x)"])
    if not boards:
        rows.append(["no real Kanboard named (AGAP_BENCH_KANBOARDS)", "nothing to measure"])
    return {
        "title": "What a Kanboard call costs the board (CPU of its server processes, ms a request)",
        "rows": rows,
        "boards": boards,
    }


if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    print(json.dumps(result, indent=2))
