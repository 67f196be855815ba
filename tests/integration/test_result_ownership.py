"""Result ownership: a fenced owner's output is evidence, never the result; a rejected
result is reworked with the reason in the model's conversation.

The worker is the real one (the model executor in gateway mode) against the embedded
board over HTTP; the model provider is the loopback OpenAI-protocol stand-in, whose
answers the test releases, so nothing here waits on time.
"""

from __future__ import annotations

import base64
import multiprocessing as mp
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import evidence_key
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.sweeps import sweep_leases_and_gaps
from tests.conftest import REAL_SKIP, make_fabric, real_kanboard, scratch_board
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from tests.integration.procs import model_worker_one_task
from tests.integration.test_worker import CARDS, gateway_env, settings, stub, wcards
from workers.assembly import build_worker

__all__ = ["settings", "stub", "wcards"]  # the worker tests' fixtures, used here too


def _env(stub: OpenAIStub, tmp_path: Path, name: str) -> dict[str, str]:
    return gateway_env(stub, XDG_CACHE_HOME=str(tmp_path / f"cache-{name}"))


def _result_text(fab: Fabric, tid: int, ref: str) -> str:
    name = ref.rsplit("/", 1)[1]
    (f,) = [f for f in fab.board.files(tid) if f.name == name]
    return base64.b64decode(fab.board.download(f.id)).decode()


@pytest.fixture(params=["embedded", "real-kanboard"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    """Settings for a fresh pair of projects on the embedded board, or on a real Kanboard."""
    run = secrets.token_hex(4)
    if request.param == "embedded":
        with EmbeddedBoard(tmp_path / "board.sqlite3") as board:
            yield Settings(
                board_url=board.url, board_token=board.token, cards_dir=CARDS, state_dir=tmp_path / "s"
            )
        return
    real = real_kanboard()
    if real is None:
        pytest.skip(REAL_SKIP)
    scratch_board(*real)
    yield Settings(
        board_url=real[0],
        board_token=real[1],
        cards_dir=CARDS,
        state_dir=tmp_path / "s",
        project=f"fenced-{run}",
        locks_project=f"fenced-locks-{run}",
    )


@pytest.mark.timeout(600)
def test_a_frozen_workers_answer_is_evidence_and_the_new_owner_calls_the_model_again(
    target: Settings, wcards: CardSet, stub: OpenAIStub, tmp_path: Path
) -> None:
    settings = target
    called, thaw = threading.Event(), threading.Event()
    calls: list[int] = []

    def reply(body: dict[str, Any]) -> str:
        calls.append(1)
        if len(calls) == 1:
            called.set()
            thaw.wait(60)  # answered only once the worker is frozen and fenced
            return "first answer, from the frozen worker"
        return "second answer, from the new owner"

    stub.reply = reply
    client = KanboardClient(settings.board_url, settings.board_token)
    fab = make_fabric(client, wcards, settings=settings)
    # The keeper's clock runs a minute ahead: the frozen worker's 5 s lease has expired.
    keeper = make_fabric(client, wcards, clock=lambda: time.time() + 60, settings=settings)
    tid = fab.submit("Pick a restaurant", target="tester", priority="high").task_id

    ctx = mp.get_context("spawn")
    frozen = ctx.Process(
        target=model_worker_one_task,
        args=(
            settings.board_url,
            settings.board_token,
            str(CARDS),
            "tester",
            _env(stub, tmp_path, "frozen"),
            str(tmp_path / "state-frozen"),
            settings.project,
            settings.locks_project,
        ),
    )
    frozen.start()
    assert frozen.pid is not None
    try:
        assert called.wait(60), "the first worker never called the model"
        os.kill(frozen.pid, signal.SIGSTOP)  # frozen in the middle of its model call
        assert sweep_leases_and_gaps(keeper).requeued, "the keeper did not requeue the expired lease"
        first_epoch = next(e for e, r in fab.board.read(tid).records.items() if r.op == "claim")
        thaw.set()  # the answer is on its way; the worker thaws and gets it, fenced
        os.kill(frozen.pid, signal.SIGCONT)
        frozen.join(60)
        assert frozen.exitcode == 0
    finally:
        if frozen.is_alive():
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
            frozen.join(5)

    view = fab.board.read(tid)
    assert view.current is not None and view.current.state == State.QUEUED
    evidence = view.meta.get(evidence_key(first_epoch), "")
    assert "first answer" in evidence, sorted(view.meta)
    assert not any(r.receipts for e, r in view.records.items() if e > first_epoch)

    with Running(build_worker("tester", settings, wcards, env=_env(stub, tmp_path, "new"))):
        wait_until(lambda: fab.board.read(tid).current.state == State.DONE, what="done by the new owner")  # type: ignore[union-attr]
    view = fab.board.read(tid)
    done = view.current
    assert done is not None and done.result_ref is not None
    assert len(stub.chat_requests()) == 2, "the new owner must call the model itself"
    assert done.result_ref.endswith(f"/result-e{done.epoch - 1}.md") and done.epoch - 1 > first_epoch
    assert _result_text(fab, tid, done.result_ref) == "second answer, from the new owner"
    notes = [c.text for c in fab.board.comments(tid)]
    assert any("kept as evidence, not as the result" in n for n in notes), notes


def test_reopen_reworks_with_the_reason_in_the_models_conversation(
    embedded_board: EmbeddedBoard, settings: Settings, wcards: CardSet, stub: OpenAIStub, tmp_path: Path
) -> None:
    def reply(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        return "Chez Marcel" if "Wrong restaurant" in prompt else "Le Bistro"

    stub.reply = reply
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), wcards, settings=settings)
    tid = fab.submit("Book a restaurant", target="tester", priority="high").task_id

    def state() -> State | None:
        cur = fab.board.read(tid).current
        return cur.state if cur else None

    with Running(build_worker("tester", settings, wcards, env=_env(stub, tmp_path, "w"))):
        wait_until(lambda: state() == State.DONE, what="first result")
        first = fab.board.read(tid).current
        assert first is not None and first.result_ref is not None
        fab.ledger.reopen(tid, "alvis", "Wrong restaurant: I said vegetarian")
        wait_until(lambda: state() == State.DONE, what="reworked result")
    done = fab.board.read(tid).current
    assert done is not None and done.result_ref is not None and done.result_ref != first.result_ref
    assert _result_text(fab, tid, first.result_ref) == "Le Bistro"
    assert _result_text(fab, tid, done.result_ref) == "Chez Marcel"
    first_call, second_call = stub.chat_requests()
    assert "Wrong restaurant: I said vegetarian" in second_call.body["messages"][-1]["content"]
    assert first_call.headers["idempotency-key"] != second_call.headers["idempotency-key"]
