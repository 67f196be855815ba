"""``agap worker``: run one queue's worker daemon."""

from __future__ import annotations

import click

from fabric.apps.cli import logs, main
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal


@main.command("worker")
@click.option("--agent", required=True, help="The agent (card id) whose queue to drain.")
@click.option("--concurrency", type=int, help="Tasks at once (default: the card's).")
@click.option("--drain", is_flag=True, help="Exit when the queue is empty (batch runs).")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
def worker_cmd(agent: str, concurrency: int | None, drain: bool, verbose: bool, quiet: bool) -> None:
    """Drain one agent's queue: check a(t), claim, execute, report. SIGTERM exits cleanly.

    Started while the board is away, it waits for it (AGAP_BOARD_WAIT_CAP between tries).
    """
    exit_on_signal(0)  # a stop during start-up exits 0, as one later does
    # Imported here: `agap ls` and friends must not pay for the worker's imports.
    from workers.assembly import build_worker, run_until_signalled

    logs.configure(verbose=verbose, quiet=quiet)
    settings = Settings.from_env()
    cards = logs.daemon_cards(settings.cards_dir, own=agent)  # a bad card stops only its worker
    worker = build_worker(agent, settings, cards, concurrency=concurrency, drain=drain)
    run_until_signalled(worker, settings, cards.get(agent))
    s = worker.stats
    click.echo(
        f"worker {agent}: {s.completed} completed, {s.failed} failed, {s.fenced} fenced, {s.claimed} claimed",
        err=True,
    )
