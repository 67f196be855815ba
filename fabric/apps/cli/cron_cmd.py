"""``agap cron``: submit scheduled tasks from a schedule file.

The daemon started while its board is unreachable waits for it (capped backoff between
tries, ``AGAP_BOARD_WAIT_CAP``), says so once, and starts when the board answers; only a
bad schedule file or setting, a rejected token or a missing project end it non-zero.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from fabric.apps.cli import logs, main
from fabric.core import Fabric
from fabric.degraded import Backoff, BoardWait
from fabric.errors import EXIT_FAILED, InvalidInput
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal, set_on_signal

if TYPE_CHECKING:
    from fabric.apps.cron import CronState, Firing, Schedule


def _firing_json(f: Firing) -> dict[str, object]:
    return {
        "schedule": f.schedule,
        "planned": f.planned.isoformat(),
        "key": f.key,
        "task_id": f.task_id,
        "created": f.created,
        "error": f.error,
    }


def _parse_now(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"{text!r} is not a time", where="--now", hint="ISO-8601, e.g. 2027-01-15T08:00:00Z"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _list(schedules: list[Schedule], state: CronState, now: float, as_json: bool) -> None:
    at = datetime.fromtimestamp(now, UTC)
    known = state.read()
    rows = []
    for s in schedules:
        nxt = s.next_after(at)
        e = known.get(s.name, {})
        rows.append(
            {
                "name": s.name,
                "when": s.when,
                "must_not_miss": s.must_not_miss,
                "next_planned": nxt.isoformat() if nxt else None,
                "last_planned": e.get("last_planned_iso"),
                "last_actual": e.get("last_actual_iso"),
                "last_task": e.get("last_task"),
                "missed": int(e.get("missed", 0)),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for r in rows:
        click.echo(
            f"{r['name']}: {r['when']}; next {r['next_planned'] or '-'}; last "
            f"{r['last_planned'] or '-'} -> task:{r['last_task'] or '-'}; missed {r['missed']}"
        )


def _once(
    fab: Fabric, schedules: list[Schedule], state: CronState, name: str, path: str, as_json: bool
) -> None:
    from fabric.apps.cron import fire_once  # APScheduler: only for `agap cron`

    by_name = {s.name: s for s in schedules}
    if name not in by_name:
        raise InvalidInput(
            f"no schedule named {name!r} in {path}",
            where="--once",
            hint="schedules: " + ", ".join(sorted(by_name)),
        )
    f = fire_once(fab, by_name[name], state)
    click.echo(json.dumps(_firing_json(f), sort_keys=True) if as_json else f.line())
    if f.error:
        raise SystemExit(EXIT_FAILED)


def _wait_for_board(settings: Settings, stop: threading.Event) -> Fabric | None:
    """Degraded start: the connected fabric once the board answers (None: stopped first)."""
    url, _ = settings.require_board()  # a missing URL or token is bad configuration: exit 2

    cards = logs.daemon_cards(settings.cards_dir)  # a bad card fails only its schedules

    def attempt() -> Fabric:
        fab = Fabric.connect(settings, cards=cards)
        fab.board.schedule_states()  # one read: a cached layout alone proves nothing
        return fab

    backoff = Backoff(cap=registry.get_duration("AGAP_BOARD_WAIT_CAP"))
    return BoardWait(url, "agap cron", stop.wait, backoff, say=_say).until(attempt)


def _say(line: str) -> None:
    click.echo(line, err=True)


@main.command("cron")
@click.option(
    "--file",
    "path",
    default=lambda: registry.get_str("AGAP_SCHEDULES"),
    show_default="$AGAP_SCHEDULES or schedules.yaml",
    help="The schedule file.",
)
@click.option(
    "--once", "once", metavar="NAME", help="Fire this schedule now, for its latest planned time, and exit."
)
@click.option(
    "--list",
    "listing",
    is_flag=True,
    help="Show the schedules, their next planned time and last firing, and exit.",
)
@click.option(
    "--tick",
    is_flag=True,
    help="One pass, then exit: fire what is due, record what was missed on the board.",
)
@click.option(
    "--now",
    "now_text",
    metavar="TIME",
    help="With --tick or --list: act as if it were TIME (ISO-8601), e.g. to check a schedule file.",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("-v", "--verbose", is_flag=True, help="The daemon logs at DEBUG level.")
@click.option("-q", "--quiet", is_flag=True, help="The daemon logs warnings and errors only.")
def cron_cmd(
    path: str,
    once: str | None,
    listing: bool,
    tick: bool,
    now_text: str | None,
    as_json: bool,
    verbose: bool,
    quiet: bool,
) -> None:
    """Run the schedules: each firing submits one task, keyed by its planned time.

    A planned run missed by more than the grace (the host or this process was down) is
    never fired: it is recorded on the board, and the keeper's metrics report a missed
    must_not_miss run to Zabbix. Started while the board is away, it waits for it.
    """
    # Imported here: the rest of the CLI does not pay for APScheduler.
    from fabric.apps.cron import CronRunner, CronState, load_schedules  # APScheduler: only here

    schedules = load_schedules(path)  # a bad file ends here (exit 2), board or not
    now = _parse_now(now_text)
    if now is not None and not (tick or listing):
        raise InvalidInput("--now only goes with --tick or --list", where="--now")
    if listing or once is not None or tick:
        fab = Fabric.connect()
        state = CronState(fab.settings.state_dir)
        if listing:
            _list(schedules, state, fab.clock() if now is None else now, as_json)
        elif once is not None:
            _once(fab, schedules, state, once, path, as_json)
        else:
            fired = CronRunner(fab, schedules, state).tick(now)
            for f in fired:
                click.echo(json.dumps(_firing_json(f), sort_keys=True) if as_json else f.line())
            if any(f.error for f in fired):
                raise SystemExit(EXIT_FAILED)
        return
    exit_on_signal(0)  # a stop during start-up exits 0, as one later does
    logs.configure(verbose=verbose, quiet=quiet)
    stop = threading.Event()
    set_on_signal(stop)
    daemon = _wait_for_board(Settings.from_env(), stop)
    if daemon is None:
        return  # stopped while waiting for the board
    state = CronState(daemon.settings.state_dir)
    if not quiet:
        click.echo(f"agap cron: {len(schedules)} schedule(s) from {path}; state in {state.path}", err=True)
    CronRunner(daemon, schedules, state).run(stop)
