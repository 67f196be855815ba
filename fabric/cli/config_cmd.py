"""``agap config show``: the effective settings, where each came from, secrets masked."""

from __future__ import annotations

import json

import click

from fabric.cli import main
from fabric.config import KNOWN, effective, mask, warn_if_plaintext


@main.group("config")
def config() -> None:
    """Settings: environment, then AGAP_ENV_FILE, then .agap.env (walking up)."""


@config.command("show")
@click.option("--all", "show_all", is_flag=True, help="Also list unset known settings.")
@click.option("--json", "as_json", is_flag=True)
def show(show_all: bool, as_json: bool) -> None:
    """Print each known setting's effective value (secrets masked) and its source."""
    resolved = effective()
    rows = []
    for k in KNOWN:
        if k.name in resolved.values:
            rows.append({"name": k.name, "value": mask(k.name, resolved.values[k.name]),
                         "source": resolved.sources[k.name], "meaning": k.meaning})
        elif show_all or k.default:
            rows.append({"name": k.name, "value": k.default, "source": "default" if k.default
                         else "unset", "meaning": k.meaning})
    for name, what in (("KANBOARD_URL", "the board"), ("AGAP_EVENTS_URL", "the events broker"),
                       ("AGAP_LITELLM_URL", "the LiteLLM proxy")):
        warn_if_plaintext(resolved.values.get(name, ""), what)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['value'] or '-':<36}  {r['source']}")
