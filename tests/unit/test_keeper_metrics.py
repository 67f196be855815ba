"""The metrics endpoint (auth, content) and the Zabbix template's structure."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.kanboard.layout import park_key
from fabric.settings.keeper import KeeperConfig
from keeper.daemon import Keeper
from keeper.metrics import Metrics, MetricsServer
from tests.conftest import ROOT, FakeClock

TEMPLATE = ROOT / "compose" / "zabbix" / "agap_fabric_zbx_template.yaml"


@pytest.fixture
def swept(local_fabric: Fabric, clock: FakeClock) -> Keeper:
    for i in range(3):
        local_fabric.submit(f"queued {i}", target="kimi")
    tid = local_fabric.submit("working", target="kimi").task_id
    local_fabric.ledger.claim(local_fabric.board.read(tid), "w1", lease_seconds=3600)
    local_fabric.submit("gate", target="alvis")
    local_fabric.port.call(
        "saveProjectMetadata",
        {
            "project_id": local_fabric.board.layout.project_id,
            "values": {
                park_key("kimi"): '{"queue": "kimi", "parked": true, "reason": "quota", "models": ["kimi"], '
                f'"until": {clock.now + 60}, "since": {clock.now}}}'
            },
        },
    )
    clock.advance(120)
    k = Keeper.for_fabric(local_fabric, KeeperConfig())
    assert all(k.run_once().values())
    return k


@pytest.fixture
def server(swept: Keeper) -> Iterator[MetricsServer]:
    with MetricsServer(swept.metrics, token="tok3n") as srv:
        yield srv


def test_the_endpoint_refuses_to_start_without_a_token_or_allow_list() -> None:
    with pytest.raises(ConfigError, match="token"):
        MetricsServer(Metrics())


def test_401_without_the_token_200_with_it(server: MetricsServer) -> None:
    for path in ("/metrics", "/metrics.json"):
        r = requests.get(server.url + path, timeout=5)
        assert r.status_code == 401 and "Bearer" in r.headers["WWW-Authenticate"]
        r = requests.get(server.url + path, headers={"Authorization": "Bearer wrong"}, timeout=5)
        assert r.status_code == 401
        r = requests.get(server.url + path, headers={"Authorization": "Bearer tok3n"}, timeout=5)
        assert r.status_code == 200
    assert server.url.startswith("http://127.0.0.1:")


def test_the_allow_list_admits_listed_clients_only(swept: Keeper) -> None:
    with MetricsServer(swept.metrics, allow=["127.0.0.0/8"]) as srv:
        assert requests.get(srv.url + "/metrics.json", timeout=5).status_code == 200
    with MetricsServer(swept.metrics, allow=["10.9.9.9/32"]) as srv:
        assert requests.get(srv.url + "/metrics.json", timeout=5).status_code == 401


def test_json_content_for_zabbix(server: MetricsServer, swept: Keeper, clock: FakeClock) -> None:
    data = requests.get(
        server.url + "/metrics.json", headers={"Authorization": "Bearer tok3n"}, timeout=5
    ).json()
    assert data["up"] == 1 and data["board_up"] == 1
    queues = {q["queue"]: q for q in data["queues"]}
    assert set(swept.fab().cards.queues()) <= set(queues)
    kimi = queues["kimi"]
    assert (kimi["depth"], kimi["working"], kimi["parked"], kimi["park_reason"]) == (3, 1, 1, "quota")
    assert kimi["oldest_age"] == pytest.approx(120, abs=1)
    assert kimi["park_overdue"] == pytest.approx(60, abs=1)
    assert queues["alvis"]["waiting"] == 1 and data["waiting_on_humans"] == 1
    assert {j["job"] for j in data["job_list"]} >= {"leases", "gaps", "gestures", "digest", "gc"}
    assert data["jobs"]["leases"]["last_success"] == clock.now
    assert data["dead_letters"] == 0 and data["lease_expiries_total"] == 0


def test_prometheus_text(server: MetricsServer) -> None:
    text = requests.get(server.url + "/metrics", headers={"Authorization": "Bearer tok3n"}, timeout=5).text
    for needle in (
        "keeper_up 1",
        "keeper_board_errors_total 0",
        'keeper_queue_depth{queue="kimi"} 3',
        'keeper_queue_parked{queue="kimi",reason="quota"} 1',
        'keeper_last_success_timestamp{job="leases"}',
        "keeper_lease_expiries_total 0",
        "keeper_gaps_resolved_total 0",
        'keeper_queue_oldest_age_seconds{queue="kimi"}',
        'keeper_queue_dead_letters{queue="kimi"} 0',
        "# TYPE keeper_board_errors_total counter",
    ):
        assert needle in text, needle
    for line in text.splitlines():
        assert line.startswith("#") or re.match(r"^[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+$", line), line


def test_a_scrape_never_calls_the_board(server: MetricsServer, swept: Keeper) -> None:
    before = swept.fab().port.stats.trips
    for _ in range(3):
        requests.get(server.url + "/metrics", headers={"Authorization": "Bearer tok3n"}, timeout=5)
    assert swept.fab().port.stats.trips == before


# -- the Zabbix template ---------------------------------------------------------------------


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_the_zabbix_template_is_a_6_0_export_with_the_seven_triggers() -> None:
    doc = yaml.safe_load(TEMPLATE.read_text())["zabbix_export"]
    # 6.0 LTS refuses a newer version number, `template_groups` and `vendor`; 7.0 imports 6.0.
    assert doc["version"] == "6.0"
    assert "template_groups" not in doc and all("vendor" not in t for t in doc["templates"])
    (tpl,) = doc["templates"]
    assert {g["name"] for g in tpl["groups"]} <= {g["name"] for g in doc["groups"]}
    uuids = [n["uuid"] for n in _walk(doc) if "uuid" in n]
    assert len(uuids) == len(set(uuids)) > 20
    assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", u) for u in uuids), (
        "Zabbix wants 32-hex UUIDv4"
    )
    items = list(tpl["items"])
    protos = [p for rule in tpl["discovery_rules"] for p in rule["item_prototypes"]]
    keys = {i["key"] for i in items}
    (master,) = [i for i in items if i["type"] == "HTTP_AGENT"]
    assert master["url"] == "{$AGAP.METRICS.URL}"
    assert {"name": "Authorization", "value": "Bearer {$AGAP.METRICS.TOKEN}"} in master["headers"]
    for it in [*items, *protos, *tpl["discovery_rules"]]:
        if it["type"] == "DEPENDENT":
            assert it["master_item"]["key"] in keys, it["key"]
            assert it["preprocessing"][0]["type"] == "JSONPATH"
    triggers = [t for i in items for t in i.get("triggers", [])]
    triggers += [t for rule in tpl["discovery_rules"] for t in rule.get("trigger_prototypes", [])]
    proto_triggers = [t for p in protos for t in p.get("trigger_prototypes", [])]
    triggers += proto_triggers
    names = " | ".join(t["name"] for t in triggers).lower()
    for wanted in ("silent", "backing up", "oldest task too old", "dead letters", "parked past", "missed"):
        assert wanted in names, wanted
    # Every trigger names its problem class: the ops-agent's playbooks are keyed by it.
    classes = [{x["tag"]: x["value"] for x in t.get("tags", [])}.get("agap.class") for t in triggers]
    assert len(triggers) == 7 and len(set(classes)) == 7 and None not in classes, classes
    # "up" is calculated by the server: a dependent item gets no value when the scrape fails.
    (up,) = [i for i in items if i["key"] == "agap.keeper.up"]
    assert up["type"] == "CALCULATED" and "agap.keeper.answered" in up["params"]
    proto_keys = {p["key"] for p in protos}
    for t in triggers:
        for ref in re.findall(r"/AGAP fabric keeper/([^,)]+)", t["expression"]):
            assert ref in keys or ref in proto_keys, ref
        assert t["priority"] in ("INFO", "WARNING", "AVERAGE", "HIGH", "DISASTER")
    declared = {m["macro"] for m in tpl["macros"]}
    used = set(re.findall(r"\{\$[A-Z0-9_.]+\}", TEMPLATE.read_text()))
    assert used <= declared, used - declared
    rules = {r["key"]: r for r in tpl["discovery_rules"]}
    q = rules["agap.queues.discovery"]
    assert q["lld_macro_paths"] == [{"lld_macro": "{#QUEUE}", "path": "$.queue"}]
    assert q["preprocessing"][0]["parameters"] == ["$.queues"]


def test_the_template_paths_match_the_json(swept: Keeper) -> None:
    """Every JSONPath in the template names a field the keeper serves."""
    # A schedule as `agap cron` publishes it, so the schedule paths are checked too.
    swept.metrics.observe_schedules(
        {
            "fabric.cron.nightly": json.dumps(
                {
                    "schedule": "nightly",
                    "must_not_miss": True,
                    "grace": 60,
                    "next_planned": 100.0,
                    "last_planned": 10.0,
                    "last_actual": 11.0,
                    "missed": 0,
                }
            )
        },
        50.0,
    )
    data = swept.metrics.to_json()
    doc = yaml.safe_load(Path(TEMPLATE).read_text())["zabbix_export"]
    for node in _walk(doc):
        if node.get("type") != "JSONPATH":
            continue
        path = node["parameters"][0]
        m = re.match(r"^\$\.(\w+)$", path) or re.match(r"^\$\.(\w+)\[\?\(@\.\w+=='\{#\w+\}'\)\]\.(\w+)", path)
        assert m, path
        top = data[m.group(1)]
        if m.lastindex == 2:
            assert m.group(2) in top[0], path


def test_parks_are_shown_per_model_endpoint_too(swept: Keeper, clock: FakeClock) -> None:
    data = swept.metrics.to_json()
    models = {m["model"]: m for m in data["models"]}
    assert set(models) >= {"kimi", "gemma-local", "qwen-remote"}
    assert models["kimi"]["parked"] == 1 and models["kimi"]["queues"] == ["kimi"]
    assert models["kimi"]["park_reason"] == "quota" and models["gemma-local"]["parked"] == 0
    assert data["parked_models"] == 1
    assert 'keeper_model_parked{model="kimi",reason="quota"} 1' in swept.metrics.to_prometheus()
