"""The Zabbix template against a real Zabbix 6.0 server (Debian's packages; .ci/run installs them).

Imported through the API with the README's rules, linked to a host with short intervals,
polling a real keeper over the embedded board: items collect, discovery finds the queues,
and each trigger fires on a condition made with ``agap`` and resolves when it clears.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import cron_key, park_key
from tests.conftest import ROOT
from tests.helpers import signed_in
from tests.integration.zabbix_real import RealZabbix, free_port, import_rules, missing, real_zabbix, wait_for

TEMPLATE = ROOT / "compose" / "zabbix" / "agap_fabric_zbx_template.yaml"
WHY = missing()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")
METRICS_TOKEN = "zbx-test-metrics-token"

# Short enough for a test, long enough for a busy 2-core machine. nodata() takes 30 s at least.
MACROS = {
    "{$AGAP.METRICS.INTERVAL}": "5s",
    "{$AGAP.KEEPER.UP.WINDOW}": "15s",
    "{$AGAP.KEEPER.SILENT}": "30s",
    "{$AGAP.QUEUE.BACKLOG.MAX}": "1",
    "{$AGAP.QUEUE.BACKLOG.TIME}": "10s",
    "{$AGAP.QUEUE.OLDEST.MAX}": "20",
    "{$AGAP.PARK.GRACE}": "5",
}
FIRE = 150.0  # seconds a trigger may take to fire or resolve (interval, LLD, cache update, timer)


@dataclass
class Stack:
    zbx: RealZabbix
    board: EmbeddedBoard
    db: Path
    env: dict[str, str]
    keeper: subprocess.Popen[bytes] | None
    metrics_port: int
    hostid: str

    def agap(self, *args: str) -> Any:
        res = CliRunner().invoke(main, [*args, "--json"], env=self.env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    def start_keeper(self) -> None:
        env = {**os.environ, **self.env, "AGAP_KEEPER_METRICS_TOKEN": METRICS_TOKEN}
        env["AGAP_KEEPER_LEASES_EVERY"] = "2s"
        self.keeper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fabric.apps.cli",
                "keeper",
                "--metrics-port",
                str(self.metrics_port),
                "-q",
            ],
            env=env,
            cwd=ROOT,
        )

    def stop_keeper(self) -> None:
        if self.keeper is not None and self.keeper.poll() is None:
            self.keeper.terminate()
            self.keeper.wait(timeout=30)
        self.keeper = None

    def item(self, key: str) -> dict[str, Any] | None:
        got = self.zbx.api.call(
            "item.get",
            {
                "hostids": self.hostid,
                "filter": {"key_": key},
                "output": ["lastvalue", "lastclock", "state", "error"],
            },
        )
        return got[0] if got else None

    def value(self, key: str) -> str | None:
        it = self.item(key)
        return str(it["lastvalue"]) if it and it["lastclock"] != "0" else None

    def problems(self, cls: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.zbx.api.call(
            "problem.get",
            {
                "hostids": self.hostid,
                "tags": [{"tag": "agap.class", "value": cls, "operator": 1}],
                "selectTags": "extend",
                "output": ["eventid", "name", "r_eventid"],
            },
        )
        return got

    def fires(self, cls: str) -> list[dict[str, Any]]:
        return wait_for(f"a {cls} problem", lambda: self.problems(cls), FIRE, 2)

    def resolves(self, cls: str) -> None:
        wait_for(f"the {cls} problem to resolve", lambda: not self.problems(cls), FIRE, 2)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with real_zabbix() as zbx, EmbeddedBoard(tmp_path / "board.sqlite3") as board:
        env = {
            "KANBOARD_URL": board.url,
            "KANBOARD_API_TOKEN": board.token,
            "AGAP_CARDS_DIR": str(ROOT / "cards"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            **signed_in(board, "alvis"),  # alvis at the shell, as himself
        }
        assert CliRunner().invoke(main, ["init"], env=env).exit_code == 0
        api = zbx.api
        # With the template rules alone (what the README once said) the import is empty.
        bare = {"groups": {"createMissing": True}, "templates": {"createMissing": True}}
        assert api.call(
            "configuration.import", {"format": "yaml", "source": TEMPLATE.read_text(), "rules": bare}
        )
        (tpl,) = api.call(
            "template.get", {"filter": {"host": "AGAP fabric keeper"}, "output": ["templateid"]}
        )
        assert _count(api, "item.get", tpl["templateid"]) == 0
        assert _count(api, "discoveryrule.get", tpl["templateid"]) == 0
        assert api.call(
            "configuration.import",
            {"format": "yaml", "source": TEMPLATE.read_text(), "rules": import_rules(api.version())},
        )
        port = free_port()
        macros = {**MACROS, "{$AGAP.METRICS.URL}": f"http://127.0.0.1:{port}/metrics.json"}
        macros["{$AGAP.METRICS.TOKEN}"] = METRICS_TOKEN
        host = api.call(
            "host.create",
            {
                "host": "agap-test-keeper",
                "groups": [{"groupid": "2"}],  # Linux servers, in the seeded database
                "templates": [{"templateid": tpl["templateid"]}],
                "macros": [{"macro": k, "value": v} for k, v in macros.items()],
            },
        )
        s = Stack(zbx, board, tmp_path / "board.sqlite3", env, None, port, host["hostids"][0])
        s.start_keeper()
        zbx.reload_config()
        try:
            yield s
        finally:
            s.stop_keeper()


def _count(api: Any, method: str, templateid: str) -> int:
    return int(api.call(method, {"templateids": templateid, "countOutput": True}))


@pytest.mark.timeout(1500)
def test_the_template_collects_discovers_and_fires_on_real_conditions(stack: Stack) -> None:
    api = stack.zbx.api
    (tpl,) = api.call("template.get", {"filter": {"host": "AGAP fabric keeper"}, "output": ["templateid"]})
    tid = tpl["templateid"]
    # The README's rules import everything, not an empty template.
    (src,) = yaml.safe_load(TEMPLATE.read_text())["zabbix_export"]["templates"]
    rules = src["discovery_rules"]
    protos = [p for r in rules for p in r["item_prototypes"]]
    assert _count(api, "item.get", tid) == len(src["items"]) == 17
    assert _count(api, "discoveryrule.get", tid) == len(rules) == 4
    assert _count(api, "itemprototype.get", tid) == len(protos)
    assert _count(api, "trigger.get", tid) == 3
    assert _count(api, "triggerprototype.get", tid) == 4

    # Items collect; up reads 1.
    wait_for("agap.keeper.up = 1", lambda: stack.value("agap.keeper.up") == "1", FIRE, 2)
    assert stack.value("agap.keeper.board_up") == "1"
    # The shared-quota items read the keeper's JSON too (0 slots: no quota kept across hosts).
    assert stack.value("agap.quota.slots_in_use") == "0"
    assert stack.value("agap.quota.slots_returned") == "0"
    # Discovery finds the cards' queues.
    queues = wait_for(
        "the queue items",
        lambda: (
            {
                i["key_"]
                for i in api.call(
                    "item.get", {"hostids": stack.hostid, "search": {"key_": "agap.queue.depth["}}
                )
            }
            >= {"agap.queue.depth[kimi]", "agap.queue.depth[claude-coder]"}
        ),
        FIRE,
        2,
    )
    assert queues

    # A dead letter (agap submit, claim, fail --poison) fires; dropping it resolves.
    tid_dead = str(stack.agap("submit", "--target", "claude-coder", "--intent", "flaky?")["task_id"])
    claim = stack.agap("claim", "--agent", "claude-coder", "--owner", "t1")
    stack.agap("fail", tid_dead, "--epoch", str(claim["epoch"]), "--owner", "t1", "--reason", "x", "--poison")
    stack.fires("dead_letter")
    stack.agap("drop", tid_dead, "--reason", "seen by the test")
    stack.resolves("dead_letter")

    # A backlog and an old task on kimi (no worker drains it here); cancelling clears both.
    ids = [
        str(stack.agap("submit", "--target", "kimi", "--intent", f"backlog {i}")["task_id"]) for i in range(3)
    ]
    (problem,) = stack.fires("backlog")
    assert {"tag": "queue", "value": "kimi"} in problem["tags"]
    stack.fires("oldest_task")
    for t in ids:
        stack.agap("cancel", t, "--reason", "cleared by the test")
    stack.resolves("backlog")
    stack.resolves("oldest_task")

    _park_and_miss(stack)

    # The board down: the keeper's scrapes say board_up 0; back, it resolves.
    stack.board.stop()
    stack.fires("board_down")
    stack.board = EmbeddedBoard(stack.db, port=stack.board.port, token=stack.board.token).start()
    stack.resolves("board_down")

    # The keeper gone: up reads 0 and "keeper is silent" fires; back, both recover.
    stack.stop_keeper()
    wait_for("agap.keeper.up = 0", lambda: stack.value("agap.keeper.up") == "0", FIRE, 2)
    stack.fires("keeper_silent")
    stack.start_keeper()
    wait_for("agap.keeper.up = 1 again", lambda: stack.value("agap.keeper.up") == "1", FIRE, 2)
    stack.resolves("keeper_silent")


def _park_and_miss(stack: Stack) -> None:
    """A queue parked past its announced reset, and a must-not-miss schedule that missed a run,
    as a worker and ``agap cron`` publish them on the board."""
    client = KanboardClient(stack.board.url, stack.board.token)
    try:
        project = client.call("getProjectByName", {"name": "Agent Fabric"})["id"]
        now = time.time()

        def meta(key: str, value: dict[str, Any]) -> None:
            client.call("saveProjectMetadata", {"project_id": project, "values": {key: json.dumps(value)}})

        park = {"queue": "kimi", "parked": True, "reason": "quota", "models": ["kimi"]}
        meta(park_key("kimi"), {**park, "until": now - 60, "since": now - 120})
        (problem,) = stack.fires("parked_past_reset")
        assert {"tag": "queue", "value": "kimi"} in problem["tags"]
        meta(park_key("kimi"), {**park, "parked": False})
        stack.resolves("parked_past_reset")

        sched = {"schedule": "nightly", "must_not_miss": True, "grace": 60, "missed": 0}
        sched |= {"next_planned": now + 3600, "last_planned": now - 60, "last_actual": now - 59}
        meta(cron_key("nightly"), sched)
        wait_for(
            "the nightly schedule item", lambda: stack.value("agap.cron.missed[nightly]") == "0", FIRE, 2
        )
        meta(cron_key("nightly"), {**sched, "missed": 1, "missed_runs": {"first": now - 60, "count": 1}})
        (problem,) = stack.fires("schedule_missed")
        assert {"tag": "schedule", "value": "nightly"} in problem["tags"]
        # It stays open until a person closes it (manual close): the fabric never re-fires.
        api = stack.zbx.api
        api.call(
            "event.acknowledge",
            {"eventids": problem["eventid"], "action": 1, "message": "closed by the test"},
        )
        stack.resolves("schedule_missed")
    finally:
        client.close()


def _acks(stack: Stack, eventid: str) -> list[str]:
    (event,) = stack.zbx.api.call(
        "event.get",
        {"eventids": eventid, "select_acknowledges": ["message", "action"], "output": ["eventid"]},
    )
    return [str(a["message"]) for a in event["acknowledges"]]


@pytest.mark.timeout(900)
def test_the_ops_agent_files_a_dead_letter_once_and_acknowledges_it(stack: Stack, tmp_path: Path) -> None:
    env = {
        **stack.env,
        "AGAP_ZABBIX_URL": stack.zbx.api_url,
        "AGAP_ZABBIX_TOKEN": stack.zbx.api_token(),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "AGAP_ACTOR": "cron",
    }

    def ops() -> dict[str, Any]:
        res = CliRunner().invoke(main, ["ops", "--once"], env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.output.strip().splitlines()[-1]))

    dead = str(stack.agap("submit", "--target", "claude-coder", "--intent", "flaky?")["task_id"])
    claim = stack.agap("claim", "--agent", "claude-coder", "--owner", "t1")
    stack.agap("fail", dead, "--epoch", str(claim["epoch"]), "--owner", "t1", "--reason", "x", "--poison")
    (problem,) = stack.fires("dead_letter")
    eventid = problem["eventid"]

    first = ops()
    assert first["acted"] == [eventid]
    task = first["events"][eventid]["task"]
    shown = stack.agap("show", str(task))["spec"]
    assert shown["target"] == "alvis"  # the dead-letters playbook's person (cards/_ops.yaml)
    assert any(r.endswith(f"/event/{eventid}") for r in shown["refs"]), shown["refs"]
    assert f"eventid={eventid}" in shown["intent"]  # the event's page, for the person
    (ack,) = _acks(stack, eventid)
    assert f"filed task #{task} to alvis" in ack

    # A restart (a new process reading the event log) handles nothing twice.
    again = ops()
    assert again["acted"] == [] and len(_acks(stack, eventid)) == 1
    # Even with the event log lost, the event id as action id files no second task.
    (tmp_path / "state" / "ops" / "events.json").unlink()
    lost = ops()
    assert lost["events"][eventid]["task"] == task

    # The task dropped by the person: acknowledged again, once.
    stack.agap("cancel", str(task), "--reason", "handled by hand")
    ops()
    acks = _acks(stack, eventid)
    assert sum(f"task #{task} canceled" in a for a in acks) == 1, acks
    ops()
    assert len(_acks(stack, eventid)) == len(acks)


def test_agap_ops_with_zabbix_unreachable_is_one_line_and_parks(stack: Stack, tmp_path: Path) -> None:
    env = {
        **stack.env,
        "AGAP_ZABBIX_URL": f"http://127.0.0.1:{free_port()}/api_jsonrpc.php",
        "AGAP_ZABBIX_TOKEN": "nope",
        "AGAP_STATE_DIR": str(tmp_path / "state"),
    }
    res = CliRunner().invoke(main, ["ops", "--once"], env=env)
    assert res.exit_code == 3, res.output
    assert "cannot reach Zabbix" in res.output and "Traceback" not in res.output
    client = KanboardClient(stack.board.url, stack.board.token)
    try:
        project = client.call("getProjectByName", {"name": "Agent Fabric"})["id"]
        meta = client.call("getProjectMetadata", {"project_id": project})
    finally:
        client.close()
    assert json.loads(meta[park_key("ops")])["parked"] is True
