"""``agap compose render``: the compose stack's generated parts, from the cards."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.apps.deploy.render import render, stale
from fabric.cards import load_cards
from fabric.errors import EXIT_FAILED


@main.group("compose")
def compose() -> None:
    """The docker compose stack (compose/): generated parts, from the cards."""


@compose.command("render")
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("compose"),
    show_default=True,
    help="The compose folder (holding docker-compose.yml and .env.example).",
)
@click.option(
    "--cards",
    "cards_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default="cards",
    show_default=True,
    envvar="AGAP_CARDS_DIR",
    help="Folder of agent cards (env AGAP_CARDS_DIR).",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if the checked-in files differ from the cards (CI)."
)
def render_cmd(out: Path, cards_dir: Path, check: bool) -> None:
    """Write the LiteLLM proxy config and one worker service per queue, from the cards."""

    cards = load_cards(cards_dir)
    if check:
        changed = stale(cards, out)
        for path in changed:
            click.echo(f"{path}: differs from the cards; run `agap compose render`", err=True)
        if changed:
            sys.exit(EXIT_FAILED)
        click.echo(f"ok: {out} matches {len(cards)} cards")
        return
    changed = render(cards, out)
    for path in changed:
        click.echo(f"wrote {path}")
    if not changed:
        click.echo(f"{out} already matches the cards")
