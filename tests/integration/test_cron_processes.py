"""Two cron processes firing the same schedule make one task (real processes, real HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import fabric.apps.cli.cron_cmd  # noqa: F401 - registers `agap cron` until the CLI lists it
from fabric.apps.cli import main
from fabric.apps.cron import CronState
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.fit import fit
from fabric.kanboard.layout import META_SPEC
from fabric.kanboard.port import Call
from fabric.task import TaskSpec
from tests.conftest import ROOT
from tests.helpers import wait_until

AGAP = [
    sys.executable,
    "-c",
    "import sys, fabric.apps.cli.cron_cmd; from fabric.apps.cli import main; sys.argv[0] = 'agap'; main()",
]

SCHEDULES = """
timezone: UTC
schedules:
  - name: daily
    cron: "0 6 * * *"
    target: gemma-local
    intent: "Daily check for {planned:%Y-%m-%d}"
  - name: fast
    every: 2s
    target: gemma-local
    intent: "tick"
    key: "fast/{ts}"
"""


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        {
            "KANBOARD_URL": embedded_board.url,
            "KANBOARD_API_TOKEN": embedded_board.token,
            "AGAP_CARDS_DIR": str(ROOT / "cards"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "AGAP_STATE_DIR": str(tmp_path / "state"),
            "AGAP_SCHEDULES": str(tmp_path / "s.yaml"),
            "PYTHONPATH": str(ROOT),
        }
    )
    (tmp_path / "s.yaml").write_text(SCHEDULES)
    res = CliRunner().invoke(main, ["init"], env=e, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return e


def keyed_tasks(board: EmbeddedBoard) -> Counter[str]:
    """``actor:key`` -> how many tasks carry it (read from each task's spec)."""
    client = fit(KanboardClient(board.url, board.token))
    project = client.call("getProjectByName", {"name": "Agent Fabric"})
    # A keyed task's reference is its receipt's hash (fabric.kanboard.layout.receipt_reference).
    rows = client.call("searchTasks", {"project_id": int(project["id"]), "query": "ref:rcpt:*"})
    out = client.batch([Call("getTaskMetadata", {"task_id": int(r["id"])}) for r in rows or []])
    # A task created a moment ago may not have its spec yet (createTask, then its metadata):
    # it is counted once it has one; the final counts are read after the daemons stopped.
    metas = [o.unwrap() for o in out]
    specs = [TaskSpec.from_meta(m[META_SPEC]) for m in metas if META_SPEC in m]
    return Counter(f"{s.actor}:{s.action_id}" for s in specs)


def test_two_processes_firing_at_once_make_one_task(
    env: dict[str, str], embedded_board: EmbeddedBoard
) -> None:
    for _ in range(3):
        procs = [
            subprocess.Popen(
                [*AGAP, "cron", "--once", "daily", "--json"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        results = [json.loads(o) for o, _ in outs]
        assert results[0]["task_id"] == results[1]["task_id"]
        assert results[0]["key"] == results[1]["key"]
    counts = keyed_tasks(embedded_board)
    assert len(counts) == 1 and set(counts.values()) == {1}, counts
    state = json.loads(Path(env["AGAP_STATE_DIR"], "cron-state.json").read_text())["schedules"]
    assert state["daily"]["fired"] == 1 and state["daily"]["deduplicated"] == 5
    assert state["daily"]["last_planned_iso"].endswith("T06:00:00+00:00")


def test_two_cron_daemons_make_one_task_per_planned_time(
    env: dict[str, str], embedded_board: EmbeddedBoard, tmp_path: Path
) -> None:
    procs = []
    for i in range(2):
        e = dict(env, AGAP_STATE_DIR=str(tmp_path / f"state{i}"))  # separate state: the race is real
        procs.append(
            subprocess.Popen(
                [*AGAP, "cron"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )

    def fired_by(i: int) -> bool:
        """Daemon ``i`` has fired (or found already made) a planned time of the fast schedule."""
        entry = CronState(tmp_path / f"state{i}").read().get("fast", {})
        return bool(entry.get("last_planned") and entry.get("last_actual"))

    try:
        # Conditions, never a fixed time (a loaded machine starts the daemons slowly): two
        # planned times of the 2 s schedule on the board, and each daemon took part.
        wait_until(
            lambda: len([k for k in keyed_tasks(embedded_board) if k.startswith("cron:fast/")]) >= 2,
            timeout=90,
            what="two firings of the fast schedule",
        )
        wait_until(lambda: fired_by(0) and fired_by(1), timeout=90, what="both daemons to fire the schedule")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.communicate(timeout=30)
    counts = keyed_tasks(embedded_board)
    fast = {k: n for k, n in counts.items() if k.startswith("cron:fast/")}
    assert len(fast) >= 2, counts
    assert set(fast.values()) == {1}, f"a planned time made more than one task: {fast}"
    for i in range(2):
        e = json.loads((tmp_path / f"state{i}" / "cron-state.json").read_text())["schedules"]
        assert e["fast"]["last_planned"] and e["fast"]["last_actual"] >= e["fast"]["last_planned"]
