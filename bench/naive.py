"""A naive claimer, for comparison: what the seed's "assign to self + move" design does.

It polls the Queued column, moves a card to Working and assigns it to itself (no lock
tag, no epochs), executes (logging to its own drill-style SQLite log), then moves the
card to Done. Kanboard has no conditional write, so two claimers that polled the same
card both "win" it. It talks to the board only through :class:`KanboardClient` calls.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.env import CountingClient
from fabric.kanboard.port import BoardError, Call
from workers import drill

CANDIDATES = 8  # spread over the best few like the fabric's reader, for a fair comparison
BOTTOM = 1_000_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    task_id INTEGER NOT NULL, owner TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL
);
"""


def open_log(path: str | Path) -> sqlite3.Connection:
    return drill.open_log(path, SCHEMA)


def double_executions(path: str | Path) -> tuple[int, int, int]:
    """(tasks executed, tasks executed more than once, executions) in a naive log."""
    db = open_log(path)
    rows = db.execute("SELECT task_id, COUNT(*) FROM executions GROUP BY task_id").fetchall()
    db.close()
    return len(rows), sum(1 for _, n in rows if n > 1), sum(n for _, n in rows)


def executed_ids(path: str | Path) -> set[int]:
    """The task ids a naive log shows executed (at least once)."""
    db = open_log(path)
    rows = db.execute("SELECT DISTINCT task_id FROM executions").fetchall()
    db.close()
    return {int(tid) for (tid,) in rows}


@dataclass(frozen=True)
class NaiveLayout:
    """Kanboard ids the naive claimer needs."""

    project_id: int
    swimlane_id: int
    queue: str
    queued: int
    working: int
    done: int


class NaiveClaimer:
    """Poll → move to Working + assign to self → execute → move to Done."""

    def __init__(
        self,
        client: CountingClient,
        layout: NaiveLayout,
        owner: str,
        user_id: int,
        log_path: str | Path,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.owner = owner
        self.user_id = user_id
        self.log_path = str(log_path)
        self.rng = rng or random.Random()
        self.done = 0
        self.claim_errors = 0
        self.polls = 0

    def poll(self) -> list[dict[str, Any]]:
        self.polls += 1
        rows = (
            self.client.call(
                "searchTasks",
                {
                    "project_id": self.layout.project_id,
                    "query": f'status:open column:"Queued" swimlane:"{self.layout.queue}"',
                },
            )
            or []
        )
        rows = list(rows)
        rows.sort(key=lambda r: (-int(r.get("priority") or 0), int(r["id"])))
        return rows

    def claim(self, task_id: int) -> bool:
        """Assign to self and move to Working, in one round trip. Trusts the board blindly."""
        out = self.client.batch(
            [
                Call(
                    "moveTaskPosition",
                    {
                        "project_id": self.layout.project_id,
                        "task_id": task_id,
                        "column_id": self.layout.working,
                        "position": BOTTOM,
                        "swimlane_id": self.layout.swimlane_id,
                    },
                ),
                Call("updateTask", {"id": task_id, "owner_id": self.user_id}),
            ]
        )
        # A naive design has no way to tell a lost race from a win: it only gives up on
        # an outright error.
        return all(o.error is None for o in out)

    def execute(self, db: sqlite3.Connection, task_id: int) -> None:
        db.execute(
            "INSERT INTO executions (task_id, owner, pid, at) VALUES (?,?,?,?)",
            (task_id, self.owner, os.getpid(), time.time()),
        )

    def finish(self, task_id: int) -> None:
        self.client.call(
            "moveTaskPosition",
            {
                "project_id": self.layout.project_id,
                "task_id": task_id,
                "column_id": self.layout.done,
                "position": BOTTOM,
                "swimlane_id": self.layout.swimlane_id,
            },
        )

    def drain(self, deadline: float) -> None:
        """Work until a poll finds the Queued column empty (or the deadline passes)."""
        db = open_log(self.log_path)
        try:
            while time.monotonic() < deadline:
                try:
                    rows = self.poll()
                except BoardError:
                    continue
                if not rows:
                    return
                pick = self.rng.choice(rows[:CANDIDATES])
                task_id = int(pick["id"])
                try:
                    if not self.claim(task_id):
                        self.claim_errors += 1
                        continue
                except BoardError:
                    self.claim_errors += 1
                    continue
                self.execute(db, task_id)
                try:
                    self.finish(task_id)
                except BoardError:
                    continue
                self.done += 1
        finally:
            db.close()


def naive_job(p: dict[str, Any]) -> Any:
    """Pool job: one naive claimer process."""
    client = CountingClient(p["url"], p["token"])
    claimer = NaiveClaimer(client, NaiveLayout(**p["layout"]), p["owner"], int(p["user_id"]), p["log"])

    def run() -> dict[str, Any]:
        deadline = time.monotonic() + float(p["deadline"])
        claimer.drain(deadline)
        return {
            "completed": claimer.done,
            "claim_errors": claimer.claim_errors,
            "timed_out": time.monotonic() >= deadline,
            "polls": claimer.polls,
            "trips": client.stats.trips,
            "calls": client.stats.calls,
            "errors": dict(client.errors),
        }

    return run
