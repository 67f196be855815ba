"""``agap mcp serve``: one agent's queue, submits and questions as MCP tools."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.apps.cli.lease_cmd import default_owner
from fabric.apps.mcp.agent import AgentTools
from fabric.apps.signin import SIGN_IN, signed_in_person
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.durations import parse_setting_duration
from fabric.errors import ConfigError, InvalidInput
from fabric.events.attach import attach_submitter
from fabric.kanboard.principals import worker_settings
from fabric.people import find_person
from fabric.results import store_for
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal

# fabric.apps.mcp.server is imported where it is needed: it needs the optional `mcp`
# extra (the SDK), and `agap` imports every command module, `--help` included.


@main.group("mcp")
def mcp_group() -> None:
    """The fabric as MCP tools for agent runtimes (Claude Code, OpenClaw)."""


@mcp_group.command("serve")
@click.option("--agent", required=True, help="The agent card the server acts as (its queue, trust, domains).")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (launched by the runtime), or streamable HTTP on loopback (bearer token required).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: a loopback address to bind.")
@click.option("--port", default=8710, show_default=True, type=int, help="HTTP: the port (0 picks one).")
@click.option(
    "--renew-for",
    help="Renew held leases on their own for this long after a claim or heartbeat "
    "(a duration; default the card's runtime.timeout_seconds; 0: never).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level (to stderr).")
def serve_cmd(agent: str, transport: str, host: str, port: int, renew_for: str | None, verbose: bool) -> None:
    """Serve AGENT's tools over MCP: list_targets, submit_task, get_task, claim_task,
    heartbeat_task, complete_task, fail_task, ask_human; resources agap://targets,
    agap://queue and agap://task/{id}.

    Over HTTP the endpoint is http://HOST:PORT/mcp and every request needs
    `Authorization: Bearer $AGAP_MCP_TOKEN`; the server refuses to start without it.
    """
    exit_on_signal(0)  # a stop during start-up exits 0, as one later does
    from fabric.apps.mcp import server as mcp  # the mcp extra
    from fabric.apps.mcp.handles import TaskHandles  # the mcp extra

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )  # stderr: in stdio mode stdout carries the protocol
    renew_seconds = _duration(renew_for)
    token = ""
    if transport == "http":  # checked first: no loopback address or no token, no server
        mcp.check_loopback(host)
        token = mcp.check_token(registry.get_str("AGAP_MCP_TOKEN"), "AGAP_MCP_TOKEN")
    every = registry.get_duration("AGAP_MCP_WATCH_EVERY")
    if every <= 0:
        raise ConfigError("the board read interval must be more than 0", where="AGAP_MCP_WATCH_EVERY")
    settings = Settings.from_env()
    require_launch_settings(settings)
    if settings.board_user:  # a confined agent's runtime signs in as its own user
        settings = worker_settings(settings, load_cards(settings.cards_dir).get(agent))
    # A confined agent's queue lives in its home (fabric.kanboard.principals).
    fab = Fabric.connect(settings)
    fab = fab.home_fabric(fab.cards.get(agent))
    # Publishes "submitted" (and wakes the queue) when events are on; its transport also
    # wakes the watcher of subscribed tasks.
    publisher = attach_submitter(fab)
    events = publisher.transport if publisher is not None else None
    tools = AgentTools(
        fab,
        agent,
        owner=default_owner(agent),
        results=store_for(
            registry.get_str("AGAP_RESULT_STORE"), fab.board, registry.get_str("AGAP_RESULT_DIR") or None
        ),
        result_dir=registry.get_str("AGAP_RESULT_DIR") or None,
        renew_for=renew_seconds,
    )
    user = tools.user = _user(tools, settings, registry.get_str("AGAP_MCP_USER"))
    key = mcp.task_key(registry.get_str("AGAP_MCP_TASK_KEY"), token or None)
    handles = TaskHandles(tools, key, user=user, live=events is not None)
    if transport == "stdio":
        mcp.serve_stdio(tools, handles, events, every)
        return

    def ready(url: str) -> None:
        click.echo(f"agap mcp: serving {agent} on {url} (owner {tools.owner})", err=True)

    mcp.serve_http(
        tools,
        host=host,
        port=port,
        token=token,
        ready=ready,
        handles=handles,
        events=events,
        watch_every=every,
    )


def _user(tools: AgentTools, settings: Settings, name: str) -> str | None:
    """AGAP_MCP_USER as a Kanboard username (a person's card id or username), or None.

    The client's answers become that person's (elicitation, tasks/update): the server
    believes the name only when AGAP_USER signs that same person in (checked once, here).
    """
    if not name.strip():
        return None
    card = find_person(tools.fab.cards, name.strip())
    if card is None or card.human is None:
        known = ", ".join(c.id for c in tools.fab.cards.humans())
        raise ConfigError(f"unknown person {name.strip()!r}", where="AGAP_MCP_USER", hint=f"known: {known}")
    person = signed_in_person(settings, tools.fab.cards)
    if person is None:
        raise ConfigError(
            f"AGAP_MCP_USER names {card.id}, but nobody is signed in: the client's answers would "
            f"be {card.id}'s",
            where="AGAP_MCP_USER",
            hint=f"{card.id} signs in: {SIGN_IN}",
        )
    if person.id != card.id:
        raise ConfigError(
            f"AGAP_MCP_USER names {card.id}, but AGAP_USER signs in {person.id}",
            where="AGAP_MCP_USER",
            hint="name the person who signs in, or unset AGAP_MCP_USER",
        )
    return card.human.username


def require_launch_settings(settings: Settings) -> None:
    """Refuse to start, in one line, when the board or the cards cannot be found.

    A runtime launches this server with a bare environment and a working directory of its
    own (OpenClaw passes only HOME, PATH, PWD, SHELL and TERM), and shows a server that
    exits at once as "Connection closed": the line says what is missing and where to put it.
    """
    missing = [] if settings.board_url else ["KANBOARD_URL"]
    if not settings.board_user and not settings.board_token:
        missing.append("KANBOARD_API_TOKEN")
    elif settings.board_user and not settings.board_password:
        missing.append("AGAP_BOARD_PASSWORD")
    cards = settings.cards_dir
    if not cards.is_dir():
        shown = str(cards) if cards.is_absolute() else f"{cards} (relative to {Path.cwd()})"
        missing.append(f"AGAP_CARDS_DIR ({shown} is not a directory)")
    if missing:
        raise ConfigError(
            "cannot start: missing " + ", ".join(missing),
            where="agap mcp serve",
            hint="put KEY=VALUE lines (absolute paths) in ~/.config/agap/env, or pass "
            "`agap --env-file PATH mcp serve …`; keep secrets there, not in the runtime's config "
            "(docs/OPENCLAW.md)",
        )


def _duration(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_setting_duration(text)
    except InvalidInput as exc:
        raise InvalidInput(exc.what, where="--renew-for") from None
