"""``agap up``: the whole fabric on the embedded board, offline (what ``make run`` runs).

Starts the embedded board, bootstraps it from the cards, then supervises one worker
process per agent that has a worker, the keeper (when present) and ``agap cron`` on the
schedule file (``AGAP_SCHEDULES`` when that file exists, else ``schedules.example.yaml``).
Models default to the offline demo model, so nothing needs an API key; with
``AGAP_HINDSIGHT_URL`` unset, ``hindsight://`` refs recall from an embedded stand-in
seeded with demo memories (:mod:`fabric.embedded.hindsight`). Ctrl-C stops everything.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

from fabric import cardcache
from fabric.apps.cli import logs, main
from fabric.apps.web import WebView
from fabric.cards import Card, CardSet
from fabric.embedded.hindsight import HindsightStandIn
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import ConfigError
from fabric.kanboard.bootstrap import init_board, save_layout_cache
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.principals import (
    agent_password,
    board_username,
    confined,
    home_names,
    password_variable,
)
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import STOP_BOUND, exit_on_signal, grace, set_on_signal

RESTART_DELAY = 5.0
# Runs a command with SIGINT ignored, without a Python pre-exec hook (unsafe with threads).
IGNORE_SIGINT = ["/bin/sh", "-c", 'trap "" INT; exec "$0" "$@"']
EXAMPLE_SCHEDULES = "schedules.example.yaml"


def worker_agents(cards: CardSet) -> list[str]:
    """Agents whose queue a worker daemon drains (not humans, not external runtimes)."""
    return [c.id for c in cards if c.kind != "human" and c.runtime.mode not in ("human", "external")]


def schedule_file() -> Path | None:
    """The schedules ``agap up`` runs: ``AGAP_SCHEDULES`` when it exists, else the example."""
    for candidate in (registry.get_path("AGAP_SCHEDULES"), Path(EXAMPLE_SCHEDULES)):
        if candidate.is_file():
            return candidate
    return None


def shell_setup(
    board: EmbeddedBoard, model_mode: str, hindsight_url: str = "", *, explicit: dict[str, str] | None = None
) -> str:
    """The lines a second shell needs to use this fabric (the README's tour starts with them).

    ``agap`` is put on PATH from this interpreter's directory (the venv ``make run`` made):
    nothing in the tour assumes an activated venv. ``explicit``: settings this process was
    given (its cards, its state), which the second shell must share.
    """
    lines = [f"cd {shlex.quote(str(Path.cwd()))}"]
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a symlink
    if (bin_dir / "agap").exists():
        lines.append(f"export PATH={shlex.quote(str(bin_dir))}:$PATH")
    lines.append(f"export KANBOARD_URL={board.url}")
    lines.append(f"export KANBOARD_API_TOKEN={board.token}")
    if model_mode:
        lines.append(f"export AGAP_MODEL_MODE={shlex.quote(model_mode)}")
    if hindsight_url:
        lines.append(f"export AGAP_HINDSIGHT_URL={hindsight_url}")
    for name, value in sorted((explicit or {}).items()):
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(f"  {line}" for line in lines)


class Supervisor:
    """Keeps child processes running; stops them all with SIGTERM, then SIGKILL."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: dict[str, tuple[list[str], subprocess.Popen[bytes]]] = {}
        self.restart_at: dict[str, float] = {}
        self.envs: dict[str, dict[str, str]] = {}  # a child's own environment, if not env
        self.stopping = threading.Event()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        if self.stopping.is_set():
            return  # told to stop while starting the others: start nothing more
        if env is not None:
            self.envs[name] = env
        # In this process group: Ctrl-C in the terminal reaches the children too, and the
        # SIGTERM sent below then is the same stop said twice (fabric.signals ignores it).
        # A child starts with SIGINT ignored (Python keeps an ignored SIGINT so, until the
        # daemon's own handler): a Ctrl-C while its interpreter is still loading would end
        # it with a traceback. `agap up` stops it with SIGTERM.
        proc = subprocess.Popen([*IGNORE_SIGINT, *argv], env=self.envs.get(name, self.env))
        self.children[name] = (argv, proc)

    def watch(self) -> None:
        for name, (argv, proc) in list(self.children.items()):
            code = proc.poll()
            if code is None:
                continue
            due = self.restart_at.setdefault(name, time.monotonic() + RESTART_DELAY)
            if time.monotonic() >= due:
                click.echo(f"agap up: {name} exited with {code}; restarting", err=True)
                self.restart_at.pop(name)
                self.start(name, argv)

    def stop(self, deadline: float) -> None:
        """SIGTERM to every child at once; SIGKILL to any still running at ``deadline``
        (monotonic). A child's own watchdog ends it before that (:mod:`fabric.signals`)."""
        for _, proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, (_, proc) in self.children.items():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                click.echo(f"agap up: {name} did not stop in time; killed", err=True)
                proc.kill()
                proc.wait()

    def kill(self) -> None:
        """SIGKILL every child (``agap up``'s own watchdog, before it exits)."""
        for _, proc in self.children.values():
            if proc.poll() is None:
                proc.kill()


def hold_state(state: Path) -> int:
    """Lock ``state`` for this ``agap up`` (the descriptor stays open for its lifetime)."""
    path = state / "agap-up.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.read(fd, 32).decode().strip() or "?"
        os.close(fd)
        raise ConfigError(
            f"another agap up is running on {state} (pid {pid})",
            hint="stop it first (Ctrl-C in its shell), or give this one its own AGAP_STATE_DIR",
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def wipe_state(state: Path) -> None:
    """Delete everything in ``state`` but its lock: the demo board, counters, cron state."""
    for entry in state.iterdir():
        if entry.name == "agap-up.lock":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _stand_in(port: int) -> HindsightStandIn:
    """The Hindsight stand-in on ``port`` (any port when that one is taken, or 0)."""
    try:
        return HindsightStandIn.with_demo_memories(port=port).start()
    except OSError:
        return HindsightStandIn.with_demo_memories().start()


def _derived_password(token: str, agent: str) -> str:
    """A confined agent's board password under `agap up`: a function of the board's token."""
    return hmac.new(token.encode(), f"agap up board user {agent}".encode(), hashlib.sha256).hexdigest()


def _worker_env(env: dict[str, str], card: Card, passwords: dict[str, str]) -> dict[str, str] | None:
    """A confined agent's worker signs in as its own user, without the app token."""
    if card.id not in passwords:
        return None
    own = {k: v for k, v in env.items() if k != "KANBOARD_API_TOKEN"}
    return {**own, "AGAP_BOARD_USER": board_username(card), "AGAP_BOARD_PASSWORD": passwords[card.id]}


@main.command("up")
@click.option(
    "--port",
    type=int,
    default=lambda: registry.get_int("AGAP_BOARD_PORT"),
    help="Board port on 127.0.0.1 (AGAP_BOARD_PORT, default 8765; 0 = any).",
)
@click.option("--no-workers", is_flag=True, help="Only the board (and init).")
@click.option("--reset", is_flag=True, help="Start over: delete this state's demo board and state first.")
@click.option("--no-start", is_flag=True, help="With --reset: only start over (`make reset`); start nothing.")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="The workers' and keeper's INFO lines (-vv: DEBUG); by default only warnings.",
)
def up_cmd(port: int, no_workers: bool, reset: bool, no_start: bool, verbose: int) -> None:
    """Run the fabric on the embedded board: board, init, workers, keeper. Ctrl-C stops."""
    exit_on_signal(0)  # a stop during start-up exits 0 (no child is started yet)
    settings = Settings.from_env()
    state = settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    _lock = hold_state(state)  # one agap up per state, for as long as this runs
    if reset:
        wipe_state(state)
        if no_start:
            click.echo(f"agap up: {state} is empty; `make run` starts the demo afresh")
            return
    elif no_start:
        raise ConfigError("--no-start only goes with --reset", hint="run `agap up --reset --no-start`")
    # As a daemon loads them; clean cards are remembered, so each worker started below
    # reads them back instead of checking them again (fabric.cardcache).
    cards, problems = cardcache.daemon_cards(settings.cards_dir)
    for p in problems:  # said once, here (the children are told they are supervised)
        click.echo(f"agap up: {p} — not started until it is fixed", err=True)
    board = _board(state, port)
    settings = Settings(**{**settings.__dict__, "board_url": board.url, "board_token": board.token})
    board.set_view(WebView(board.api, settings))  # read-only page, same token
    # Each confined agent's board password: the operator's, else one derived from the
    # board's token (stable across restarts). `agap init` reads them from the environment.
    passwords = {
        c.id: agent_password(c) or _derived_password(board.token, c.id) for c in cards if confined(c)
    }
    given = {password_variable(cards.get(a)): pw for a, pw in passwords.items()}
    report = init_board(KanboardClient(board.url, board.token), settings, cards, env=given)
    assert report.layout is not None
    save_layout_cache(settings, report.layout)
    env = _children_env(board, settings, exclude=set(given))
    # No Hindsight named: the stand-in, so the shipped reflect schedule has a bank to read.
    # Next to the board's port, so the lines pasted in another shell stay true across runs.
    memory = None
    if not registry.get_str("AGAP_HINDSIGHT_URL", fallback=""):
        memory = _stand_in(board.port + 1 if port else 0)
        env["AGAP_HINDSIGHT_URL"] = memory.url
    sup = Supervisor(env)
    asked: list[float] = []
    # From here a stop is orderly: the children get the daemons' grace to stop on their
    # own, then SIGKILL; `agap up` is gone inside the 3 s bound (its watchdog kills them
    # all if not). Before, a stop exits at once: the board and init are transactional.
    set_on_signal(
        sup.stopping, note=lambda _: asked.append(time.monotonic()), on_force=sup.kill, grace=STOP_BOUND - 0.2
    )
    started = [] if no_workers else _start_children(sup, settings, cards, passwords, verbose)
    shared = {k: env[k] for k in ("AGAP_CARDS_DIR", "AGAP_STATE_DIR") if registry.named(k)}
    paste = shell_setup(board, env["AGAP_MODEL_MODE"], memory.url if memory else "", explicit=shared)
    (state / "shell.env").write_text("\n".join(line.strip() for line in paste.splitlines()) + "\n")
    click.echo(_banner(state, board, env, sup, started, memory is not None, verbose, paste), err=False)
    sys.stdout.flush()
    try:
        while not sup.stopping.wait(0.2):
            sup.watch()
    finally:
        click.echo("agap up: stopping workers and the board…", err=True)
        sup.stop((asked[0] if asked else time.monotonic()) + grace() + 0.3)
        if memory is not None:
            memory.stop()
        board.stop()


def _board(state: Path, port: int) -> EmbeddedBoard:
    """The embedded board of ``state``, serving on ``port``."""
    try:
        return EmbeddedBoard(
            state / "board.sqlite3", port=port, token=registry.get_str("AGAP_BOARD_TOKEN") or None
        ).start()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
            hint="another program holds the port: set AGAP_BOARD_PORT (or --port) to another",
        ) from None


def _children_env(board: EmbeddedBoard, settings: Settings, *, exclude: set[str]) -> dict[str, str]:
    """The children's environment: this process's, with the board and the demo model
    filled in (an empty AGAP_MODEL_MODE keeps the cards' own modes); no child sees the
    agents' passwords (``exclude``) but the agent's own worker."""
    env = {
        **os.environ,
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_MODEL_MODE": registry.get_str("AGAP_MODEL_MODE", fallback="demo"),
        "AGAP_STATE_DIR": str(settings.state_dir.resolve()),
        "AGAP_CARDS_DIR": str(Path(settings.cards_dir).resolve()),
        "AGAP_SUPERVISED": "1",
    }
    return {k: v for k, v in env.items() if k not in exclude}


def _start_children(
    sup: Supervisor, settings: Settings, cards: CardSet, passwords: dict[str, str], verbose: int
) -> list[str]:
    """A worker per agent that has one, the keepers and cron; the agents started."""
    agents = worker_agents(cards)
    cli = [sys.executable, "-m", "fabric.apps.cli"]
    flags = logs.child_flags(verbose)
    for agent in agents:
        sup.start(
            f"worker {agent}",
            [*cli, "worker", "--agent", agent, *flags],
            _worker_env(sup.env, cards.get(agent), passwords),
        )
    if "keeper" in main.commands:
        sup.start("keeper", [*cli, "keeper", *flags])
        for card in (c for c in cards if confined(c)):  # each home has a keeper of its own
            work, locks = home_names(settings, card)
            home = {**sup.env, "AGAP_PROJECT": work, "AGAP_LOCKS_PROJECT": locks}
            sup.start(f"keeper {card.id}", [*cli, "keeper", *flags], home)
    schedules = schedule_file()
    if schedules is not None:
        sup.start("cron", [*cli, "cron", "--file", str(schedules), *flags])
    if zabbix_configured():  # the ops-agent only where there is a Zabbix to watch
        sup.start("ops", [*cli, "ops", *flags])
    return agents


def zabbix_configured() -> bool:
    """AGAP_ZABBIX_URL and AGAP_ZABBIX_TOKEN both set: ``agap ops`` has a Zabbix to poll."""
    return all(registry.get_str(name, fallback="") for name in ("AGAP_ZABBIX_URL", "AGAP_ZABBIX_TOKEN"))


def _banner(
    state: Path,
    board: EmbeddedBoard,
    env: dict[str, str],
    sup: Supervisor,
    agents: list[str],
    stand_in: bool,
    verbose: int,
    paste: str,
) -> str:
    cron = next((argv[-1] for name, (argv, _) in sup.children.items() if name == "cron"), None)
    ops = "running" if "ops" in sup.children else "not started (AGAP_ZABBIX_URL, AGAP_ZABBIX_TOKEN unset)"
    return f"""
agap fabric is up on the embedded board ({state / "board.sqlite3"}).
  board     {board.url}
  view      http://127.0.0.1:{board.port}/ (user jsonrpc, password: the token)
  workers   {", ".join(agents) or "none"} (model mode: {env["AGAP_MODEL_MODE"]})
  keeper    {"running" if "keeper" in sup.children else "not started"}
  cron      {cron or "not started (no schedule file)"}
  ops       {ops}
  hindsight {env["AGAP_HINDSIGHT_URL"]}{" (embedded stand-in, demo memories)" if stand_in else ""}
  logs      {"warnings only (agap up -v for the daemons' INFO lines)" if verbose <= 0 else "verbose"}

In another shell, paste these lines (or run: . {state / "shell.env"}), then follow README.md:
{paste}
  agap submit --target kimi --intent "Summarise the README" --ref "file://$PWD/README.md"
  agap ls

Ctrl-C stops everything."""
