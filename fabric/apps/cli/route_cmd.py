"""``agap route``: where a task would go, and why, without submitting it."""

from __future__ import annotations

import json

import click

from fabric.apps.cli import main
from fabric.cards import Card, CardSet
from fabric.cards.backbone import backbone_choices
from fabric.core import Fabric


@main.command("route")
@click.option("--target", help="Agent id (direct), or 'auto' for the router policy.")
@click.option(
    "--constraints", help="Constraint set, e.g. tier>=large,cap=tools (with auto: extra requirements)."
)
@click.option("--intent", default="", help="The task's intent (auto rules look at it).")
@click.option("--ref", "refs", multiple=True, help="Context reference (URI); repeatable.")
@click.option(
    "--priority",
    default="normal",
    show_default=True,
    help="low, normal, high or urgent (high and urgent count as interactive).",
)
@click.option("--explain", is_flag=True, help="Print every candidate and why it was or was not chosen.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def route_cmd(
    target: str | None,
    constraints: str | None,
    intent: str,
    refs: tuple[str, ...],
    priority: str,
    explain: bool,
    as_json: bool,
) -> None:
    """Resolve a target to an agent the way submit would; nothing is submitted."""
    fab = Fabric.connect()
    choice = fab.route(
        intent=intent or "(no intent given)",
        target=target,
        constraints=constraints,
        refs=refs,
        priority=priority,
    )
    if as_json:
        click.echo(json.dumps(choice.as_dict(), indent=2, sort_keys=True))
    elif explain:
        click.echo(choice.render())
        for line in _backbone_lines(choice.card, fab.cards):
            click.echo(line)
    else:
        click.echo(f"{choice.card.id}\t{choice.why()}")


def _backbone_lines(card: Card, cards: CardSet) -> list[str]:
    """What the picked persona thinks with, and why (its backbone among the model cards)."""
    choices = backbone_choices(card, cards)
    if not choices:
        return []
    lines = [f"backbone of {card.id}: {card.runtime.model or '(none fits)'}"]
    width = max(len(c.card.id) for c in choices)
    lines += [f"  {'*' if c.fits else '-'} {c.card.id:<{width}}  {c.why}" for c in choices]
    return lines
