"""Stop a daemon at a random moment and time its exit: the stop-bound test and ``bench.stop``.

Each trial starts a real ``agap`` process, sends it SIGTERM or SIGINT after a random delay
(inside its start-up or inside its work) and measures the time from the signal to the
process's exit. The delay is the experiment's variable, drawn before the process starts:
it chooses *when* the signal lands, it does not wait for anything to happen.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.signals import STOP_BOUND
from fabric.task import State
from tests.fakes.openai_stub import OpenAIStub

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "fabric.apps.cli"]
FORCED = "exiting now"  # what the watchdog says (fabric.signals)
SIGINT_FROM = 0.5


@dataclass(frozen=True)
class Trial:
    """One signal sent to one daemon."""

    daemon: str
    delay: float  # seconds after the start when the signal was sent
    signum: int
    seconds: float  # from the signal to the exit (inf: not gone within the wait)
    code: int | None
    stderr: str

    @property
    def forced(self) -> bool:
        """The watchdog ended it (the orderly stop did not finish within the grace)."""
        return FORCED in self.stderr

    @property
    def over(self) -> bool:
        return self.seconds > STOP_BOUND

    def line(self) -> str:
        name = signal.Signals(self.signum).name
        return (
            f"{self.daemon}: {name} at +{self.delay:.2f}s, gone {self.seconds:.2f}s later, exit {self.code}"
            + (" (watchdog)" if self.forced else "")
        )


@dataclass
class Daemon:
    """How to start one kind of daemon, and what to do to it while it runs."""

    name: str
    argv: list[str]
    env: dict[str, str]
    # Called right after the start, in a thread: gives the daemon work to be caught in
    # (a held connection, tasks to claim); returns what to undo afterwards.
    busy: Callable[[], Callable[[], None]] | None = None
    max_delay: float = 3.0
    cwd: Path = ROOT
    open_stdin: bool = False  # a stdio server: its client keeps stdin open
    # A supervisor (``agap up``): SIGINT goes to its whole process group, as a terminal's
    # Ctrl-C does, and it is gone only when every process of the group is.
    group: bool = False


@dataclass
class Results:
    trials: list[Trial] = field(default_factory=list)

    def over(self) -> list[Trial]:
        return [t for t in self.trials if t.over]

    def forced(self) -> list[Trial]:
        return [t for t in self.trials if t.forced]

    def seconds(self, daemon: str | None = None) -> list[float]:
        return sorted(t.seconds for t in self.trials if daemon is None or t.daemon == daemon)

    def summary(self) -> str:
        return "\n".join(t.line() for t in self.trials)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


def stop_once(daemon: Daemon, delay: float, signum: int = signal.SIGTERM, wait: float = 15.0) -> Trial:
    """Start ``daemon``, signal it ``delay`` seconds later, and time its exit."""
    proc = subprocess.Popen(
        daemon.argv,
        env=daemon.env,
        cwd=daemon.cwd,
        stdin=subprocess.PIPE if daemon.open_stdin else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal meant for the test run never reaches it
    )
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(proc.stderr or ()), daemon=True)
    reader.start()
    undo: list[Callable[[], None]] = []
    if daemon.busy is not None:
        busy = daemon.busy
        threading.Thread(target=lambda: undo.append(busy()), daemon=True).start()
    threading.Event().wait(delay)  # the random moment the signal lands (see the module doc)
    sent = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        if daemon.group and signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    try:
        code: int | None = proc.wait(wait)
        if daemon.group and not group_gone(proc.pid, sent + wait):
            raise subprocess.TimeoutExpired(daemon.argv, wait)
        seconds = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        code, seconds = None, float("inf")
    with_kids_gone(proc.pid)
    reader.join(5)
    if proc.stdin is not None:
        proc.stdin.close()
    for fn in undo:
        fn()
    return Trial(daemon.name, delay, signum, seconds, code, "".join(chunks))


def group_gone(pgid: int, deadline: float) -> bool:
    """Wait (bounded) until no process of the group is left; True when none is."""
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        threading.Event().wait(0.01)  # polling the process table: there is no event for it
    return False


def with_kids_gone(pgid: int) -> None:
    """Kill whatever is left of the process group (a supervisor's children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_trials(daemons: Sequence[Daemon], trials: int, seed: int | None = None) -> Results:
    """``trials`` signals spread over ``daemons`` in turn, each at a random moment."""
    rng = random.Random(seed)
    out = Results()
    for i in range(trials):
        d = daemons[i % len(daemons)]
        signum = signal.SIGTERM if rng.random() < 0.7 else signal.SIGINT
        # SIGINT (a Ctrl-C) from half a second on: before Python has loaded any of the
        # fabric, its own handler answers with a KeyboardInterrupt traceback.
        low = SIGINT_FROM if signum == signal.SIGINT else 0.0
        out.trials.append(stop_once(d, rng.uniform(low, max(low, d.max_delay)), signum))
    return out


def held_connection(port: int) -> Callable[[], None]:
    """A client that sends half a request and waits: a server's graceful stop waits for it."""
    deadline = time.monotonic() + 20
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                return lambda: None
            threading.Event().wait(0.05)  # the server is still starting: poll the port
    sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{")
    return sock.close


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the fabric to stop: a household board, and a worker's queue with a slow model --------

STOP_CARD = """\
id: stopper
kind: model
name: A model that takes its time
tier: medium
trust: trusted
capabilities: [chat]
runtime:
  mode: gateway
  model: openai/stub
  poll_seconds: 0.05
  lease_seconds: 30
  backoff_seconds: 0.1
  max_attempts: 50
"""
PERSON = """\
id: alvis
kind: human
name: Alvis
trust: human
runtime:
  mode: human
human:
  username: alvis
  display_name: Alvis
"""


def base_env(tmp: Path, board: EmbeddedBoard, cards: Path) -> dict[str, str]:
    """A daemon's environment: this board, these cards, nothing of the caller's AGAP_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    return {
        **env,
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_CARDS_DIR": str(cards),
        "AGAP_STATE_DIR": str(tmp / "state"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "AGAP_ACTOR": "cron",
        "AGAP_KEEPER_METRICS_PORT": "0",
        "AGAP_KEEPER_HOOK_PORT": "0",
    }


def init(env: dict[str, str]) -> None:
    res = CliRunner().invoke(main, ["init"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output


@contextmanager
def household(tmp: Path) -> Iterator[dict[str, str]]:
    """The shipped household's cards on an embedded board, initialised."""
    with EmbeddedBoard(tmp / "board.sqlite3") as board:
        env = base_env(tmp, board, ROOT / "cards")
        init(env)
        yield env


@contextmanager
def slow_model(seconds: float = 4.0, seed: int = 7) -> Iterator[OpenAIStub]:
    """A provider whose answers take 0..``seconds``: signals land inside model calls."""
    rng = random.Random(seed)

    def reply(body: dict[str, Any]) -> str:
        threading.Event().wait(rng.uniform(0.0, seconds))  # the stand-in's thinking time
        return "an answer, eventually"

    with OpenAIStub(reply=reply) as stub:
        yield stub


@dataclass
class Queue:
    """The worker's board and environment, and the tasks the trials gave it."""

    env: dict[str, str]
    fab: Fabric
    submitted: list[int] = field(default_factory=list)

    def top_up(self) -> Callable[[], None]:
        """Two tasks queued as the worker starts (so signals land inside its work)."""
        views = self.fab.board.read_many(self.submitted).values()
        queued = [v for v in views if v.current and v.current.state == State.QUEUED]
        for i in range(max(0, 2 - len(queued))):
            self.submitted.append(self.fab.submit(f"think about {i}", target="stopper").task_id)
        return lambda: None


@contextmanager
def worker_queue(tmp: Path, model: OpenAIStub) -> Iterator[Queue]:
    """A board of its own for the ``stopper`` model card, in gateway mode against ``model``."""
    cards = tmp / "wcards"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "stopper.yaml").write_text(STOP_CARD)
    (cards / "alvis.yaml").write_text(PERSON)
    with EmbeddedBoard(tmp / "wboard.sqlite3") as board:
        env = {
            **base_env(tmp / "w", board, cards),
            "AGAP_MODEL_MODE": "gateway",
            "AGAP_LITELLM_URL": model.url,
            "AGAP_LITELLM_KEY": model.api_key,
        }
        init(env)
        port = KanboardClient(board.url, board.token)
        yield Queue(env, Fabric.connect(Settings.from_env(env), port=port))


def daemons(env: dict[str, str], queue: Queue) -> list[Daemon]:
    """Every daemon of the fabric, each with the work it is caught in."""
    a2a_port, mcp_port = free_port(), free_port()
    a2a_env = {**env, "AGAP_A2A_TOKENS": "tester:" + "a" * 32}
    mcp_env = {**env, "AGAP_MCP_TOKEN": "m" * 32}
    schedules = ROOT / "schedules.example.yaml"
    mcp = [*CLI, "mcp", "serve", "--agent", "adolf"]
    return [
        Daemon("worker", [*CLI, "worker", "--agent", "stopper"], queue.env, busy=queue.top_up, max_delay=5.0),
        Daemon("keeper", [*CLI, "keeper"], env),
        Daemon("cron", [*CLI, "cron", "--file", str(schedules)], env),
        Daemon(
            "a2a",
            [*CLI, "a2a", "serve", "--agent", "kimi", "--port", str(a2a_port)],
            a2a_env,
            busy=lambda: held_connection(a2a_port),
            max_delay=4.0,
        ),
        Daemon(
            "mcp-http",
            [*mcp, "--transport", "http", "--port", str(mcp_port)],
            mcp_env,
            busy=lambda: held_connection(mcp_port),
            max_delay=4.0,
        ),
        Daemon("mcp-stdio", mcp, env, open_stdin=True),
    ]


def agap_up(tmp: Path) -> Daemon:
    """``agap up`` in ``tmp`` (its own state), on any free board port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    env |= {
        "AGAP_STATE_DIR": str(tmp / "state"),
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
    }
    shutil.copy(ROOT / "schedules.example.yaml", tmp / "schedules.example.yaml")
    return Daemon("agap up", [*CLI, "up", "--port", "0"], env, max_delay=8.0, group=True, cwd=tmp)


__all__ = [
    "CLI",
    "FORCED",
    "Daemon",
    "Queue",
    "Results",
    "Trial",
    "agap_up",
    "base_env",
    "daemons",
    "free_port",
    "held_connection",
    "household",
    "init",
    "percentile",
    "run_trials",
    "slow_model",
    "stop_once",
    "worker_queue",
]
