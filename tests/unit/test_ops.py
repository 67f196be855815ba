"""The ops-agent: playbook validation (file and line), the class → playbook mapping, and the
loop against a loopback stand-in speaking Zabbix's JSON-RPC (the real Zabbix runs in
tests/integration/test_zabbix_real.py where Debian's packages are installed)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.apps.ops.agent import EventLog, OpsAgent
from fabric.apps.ops.mapping import Problem, decide
from fabric.apps.ops.zabbix import ZabbixClient, ZabbixError
from fabric.cards import CardSet
from fabric.cards.playbooks import OPS_PLAYBOOKS, load_playbooks
from fabric.cards.problems import CardErrors
from fabric.core import Fabric
from fabric.kanboard.layout import Column, park_key
from fabric.task import State
from tests.conftest import ROOT
from tests.fakes.zabbix_stub import ZabbixStub

BOOK = ROOT / "cards" / OPS_PLAYBOOKS


def _problem(eventid: str, cls: str, **tags: str) -> Problem:
    return Problem(
        eventid, "1", f"problem {eventid}", 3, 0, {"agap.class": cls, **tags}, {"eventid": eventid}
    )


def test_the_shipped_playbooks_load_and_name_known_cards(cards: CardSet) -> None:
    book = load_playbooks(BOOK, ROOT, cards)
    assert book.operator == "alvis" and cards.get("alvis").kind == "human"


def test_a_schedule_gets_its_own_playbook_and_an_unknown_class_goes_to_the_operator(cards: CardSet) -> None:
    book = load_playbooks(BOOK, ROOT, cards)
    own = decide(_problem("1", "schedule_missed", schedule="morning-digest"), book)
    other = decide(_problem("2", "schedule_missed", schedule="reflect"), book)
    assert own.playbook == "morning-digest-missed" and "agap cron --once morning-digest" in own.intent
    assert other.playbook == "missed-run" and "reflect" in other.intent
    unknown = decide(_problem("3", "disk_full"), book)
    assert unknown.to == "alvis" and unknown.playbook == "operator"
    assert "disk_full" in unknown.intent and '"eventid": "3"' in unknown.intent  # the raw problem


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "operator: alvis\nplaybooks:\n  - name: pb\n    class: nope\n    file: {to: alvis}\n",
            ":4: playbooks.0.class",
        ),
        (
            "operator: alvis\nplaybooks:\n  - name: pb\n    class: backlog\n    file: {to: nobody}\n",
            ":5: playbooks.0.file.to",
        ),
        ("operator: kimi\nplaybooks: []\n", ":1: operator: 'kimi' is not a person"),
        ("operator: alvis\nplaybooks:\n  - name: pb\n    class: backlog\n", ":3: playbooks.0: "),
        (
            "operator: alvis\nplaybooks:\n  - name: pb\n    clas: backlog\n",
            ":4: playbooks.0.clas: unknown field",
        ),
        ("operator: alvis\nplaybooks: [\n", ":3: YAML error"),
    ],
)
def test_a_malformed_playbook_file_is_a_card_error_with_file_and_line(
    cards: CardSet, tmp_path: Path, text: str, where: str
) -> None:
    path = tmp_path / OPS_PLAYBOOKS
    path.write_text(text)
    with pytest.raises(CardErrors) as err:
        load_playbooks(path, tmp_path, cards)
    assert f"{OPS_PLAYBOOKS}{where}" in err.value.line(), err.value.line()


def test_agap_cards_validate_reports_the_playbook_file(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "cards", tmp_path / "cards")
    shutil.copytree(ROOT / "souls", tmp_path / "souls")
    (tmp_path / "cards" / OPS_PLAYBOOKS).write_text(
        "operator: alvis\nplaybooks:\n  - name: x\n    class: y\n"
    )
    res = CliRunner().invoke(main, ["cards", "validate", "--dir", str(tmp_path / "cards")])
    assert res.exit_code == 2 and f"{OPS_PLAYBOOKS}:3: playbooks.0" in res.output, res.output


# -- the loop against the stand-in -----------------------------------------------------------


@pytest.fixture
def stub() -> Iterator[ZabbixStub]:
    with ZabbixStub() as z:
        yield z


def _agent(fab: Fabric, stub: ZabbixStub, state: Path, cards: CardSet) -> OpsAgent:
    book = load_playbooks(BOOK, ROOT, cards)
    return OpsAgent(fab, ZabbixClient(stub.url, stub.token, timeout=5), book, EventLog(state), "http://zbx")


def test_each_event_is_handled_once_across_restarts(
    local_fabric: Fabric, stub: ZabbixStub, tmp_path: Path, cards: CardSet
) -> None:
    state = tmp_path / "events.json"
    stub.add_problem("41", "Queue kimi is backing up", {"agap.class": "backlog", "queue": "kimi"})
    stub.add_problem("42", "Disk full", {"agap.class": "disk_full"})
    assert _agent(local_fabric, stub, state, cards).poll_once() == ["41", "42"]
    log = json.loads(state.read_text())
    backlog, unknown = (local_fabric.board.read(log[e]["task"]) for e in ("41", "42"))
    assert backlog.spec is not None and backlog.spec.target == "alvis" and "kimi" in backlog.spec.intent
    assert backlog.spec.refs == ("zabbix://zbx/event/41",)
    assert unknown.spec is not None and "Disk full" in unknown.spec.intent
    assert [a["eventids"] for a in stub.acks] == [["41"], ["42"]]
    assert f"filed task #{log['41']['task']} to alvis" in stub.acks[0]["message"]
    # A new agent over the same event log: nothing filed, nothing acknowledged twice.
    assert _agent(local_fabric, stub, state, cards).poll_once() == []
    assert len(stub.acks) == 2
    # The task ends: acknowledged once more, then never again.
    local_fabric.ledger.cancel(log["41"]["task"], "alvis", "handled")
    again = _agent(local_fabric, stub, state, cards)
    again.poll_once()
    again.poll_once()
    assert len(stub.acks) == 3 and "canceled" in stub.acks[2]["message"]


def test_a_revive_playbook_is_bounded(
    local_fabric: Fabric, stub: ZabbixStub, tmp_path: Path, cards: CardSet
) -> None:
    ids = []
    for i in range(3):
        tid = local_fabric.submit(f"dead {i}", target="kimi").task_id
        lease = local_fabric.ledger.claim(local_fabric.board.read(tid), "w", lease_seconds=60)
        local_fabric.ledger.fail(lease, "x", poison=True)
        ids.append(tid)
    book = tmp_path / OPS_PLAYBOOKS
    book.write_text("operator: alvis\nplaybooks:\n  - {name: revive, class: dead_letter, revive: {max: 2}}\n")
    agent = _agent(local_fabric, stub, tmp_path / "events.json", cards)
    agent.book = load_playbooks(book, tmp_path, cards)
    stub.add_problem("7", "dead letters", {"agap.class": "dead_letter"})
    assert agent.poll_once() == ["7"]
    states = [local_fabric.board.read(t).current.state for t in ids]  # type: ignore[union-attr]
    assert states.count(State.QUEUED) == 2 and states.count(State.DEAD) == 1
    assert "revived at most 2" in stub.acks[0]["message"]
    assert agent.poll_once() == [] and len(local_fabric.board.open_in([Column.DEAD])) == 1


def test_an_unreadable_answer_is_one_line_and_parks_the_ops_queue(
    local_fabric: Fabric, stub: ZabbixStub, tmp_path: Path, cards: CardSet
) -> None:
    agent = _agent(local_fabric, stub, tmp_path / "events.json", cards)
    stub.raw = b"<html>502 Bad Gateway</html>"
    with pytest.raises(ZabbixError) as err:
        agent.poll_once()
    assert "not JSON" in err.value.line() and "\n" not in err.value.line()
    assert json.loads(_park(local_fabric))["parked"] is True
    stub.raw = json.dumps({"jsonrpc": "2.0", "result": [{"eventid": "x"}], "id": 1}).encode()
    with pytest.raises(ZabbixError, match="cannot read"):
        agent.poll_once()
    stub.add_problem("5", "Queue kimi is backing up", {"agap.class": "backlog", "queue": "kimi"})
    assert agent.poll_once() == ["5"]  # back: nothing was lost
    assert json.loads(_park(local_fabric))["parked"] is False


def _park(fab: Fabric) -> str:
    meta = fab.port.call("getProjectMetadata", {"project_id": fab.board.layout.project_id})
    return str(meta[park_key("ops")])
