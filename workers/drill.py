"""A drill executor: does no real work, but records every execution.

The race and chaos tests and the benchmarks run real worker processes with it, then
count executions across processes from its SQLite log. It also delivers one side effect
per task to a stand-in "service" table that deduplicates by idempotency key, the way a
real receiving system would, and counts every delivery attempt.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from pathlib import Path

from fabric.ledger import Fenced
from workers.job import Job, JobOutcome

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    uid TEXT NOT NULL, epoch INTEGER NOT NULL, owner TEXT NOT NULL, pid INTEGER NOT NULL,
    started REAL NOT NULL, finished REAL
);
CREATE TABLE IF NOT EXISTS deliveries (key TEXT NOT NULL, owner TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS applied (key TEXT PRIMARY KEY, uid TEXT NOT NULL, owner TEXT NOT NULL);
"""


def open_log(path: str | Path, schema: str = SCHEMA) -> sqlite3.Connection:
    """Open (and create) an execution log; safe to share between processes."""
    db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=60000")
    db.executescript(schema)
    return db


class DrillExecutor:
    """Logs the execution, optionally sleeps, delivers one keyed side effect, returns."""

    def __init__(
        self,
        log_path: str | Path,
        *,
        min_seconds: float = 0.0,
        max_seconds: float = 0.0,
        effect: bool = True,
        crash_after_delivery: str | Path | None = None,
    ) -> None:
        self.log_path = str(log_path)
        # Crash drill: the first process to deliver creates this file and dies at once,
        # before recording the receipt (the worst moment for a side effect).
        self.crash_after_delivery = Path(crash_after_delivery) if crash_after_delivery else None
        self.min_seconds = min_seconds
        self.max_seconds = max_seconds
        self.with_effect = effect
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = open_log(self.log_path)
        return self._db

    def __call__(self, job: Job) -> JobOutcome:
        lease = job.lease
        cur = self.db.execute(
            "INSERT INTO executions (uid, epoch, owner, pid, started) VALUES (?,?,?,?,?)",
            (lease.uid, lease.epoch, lease.owner, os.getpid(), time.time()),
        )
        row_id = cur.lastrowid
        if self.max_seconds > 0:
            deadline = time.monotonic() + random.uniform(self.min_seconds, self.max_seconds)
            while time.monotonic() < deadline and not job.should_stop:
                time.sleep(0.01)
        if job.fenced.is_set():
            return JobOutcome.failed("fenced while working")
        if self.with_effect:
            effect = job.effect("notify")
            if not effect.done:
                self.db.execute(
                    "INSERT INTO deliveries (key, owner, at) VALUES (?,?,?)",
                    (effect.key, lease.owner, time.time()),
                )
                self.db.execute(
                    "INSERT OR IGNORE INTO applied (key, uid, owner) VALUES (?,?,?)",
                    (effect.key, lease.uid, lease.owner),
                )
                if self.crash_after_delivery is not None:
                    try:
                        self.crash_after_delivery.touch(exist_ok=False)
                        os._exit(137)
                    except FileExistsError:
                        pass
                try:
                    job.effect_done(effect, f"applied:{effect.key}")
                except Fenced:
                    return JobOutcome.failed("fenced after the side effect")
        self.db.execute("UPDATE executions SET finished = ? WHERE rowid = ?", (time.time(), row_id))
        return JobOutcome.done(f"drill://{lease.uid}/e{lease.epoch}/{lease.owner}")
