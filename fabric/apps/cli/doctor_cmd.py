"""``agap doctor``: the smoke test of a deployment, one line per part.

It reads the same settings the daemons read (the environment, the cards) and asks each
part the fabric needs whether it answers: the board (and the token), the layout `agap
init` makes, the keeper's metrics, the model plane, the events broker; with ``--agent``
it also sends one small task through that agent's worker and waits for its answer. It
changes nothing but that one task (which it verifies, so it leaves no inbox item).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import click
import requests

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, FabricError
from fabric.events.transport import TransportError, queue_topic
from fabric.kanboard.bootstrap import board_version, load_layout
from fabric.kanboard.principals import board_client
from fabric.settings import registry
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import Settings
from fabric.task import State

# The task --agent sends: short, harmless, and plainly the doctor's.
PROBE_INTENT = "agap doctor: a smoke test of this deployment. Reply with one short sentence."
ACTOR = "agap-doctor"


@dataclass(frozen=True)
class Check:
    """One part's answer: ``ok`` None means skipped (not configured here)."""

    name: str
    ok: bool | None
    detail: str
    unreachable: bool = False


def _run(name: str, probe: Callable[[], str]) -> Check:
    try:
        return Check(name, True, probe())
    except _Skip as skip:
        return Check(name, None, str(skip))
    except FabricError as exc:
        return Check(name, False, exc.line(), unreachable=exc.exit_code == EXIT_UNREACHABLE)
    except requests.RequestException as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}".splitlines()[0], unreachable=True)


class _Skip(Exception):
    """The part is not configured here: said, not counted as a failure."""


def _board(settings: Settings) -> str:
    url, _ = settings.require_board()
    who = f"board user {settings.board_user}" if settings.board_user else "the API token"
    return f"{url}: Kanboard {board_version(board_client(settings, timeout=10.0))}, {who} accepted"


def _layout(settings: Settings) -> str:
    cards = load_cards(settings.cards_dir)
    layout = load_layout(board_client(settings, timeout=10.0), settings)
    queues = [c.queue_name for c in cards if c.queue_name]
    lanes = set(layout.swimlanes).union(*(set(h.swimlanes) for h in layout.homes.values()))
    missing = [q for q in queues if q not in lanes]
    if missing:
        raise FabricError(
            f"no swimlane for {', '.join(sorted(missing))}", where=settings.project, hint="run `agap init`"
        )
    homes = f" and {len(layout.homes)} homes" if layout.homes else ""
    return f"{settings.project!r}{homes}: every card's queue has its swimlane ({len(cards)} cards)"


def _keeper(url: str, now: Callable[[], float]) -> str:
    token = registry.get_str("AGAP_KEEPER_METRICS_TOKEN", fallback="")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = requests.get(url, headers=headers, timeout=10.0)
    if r.status_code in (401, 403):
        raise FabricError(
            f"the keeper refused the metrics token (HTTP {r.status_code})",
            where=url,
            hint="set AGAP_KEEPER_METRICS_TOKEN to the keeper's",
        ).with_exit(EXIT_UNREACHABLE)
    r.raise_for_status()
    data = r.json()
    age = now() - float(data.get("last_success") or 0.0)
    if not data.get("board_up"):
        raise FabricError("the keeper cannot reach the board (board_up 0)", where=url)
    return (
        f"{url}: up, last sweep {age:.0f} s ago, {data.get('queued', 0)} queued, "
        f"{data.get('dead_letters', 0)} dead letters, {data.get('missed_schedules', 0)} missed schedules"
    )


def _models(settings: Settings) -> str:
    mode = registry.get_str("AGAP_MODEL_MODE", fallback="gateway")
    if mode != "gateway":
        raise _Skip(f"AGAP_MODEL_MODE={mode}: no proxy to ask")
    base = registry.get_str("AGAP_LITELLM_URL", fallback="")
    if not base:
        raise _Skip("AGAP_LITELLM_URL is not set here (a keeper never calls a model; --agent's task does)")
    url = base.rstrip("/") + "/health/liveliness"
    r = requests.get(url, timeout=10.0)
    r.raise_for_status()
    return f"{base}: the LiteLLM proxy is alive"


def _broker() -> str:

    config = EventsConfig.from_env()
    if config is None:
        raise _Skip("AGAP_EVENTS_URL is not set: live events are off (the board is polled)")
    from fabric.events.brokers import open_transport  # heavy (nats, paho): only when asked

    transport = open_transport(config)
    try:
        # Nobody listens on this queue's topic; an acknowledged publish proves the
        # address, the credentials and the broker's permissions.
        transport.publish(queue_topic("agap-doctor"), b"{}", retain=False, timeout=10.0)
    except TransportError as exc:
        raise FabricError(f"the broker did not take a message: {exc}", where=config.url).with_exit(
            EXIT_UNREACHABLE
        ) from None
    finally:
        transport.close()
    return f"{config.url}: connected and published"


def _end_to_end(agent: str, timeout: float, now: Callable[[], float], wait: Callable[[float], None]) -> str:

    fab = Fabric.connect()
    try:
        start = now()
        receipt = fab.submit(PROBE_INTENT, target=agent, actor=ACTOR)
        deadline = now() + timeout
        while True:
            view = fab.show(receipt.task_id)
            cur = view.current
            if cur is not None and cur.state in (State.DONE, State.DEAD, State.CANCELED, State.DROPPED):
                break
            if now() >= deadline:
                state = cur.state.value if cur is not None else "queued"
                raise FabricError(
                    f"{receipt.ref} still {state} after {timeout:.0f} s",
                    where=f"worker of {agent}",
                    hint=f"is worker-{agent} running? `agap show {receipt.ref}`",
                )
            wait(1.0)
        if cur.state is not State.DONE:
            raise FabricError(
                f"{receipt.ref} ended {cur.state.value}: {cur.reason or 'no reason'}", where=agent
            )
        took = now() - start
        try:
            fab.ledger.verify(receipt.task_id, ACTOR, "smoke test")
            closed = "verified"
        except FabricError as exc:
            closed = f"left for a person to verify ({exc.line()})"
        return f"{receipt.ref} done in {took:.1f} s, result {cur.result_ref}; {closed}"
    finally:
        fab.close()


@main.command("doctor")
@click.option("--agent", help="Also send one small task through this agent's worker and wait for it.")
@click.option(
    "--keeper",
    "keeper_url",
    default="http://127.0.0.1:9464/metrics.json",
    show_default=True,
    help="The keeper's metrics URL (in the compose stack: http://keeper:9464/metrics.json).",
)
@click.option("--no-keeper", is_flag=True, help="Do not ask a keeper (none runs here).")
@click.option(
    "--timeout", type=float, default=120.0, show_default=True, help="Seconds --agent's task may take."
)
def doctor_cmd(agent: str | None, keeper_url: str, no_keeper: bool, timeout: float) -> None:
    """Check every part this deployment needs, one line each; exit 0 when all answer.

    Exit 3 when a part cannot be reached or refuses the credentials, 1 when one answers
    wrongly (no layout, a task that failed), 2 on bad settings.
    """
    settings = Settings.from_env()
    checks = [_run("board", lambda: _board(settings))]
    if checks[0].ok:
        checks.append(_run("layout", lambda: _layout(settings)))
    if not no_keeper:
        checks.append(_run("keeper", lambda: _keeper(keeper_url, time.time)))
    checks.append(_run("models", lambda: _models(settings)))
    checks.append(_run("events", _broker))
    if agent and all(c.ok is not False for c in checks):
        checks.append(_run("task", lambda: _end_to_end(agent, timeout, time.monotonic, time.sleep)))
    elif agent:
        checks.append(Check("task", None, "not sent: fix the parts above first"))
    for c in checks:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[c.ok]
        click.echo(f"{mark} {c.name:<7} {c.detail}")
    failed = [c for c in checks if c.ok is False]
    if not failed:
        sys.exit(EXIT_OK)
    sys.exit(EXIT_UNREACHABLE if any(c.unreachable for c in failed) else EXIT_FAILED)
