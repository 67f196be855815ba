"""``agap watch TASK``: follow one task's live events until it ends.

Events print as JSON lines on stdout (logs go to stderr), one shape whatever their source:
``source`` (broker or board) and the seven fields of the wire schema
(:mod:`fabric.events.schema`), without the signature. The board is checked at start
and whenever the broker drops or comes back, so a task that already ended returns at
once, and while the broker is away the board is polled instead. Exit codes (the one
table, :mod:`fabric.errors`): 0 completed, 1 failed or canceled, 8 the wait ran out (wall
clock or idle), 3 broker away and the board not answering either, 2 a usage or
configuration error (no such task, a missing secret), never mistaken for a timeout.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from fabric.apps.cli import main
from fabric.apps.cli.params import task_number
from fabric.core import Fabric
from fabric.errors import EXIT_TIMEOUT, EXIT_UNREACHABLE, FabricError, InvalidInput
from fabric.events.subscriber import BoardStatus, WatchOptions, watch
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardUnavailable
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import Settings

log = logging.getLogger("agap.watch")

BOARD_TIMEOUT = 5.0


def parse_task(text: str) -> int:
    number = task_number(text)
    if number is None:
        raise InvalidInput(f"not a task: {text!r}", where="TASK", hint="give 42, #42 or task:42")
    return number


class BoardReader:
    """Reads the task's state; connects lazily so a board that is away at start is survivable."""

    def __init__(self, task_id: int) -> None:
        self.task_id = task_id
        self.fab: Fabric | None = None

    def __call__(self) -> BoardStatus:
        if self.fab is None:
            settings = Settings.from_env()
            url, token = settings.require_board()
            # A short timeout: a hung board must not hold up the watch for long.
            self.fab = Fabric.connect(settings, port=KanboardClient(url, token, timeout=BOARD_TIMEOUT))
        view = self.fab.show(self.task_id)
        cur = view.current
        if cur is None:
            raise BoardUnavailable("the task has no fabric records yet", where=f"task #{self.task_id}")
        return BoardStatus(cur.state, cur.epoch, cur.result_ref, cur.reason)


def _print(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


@main.command("watch")
@click.argument("task")
@click.option(
    "--timeout",
    type=float,
    default=3600.0,
    show_default=True,
    help="Wall-clock budget in seconds (exit 8 when spent).",
)
@click.option(
    "--idle-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Give up after this many seconds without an event (exit 8).",
)
@click.option(
    "--poll", type=float, default=2.0, show_default=True, help="Board poll interval while the broker is away."
)
@click.option(
    "--recheck",
    type=float,
    default=30.0,
    show_default=True,
    help="Safety board check interval while the broker is up (0: never).",
)
@click.option("-v", "--verbose", count=True, help="More logs on stderr.")
def watch_cmd(
    task: str, timeout: float, idle_timeout: float, poll: float, recheck: float, verbose: int
) -> None:
    """Print TASK's live events as JSON lines until it completes, fails or times out.

    Exit codes (the one table): 0 completed, 1 failed or canceled, 8 the wait ran out, 3 the
    event broker is unavailable and so is the board, 2 bad input or configuration.
    """
    logging.basicConfig(
        stream=sys.stderr,
        format="agap watch: %(message)s",
        level=logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING,
    )
    try:
        task_id = parse_task(task)
        config = EventsConfig.from_env()
        if config is None:
            log.info("AGAP_EVENTS_URL is not set: following the board only")  # nothing to act on
        transport = None
        if config is not None:
            from fabric.events.brokers import open_transport  # heavy (nats, aiohttp): off the CLI path

            transport = open_transport(config)
        try:
            result = watch(
                task_id,
                board=BoardReader(task_id),
                emit=_print,
                transport=transport,
                secret=config.secret if config else None,
                options=WatchOptions(
                    timeout=timeout, idle_timeout=idle_timeout, board_poll=poll, recheck=recheck
                ),
                # The readiness line (-v): from here on no event of the task is missed.
                on_live=lambda: log.info("task #%s: live (subscribed, board checked)", task_id),
            )
        finally:
            if transport is not None:
                transport.close()
    except FabricError as exc:  # not a timeout: the error's own code
        click.echo(f"agap: error: {exc.line()}", err=True)
        sys.exit(exc.exit_code)
    log.info("task #%s: %s (exit %s)", task_id, result.reason, result.code)
    if result.code == EXIT_TIMEOUT:
        click.echo(f"agap watch: task #{task_id}: {result.reason}", err=True)
    elif result.code == EXIT_UNREACHABLE:
        click.echo(
            f"agap watch: task #{task_id}: the event broker and the board are both unavailable", err=True
        )
    sys.exit(result.code)
