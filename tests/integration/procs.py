"""Entry points for worker processes started by the integration tests (spawn-safe)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from workers.assembly import build_worker
from workers.drill import DrillExecutor
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig


def drill_worker(
    url: str,
    token: str,
    cards_dir: str,
    queue: str,
    owner: str,
    log_path: str,
    lease_seconds: float,
    min_seconds: float,
    max_seconds: float,
    drain: bool,
    cache_dir: str,
    crash_marker: str | None = None,
    project: str = "Agent Fabric",
    locks_project: str = "Agent Fabric Locks",
) -> None:
    """Run one worker process with the drill executor until drained (or killed)."""
    os.environ["XDG_CACHE_HOME"] = cache_dir
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(
        board_url=url,
        board_token=token,
        cards_dir=Path(cards_dir),
        project=project,
        locks_project=locks_project,
    )
    cards = load_cards(Path(cards_dir), base_dir=Path(cards_dir).parent)

    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(url, token))

    worker = Worker(
        connect,
        DrillExecutor(
            log_path, min_seconds=min_seconds, max_seconds=max_seconds, crash_after_delivery=crash_marker
        ),
        WorkerConfig(
            queue=queue, owner=owner, lease_seconds=lease_seconds, poll_seconds=0.05, exit_when_idle=drain
        ),
    )
    worker.run()


def win_lock_and_die(url: str, token: str, locks_project_id: int, tag: str) -> None:
    """Win a lock tag, then die before writing anything else (a gap's origin)."""
    KanboardClient(url, token).call("createTag", {"project_id": locks_project_id, "tag": tag})
    os._exit(9)


def checkpoint_worker(
    url: str,
    token: str,
    cards_dir: str,
    queue: str,
    owner: str,
    log_path: str,
    cache_dir: str,
    steps: int,
    die_after: int,
    marker: str,
) -> None:
    """A worker whose executor does ``steps`` steps, checkpointing after each; the first
    process to reach step ``die_after`` dies there (SIGKILL-like, no cleanup)."""
    import sqlite3

    from workers.job import JobOutcome

    os.environ["XDG_CACHE_HOME"] = cache_dir
    settings = Settings(board_url=url, board_token=token, cards_dir=Path(cards_dir))
    cards = load_cards(Path(cards_dir), base_dir=Path(cards_dir).parent)

    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(url, token))

    def execute(job: Job) -> JobOutcome:
        db = sqlite3.connect(log_path, timeout=30, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS steps (uid TEXT, epoch INT, step INT, owner TEXT)")
        start = int((job.resume_from or "step:0").rsplit(":", 1)[1])
        for step in range(start + 1, steps + 1):
            db.execute("INSERT INTO steps VALUES (?,?,?,?)", (job.lease.uid, job.lease.epoch, step, owner))
            job.checkpoint(f"step:{step}")
            if step == die_after and not Path(marker).exists():
                Path(marker).touch()
                os._exit(137)
        return JobOutcome.done(f"drill://{job.lease.uid}/steps/{steps}")

    Worker(
        connect,
        execute,
        WorkerConfig(queue=queue, owner=owner, lease_seconds=1.5, poll_seconds=0.05, exit_when_idle=True),
    ).run()


def model_worker_one_task(
    url: str,
    token: str,
    cards_dir: str,
    agent: str,
    env: dict[str, str],
    state_dir: str,
    project: str = "Agent Fabric",
    locks_project: str = "Agent Fabric Locks",
) -> None:
    """A real model worker (the built-in executor) that takes one task and then stops.

    Stopping after one task keeps a frozen-then-thawed worker from claiming the task
    again once it has been requeued: the test decides who the next owner is.
    """
    os.environ.update(env)
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(
        board_url=url,
        board_token=token,
        cards_dir=Path(cards_dir),
        state_dir=Path(state_dir),
        project=project,
        locks_project=locks_project,
    )
    cards = load_cards(Path(cards_dir), base_dir=Path(cards_dir))
    worker = build_worker(agent, settings, cards, env=env)
    inner = worker.executor

    def one(job: Job) -> JobOutcome:
        try:
            return inner(job)
        finally:
            worker.stop.set()

    worker.executor = one
    worker.run()
