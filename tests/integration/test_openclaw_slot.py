"""OpenClaw's command automation: ``sh -lc /abs/agap-slot …`` with the environment it has.

OpenClaw runs a command payload as ``sh -lc <command>``; the login shell's profile resets
PATH, and the automation carries no secret. The wrapper names agap by an absolute path and
agap reads ~/.config/agap/env. The slots here are real cron expressions on the real clock:
``* * * * *`` is always inside its grace (its latest time is under 60 s ago), and
``0 0 1 1 *`` is always past it (except in the first minute of a year).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.settings.resolve import Settings
from tests.conftest import ROOT

WRAPPER = ROOT / "integrations" / "openclaw" / "agap-slot"
AGAP = Path(sys.executable).parent / "agap"


@pytest.fixture
def home(embedded_board: EmbeddedBoard, tmp_path: Path) -> Path:
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    init = CliRunner().invoke(main, ["init"], env={**env, "AGAP_EVENTS_URL": ""})
    assert init.exit_code == 0, init.output
    home = tmp_path / "home"
    (home / ".config" / "agap").mkdir(parents=True)
    (home / ".config" / "agap" / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return home


@pytest.fixture
def fab(embedded_board: EmbeddedBoard) -> Fabric:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return Fabric.connect(settings, cards=load_cards(ROOT / "cards", base_dir=ROOT))


def sh_lc(home: Path, command: str) -> subprocess.CompletedProcess[str]:
    """As OpenClaw runs a command automation: ``sh -lc`` in a bare environment."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "TERM": "dumb", "PWD": str(home)}
    return subprocess.run(
        ["sh", "-lc", command], env=env, cwd=home, capture_output=True, text=True, timeout=60, check=False
    )


def slot(job: str, cron: str, *args: str, agap_bin: bool = True) -> str:
    prefix = f"AGAP_BIN={AGAP} " if agap_bin else ""
    quoted = " ".join(f"'{a}'" for a in args)
    return f"{prefix}{WRAPPER} {job} '{cron}' Europe/Berlin {quoted}"


def test_a_slot_fired_twice_under_sh_lc_is_one_task(home: Path, fab: Fabric) -> None:
    assert WRAPPER.is_file() and os.access(WRAPPER, os.X_OK)
    cmd = slot("water", "* * * * *", "--target", "adolf", "--intent", "Water the plants", "--json")
    for _ in range(3):  # two firings in one minute (a pair straddling the minute is tried again)
        t0 = time.time()
        first, again = sh_lc(home, cmd), sh_lc(home, cmd)
        if int(t0 // 60) == int(time.time() // 60):
            break
    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    assert two["task_id"] == one["task_id"] and two["created"] is False
    spec = fab.show(one["task_id"]).spec
    assert spec is not None and spec.actor == "openclaw" and spec.target == "adolf"
    planned = int(t0 // 60) * 60
    assert spec.action_id == "openclaw/water/" + time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(planned))


def test_the_checkouts_agap_is_found_without_agap_bin(home: Path) -> None:
    done = sh_lc(
        home, slot("feed", "* * * * *", "--target", "adolf", "--intent", "Feed the cat", agap_bin=False)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("task:")


def test_a_missed_slot_is_refused_in_one_line_and_makes_no_task(home: Path, fab: Fabric) -> None:
    before = len(fab.listing(include_closed=True))
    done = sh_lc(home, slot("new-year", "0 0 1 1 *", "--target", "adolf", "--intent", "Happy new year"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("agap: error: --slot: slot ")
    assert "past the 60 s grace: missed, not run late" in done.stderr
    assert len(fab.listing(include_closed=True)) == before


def test_a_wrong_target_is_one_line_and_makes_no_task(home: Path, fab: Fabric) -> None:
    before = len(fab.listing(include_closed=True))
    done = sh_lc(home, slot("water", "* * * * *", "--target", "kimmi", "--intent", "Water the plants"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "unknown agent 'kimmi'" in done.stderr
    assert len(fab.listing(include_closed=True)) == before


def test_the_wrapper_without_its_arguments_says_how(home: Path) -> None:
    done = sh_lc(home, f"{WRAPPER} water")
    assert done.returncode == 2 and done.stderr.startswith(
        "agap-slot: error: usage: agap-slot JOB 'CRON' ZONE"
    )
