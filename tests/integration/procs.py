"""Entry points for worker processes started by the integration tests (spawn-safe)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fabric.cards import load_cards
from fabric.config import Settings
from fabric.core import Fabric
from fabric.kanboard.client import KanboardClient
from workers.drill import DrillExecutor
from workers.loop import Worker, WorkerConfig


def drill_worker(url: str, token: str, cards_dir: str, queue: str, owner: str, log_path: str,
                 lease_seconds: float, min_seconds: float, max_seconds: float,
                 drain: bool, cache_dir: str) -> None:
    """Run one worker process with the drill executor until drained (or killed)."""
    os.environ["XDG_CACHE_HOME"] = cache_dir
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(board_url=url, board_token=token, cards_dir=Path(cards_dir))
    cards = load_cards(Path(cards_dir), base_dir=Path(cards_dir).parent)

    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(url, token))

    worker = Worker(connect, DrillExecutor(log_path, min_seconds=min_seconds,
                                           max_seconds=max_seconds),
                    WorkerConfig(queue=queue, owner=owner, lease_seconds=lease_seconds,
                                 poll_seconds=0.05, exit_when_idle=drain))
    worker.run()
