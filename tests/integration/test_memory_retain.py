"""``agap memory retain``: a task's result back into a Hindsight bank, end to end — the
project's cards and policy, the embedded board over HTTP, the real worker on the demo
model, the Hindsight stand-in over loopback (its retain and consolidate endpoints).

The attack: a task done for alvis (private:alvis) retained into elizaveta's bank is
refused before anything reaches Hindsight (exit 6, one line); so is a bank no rule owns."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_POLICY, EXIT_UNREACHABLE
from fabric.settings.resolve import Settings
from tests.conftest import ROOT
from tests.fakes.hindsight_stub import HindsightStub, Memory
from tests.helpers import acting_as, board_env, drain, sign_in_people
from workers.assembly import build_worker


@dataclass
class World:
    env: dict[str, str]
    memory: HindsightStub
    settings: Settings

    def agap(self, *args: str, actor: str = "cli", **env: str) -> Result:
        return CliRunner().invoke(main, list(args), env={**self.env, **acting_as(actor), **env})

    def done_task(self, actor: str, refs: tuple[str, ...] = ()) -> int:
        args = ["submit", "--target", "adolf", "--intent", "plan the week", "--json"]
        for ref in refs:
            args += ["--ref", ref]
        res = self.agap(*args, actor=actor)
        assert res.exit_code == 0, res.output
        task_id = int(json.loads(res.output)["task_id"])
        drain(build_worker("adolf", self.settings, load_cards(ROOT / "cards"), env=self.env, drain=True))
        shown = self.agap("show", str(task_id), "--json")
        assert json.loads(shown.output)["state"] == "done", shown.output
        return task_id

    def retains(self) -> list[object]:
        return [r.body for r in self.memory.requests if r.method == "POST" and r.path.endswith("/memories")]


@pytest.fixture
def world(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[World]:
    banks = {"adolf-alvis": [Memory("a1", "Alvis cycles to work on Mondays.")], "adolf-elizaveta": []}
    with HindsightStub(banks, api_key="hs-key") as memory:
        settings = Settings(
            board_url=embedded_board.url,
            board_token=embedded_board.token,
            cards_dir=ROOT / "cards",
            state_dir=tmp_path / "state",
        )
        env = board_env(
            embedded_board.url,
            embedded_board.token,
            ROOT / "cards",
            settings.state_dir,
            AGAP_MODEL_MODE="demo",
            AGAP_HINDSIGHT_URL=memory.url,
            AGAP_HINDSIGHT_KEY="hs-key",
        )
        sign_in_people(embedded_board)
        res = CliRunner().invoke(main, ["init"], env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        yield World(env, memory, settings)


def one_line(res: Result, code: int, text: str) -> None:
    assert res.exit_code == code, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert text in line, line


def test_a_result_is_retained_into_its_own_persons_bank_once_per_task(world: World) -> None:
    task_id = world.done_task("alvis")
    res = world.agap("memory", "retain", str(task_id), "hindsight://adolf-alvis/", "--json")
    assert res.exit_code == EXIT_OK, res.output
    out = json.loads(res.output)
    assert out["bank"] == "adolf-alvis" and out["domain"] == "private:alvis" and out["consolidation"] is None
    (body,) = world.retains()
    assert isinstance(body, dict)
    (item,) = body["items"]
    assert item["document_id"] == out["document_id"] and item["document_id"].startswith("agap-task-")
    assert item["context"] == f"agap task #{task_id}: plan the week" and item["content"].strip()
    assert world.memory.requests[-1].authorization == "Bearer hs-key"
    kept = world.memory.memories("adolf-alvis")
    assert kept[0].text == "Alvis cycles to work on Mondays." and len(kept) == 2
    # Again, with Hindsight's own consolidation: the same document, replaced, not copied.
    res = world.agap("memory", "retain", str(task_id), "hindsight://adolf-alvis/", "--consolidate")
    assert res.exit_code == EXIT_OK, res.output
    assert "consolidation queued" in res.output
    assert len(world.memory.memories("adolf-alvis")) == 2
    assert world.memory.consolidations == ["adolf-alvis"]


def test_alvis_s_result_is_refused_into_elizaveta_s_bank_and_nothing_is_sent(world: World) -> None:
    task_id = world.done_task("alvis")
    for bank, rule in (
        ("hindsight://adolf-elizaveta/", "privacy.retain"),
        ("hindsight://Adolf-Alvis/", "privacy.unknown"),  # another bank: ids are case-sensitive
        ("hindsight://nobody/", "privacy.unknown"),
    ):
        one_line(world.agap("memory", "retain", str(task_id), bank), EXIT_POLICY, f"PRIVACY [{rule}")
    assert world.retains() == [], "a refused retain never reaches Hindsight"
    assert world.memory.memories("adolf-elizaveta") == []


def test_a_task_that_read_alvis_s_bank_goes_back_into_it_only(world: World) -> None:
    # What the shipped reflect schedule does: no person submitted it, it read alvis's bank.
    task_id = world.done_task("cron", refs=("hindsight://adolf-alvis/?newest=5",))
    res = world.agap("memory", "retain", str(task_id), "hindsight://adolf-alvis/")
    assert res.exit_code == EXIT_OK, res.output
    one_line(
        world.agap("memory", "retain", str(task_id), "hindsight://adolf-elizaveta/"),
        EXIT_POLICY,
        "PRIVACY [privacy.retain",
    )


def test_bad_input_is_one_line_with_its_exit_code_and_nothing_is_retried(world: World) -> None:
    task_id = world.done_task("alvis")
    retain = ("memory", "retain", str(task_id), "hindsight://adolf-alvis/")
    one_line(
        world.agap("memory", "retain", str(task_id), "hindsight://adolf-alvis/q"),
        EXIT_INVALID,
        "a whole bank",
    )
    one_line(world.agap("memory", "retain", str(task_id), "file:///tmp/x"), EXIT_INVALID, "not a bank")
    one_line(world.agap(*retain, AGAP_HINDSIGHT_KEY="wrong"), EXIT_UNREACHABLE, "refused the credentials")
    world.memory.fail_next(1, 503)
    one_line(world.agap(*retain), EXIT_UNREACHABLE, "HTTP 503")
    sent = len(world.retains())
    assert sent == 2  # the 401 and the 503, each sent once: never again on its own
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    one_line(
        world.agap(*retain, AGAP_HINDSIGHT_URL=f"http://127.0.0.1:{port}"), EXIT_UNREACHABLE, "no answer"
    )
    res = world.agap("submit", "--target", "adolf", "--intent", "not yet", "--json", actor="alvis")
    waiting = json.loads(res.output)["task_id"]
    one_line(
        world.agap("memory", "retain", str(waiting), "hindsight://adolf-alvis/"), EXIT_FAILED, "no result"
    )
    assert len(world.memory.memories("adolf-alvis")) == 1  # nothing half-written
