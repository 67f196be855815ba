"""``agap eval``: replay an agent's golden set on its current and a proposed backbone."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.apps.deploy.evalgate import dumps, evaluate
from fabric.cards import load_cards
from fabric.cards.backbone import RECORD_FILE, read_record, write_record
from fabric.errors import EXIT_FAILED


@main.command("eval")
@click.option("--agent", required=True, help="The agent (card id) whose golden set to replay.")
@click.option(
    "--backbone",
    default=None,
    help="The proposed backbone: a model name the model plane serves (default: what the "
    "persona's backbone resolves to now).",
)
@click.option(
    "--judge", default=None, help="Model that scores `judge` cases (default: the current backbone)."
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
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--record",
    is_flag=True,
    help=f"On a pass, record the proposed backbone as the gated one (cards/{RECORD_FILE}).",
)
def eval_cmd(
    agent: str, backbone: str | None, judge: str | None, cards_dir: Path, as_json: bool, record: bool
) -> None:
    """Side by side: the golden set on the current backbone and on BACKBONE.

    The current backbone is the one the gate last passed (cards/_backbones.yaml), else the
    card's. Exit 1 on a regression: the proposed backbone passes fewer cases, or fails any
    case the current one passes. Use it as a gate before merging a card change.
    """
    cards = load_cards(cards_dir)
    proposed = backbone if backbone is not None else cards.get(agent).runtime.model or ""
    report = evaluate(agent, proposed, cards, judge=judge)
    click.echo(dumps(report) if as_json else report.table())
    if report.regression:
        sys.exit(EXIT_FAILED)
    if record:
        gated = read_record(cards_dir)
        gated[agent] = proposed
        write_record(cards_dir, gated)
        click.echo(f"recorded: {agent} thinks with {proposed} (cards/{RECORD_FILE})", err=True)
