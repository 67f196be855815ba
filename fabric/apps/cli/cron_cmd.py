"""``agap cron``: submit scheduled tasks from a schedule file."""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import UTC, datetime

import click

from fabric.apps.cli import main
from fabric.core import Fabric
from fabric.errors import InvalidInput
from fabric.settings import registry


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
@click.option("--json", "as_json", is_flag=True)
def cron_cmd(path: str, once: str | None, listing: bool, as_json: bool) -> None:
    """Run the schedules: each firing submits one task, keyed by its planned time."""
    # Imported here: the rest of the CLI does not pay for APScheduler.
    from fabric.apps.cron import CronRunner, CronState, fire_once, load_schedules

    schedules = load_schedules(path)
    fab = Fabric.connect()
    state = CronState(fab.settings.state_dir)
    if listing:
        now = datetime.fromtimestamp(fab.clock(), UTC)
        known = state.read()
        rows = []
        for s in schedules:
            nxt = s.next_after(now)
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
                }
            )
        if as_json:
            click.echo(json.dumps(rows, indent=2, sort_keys=True))
        else:
            for r in rows:
                click.echo(
                    f"{r['name']}: {r['when']}; next {r['next_planned'] or '-'}; last "
                    f"{r['last_planned'] or '-'} -> task:{r['last_task'] or '-'}"
                )
        return
    if once is not None:
        by_name = {s.name: s for s in schedules}
        if once not in by_name:
            raise InvalidInput(
                f"no schedule named {once!r} in {path}",
                where="--once",
                hint="schedules: " + ", ".join(sorted(by_name)),
            )
        f = fire_once(fab, by_name[once], state)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "schedule": f.schedule,
                        "planned": f.planned.isoformat(),
                        "key": f.key,
                        "task_id": f.task_id,
                        "created": f.created,
                        "error": f.error,
                    },
                    sort_keys=True,
                )
            )
        else:
            click.echo(f.line())
        if f.error:
            raise SystemExit(1)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    click.echo(f"agap cron: {len(schedules)} schedule(s) from {path}; state in {state.path}", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        CronRunner(fab, schedules, state).run()
