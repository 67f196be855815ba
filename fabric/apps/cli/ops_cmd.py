"""``agap ops``: the ops-agent daemon (Zabbix problems → mitigations or tasks; docs/OPS.md)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import click

from fabric.apps.cli import logs, main
from fabric.apps.ops.agent import EventLog, OpsAgent, frontend_of
from fabric.apps.ops.zabbix import ZabbixClient, ZabbixError
from fabric.cards.playbooks import OPS_PLAYBOOKS, load_playbooks
from fabric.core import Fabric
from fabric.degraded import Backoff
from fabric.errors import ConfigError, FabricError
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal, set_on_signal

log = logging.getLogger("agap.ops")


@main.command("ops")
@click.option("--once", is_flag=True, help="One round (poll, act, acknowledge) and exit; prints what it did.")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
def ops_cmd(once: bool, verbose: bool, quiet: bool) -> None:
    """Poll Zabbix's problems; per class, mitigate or file a task, once per event.

    Needs AGAP_ZABBIX_URL (…/api_jsonrpc.php) and AGAP_ZABBIX_TOKEN (an API token), and
    the playbooks in cards/_ops.yaml. Zabbix unreachable parks the ops queue and retries
    with a backoff. SIGTERM exits cleanly.
    """
    if not once:
        exit_on_signal(0)
    logs.configure(verbose=verbose, quiet=quiet)
    url = registry.get_str("AGAP_ZABBIX_URL", fallback="")
    token = registry.get_str("AGAP_ZABBIX_TOKEN", fallback="")
    if not url or not token:
        raise ConfigError(
            "AGAP_ZABBIX_URL and AGAP_ZABBIX_TOKEN must both be set",
            hint="the api_jsonrpc.php URL and an API token (Zabbix: Users → API tokens)",
        )
    settings = Settings.from_env()
    settings.require_board()
    cards = logs.daemon_cards(settings.cards_dir, own="ops")
    book = load_playbooks(Path(settings.cards_dir) / OPS_PLAYBOOKS, Path.cwd(), cards)
    fab = Fabric.connect(settings, cards=cards)
    agent = OpsAgent(
        fab,
        ZabbixClient(url, token),
        book,
        EventLog(Path(settings.state_dir) / "ops" / "events.json"),
        frontend=frontend_of(url),
    )
    if once:
        acted = agent.poll_once()
        click.echo(json.dumps({"acted": acted, "events": agent.events.events}, sort_keys=True))
        return
    _serve(agent, registry.get_duration("AGAP_OPS_POLL_EVERY"))


def _serve(agent: OpsAgent, every: float) -> None:
    stop = threading.Event()
    set_on_signal(stop)
    backoff = Backoff(cap=max(every * 10, 60.0))
    failures = 0
    while not stop.is_set():
        try:
            agent.poll_once()
            if failures:
                log.warning("Zabbix and the board answer again; the ops queue resumes")
            failures = 0
            stop.wait(every)
        except FabricError as exc:  # Zabbix, or the board (a task could not be filed yet)
            failures += 1
            delay = backoff.delay(failures)
            if failures == 1:  # said once per outage, not every retry
                what = "the ops queue parks" if isinstance(exc, ZabbixError) else "nothing is lost"
                log.warning("%s; %s, retrying with a backoff", exc.line(), what)
            stop.wait(delay)
