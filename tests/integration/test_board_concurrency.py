"""Several OS processes hammer one embedded board over HTTP.

Two servers share one SQLite file (separate connections, as two processes would), and
worker processes (spawned, so nothing is shared but the database) create tasks, save
metadata on them and race ``createTag`` on common names. Afterwards no write may be
lost, every tag name has exactly one winner, and the database passes
``PRAGMA integrity_check``.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path
from typing import Any

from fabric.embedded.flavour import install
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import Call

WORKERS = 4
TASKS_PER_WORKER = 40
TAG_ROUNDS = 25
TOKEN = "concurrency-token-0123456789"


def _worker(index: int, urls: list[str], project_id: int, barrier: Any) -> dict[str, Any]:
    client = KanboardClient(urls[index % len(urls)], TOKEN, timeout=60)
    created: dict[str, int] = {}
    wins: dict[str, Any] = {}
    try:
        for n in range(TASKS_PER_WORKER):
            ref = f"w{index}-t{n}"
            task_id = client.call("createTask", {"title": ref, "project_id": project_id, "reference": ref})
            assert isinstance(task_id, int) and task_id > 0, task_id
            created[ref] = task_id
            [saved] = client.batch([Call("saveTaskMetadata", [task_id, {"owner": str(index), "n": str(n)}])])
            assert saved.unwrap() is True
            if n % (TASKS_PER_WORKER // TAG_ROUNDS + 1) == 0 and len(wins) < TAG_ROUNDS:
                name = f"lock-{len(wins)}"
                barrier.wait(timeout=60)
                wins[name] = client.call("createTag", [project_id, name])
        while len(wins) < TAG_ROUNDS:  # keep in step with the other workers
            name = f"lock-{len(wins)}"
            barrier.wait(timeout=60)
            wins[name] = client.call("createTag", [project_id, name])
    finally:
        client.close()
    return {"created": created, "wins": wins}


def test_processes_lose_no_write_and_tags_have_one_winner(tmp_path: Path) -> None:
    db = tmp_path / "board.sqlite3"
    with EmbeddedBoard(db, token=TOKEN) as first, EmbeddedBoard(db, token=TOKEN) as second:
        client = KanboardClient(first.url, TOKEN)
        project_id = client.call("createProject", {"name": "concurrency"})
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(WORKERS)
            with ctx.Pool(WORKERS) as pool:
                results = pool.starmap(
                    _worker,
                    [(i, [first.url, second.url], project_id, barrier) for i in range(WORKERS)],
                )

        # No lost task, and every task has its own metadata.
        created = {ref: tid for r in results for ref, tid in r["created"].items()}
        assert len(created) == WORKERS * TASKS_PER_WORKER
        assert len(set(created.values())) == len(created)
        tasks = client.call("getAllTasks", [project_id, 1])
        assert {t["reference"]: t["id"] for t in tasks} == created
        for ref, task_id in created.items():
            worker, n = ref[1:].split("-t")
            assert client.call("getTaskMetadata", [task_id]) == {"n": n, "owner": worker}
        positions = sorted(t["position"] for t in tasks)
        assert positions == list(range(1, len(tasks) + 1))

        # Exactly one createTag winner per name, and one tag row.
        tags = {t["name"]: t["id"] for t in client.call("getTagsByProject", [project_id])}
        assert len(tags) == TAG_ROUNDS
        for name, tag_id in tags.items():
            answers = [r["wins"][name] for r in results]
            winners = [a for a in answers if a is not False]
            assert winners == [tag_id], (name, answers)
        client.close()

    with sqlite3.connect(db) as conn:
        install(conn)  # the collation its indexes are built with
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
