"""``agap up``: the whole fabric on the embedded board, offline (what ``make run`` runs).

Starts the embedded board, bootstraps it from the cards, then supervises one worker
process per agent that has a worker (and the keeper, when present). Models default to
the offline demo model, so nothing needs an API key. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import click

from fabric.apps.cli import main
from fabric.apps.web import WebView
from fabric.cards import CardSet, load_cards
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import ConfigError
from fabric.kanboard.bootstrap import init_board, save_layout_cache
from fabric.kanboard.client import KanboardClient
from fabric.settings import registry
from fabric.settings.resolve import Settings

RESTART_DELAY = 5.0


def worker_agents(cards: CardSet) -> list[str]:
    """Agents whose queue a worker daemon drains (not humans, not external runtimes)."""
    return [c.id for c in cards if c.kind != "human" and c.runtime.mode not in ("human", "external")]


def shell_setup(board: EmbeddedBoard, model_mode: str) -> str:
    """The lines a second shell needs to use this fabric (the README's tour starts with them).

    ``agap`` is put on PATH from this interpreter's directory (the venv ``make run`` made):
    nothing in the tour assumes an activated venv.
    """
    lines = [f"cd {shlex.quote(str(Path.cwd()))}"]
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a symlink
    if (bin_dir / "agap").exists():
        lines.append(f"export PATH={shlex.quote(str(bin_dir))}:$PATH")
    lines.append(f"export KANBOARD_URL={board.url}")
    lines.append(f"export KANBOARD_API_TOKEN={board.token}")
    if model_mode:
        lines.append(f"export AGAP_MODEL_MODE={shlex.quote(model_mode)}")
    return "\n".join(f"  {line}" for line in lines)


class Supervisor:
    """Keeps child processes running; stops them all with SIGTERM, then SIGKILL."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: dict[str, tuple[list[str], subprocess.Popen[bytes]]] = {}
        self.restart_at: dict[str, float] = {}

    def start(self, name: str, argv: list[str]) -> None:
        self.children[name] = (argv, subprocess.Popen(argv, env=self.env))

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

    def stop(self, grace: float = 20.0) -> None:
        for _, proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in self.children.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@main.command("up")
@click.option(
    "--port",
    type=int,
    default=lambda: registry.get_int("AGAP_BOARD_PORT"),
    help="Board port on 127.0.0.1 (AGAP_BOARD_PORT, default 8765; 0 = any).",
)
@click.option("--no-workers", is_flag=True, help="Only the board (and init).")
def up_cmd(port: int, no_workers: bool) -> None:
    """Run the fabric on the embedded board: board, init, workers, keeper. Ctrl-C stops."""
    settings = Settings.from_env()
    cards = load_cards(settings.cards_dir)
    state = settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    try:
        board = EmbeddedBoard(
            state / "board.sqlite3", port=port, token=registry.get_str("AGAP_BOARD_TOKEN") or None
        ).start()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
            hint="another `agap up` may be running; or set AGAP_BOARD_PORT",
        ) from None
    settings = Settings(**{**settings.__dict__, "board_url": board.url, "board_token": board.token})
    board.set_view(WebView(board.api, settings))  # read-only page, same token
    report = init_board(KanboardClient(board.url, board.token), settings, cards)
    assert report.layout is not None
    save_layout_cache(settings, report.layout)

    # The children get this process's whole environment, with the board and the demo
    # model filled in (an empty AGAP_MODEL_MODE keeps the cards' own modes).
    env = {
        **os.environ,
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_MODEL_MODE": registry.get_str("AGAP_MODEL_MODE", fallback="demo"),
        "AGAP_STATE_DIR": str(state.resolve()),
        "AGAP_CARDS_DIR": str(Path(settings.cards_dir).resolve()),
    }
    sup = Supervisor(env)
    agents = [] if no_workers else worker_agents(cards)
    for agent in agents:
        sup.start(f"worker {agent}", [sys.executable, "-m", "fabric.apps.cli", "worker", "--agent", agent])
    if not no_workers and "keeper" in main.commands:
        sup.start("keeper", [sys.executable, "-m", "fabric.apps.cli", "keeper"])

    click.echo(
        f"""
agap fabric is up on the embedded board ({state / "board.sqlite3"}).
  board     {board.url}
  view      http://127.0.0.1:{board.port}/ (user jsonrpc, password: the token)
  workers   {", ".join(agents) or "none"} (model mode: {env["AGAP_MODEL_MODE"]})
  keeper    {"running" if "keeper" in sup.children else "not started"}

In another shell, paste these lines, then follow the tour in README.md:
{shell_setup(board, env["AGAP_MODEL_MODE"])}
  agap submit --target kimi --intent "Summarise the README" --ref "file://$PWD/README.md"
  agap ls

Ctrl-C stops everything.""",
        err=False,
    )
    sys.stdout.flush()

    stopping = False

    def _stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopping:
            sup.watch()
            time.sleep(0.2)
    finally:
        click.echo("agap up: stopping workers and the board…", err=True)
        sup.stop()
        board.stop()
