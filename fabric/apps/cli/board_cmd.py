"""``agap board serve``: the embedded Kanboard-compatible board."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.apps.web import WebView
from fabric.embedded.flavour import DEFAULT_FLAVOUR, FLAVOURS
from fabric.embedded.server import EmbeddedBoard
from fabric.embedded.store import Store, new_api_token
from fabric.errors import ConfigError, InvalidInput
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import set_on_signal

DEFAULT_DB = Path("var/board.sqlite3")
DEFAULT_PORT = 8765


@main.group("board")
def board() -> None:
    """The embedded Kanboard-compatible board (for running without PHP)."""


@board.command("serve")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_DB,
    show_default=True,
    help="SQLite file of the board.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (loopback unless you mean it; auth is always on).",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--flavour",
    type=click.Choice(FLAVOURS),
    default=DEFAULT_FLAVOUR,
    show_default=True,
    help="Kanboard database backend to imitate (strict: fails wherever any does).",
)
@click.option(
    "--webhook-url",
    default="",
    help="POST every task event here, as Kanboard's webhook does (token: AGAP_KEEPER_HOOK_TOKEN).",
)
def serve(db_path: Path, host: str, port: int, flavour: str, webhook_url: str) -> None:
    """Serve Kanboard's JSON-RPC API on HTTP; prints KANBOARD_URL and the token."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    token = registry.get_str("AGAP_BOARD_TOKEN") or None
    try:
        srv = EmbeddedBoard(db_path, host=host, port=port, token=token, flavour=flavour)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}", hint="pick another --port"
        ) from None
    srv.set_view(WebView(srv.api, Settings.from_env()))  # read-only page, same token
    if webhook_url:
        hook_token = registry.get_str("AGAP_KEEPER_HOOK_TOKEN")
        if not hook_token:
            raise ConfigError("--webhook-url needs a token", where="AGAP_KEEPER_HOOK_TOKEN", hint="set it")
        srv.set_webhook(webhook_url, hook_token)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(
            f"warning: listening on {host}, not loopback; the token is the only "
            "protection and HTTP is not encrypted",
            err=True,
        )
    click.echo(f"KANBOARD_URL={srv.url}")
    click.echo(f"KANBOARD_API_TOKEN={srv.token}")
    click.echo(f"# board view: http://{srv.host}:{srv.port}/ (user jsonrpc, the token)", err=True)
    click.echo(f"# embedded board on {db_path} ({flavour} flavour); Ctrl-C stops it", err=True)
    sys.stdout.flush()

    # The relay thread asks serve_forever (this thread) to return (fabric.signals).
    set_on_signal(threading.Event(), note=lambda _: srv.request_stop())
    try:
        srv.serve_forever()
    finally:
        srv.stop()


@board.command("user-token")
@click.argument("username")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_DB,
    show_default=True,
    help="SQLite file of the board (agap up's: $AGAP_STATE_DIR/board.sqlite3).",
)
def user_token(username: str, db_path: Path) -> None:
    """Print a new personal API token for USERNAME on the embedded board (it replaces the
    old one): what Kanboard's "My profile > API > Generate a new API token" does. A person
    signs in with it as AGAP_USER_PASSWORD."""
    if not db_path.is_file():
        raise ConfigError(
            f"{db_path} is not an embedded board's database", where="--db", hint="name the board's file"
        )
    store = Store(db_path)
    try:
        token = new_api_token(store, username)
    finally:
        store.close()
    if token is None:
        raise InvalidInput(
            f"the board has no user {username!r}",
            where="USERNAME",
            hint="`agap init` makes the people's users",
        )
    click.echo(token)
