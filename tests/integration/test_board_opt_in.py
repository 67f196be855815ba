"""A test never writes to a Kanboard it was not explicitly given, nor to one in use.

The README's tour exports ``KANBOARD_URL``; a shell that points at a household's Kanboard
and then runs ``make test`` must leave that board as it was. Here a pytest run of the
real-board contract tests is started as a user would, with the fabric's variables set to
a board that holds a household's project, then with the tests' own variable naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from tests.conftest import REAL_FLAVOUR, REAL_TOKEN, REAL_URL, ROOT, SCRATCH_MARK

SELECT = ["tests/contract/test_projects.py", "-k", "real", "-q", "-n", "0"]


def _projects(board: EmbeddedBoard) -> list[str]:
    client = KanboardClient(board.url, board.token)
    try:
        return sorted(p["name"] for p in client.call("getAllProjects"))
    finally:
        client.close()


def _pytest(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *SELECT, "-rs"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_kanboard_url_in_the_shell_sends_no_test_to_that_board(tmp_path: Path) -> None:
    with EmbeddedBoard(tmp_path / "household.sqlite3") as board:
        KanboardClient(board.url, board.token).call("createProject", {"name": "Household"})
        done = _pytest(
            {"KANBOARD_URL": board.url, "KANBOARD_API_TOKEN": board.token, "KANBOARD_FLAVOUR": "sqlite"}
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "skipped" in done.stdout and REAL_URL in done.stdout, done.stdout
        assert _projects(board) == ["Household"]


def test_a_named_board_that_holds_other_projects_is_refused_untouched(tmp_path: Path) -> None:
    with EmbeddedBoard(tmp_path / "household.sqlite3") as board:
        KanboardClient(board.url, board.token).call("createProject", {"name": "Household"})
        done = _pytest({REAL_URL: board.url, REAL_TOKEN: board.token, REAL_FLAVOUR: "sqlite"})
        assert done.returncode != 0
        assert "holds projects the tests did not make (Household)" in done.stdout, done.stdout
        assert _projects(board) == ["Household"]


def test_an_empty_named_board_is_marked_and_used(tmp_path: Path) -> None:
    with EmbeddedBoard(tmp_path / "scratch.sqlite3", flavour="sqlite") as board:
        done = _pytest({REAL_URL: board.url, REAL_TOKEN: board.token, REAL_FLAVOUR: "sqlite"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert "passed" in done.stdout and "skipped" not in done.stdout, done.stdout
        assert SCRATCH_MARK in _projects(board)
