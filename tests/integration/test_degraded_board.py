"""The degraded mode: Kanboard goes away mid-run and comes back on the same port and DB.

Real processes: `agap worker` x3 on two queues and `agap keeper` (with its metrics
endpoint), the model plane a loopback stand-in. While the board is down, workers park and
retry and the keeper reports board_up=0; nothing crashes. When it is back, every task ends
done exactly once, and every process still exits 0 on SIGTERM.

To extend (A2A, once `agap a2a serve` lands): start it in :class:`Stack` like the keeper,
and in ``during_outage`` make a sync call that must still answer, then check after the
restart that it was journaled to the board.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardError
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.fakes.litellm_proxy import free_port
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import wait_until as _wait_until

TOKEN = "degraded-mode-board-token-0123456789"
METRICS_TOKEN = "degraded-mode-metrics-token-0123456789"

_MODEL_CARD = """\
id: {id}
kind: model
name: {id}
tier: small
trust: trusted
capabilities: [chat]
runtime:
  mode: gateway
  model: openai/stub
  poll_seconds: 0.1
  lease_seconds: 6
  backoff_seconds: 0.1
  max_attempts: 5
"""
_HUMAN_CARD = """\
id: ops
kind: human
name: Ops
trust: human
runtime:
  mode: human
human:
  username: ops
  display_name: Ops
"""


def write_cards(root: Path) -> Path:
    cards = root / "cards"
    cards.mkdir(parents=True)
    for agent in ("alpha", "beta"):
        (cards / f"{agent}.yaml").write_text(_MODEL_CARD.format(id=agent))
    (cards / "ops.yaml").write_text(_HUMAN_CARD)
    return cards


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Wait through the outage: a board or broker that is down counts as "not yet"."""
    return _wait_until(check, timeout, what, ignoring=(requests.RequestException, OSError, BoardError))


@dataclass
class Stack:
    """The board, the workers and the keeper, each its own OS process.

    The board runs as ``agap board serve`` (an :class:`EmbeddedBoard` on a fixed port and
    DB): killing the process drops every open connection, as a real outage does (an
    in-process ``EmbeddedBoard.stop()`` keeps serving the keep-alive connections it has).
    """

    root: Path
    stub: OpenAIStub
    cards_dir: Path
    board_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    board: subprocess.Popen[str] | None = None

    @property
    def board_url(self) -> str:
        return f"http://127.0.0.1:{self.board_port}/jsonrpc.php"

    def start_board(self) -> None:
        """``agap board serve`` on the same port and DB every time; wait until it answers."""
        log = (self.root / "board.log").open("a")
        env = {**self.env, "AGAP_BOARD_TOKEN": TOKEN}
        self.board = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fabric.apps.cli",
                "board",
                "serve",
                "--db",
                str(self.root / "board.sqlite3"),
                "--port",
                str(self.board_port),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        client = KanboardClient(self.board_url, TOKEN)
        try:
            # A bound, not a pace: a process start on a loaded machine can take this long.
            wait_until(lambda: client.call("getVersion"), timeout=60, what="the board to answer")
        except BaseException:
            self.board.kill()  # never leave a board process behind
            self.board.wait(timeout=10)
            raise

    def kill_board(self) -> None:
        """The board dies (SIGKILL: no goodbye to anyone)."""
        assert self.board is not None
        self.board.kill()
        self.board.wait(timeout=10)

    @property
    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_", "LITELLM_"))}
        return {
            **keep,
            "KANBOARD_URL": self.board_url,
            "KANBOARD_API_TOKEN": TOKEN,
            "AGAP_CARDS_DIR": str(self.cards_dir),
            "AGAP_STATE_DIR": str(self.root / "state"),
            "XDG_CACHE_HOME": str(self.root / "cache"),
            "AGAP_MODEL_MODE": "gateway",
            "AGAP_LITELLM_URL": self.stub.url,
            "AGAP_LITELLM_KEY": self.stub.api_key,
            "AGAP_KEEPER_METRICS_TOKEN": METRICS_TOKEN,
            "AGAP_KEEPER_LEASE_GRACE": "1",
            "AGAP_KEEPER_LEASES_EVERY": "1",
            "AGAP_KEEPER_GAPS_EVERY": "1",
            "AGAP_KEEPER_GESTURES_EVERY": "2",
            "AGAP_KEEPER_INBOX_EVERY": "2",
            "AGAP_KEEPER_DEADLINES_EVERY": "2",
            "AGAP_KEEPER_REMINDERS_EVERY": "5",
            "AGAP_KEEPER_GC_EVERY": "1h",
            "AGAP_KEEPER_BACKOFF": "1",
            "AGAP_KEEPER_BACKOFF_CAP": "3",
        }

    def start(self, name: str, *args: str) -> None:
        log = (self.root / f"{name}.log").open("w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "fabric.apps.cli", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]

    def met_the_outage(self, name: str) -> bool:
        text = (self.root / f"{name}.log").read_text(errors="replace")
        return any(s in text for s in ("board unavailable", "board away", "heartbeat for task"))

    def alive(self) -> dict[str, int | None]:
        return {name: p.poll() for name, p in self.procs.items()}

    def metrics(self) -> dict[str, Any]:
        resp = requests.get(
            f"http://127.0.0.1:{self.metrics_port}/metrics.json",
            timeout=2,
            headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
        )
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def served_metrics(self) -> dict[str, Any] | None:
        """The keeper's metrics, or None while its listener is not up yet (it must be alive)."""
        assert self.procs["keeper"].poll() is None, self.log("keeper")
        try:
            return self.metrics()
        except requests.ConnectionError:
            return None

    def stop_all(self) -> dict[str, int]:
        """SIGTERM every fabric process; their exit codes. Then stop the board."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = -9
        if self.board is not None and self.board.poll() is None:
            self.board.terminate()
            try:
                self.board.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.board.kill()
                self.board.wait(timeout=10)
        return codes


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    def think(body: dict[str, Any]) -> str:
        time.sleep(0.4)
        return f"answer from {body['model']}"

    with OpenAIStub(reply=think) as s:
        yield s


def test_the_board_going_down_mid_run_parks_everyone_and_loses_nothing(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    cards_dir = write_cards(tmp_path)
    cards = load_cards(cards_dir, base_dir=tmp_path)
    stack = Stack(tmp_path, stub, cards_dir)
    stack.start_board()
    settings = Settings(board_url=stack.board_url, board_token=TOKEN, cards_dir=cards_dir)
    fab: Fabric = make_fabric(KanboardClient(stack.board_url, TOKEN), cards, settings=settings)
    tasks = [fab.submit(f"job {i}", target="alpha" if i % 3 else "beta").task_id for i in range(15)]

    def states() -> list[State | None]:
        views = fab.board.read_many(tasks)
        return [v.current.state if v.current else None for v in views.values()]

    try:
        stack.start("keeper", "keeper", "--metrics-port", str(stack.metrics_port))
        stack.start("alpha-1", "worker", "--agent", "alpha")
        stack.start("alpha-2", "worker", "--agent", "alpha")
        stack.start("beta-1", "worker", "--agent", "beta")
        wait_until(
            lambda: states().count(State.DONE) >= 3 and State.WORKING in states(),
            timeout=60,
            what="some tasks done and some in flight",
        )
        # The keeper starts beside the workers, not before them: wait for its listener.
        wait_until(
            lambda: (m := stack.served_metrics()) is not None and m["board_up"] == 1,
            timeout=60,
            what="the keeper serving its metrics with the board up",
        )

        stack.kill_board()  # Kanboard goes away mid-run
        wait_until(
            lambda: stack.metrics()["board_up"] == 0, timeout=20, what="the keeper to report the board down"
        )
        # Every worker has met the dead board (a poll, a heartbeat or a write that failed).
        wait_until(
            lambda: all(stack.met_the_outage(n) for n in stack.procs if n != "keeper"),
            timeout=30,
            what="every worker to notice the board is gone",
        )
        assert all(code is None for code in stack.alive().values()), {
            n: stack.log(n) for n, c in stack.alive().items() if c is not None
        }

        stack.start_board()  # back on the same port, with the same DB
        wait_until(
            lambda: all(s == State.DONE for s in states()),
            timeout=90,
            what="every task done after the board came back",
        )
        # The keeper recovered: its sweeps reach the board again and see the drained queues.
        metrics = wait_until(
            lambda: (m := stack.metrics())["board_up"] == 1 and m["queued"] == 0 and m["working"] == 0 and m,
            timeout=30,
            what="the keeper to see the board again",
        )
        assert metrics["board_errors_total"] >= 1, "the keeper noticed the outage"
        assert metrics["jobs"]["leases"]["last_success"] > time.time() - 15
        assert all(code is None for code in stack.alive().values()), "nothing crashed"
    finally:
        codes = stack.stop_all()
    assert codes == {name: 0 for name in codes}, {n: stack.log(n) for n in codes if codes[n]}

    with EmbeddedBoard(tmp_path / "board.sqlite3", token=TOKEN) as after:
        check = make_fabric(
            KanboardClient(after.url, TOKEN),
            cards,
            settings=Settings(board_url=after.url, board_token=TOKEN, cards_dir=cards_dir),
        )
        views = check.board.read_many(tasks)
        assert len(views) == len(tasks), "no task lost"
        for tid, view in views.items():
            ops = [r.op for _, r in sorted(view.records.items())]
            assert ops.count("complete") == 1, (tid, ops)
            assert view.current is not None and view.current.state == State.DONE
            assert view.current.result_ref, "the result is recorded"
