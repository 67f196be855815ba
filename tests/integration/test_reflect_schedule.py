"""The shipped reflect and consolidation schedules, end to end, as ``make run`` runs them:
``schedules.example.yaml`` fired with ``agap cron --once``, the project's cards and policy,
the embedded board over HTTP, the Hindsight stand-in ``agap up`` embeds (with its demo
memories) and the real worker of the agent the task was routed to, on the demo model.

The demo model's prompts are recorded on their way in: the recalled memories must be in
them, and the task must end done (before, every reflect dead-lettered: "unknown scheme")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.apps.cli.up_cmd import schedule_file
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.hindsight import DEMO_MEMORIES, HindsightStandIn
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT
from tests.helpers import board_env, drain
from workers.assembly import build_worker
from workers.llm import DemoClient

SCHEDULES = ROOT / "schedules.example.yaml"


@pytest.fixture
def memory() -> Iterator[HindsightStandIn]:
    with HindsightStandIn.with_demo_memories() as m:
        yield m


@pytest.fixture
def prompts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The user messages the demo model is given, in order."""
    seen: list[str] = []
    real = DemoClient.complete

    def recording(self: DemoClient, messages: list[dict[str, str]], **kw: Any) -> Any:
        seen.append("\n".join(m["content"] for m in messages if m["role"] == "user"))
        return real(self, messages, **kw)

    monkeypatch.setattr(DemoClient, "complete", recording)
    return seen


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path, memory: HindsightStandIn) -> dict[str, str]:
    e = board_env(
        embedded_board.url,
        embedded_board.token,
        ROOT / "cards",
        tmp_path / "state",
        AGAP_MODEL_MODE="demo",
        AGAP_HINDSIGHT_URL=memory.url,
    )
    res = CliRunner().invoke(main, ["init"], env=e, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return e


def fire(env: dict[str, str], name: str) -> int:
    res = CliRunner().invoke(main, ["cron", "--file", str(SCHEDULES), "--once", name, "--json"], env=env)
    assert res.exit_code == 0, res.output
    return int(json.loads(res.output)["task_id"])


def work(env: dict[str, str], fab: Fabric, task_id: int) -> None:
    """The real worker of the queue the task was routed to, until that queue is empty."""
    spec = fab.board.read(task_id).spec
    assert spec is not None
    cards = load_cards(ROOT / "cards")
    agent = next(c.id for c in cards if c.queue_name == spec.queue)
    drain(build_worker(agent, fab.settings, cards, env=env, drain=True))


@pytest.mark.parametrize(
    ("name", "listed"),
    [
        ("reflect", ["limit=50"]),
        ("consolidation", ["limit=100&type=world", "limit=100&type=experience", "limit=50&type=observation"]),
    ],
)
def test_a_shipped_schedule_runs_to_done_with_the_recalled_memories_in_its_prompt(
    env: dict[str, str], memory: HindsightStandIn, prompts: list[str], name: str, listed: list[str]
) -> None:
    settings = Settings(
        board_url=env["KANBOARD_URL"],
        board_token=env["KANBOARD_API_TOKEN"],
        cards_dir=ROOT / "cards",
        state_dir=Path(env["AGAP_STATE_DIR"]),
    )
    fab = Fabric.connect(settings, port=KanboardClient(env["KANBOARD_URL"], env["KANBOARD_API_TOKEN"]))
    task_id = fire(env, name)
    work(env, fab, task_id)
    cur = fab.board.read(task_id).current
    assert cur is not None and cur.state == State.DONE, (cur.state, cur.reason) if cur else None
    (prompt,) = prompts
    assert "=== ref 1: hindsight://adolf-alvis/?newest=" in prompt
    recent = [m.text for m in DEMO_MEMORIES["adolf-alvis"] if m.context != "habits"]  # hours old
    assert all(text in prompt for text in recent), prompt
    assert "budget reviewed" not in prompt  # 30 hours old: outside both windows
    assert not any(m.text in prompt for m in DEMO_MEMORIES["adolf-elizaveta"])  # another bank
    # The newest memories come from Hindsight's list API, which a real bank answers (a
    # recall query like "recent" matches nothing there).
    calls = [r for r in memory.requests if "/memories/" in r.path]
    assert [(r.method, r.path) for r in calls] == [
        ("GET", f"/v1/default/banks/adolf-alvis/memories/list?{q}") for q in listed
    ]
    assert fire(env, name) == task_id  # the same planned time: the same task, not a second reflect


def test_agap_up_runs_the_example_schedules_when_none_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGAP_SCHEDULES", raising=False)
    assert schedule_file() is None
    (tmp_path / "schedules.example.yaml").write_text(SCHEDULES.read_text())
    assert schedule_file() == Path("schedules.example.yaml")
    (tmp_path / "mine.yaml").write_text("schedules: []\n")
    monkeypatch.setenv("AGAP_SCHEDULES", "mine.yaml")
    assert schedule_file() == Path("mine.yaml")
