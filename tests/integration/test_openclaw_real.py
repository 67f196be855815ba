"""The real OpenClaw gateway submits to the fabric: a cron agent turn and a command automation.

The gateway, Node, OpenClaw's install and the model stand-in are
:mod:`tests.openclaw_gateway`'s (shared with ``bench/openclaw.py``). When Node or OpenClaw
cannot be installed the test is skipped with the reason.

Slots here are real cron expressions on the real clock: ``* * * * *`` is always inside
its 60 s grace, ``0 0 1 1 *`` always past it. Two firings of one slot are one task; two
firings that straddle a minute are two slots, each with its one task.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.layout import META_OPENCLAW_RUN, cron_key
from fabric.settings.resolve import Settings
from keeper.daemon import Keeper
from keeper.hook import HookServer
from tests.conftest import ROOT
from tests.helpers import wait_until
from tests.openclaw_gateway import (
    WRAPPER,
    Gateway,
    GatewayFailed,
    Missing,
    Model,
    openclaw_command,
    prepare_home,
)

WEBHOOK_TOKEN = "oc-webhook-" + "w" * 24
PLANS: dict[str, dict[str, str]] = {
    "digest": {
        "intent": "Morning digest for the household",
        "target": "adolf",
        "key": "openclaw/digest",
        "slot": "* * * * *",
        "timezone": "Europe/Berlin",
    },
    "wrong": {
        "intent": "Summarise the week",
        "target": "kimmi",
        "key": "openclaw/week",
        "slot": "* * * * *",
        "timezone": "Europe/Berlin",
    },
    "missed": {
        "intent": "Happy new year",
        "target": "adolf",
        "key": "openclaw/new-year",
        "slot": "0 0 1 1 *",
        "timezone": "Europe/Berlin",
    },
}


@pytest.fixture(scope="module")
def openclaw() -> list[str]:
    """The ``openclaw`` command (node and its entry script), installed once into var/openclaw."""
    try:
        return openclaw_command()
    except Missing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def model() -> Iterator[Model]:
    m = Model(PLANS).start()
    yield m
    m.stop()


@pytest.fixture
def gateway(
    openclaw: list[str], model: Model, embedded_board: EmbeddedBoard, tmp_path: Path
) -> Iterator[Gateway]:
    gw = prepare_home(
        openclaw, embedded_board.url, embedded_board.token, tmp_path, model.url, webhook_token=WEBHOOK_TOKEN
    )
    try:
        gw.start()
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def fab(embedded_board: EmbeddedBoard) -> Fabric:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return Fabric.connect(settings, cards=load_cards(ROOT / "cards", base_dir=ROOT))


def _keys(fab: Fabric, prefix: str) -> list[str]:
    specs = [fab.show(int(r["id"])).spec for r in fab.listing(include_closed=True)]
    return sorted(
        s.action_id for s in specs if s is not None and s.action_id and s.action_id.startswith(prefix)
    )


def _twice(gw: Gateway, jobs: tuple[str, str], *, at_once: bool = True) -> list[dict[str, Any]]:
    if not at_once:
        return [gw.run(job) for job in jobs]
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(gw.run, jobs))


# -- the tests ---------------------------------------------------------------------------------------

# The first test also installs OpenClaw (about 70 s); a gateway starts in about 20 s and an
# agent turn takes 15-40 s of OpenClaw's own preparation.
pytestmark = pytest.mark.timeout(900)


def test_openclaw_cron_submits_once_per_slot_and_refuses_wrong_targets_and_late_slots(
    gateway: Gateway, model: Model, fab: Fabric
) -> None:
    message = "[plan:{}] Submit this job's slot to the fabric with agap__submit_task."
    jobs = {p: gateway.add(p, "--session", "isolated", "--message", message.format(p)) for p in PLANS}
    twin = gateway.add("digest-twin", "--session", "isolated", "--message", message.format("digest"))

    # A cron agent turn submits; the same slot fired twice is one task. One after the other:
    # two agent turns at once on a loaded machine had one end early (an OpenClaw lane).
    runs = _twice(gateway, (jobs["digest"], twin), at_once=False)
    assert all(r["status"] == "ok" for r in runs), runs
    results = model.results("digest")
    assert len(results) >= 2, results
    keys = _keys(fab, "openclaw/digest/")
    assert 1 <= len(keys) <= 2 and len(set(keys)) == len(keys)  # one task per planned minute
    assert sum('\\"created\\": true' in r or '"created": true' in r for r in results) == len(keys)
    assert any('\\"created\\": false' in r or '"created": false' in r for r in results) or len(keys) == 2

    # A wrong target: one clear line back to the model, nothing on the board.
    gateway.run(jobs["wrong"])
    (wrong,) = model.results("wrong")
    assert "INVALID (exit 2: " in wrong and "unknown target 'kimmi' — you may target: auto, adolf" in wrong
    assert "list_targets" in wrong and not _keys(fab, "openclaw/week/")

    # A slot past its grace (a catch-up): refused as missed, nothing on the board.
    gateway.run(jobs["missed"])
    (missed,) = model.results("missed")
    assert "MISSED_SLOT (exit 1: " in missed and "missed, not run late" in missed
    assert not _keys(fab, "openclaw/new-year/")


def test_openclaw_command_automation_submits_once_per_slot(gateway: Gateway, fab: Fabric) -> None:
    command = f"{WRAPPER} water '* * * * *' Europe/Berlin --target adolf --intent 'Water the plants'"
    one = gateway.add("water", "--command", command)
    two = gateway.add("water-twin", "--command", command)
    runs = _twice(gateway, (one, two))
    summaries = sorted(str(r["run"].get("summary", "")) for r in runs)
    keys = _keys(fab, "openclaw/water/")
    assert all(r["status"] == "ok" for r in runs), runs
    assert all(s.startswith("task:") for s in summaries), summaries
    if len(keys) == 1:  # both inside one minute: one task, the second run found it
        assert (
            summaries[1].endswith("(existing task for this key)")
            and summaries[0].split()[0] == summaries[1].split()[0]
        )
    else:  # the two straddled a minute: two slots, one task each
        assert len(keys) == 2 and not any("existing" in s for s in summaries)
    spec = fab.show(int(summaries[0].split()[0].removeprefix("task:"))).spec
    assert spec is not None and spec.actor == "openclaw" and spec.target == "adolf"


def test_the_run_finished_webhook_records_each_run_on_the_task_its_slot_made(
    gateway: Gateway, fab: Fabric
) -> None:
    """OpenClaw's own finished event, posted by the gateway to the keeper's receiver: the
    command job's run lands on the task it submitted; a job that fails before submitting
    is a missed slot of its schedule."""
    keeper = Keeper.for_fabric(fab)
    with HookServer(
        keeper.poke, token="kb", openclaw=keeper.openclaw_run, openclaw_token=WEBHOOK_TOKEN
    ) as hook:
        command = f"{WRAPPER} water '* * * * *' Europe/Berlin --target adolf --intent 'Water the plants'"
        job = gateway.add("water", "--command", command, deliver=("--webhook", f"{hook.url}openclaw"))
        run = gateway.run(job)
        assert run["status"] == "ok", run
        task_id = int(str(run["run"]["summary"]).split()[0].removeprefix("task:"))
        wait_until(
            lambda: META_OPENCLAW_RUN in fab.show(task_id).meta, timeout=60, what="the run is recorded"
        )
        record = json.loads(fab.show(task_id).meta[META_OPENCLAW_RUN])
        assert record["job"] == "water" and record["status"] == "ok" and record["summary"].startswith("task:")
        lines = [c.text for c in fab.board.comments(task_id) if "OpenClaw run" in c.text]
        assert len(lines) == 1 and "succeeded" in lines[0]
        # A job whose command fails before it submits: the slot is recorded as missed.
        broken = gateway.add("broken", "--command", "exit 7", deliver=("--webhook", f"{hook.url}openclaw"))
        with contextlib.suppress(GatewayFailed):
            gateway.run(broken)
        key = cron_key("openclaw-broken")
        wait_until(lambda: key in fab.board.project_meta(), timeout=60, what="the missed slot is recorded")
        assert json.loads(fab.board.project_meta()[key])["missed"] == 1
        assert hook.openclaw_runs == 2
