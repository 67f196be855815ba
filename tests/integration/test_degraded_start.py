"""Degraded start: `agap worker` and `agap keeper` started while their board is down.

Real processes against a real port: first nothing listens there (the board's database
exists, its server is not started), then the embedded board starts on that port. Each
daemon says once, on stderr, that the board is unreachable and that it keeps trying; it
retries quietly (the retries are visible at -v, which is what the test waits on, never a
fixed time) and starts working when the board answers. SIGTERM during the wait exits 0;
bad configuration exits at once with its code and one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT, make_fabric
from tests.helpers import Lines, wait_until

TOKEN = "degraded-start-board-token-0123456789"
UNREACHABLE = "is unreachable"  # the one line a waiting daemon says
RETRIED = "failed too"  # each later try, at -v only


@dataclass
class DownBoard:
    """A bootstrapped board whose server is not running: its port refuses connections."""

    db: str
    port: int
    tasks: list[int]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jsonrpc.php"

    def start(self) -> EmbeddedBoard:
        return EmbeddedBoard(self.db, port=self.port, token=TOKEN).start()


def fabric_on(board: EmbeddedBoard, cards: CardSet, clock_offset: float = 0.0) -> Fabric:
    settings = Settings(board_url=board.url, board_token=TOKEN, cards_dir=ROOT / "cards")
    return make_fabric(
        KanboardClient(board.url, TOKEN), cards, clock=lambda: time.time() + clock_offset, settings=settings
    )


def state_of(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None


def agap(tmp_path: Path, url: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_", "LITELLM_"))}
    env = {
        **keep,
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": TOKEN,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "process-cache"),  # no layout cached: it must ask the board
        "AGAP_MODEL_MODE": "demo",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def one_warning(text: str, url: str) -> str:
    said = [line for line in text.splitlines() if UNREACHABLE in line]
    assert len(said) == 1, f"said more than once:\n{text[-3000:]}"
    assert url in said[0] and "until it answers" in said[0], said[0]
    assert "Traceback" not in text, text[-3000:]
    return said[0]


def test_a_worker_started_before_its_board_waits_then_claims_when_it_is_back(
    tmp_path: Path, cards: CardSet, reap: list[subprocess.Popen[str]]
) -> None:
    with EmbeddedBoard(tmp_path / "board.sqlite3", token=TOKEN) as first:
        fab = fabric_on(first, cards)
        down = DownBoard(
            first.store.path, first.port, [fab.submit("after the outage", target="kimi").task_id]
        )
    proc = agap(tmp_path, down.url, "worker", "--agent", "kimi", "-v", AGAP_BOARD_WAIT_CAP="1")
    reap.append(proc)
    err = Lines(proc.stderr)
    err.wait_for(UNREACHABLE, timeout=60)
    err.wait_for(RETRIED, count=2, timeout=60)  # it keeps trying, without saying so again
    assert proc.poll() is None, err.text()
    board = down.start()
    try:
        again = fabric_on(board, cards)
        wait_until(
            lambda: state_of(again, down.tasks[0]) == State.DONE,
            timeout=60,
            what="the worker to claim and finish the task once the board is back",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.text()
    finally:
        board.stop()
    text = err.close()
    line = one_warning(text, down.url)
    assert "worker kimi" in line
    assert "answers after" in text, "it says when the board is back"


def test_the_keeper_started_before_its_board_waits_then_sweeps_when_it_is_back(
    tmp_path: Path, cards: CardSet, reap: list[subprocess.Popen[str]]
) -> None:
    with EmbeddedBoard(tmp_path / "board.sqlite3", token=TOKEN) as first:
        # Claimed ten minutes ago with a one-minute lease: expired, for the keeper to requeue.
        past = fabric_on(first, cards, clock_offset=-600)
        tid = past.submit("expired while the board was down", target="kimi").task_id
        past.ledger.claim(past.board.read(tid), "gone-worker", lease_seconds=60)
        down = DownBoard(first.store.path, first.port, [tid])
    proc = agap(tmp_path, down.url, "keeper", "-v", AGAP_BOARD_WAIT_CAP="1", AGAP_KEEPER_LEASE_GRACE="0")
    reap.append(proc)
    err = Lines(proc.stderr)
    err.wait_for(UNREACHABLE, timeout=60)
    err.wait_for(RETRIED, count=2, timeout=60)
    assert proc.poll() is None and not err.matching("keeper running"), err.text()
    board = down.start()
    try:
        again = fabric_on(board, cards)
        err.wait_for("keeper running", timeout=60)
        wait_until(
            lambda: state_of(again, tid) == State.QUEUED,
            timeout=60,
            what="the keeper to requeue the expired lease once the board is back",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.text()
    finally:
        board.stop()
    line = one_warning(err.close(), down.url)
    assert line.split(" agap.board WARNING ", 1)[-1].startswith("keeper:")


@pytest.mark.parametrize("command", [["worker", "--agent", "kimi"], ["keeper"]], ids=["worker", "keeper"])
def test_sigterm_while_waiting_for_the_board_exits_0_at_once(
    command: list[str], tmp_path: Path, reap: list[subprocess.Popen[str]]
) -> None:
    url = "http://127.0.0.1:9/jsonrpc.php"  # nothing listens there (never an ephemeral port)
    proc = agap(tmp_path, url, *command, AGAP_BOARD_WAIT_CAP="10m")  # long waits: SIGTERM cuts them
    reap.append(proc)
    err = Lines(proc.stderr)
    err.wait_for(UNREACHABLE, timeout=60)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.text()
    assert time.monotonic() - t0 < 10, "the wait is cut short, not slept out"
    one_warning(err.close(), url)


@pytest.mark.parametrize("command", [["worker", "--agent", "kimi"], ["keeper"]], ids=["worker", "keeper"])
def test_a_rejected_token_exits_3_at_once_with_one_line(
    command: list[str], embedded_board: EmbeddedBoard, tmp_path: Path
) -> None:
    proc = agap(tmp_path, embedded_board.url, *command)  # TOKEN is not this board's token
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    errors = [line for line in err.splitlines() if line.startswith("agap: error:")]
    assert len(errors) == 1 and "rejected the credentials" in errors[0], err
    assert UNREACHABLE not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "command", [["worker", "--agent", "kimi"], ["keeper", "--once"]], ids=["worker", "keeper"]
)
def test_a_bad_wait_setting_exits_2_with_one_line(command: list[str]) -> None:
    env = {
        "KANBOARD_URL": "http://127.0.0.1:9/jsonrpc.php",
        "KANBOARD_API_TOKEN": TOKEN,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_BOARD_WAIT_CAP": "soon",
    }
    res = CliRunner().invoke(main, command, env=env)
    assert res.exit_code == 2, res.output
    assert "AGAP_BOARD_WAIT_CAP" in res.output and "soon" in res.output
