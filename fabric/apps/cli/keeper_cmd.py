"""``agap keeper``: run the fabric-keeper (the janitor that owns time)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import click

from fabric.apps.cli import logs, main
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.degraded import Backoff
from fabric.errors import EXIT_UNREACHABLE, ConfigError
from fabric.kanboard.bootstrap import load_layout
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.keeperstore import published_hooks
from fabric.kanboard.port import BoardError
from fabric.kanboard.principals import confined, home_work_settings
from fabric.kanboard.views import BoardLayout
from fabric.settings import registry
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal
from keeper.acts import agent_usernames
from keeper.daemon import Keeper
from keeper.hook import HomeRoutes, HookServer
from keeper.metrics import MetricsServer


@main.command("keeper")
@click.option("--once", is_flag=True, help="Run every job once and exit (tests, cron).")
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve metrics on this port (default AGAP_KEEPER_METRICS_PORT; 0 = off).",
)
@click.option("--metrics-host", default=None, help="Bind address (default 127.0.0.1).")
@click.option(
    "--hook-port",
    type=int,
    default=None,
    help="Receive Kanboard's webhook on this port (default AGAP_KEEPER_HOOK_PORT; 0 = off).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level (APScheduler's job lines too).")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
def keeper_cmd(
    once: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    hook_port: int | None,
    verbose: bool,
    quiet: bool,
) -> None:
    """Sweep leases, gaps, deadlines, gates and lock tags; write digests; export metrics.

    It never assigns or triggers work: stop it and work still flows. SIGTERM exits cleanly.
    Started while the board is away, it waits for it (AGAP_BOARD_WAIT_CAP between tries).
    """
    if not once:
        exit_on_signal(0)  # a stop during start-up exits 0, as one later does
    logs.configure(verbose=verbose, quiet=quiet)
    config = KeeperConfig.from_env()
    if metrics_port is not None:
        config = replace(config, metrics_port=metrics_port)
    if metrics_host is not None:
        config = replace(config, metrics_host=metrics_host)
    if hook_port is not None:
        config = replace(config, hook_port=hook_port)
    settings = Settings.from_env()
    url, _ = settings.require_board()  # fail fast on a missing URL or token
    cards = logs.daemon_cards(settings.cards_dir)  # one bad card leaves its queue out, not the keeper
    keeper = Keeper(
        config,
        lambda: Fabric.connect(settings, cards=cards),
        board_url=url,
        start_backoff=Backoff(cap=registry.get_duration("AGAP_BOARD_WAIT_CAP")),
    )
    server = None
    if config.metrics_port:
        server = MetricsServer(
            keeper.metrics,
            host=config.metrics_host,
            port=config.metrics_port,
            token=config.metrics_token,
            allow=config.metrics_allow,
        ).start()
        click.echo(f"keeper metrics on {server.url}/metrics and /metrics.json", err=True)
    home = _home_of(settings, cards)
    # A home's keeper receives what the main keeper's receiver forwards: on a port of its
    # own (any free one, on the hook host), whenever a hook token is set.
    wanted = bool(config.hook_token) if home else bool(config.hook_port)
    hook = _hook(keeper, config, settings, home=home) if wanted and not once else None
    try:
        if once:
            results = keeper.run_once()
            click.echo(
                json.dumps(
                    {"jobs": results, "metrics": keeper.metrics.to_json()}, sort_keys=True, default=str
                )
            )
            if not all(results.values()):
                sys.exit(EXIT_UNREACHABLE)  # a job could not reach the board
            return
        keeper.serve()
    finally:
        if server is not None:
            server.stop()
        if hook is not None:
            hook.stop()


def _home_of(settings: Settings, cards: CardSet) -> str:
    """The confined agent whose home ``settings`` name ("" for the work project)."""
    for card in cards:
        if confined(card) and home_work_settings(settings, card) is not settings:
            return card.id
    return ""


def _hook(keeper: Keeper, config: KeeperConfig, settings: Settings, *, home: str) -> HookServer:
    """Kanboard's webhook receiver, poking the gesture job (refuses to start without a
    token). The main keeper's routes a home's events to that home's keeper; a home's
    keeper listens on a free port and publishes it (keeper.hook)."""
    agents = agent_usernames(logs.daemon_cards(settings.cards_dir))
    route = None if home else _routes(settings, config)
    hook = HookServer(
        keeper.poke,
        token=config.hook_token,
        host=config.hook_host,
        port=0 if home else config.hook_port,
        ignore=agents,
        route=route,
        openclaw=None if home else keeper.openclaw_run,
        openclaw_token="" if home else config.openclaw_token,
        moved=keeper.note_moved,
    ).start()
    if home:
        keeper.hook_url = hook.url
        click.echo(
            f"keeper webhook receiver of {home!r}'s home on {hook.url} (the main keeper forwards)", err=True
        )
    else:
        click.echo(f"keeper webhook receiver on {hook.url}?token=… (Kanboard: Settings > Webhooks)", err=True)
        if config.openclaw_token:
            click.echo(f"OpenClaw's run-finished webhook: {hook.url}openclaw?key=openclaw/<job>", err=True)
    return hook


def _routes(settings: Settings, config: KeeperConfig) -> HomeRoutes:
    """The main receiver's routes to the homes' keepers, over a connection of its own
    (the keeper's jobs use theirs from one thread)."""
    url, token = settings.require_board()
    client = KanboardClient(url, token)
    layout: list[BoardLayout] = []

    def current() -> BoardLayout:
        if not layout:
            layout.append(load_layout(client, settings))
        return layout[0]

    def lookup() -> dict[int, str]:
        layout.clear()  # a home added since (`agap init`) is found too
        return published_hooks(client, current())

    def main_project() -> int | None:
        try:
            return current().project_id
        except (BoardError, ConfigError):
            return None

    return HomeRoutes(lookup, token=config.hook_token, main_project=main_project)
