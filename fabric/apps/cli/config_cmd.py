"""``agap config show``: the effective settings, where each came from, secrets masked."""

from __future__ import annotations

import json

import click

from fabric.apps.cli import main
from fabric.errors import InvalidInput, exit_code_table
from fabric.settings import registry
from fabric.settings.resolve import KNOWN, Resolved, effective, mask, warn_if_plaintext


@main.group("config")
def config() -> None:
    """Settings: environment, then AGAP_ENV_FILE, else .agap.env (walking up), else
    ~/.config/agap/env."""


@config.command("gestures")
def gestures_cmd() -> None:
    """Print the gesture table (what each move in Kanboard's UI means) as Markdown.

    The README's and docs/POLICY.md's tables are this output.
    """
    from fabric.kanboard.gestures import markdown  # only this command renders the table

    click.echo(markdown(), nl=False)


@config.command("exit-codes")
def exit_codes() -> None:
    """The one exit-code table every command follows (Markdown, as in the README)."""
    click.echo(exit_code_table(), nl=False)


@config.command("show")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="List every variable the fabric reads, set or not, and who reads it.",
)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--markdown",
    is_flag=True,
    help="With --all: print the README's table of every variable (defaults, no values).",
)
def show(show_all: bool, as_json: bool, markdown: bool) -> None:
    """Print each known setting's effective value (secrets masked) and its source."""
    if markdown:
        if not show_all or as_json:
            raise InvalidInput(
                "--markdown prints the whole registry",
                where="--markdown",
                hint="use `agap config show --all --markdown`",
            )
        click.echo(registry.markdown(), nl=False)
        return
    resolved = effective()
    rows = [row for k in (registry.REGISTRY if show_all else KNOWN) if (row := _row(k, resolved, show_all))]
    values = resolved.values
    warn_if_plaintext(values.get("KANBOARD_URL", ""), "the board")
    events_tls = registry.get_bool("AGAP_EVENTS_TLS", values)  # TLS on an mqtt:// or nats:// URL
    warn_if_plaintext(values.get("AGAP_EVENTS_URL", ""), "the events broker", tls=events_tls)
    warn_if_plaintext(values.get("AGAP_LITELLM_URL", ""), "the LiteLLM proxy")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    _print_table(rows, show_all)


# Read by `agap up` alone: its default says nothing about the board a shell talks to
# (KANBOARD_URL does), so it is listed only when set, or under --all.
_UP_ONLY = frozenset({"AGAP_BOARD_PORT", "AGAP_BOARD_TOKEN"})


def _row(k: registry.Var, resolved: Resolved, show_all: bool) -> dict[str, str] | None:
    """``k``'s line: its effective value (masked) and source; None to leave it out."""
    if k.name in resolved.values:
        row = {
            "name": k.name,
            "value": mask(k.name, resolved.values[k.name]),
            "source": resolved.sources[k.name],
            "meaning": k.meaning,
        }
    elif show_all or (k.default and k.name not in _UP_ONLY):
        row = {
            "name": k.name,
            "value": k.default,
            "source": "default" if k.default else "unset",
            "meaning": k.meaning,
        }
    else:
        return None
    if show_all:
        row |= {"component": ", ".join(k.readers), "type": k.kind}
    return row


def _print_table(rows: list[dict[str, str]], show_all: bool) -> None:
    width = max(len(r["name"]) for r in rows)
    if show_all:
        readers = max(len(r["component"]) for r in rows)
        for r in rows:
            click.echo(
                f"{r['name']:<{width}}  {r['component']:<{readers}}  {r['value'] or '-':<36}  {r['source']}"
            )
        return
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['value'] or '-':<36}  {r['source']}")
