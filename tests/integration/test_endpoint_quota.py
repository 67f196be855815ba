"""The model endpoint's quota holds across slots, queues and worker processes, and a
model call that times out is charged and, repeated, counts as a failed attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT, make_fabric
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from tests.integration.test_worker import gateway_env, state_of
from workers.assembly import build_worker

HUMAN = (ROOT / "tests" / "integration" / "cards_worker" / "alvis.yaml").read_text()

POOL = """
id: pool
kind: model
name: A quota-limited model
tier: medium
trust: trusted
capabilities: [chat]
availability:
  - shape: quota
    limit: 3
    window: 1h
runtime:
  mode: gateway
  model: openai/pool
  concurrency: 4
  poll_seconds: 0.05
  lease_seconds: 10
  backoff_seconds: 0.1
  timeout_seconds: {timeout}
  max_attempts: {attempts}
"""

PAL = """
id: pal
kind: persona
name: A persona on the same model
trust: trusted
capabilities: [chat]
runtime:
  mode: gateway
  model: openai/pool
  concurrency: 4
  poll_seconds: 0.05
  lease_seconds: 10
  backoff_seconds: 0.1
"""


def card_dir(tmp: Path, *, timeout: float = 30, attempts: int = 3) -> Path:
    d = tmp / "cards"
    d.mkdir()
    (d / "alvis.yaml").write_text(HUMAN)
    (d / "pool.yaml").write_text(POOL.format(timeout=timeout, attempts=attempts))
    (d / "pal.yaml").write_text(PAL)
    return d


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def _fabric(board: EmbeddedBoard, cards: CardSet, tmp: Path) -> tuple[Fabric, Settings]:
    settings = Settings(
        board_url=board.url, board_token=board.token, cards_dir=tmp / "cards", state_dir=tmp / "state"
    )
    return make_fabric(KanboardClient(board.url, board.token), cards, settings=settings), settings


def _env(tmp: Path, board: EmbeddedBoard, stub: OpenAIStub) -> dict[str, str]:
    return {
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_CARDS_DIR": str(tmp / "cards"),
        "AGAP_STATE_DIR": str(tmp / "state"),
        **gateway_env(stub),
    }


def _worker(tmp: Path, board: EmbeddedBoard, stub: OpenAIStub, agent: str, n: str) -> subprocess.Popen[str]:
    env = {**os.environ, **_env(tmp, board, stub), "AGAP_WORKER_ID": f"{agent}-{n}"}
    log = open(tmp / f"{agent}-{n}.log", "w")  # noqa: SIM115  (the process owns it)
    return subprocess.Popen(
        [sys.executable, "-c", "from fabric.apps.cli import main; main()", "worker", "--agent", agent],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _parked(fab: Fabric, queue: str) -> bool:
    state: dict[str, Any] = fab.board.park_states().get(queue, {})
    return bool(state.get("parked")) and str(state.get("reason", "")).startswith("quota spent")


def _says(tmp: Path, name: str, text: str) -> bool:
    path = tmp / f"{name}.log"
    return path.exists() and text in path.read_text()


def test_two_worker_processes_and_a_persona_queue_share_one_quota_of_three(
    embedded_board: EmbeddedBoard, stub: OpenAIStub, tmp_path: Path
) -> None:
    gate = threading.Event()

    def held(body: dict[str, Any]) -> str:
        # The calls stay open until every worker has looked: a slot that passed a(t)
        # without counting its call would start a fourth one meanwhile.
        gate.wait(60)
        return "done"

    stub.reply = held
    cards = load_cards(card_dir(tmp_path), base_dir=tmp_path)
    fab, _ = _fabric(embedded_board, cards, tmp_path)
    tasks = [fab.submit(f"pool work {i}", target="pool").task_id for i in range(6)]
    tasks += [fab.submit(f"pal work {i}", target="pal").task_id for i in range(4)]
    names = ["pool-1", "pool-2", "pal-1"]
    procs = [_worker(tmp_path, embedded_board, stub, *n.split("-", 1)) for n in names]
    try:
        wait_until(lambda: len(stub.chat_requests()) >= 3, timeout=90, what="three model calls")
        # Every worker process finds the model's quota spent, and each queue says so.
        wait_until(
            lambda: all(_says(tmp_path, n, "parked: quota spent") for n in names),
            timeout=90,
            what="every worker parks",
        )
        wait_until(lambda: _parked(fab, "pool") and _parked(fab, "pal"), timeout=30, what="both queues park")
        calls_while_open = len(stub.chat_requests())
        ls = CliRunner().invoke(main, ["ls"], env=_env(tmp_path, embedded_board, stub))
        gate.set()
        wait_until(
            lambda: sum(state_of(fab, t) == State.DONE for t in tasks) >= 3, timeout=60, what="three done"
        )
    finally:
        gate.set()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    # Four slots in each of three workers, ten tasks: three calls in a quota of three.
    assert calls_while_open == 3
    assert "PARKED model pool: queues pal, pool" in ls.output, ls.output
    assert len(stub.chat_requests()) == 3
    assert sum(state_of(fab, t) == State.DONE for t in tasks) == 3
    assert sum(state_of(fab, t) == State.QUEUED for t in tasks) == 7, "the rest wait, intact"
    ledger = json.loads((tmp_path / "state" / "endpoints" / "pool.quota0.json").read_text())
    assert len(ledger["calls"]) == 3
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]


def test_a_call_that_always_times_out_is_charged_and_ends_as_a_failed_attempt(
    embedded_board: EmbeddedBoard, stub: OpenAIStub, tmp_path: Path
) -> None:
    gate = threading.Event()

    def slow(body: dict[str, Any]) -> str:
        gate.wait(30)  # far longer than the card's timeout
        return "too late"

    stub.reply = slow
    cards = load_cards(card_dir(tmp_path, timeout=0.5, attempts=1), base_dir=tmp_path)
    fab, settings = _fabric(embedded_board, cards, tmp_path)
    tid = fab.submit("a prompt the model never finishes in time", target="pool").task_id
    try:
        with Running(build_worker("pool", settings, cards, env=gateway_env(stub))):
            wait_until(lambda: state_of(fab, tid) == State.DEAD, timeout=60, what="dead letter")
    finally:
        gate.set()
    ops = [r.op for _, r in sorted(fab.board.read(tid).records.items())]
    assert ops[:4] == ["submit", "claim", "release", "claim"], ops
    dead = fab.board.read(tid).current
    assert dead is not None and "2 times in a row" in (dead.reason or ""), dead
    assert len(stub.chat_requests()) == 2
    # The provider may still run (and bill) an abandoned call: both stay counted.
    ledger = json.loads((tmp_path / "state" / "endpoints" / "pool.quota0.json").read_text())
    assert len(ledger["calls"]) == 2


MODEL = """
id: {id}
kind: model
name: {id}
tier: {tier}
trust: trusted
capabilities: [chat, tools]
availability:
  - shape: quota
    limit: {limit}
    window: 1h
runtime:
  mode: gateway
  model: openai/{id}
"""

PERSONA = """
id: pal
kind: persona
name: A persona that names the strength it needs
trust: trusted
capabilities: [chat]
runtime:
  mode: gateway
  poll_seconds: 0.05
  lease_seconds: 10
  backoff_seconds: 0.1
backbone:
  constraints:
    tier: {tier}
    capabilities: [tools]
"""


def persona_cards(tmp: Path, tier: str) -> CardSet:
    d = tmp / "cards"
    d.mkdir(exist_ok=True)
    (d / "alvis.yaml").write_text(HUMAN)
    (d / "near.yaml").write_text(MODEL.format(id="near", tier="medium", limit=1))
    (d / "far.yaml").write_text(MODEL.format(id="far", tier="large", limit=10))
    (d / "pal.yaml").write_text(PERSONA.format(tier=tier))
    return load_cards(d, base_dir=tmp)


def models_called(stub: OpenAIStub) -> list[str]:
    return [r.body["model"] for r in stub.chat_requests()]


def test_a_persona_runs_on_the_closest_backbone_and_falls_back_when_it_parks(
    embedded_board: EmbeddedBoard, stub: OpenAIStub, tmp_path: Path
) -> None:
    cards = persona_cards(tmp_path, "medium")
    fab, settings = _fabric(embedded_board, cards, tmp_path)
    first = fab.submit("one", target="pal").task_id
    with Running(build_worker("pal", settings, cards, env=gateway_env(stub))):
        wait_until(lambda: state_of(fab, first) == State.DONE, what="first done")
        second = fab.submit("two", target="pal").task_id  # near's quota of one is spent now
        wait_until(lambda: state_of(fab, second) == State.DONE, what="second done")
    assert models_called(stub) == ["openai/near", "openai/far"]
    done = [fab.board.read(t).current for t in (first, second)]
    assert done[0] is not None and done[0].reason == "backbone near (openai/near): closest fit"
    assert done[1] is not None and (done[1].reason or "").startswith("backbone far (openai/far): fits;")


def test_a_one_line_constraint_edit_swaps_the_backbone(
    embedded_board: EmbeddedBoard, stub: OpenAIStub, tmp_path: Path
) -> None:
    cards = persona_cards(tmp_path, "large")  # the edit: tier medium -> large
    fab, settings = _fabric(embedded_board, cards, tmp_path)
    tid = fab.submit("one", target="pal").task_id
    with Running(build_worker("pal", settings, cards, env=gateway_env(stub))):
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="done")
    assert models_called(stub) == ["openai/far"]
