"""``agap cards``: check and list the agent cards."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.cards import Card, CardErrors, load_cards
from fabric.cards.backbone import backbone_changes, read_record
from fabric.errors import EXIT_INVALID
from fabric.memorybanks import check_memory

_DIR_OPTION = click.option(
    "--dir",
    "directory",
    default="cards",
    show_default=True,
    envvar="AGAP_CARDS_DIR",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder holding one <id>.yaml per agent (env AGAP_CARDS_DIR).",
)


@main.group("cards")
def cards() -> None:
    """Agent cards: who receives work, how strong, how trusted, when available."""


@cards.command("validate")
@_DIR_OPTION
def validate(directory: Path) -> None:
    """Check every card; print each problem on one line and exit 2 if any."""
    try:
        card_set = check_memory(load_cards(directory))
    except CardErrors as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        sys.exit(exc.exit_code)
    # A card edit that changes a persona's backbone must pass the eval gate first.
    changes = backbone_changes(card_set, read_record(directory))
    for change in changes:
        click.echo(change.line(), err=True)
    if changes:
        sys.exit(EXIT_INVALID)
    ids = ", ".join(card.id for card in card_set)
    click.echo(f"ok: {len(card_set)} cards ({ids})")


@cards.command("ls")
@_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the cards as JSON.")
def ls(directory: Path, as_json: bool) -> None:
    """List the cards: id, kind, tier, trust, queue, availability shapes, runtime mode."""
    card_set = load_cards(directory)
    if as_json:
        rows = [_as_json(card) for card in card_set]
        click.echo(json.dumps(rows, indent=2, sort_keys=False))
        return
    header = ("ID", "KIND", "TIER", "TRUST", "QUEUE", "AVAILABILITY", "RUNTIME")
    table = [header, *(_row(card) for card in card_set)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@cards.command("show")
@_DIR_OPTION
@click.argument("agent_id")
def show(directory: Path, agent_id: str) -> None:
    """Print one card, defaults filled in, as JSON."""
    card = load_cards(directory).get(agent_id)
    click.echo(json.dumps(_as_json(card), indent=2))


def _row(card: Card) -> tuple[str, ...]:
    return (
        card.id,
        card.kind,
        card.tier or "-",
        card.trust,
        card.queue_name,
        "+".join(card.shapes),
        card.runtime.mode,
    )


def _as_json(card: Card) -> dict[str, object]:
    data = dataclasses.asdict(card)
    data["queue"] = card.queue_name
    return data
