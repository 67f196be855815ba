"""``agap memory``: a task's result back into a Hindsight bank (docs/HINDSIGHT.md)."""

from __future__ import annotations

import json

import click

from fabric.apps.cli import main
from fabric.apps.cli.params import TASK
from fabric.core import Fabric
from fabric.retain import retain_result


@main.group("memory")
def memory_group() -> None:
    """Hindsight banks: send a task's result back as memory."""


@memory_group.command("retain")
@click.argument("task_id", type=TASK)
@click.argument("bank")
@click.option(
    "--consolidate", is_flag=True, help="Then ask Hindsight's own consolidation to run on the bank."
)
@click.option("--json", "as_json", is_flag=True)
def retain_cmd(task_id: int, bank: str, consolidate: bool, as_json: bool) -> None:
    """Retain TASK's result into BANK (hindsight://<bank>/), through Hindsight's retain API.

    Only into a bank of the task's own privacy domain (cards/_policy.yaml names each bank's
    owner): a task of one person's never goes into another's bank or a shared one (exit 6).
    Retaining the same result again replaces it (one document per task). Nothing is
    retried: Hindsight away is exit 3, an unknown bank or a refused request exit 2.
    """
    out = retain_result(Fabric.connect(), task_id, bank, consolidate=consolidate)
    text = f"task #{out.task_id}'s result is retained in {out.bank} ({out.domain}) as {out.document_id}"
    if out.consolidation:
        text += f"; Hindsight's consolidation queued ({out.consolidation})"
    click.echo(json.dumps(out.as_json(), indent=2, sort_keys=True) if as_json else text)
