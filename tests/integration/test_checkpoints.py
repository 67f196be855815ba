"""Checkpoints with a real worker process killed between them (embedded board, HTTP)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path

from fabric.cards import CardSet
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.task import State
from keeper.sweeps import sweep_leases_and_gaps
from tests.conftest import ROOT, make_fabric
from tests.integration.procs import checkpoint_worker


def test_a_worker_killed_between_checkpoints_is_resumed_not_restarted(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards)
    tid = fab.submit("five careful steps", target="gemma-local").task_id
    log, marker = tmp_path / "steps.sqlite3", tmp_path / "died"
    ctx = mp.get_context("spawn")

    def run(owner: str) -> int | None:
        p = ctx.Process(
            target=checkpoint_worker,
            args=(
                embedded_board.url,
                embedded_board.token,
                str(ROOT / "cards"),
                "gemma-local",
                owner,
                str(log),
                str(tmp_path / f"cache-{owner}"),
                5,
                3,
                str(marker),
            ),
        )
        p.start()
        p.join(60)
        return p.exitcode

    assert run("first") == 137
    deadline = time.monotonic() + 30
    while not sweep_leases_and_gaps(fab).requeued:
        assert time.monotonic() < deadline, "the dead owner's lease was never requeued"
        time.sleep(0.2)
    assert run("second") == 0
    view = fab.board.read(tid)
    assert view.current is not None and view.current.state == State.DONE
    rows = sqlite3.connect(log).execute("SELECT step, owner FROM steps ORDER BY rowid").fetchall()
    assert rows == [(1, "first"), (2, "first"), (3, "first"), (4, "second"), (5, "second")]
