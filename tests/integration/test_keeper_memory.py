"""The keeper retains done results into Hindsight for a card's ``memory.retain``: the
project's cards (adolf given both people's banks), the embedded board over HTTP, the real
worker on the demo model, the Hindsight stand-in over loopback — and, when
``AGAP_TEST_HINDSIGHT_URL`` names one (``AGAP_TEST_HINDSIGHT_TOKEN``: its key), a real
Hindsight, into banks of the run's own (docs/HINDSIGHT.md says how to run one).

Each person's result goes into that person's bank once (a second sweep, a restarted
keeper: no second retain); work of no listed bank's domain is not retained; Hindsight
down / 401 / 422 is tried a bounded number of times, then one line in the journal."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.hindsight import HindsightClient
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import META_RETAINED
from fabric.refusals import PolicyRefused
from fabric.retain import retain_result
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from keeper.daemon import Keeper
from keeper.memory import state_of
from tests.conftest import ROOT, make_fabric
from tests.fakes.hindsight_stub import HindsightStub
from tests.helpers import board_env, drain
from workers.assembly import build_worker

MEMORY = "memory:\n  retain: [hindsight://adolf-alvis/, hindsight://adolf-elizaveta/]\n"
BACKOFF = 60.0


@dataclass
class Household:
    """The board, the cards (adolf with ``memory.retain``), a worker's settings and a
    Hindsight at ``url`` with ``key``."""

    board: EmbeddedBoard
    cards: CardSet
    settings: Settings
    env: dict[str, str]
    url: str
    key: str
    shift: list[float] = field(default_factory=lambda: [0.0])

    def clock(self) -> float:
        return time.time() + self.shift[0]

    def fabric(self) -> Fabric:
        port = KanboardClient(self.board.url, self.board.token)
        return make_fabric(port, self.cards, clock=self.clock, settings=self.settings)

    def keeper(self, attempts: int = 3) -> Keeper:
        """A keeper as a fresh process would make it: a new connection, nothing remembered."""
        cfg = KeeperConfig(retain_attempts=attempts, retain_backoff=BACKOFF)
        return Keeper.for_fabric(self.fabric(), cfg, hindsight=lambda: HindsightClient(self.url, self.key))

    def done(self, actor: str, intent: str = "plan the week") -> int:
        fab = self.fabric()
        task_id = fab.submit(intent, target="adolf", actor=actor).task_id
        drain(build_worker("adolf", self.settings, self.cards, env=self.env, drain=True))
        assert fab.show(task_id).current.state.value == "done"  # type: ignore[union-attr]
        return task_id

    def record(self, task_id: int) -> dict[str, object]:
        return state_of(self.fabric().show(task_id))

    def comments(self, task_id: int) -> list[str]:
        return [c.text for c in self.fabric().board.comments(task_id)]


@dataclass
class World(Household):
    memory: HindsightStub = field(kw_only=True)

    def retains(self) -> list[dict[str, object]]:
        return [r.body for r in self.memory.requests if r.method == "POST" and r.path.endswith("/memories")]


def household(
    board: EmbeddedBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: str, banks: dict[str, str]
) -> tuple[CardSet, Settings, dict[str, str]]:
    """The project's cards with ``memory`` appended to adolf's and an owner rule per
    person's bank in ``banks``; the settings and env of a worker on the demo model."""
    shutil.copytree(ROOT / "cards", tmp_path / "cards")
    (tmp_path / "souls").symlink_to(ROOT / "souls")
    card = tmp_path / "cards" / "adolf.yaml"
    card.write_text(card.read_text() + memory)
    policy = tmp_path / "cards" / "_policy.yaml"
    rules = "".join(f'  "hindsight://{bank}/": private:{who}\n' for who, bank in banks.items())
    policy.write_text(policy.read_text().replace("\ndomains:", "\ndomains:\n" + rules.rstrip("\n"), 1))
    settings = Settings(
        board_url=board.url,
        board_token=board.token,
        cards_dir=tmp_path / "cards",
        state_dir=tmp_path / "state",
    )
    env = board_env(board.url, board.token, tmp_path / "cards", settings.state_dir, AGAP_MODEL_MODE="demo")
    # The keeper reads dir results where the workers write them (the same env file).
    monkeypatch.setenv("AGAP_RESULT_DIR", env["AGAP_RESULT_DIR"])
    return load_cards(tmp_path / "cards"), settings, env


@pytest.fixture
def world(embedded_board: EmbeddedBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # The project's cards, adolf with both people's banks; souls and golden sets beside.
    cards, settings, env = household(embedded_board, tmp_path, monkeypatch, MEMORY, {})
    with HindsightStub({"adolf-alvis": [], "adolf-elizaveta": []}, api_key="hs-key") as memory:
        yield World(embedded_board, cards, settings, env, memory.url, "hs-key", memory=memory)


def test_each_persons_result_goes_into_their_own_bank_once_across_restarts(world: World) -> None:
    alvis, eliza, cron = world.done("alvis"), world.done("elizaveta"), world.done("cron", "tidy the shed")
    report = world.keeper().job_memory()
    assert report.retained == {alvis: "adolf-alvis", eliza: "adolf-elizaveta"}
    assert report.skipped == [cron]  # shared work: adolf lists no shared bank
    by_bank = {r.path.split("/banks/")[1].split("/")[0]: r.body for r in world.memory.requests}
    assert set(by_bank) == {"adolf-alvis", "adolf-elizaveta"}
    view = world.fabric().show(alvis)
    record = state_of(view)
    assert record["outcome"] == "retained" and record["attempts"] == 1
    receipt = record["receipt"]
    assert isinstance(receipt, dict)
    assert receipt == {
        "bank": "adolf-alvis",
        "domain": "private:alvis",
        "document_id": f"agap-task-{view.uid}",
    }
    (item,) = by_bank["adolf-alvis"]["items"]
    assert item["document_id"] == f"agap-task-{view.uid}" and item["content"].strip()
    assert any("retained in Hindsight bank adolf-alvis (private:alvis)" in c for c in world.comments(alvis))
    assert world.comments(cron) == [c for c in world.comments(cron) if "retain" not in c.lower()]
    # Again, and after a restart (a new keeper, a new connection): nothing is sent twice.
    assert world.keeper().job_memory().retained == {}
    world.fabric().ledger.verify(alvis, "alvis")  # verified since: still retained once
    assert world.keeper().job_memory().retained == {}
    assert len(world.retains()) == 2
    assert [m.text for m in world.memory.memories("adolf-alvis")] == [item["content"]]


def test_an_outage_is_tried_a_bounded_number_of_times_then_one_line(world: World) -> None:
    task_id = world.done("alvis")
    world.memory.fail_next(1, 503)
    world.memory.fail_next(1, 401)
    world.memory.fail_next(1, 422)
    first = world.keeper().job_memory()
    assert first.failed == [task_id] and world.record(task_id)["outcome"] == "failed"
    # Within the backoff nothing is sent, whichever keeper looks.
    assert world.keeper().job_memory().failed == [] and len(world.retains()) == 1
    world.fabric().ledger.verify(task_id, "alvis")  # closed meanwhile: still tried
    world.shift[0] += BACKOFF + 1
    assert world.keeper().job_memory().failed == [task_id]
    assert "refused the credentials" in str(world.record(task_id)["error"])
    world.shift[0] += BACKOFF + 1
    last = world.keeper().job_memory()
    assert last.gave_up == [task_id] and len(world.retains()) == 3
    record = world.record(task_id)
    assert record["outcome"] == "gave-up" and record["attempts"] == 3
    (line,) = [c for c in world.comments(task_id) if "retain" in c.lower()]
    assert "after 3 attempts" in line and "HTTP 422" in line and len(line.splitlines()) == 1
    assert f"agap memory retain {task_id} hindsight://adolf-alvis/" in line
    world.shift[0] += 10 * BACKOFF
    assert world.keeper().job_memory().gave_up == []
    assert len(world.retains()) == 3 and world.memory.memories("adolf-alvis") == []  # nothing half-written


def test_a_failed_attempt_is_followed_by_one_retain_and_a_cut_attempt_counts(world: World) -> None:
    task_id = world.done("alvis")
    world.memory.fail_next(1, 503)
    assert world.keeper().job_memory().failed == [task_id]
    world.shift[0] += BACKOFF + 1
    assert world.keeper().job_memory().retained == {task_id: "adolf-alvis"}
    assert world.record(task_id)["attempts"] == 2 and len(world.memory.memories("adolf-alvis")) == 1
    # A keeper stopped during its last attempt: the next one gives up, sends nothing.
    other = world.done("alvis", "plan the month")
    fab = world.fabric()
    cut = {"outcome": "sending", "attempts": 1, "at": world.clock(), "bank": "adolf-alvis"}
    fab.board.save_meta(other, {META_RETAINED: json.dumps(cut)})
    world.shift[0] += BACKOFF + 1
    sent = len(world.retains())
    assert world.keeper(attempts=1).job_memory().gave_up == [other] and len(world.retains()) == sent


REAL_URL, REAL_TOKEN = "AGAP_TEST_HINDSIGHT_URL", "AGAP_TEST_HINDSIGHT_TOKEN"


def test_on_a_real_hindsight_each_result_goes_into_its_own_bank_once(
    embedded_board: EmbeddedBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = os.environ.get(REAL_URL, "").rstrip("/")
    if not url:
        pytest.skip(f"{REAL_URL} not set: name a scratch Hindsight with it (and {REAL_TOKEN}) to run this")
    run = uuid.uuid4().hex[:10]
    # Banks of this run only (a case-sensitive id, and one with Hindsight's OpenClaw "::").
    banks = {"alvis": f"Agap-Keeper-{run}", "elizaveta": f"agap::keeper::{run}"}
    memory = f"memory:\n  retain: [hindsight://{banks['alvis']}/, hindsight://{banks['elizaveta']}/]\n"
    cards, settings, env = household(embedded_board, tmp_path, monkeypatch, memory, banks)
    key = os.environ.get(REAL_TOKEN, "")
    real = Household(embedded_board, cards, settings, env, url, key)
    api = HindsightClient(url, key, timeout=120)

    def documents(bank: str) -> list[str]:
        return [
            str(m.get("document_id")) for m in api.list_memories(bank) if m.get("fact_type") != "observation"
        ]

    alvis = real.done("alvis", f"plan the week around the {run}zed dentist")
    eliza, cron = real.done("elizaveta"), real.done("cron", "tidy the shed")
    report = real.keeper().job_memory()
    assert report.retained == {alvis: banks["alvis"], eliza: banks["elizaveta"]} and report.skipped == [cron]
    view = real.fabric().show(alvis)
    document = f"agap-task-{view.uid}"
    assert set(documents(banks["alvis"])) == {document}
    assert documents(banks["elizaveta"]) == [f"agap-task-{real.fabric().show(eliza).uid}"]
    found = api.recall(banks["alvis"], {"query": f"{run}zed dentist", "budget": "low"})
    assert any(r.get("document_id") == document for r in found), found
    # Once: again, after a restart, verified since, and by hand (Hindsight upserts by document).
    assert real.keeper().job_memory().retained == {}
    real.fabric().ledger.verify(alvis, "alvis")
    assert real.keeper().job_memory().retained == {}
    retain_result(real.fabric(), alvis, f"hindsight://{banks['alvis']}/", api)
    assert set(documents(banks["alvis"])) == {document}
    # Never across people: refused before anything reaches Hindsight.
    with pytest.raises(PolicyRefused, match=r"privacy\.retain"):
        retain_result(real.fabric(), alvis, f"hindsight://{banks['elizaveta']}/", api)
    assert document not in documents(banks["elizaveta"])
    # A wrong key: tried, refused, recorded in one line; nothing written.
    other = real.done("alvis", "plan the month")
    keeper = Keeper.for_fabric(
        real.fabric(), KeeperConfig(retain_attempts=1), hindsight=lambda: HindsightClient(url, key + "-wrong")
    )
    if key:
        assert keeper.job_memory().gave_up == [other]
        (line,) = [c for c in real.comments(other) if "retain" in c.lower()]
        assert "refused the credentials (HTTP 401)" in line and len(line.splitlines()) == 1
        assert f"agap-task-{real.fabric().show(other).uid}" not in documents(banks["alvis"])
