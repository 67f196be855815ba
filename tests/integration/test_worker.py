"""Workers end to end: the embedded board over HTTP, the model plane a loopback stand-in.

The stand-in speaks the OpenAI chat-completions protocol (what the LiteLLM proxy serves),
so these tests run the worker's real gateway path without the proxy; the proxy itself is
exercised in test_litellm_gateway.py.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardError
from fabric.ledger import Lease
from fabric.results import ResultStore
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Lines, Running, wait_until
from workers.assembly import build_worker
from workers.executor import ModelExecutor

CARDS = Path(__file__).parent / "cards_worker"


@pytest.fixture
def wcards() -> CardSet:
    return load_cards(CARDS, base_dir=CARDS)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


@pytest.fixture
def settings(embedded_board: EmbeddedBoard, tmp_path: Path) -> Settings:
    return Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=CARDS,
        state_dir=tmp_path / "state",
    )


@pytest.fixture
def fab(embedded_board: EmbeddedBoard, wcards: CardSet, settings: Settings) -> Fabric:
    return make_fabric(KanboardClient(embedded_board.url, embedded_board.token), wcards, settings=settings)


def gateway_env(stub: OpenAIStub, **extra: str) -> dict[str, str]:
    return {
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": stub.url,
        "AGAP_LITELLM_KEY": stub.api_key,
        **extra,
    }


def start(settings: Settings, cards: CardSet, env: dict[str, str]) -> Running:
    return Running(build_worker("tester", settings, cards, env=env))


def state_of(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None


def test_a_task_runs_through_the_gateway_tagged_and_keyed(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    tid = fab.submit("Say hello", target="tester").task_id
    with start(settings, wcards, gateway_env(stub)):
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="task done")
    view = fab.board.read(tid)
    assert view.current is not None and view.uid is not None
    ref = view.current.result_ref
    assert ref == f"kanboard://task/{tid}/file/result-e1.md"
    files = fab.board.files(tid)
    text = base64.b64decode(fab.board.download(files[0].id)).decode()
    assert text.startswith("stub reply to:")
    assert ref in view.row["description"], "the description links the result"
    (req,) = stub.chat_requests()
    assert req.headers["authorization"] == f"Bearer {stub.api_key}"
    assert req.headers["idempotency-key"] == f"{view.uid}:e1:model-call"
    tags = req.body["metadata"]["tags"]
    assert {"agent:tester", f"task:{tid}", "queue:tester"} <= set(tags)


def test_a_spent_quota_parks_the_queue_visibly_and_low_priority_waits(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    # quota 4 per hour, half reserved for interactive work: 2 background calls, then
    # only high/urgent tasks run, then nothing.
    low = [fab.submit(f"background {i}", target="tester", priority="low").task_id for i in range(3)]
    with start(settings, wcards, gateway_env(stub)):
        wait_until(lambda: sum(state_of(fab, t) == State.DONE for t in low) == 2, what="2 done")
        # The worker publishes the park when it decides to keep the rest for interactive work.
        parks = wait_until(
            lambda: fab.board.park_states().get("tester", {}).get("parked"), what="park published"
        )
        assert parks
        state = fab.board.park_states()["tester"]
        assert state["reason"].startswith("reserved for interactive work")
        assert sum(state_of(fab, t) == State.DONE for t in low) == 2, "the reserve must hold"
        urgent = [fab.submit(f"urgent {i}", target="tester", priority="urgent").task_id for i in range(3)]
        wait_until(
            lambda: sum(state_of(fab, t) == State.DONE for t in urgent) == 2,
            what="interactive work runs in the reserve",
        )
        wait_until(
            lambda: fab.board.park_states()["tester"]["reason"].startswith("quota spent"),
            what="quota spent published",
        )
        state = fab.board.park_states()["tester"]
        assert state["parked"] and state["until"] > time.time() + 3000
    # 2 background + 2 interactive: the quota of 4, the third background task never ran.
    assert len(stub.chat_requests()) == 4
    assert [state_of(fab, t) for t in low].count(State.QUEUED) == 1, "one background task waits"
    fab.listing()
    assert fab.parks["tester"]["parked"]


def test_a_429_parks_until_the_announced_reset_and_resumes_by_itself(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    stub.fail_next("429", retry_after="1", reset_requests="1s")
    tid = fab.submit("rate limited at first", target="tester").task_id
    with start(settings, wcards, gateway_env(stub)):
        wait_until(lambda: fab.board.park_states().get("tester", {}).get("parked"), what="parked on 429")
        assert fab.board.park_states()["tester"]["reason"].startswith("rate limited")
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="resumed after reset")
        wait_until(lambda: not fab.board.park_states()["tester"]["parked"], what="unparked")
    view = fab.board.read(tid)
    ops = [r.op for _, r in sorted(view.records.items())]
    assert ops == ["submit", "claim", "release", "claim", "complete"], ops
    assert view.current is not None and view.current.attempt == 1, "a 429 is not a failure"


def test_an_unreachable_model_plane_parks_and_the_queue_resumes(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    stub.fail_next("503", count=2)
    tid = fab.submit("plane down at first", target="tester").task_id
    worker = build_worker("tester", settings, wcards, env=gateway_env(stub))
    assert isinstance(worker.executor, ModelExecutor)
    worker.executor.outage.first = 0.2
    with Running(worker):
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="done after the outage")
    ops = [r.op for _, r in sorted(fab.board.read(tid).records.items())]
    assert ops.count("release") == 2 and ops[-1] == "complete", ops
    assert "fail" not in ops


def test_a_malformed_answer_is_a_failed_attempt_then_a_retry_succeeds(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    stub.fail_next("malformed")
    tid = fab.submit("flaky model", target="tester").task_id
    with start(settings, wcards, gateway_env(stub)):
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="done after a retry")
    records = [r for _, r in sorted(fab.board.read(tid).records.items())]
    fail = next(r for r in records if r.op == "fail")
    assert "bad model response" in (fail.reason or "") and fail.not_before is not None
    assert records[-1].attempt == 2


def test_an_unknown_ref_scheme_dead_letters_with_a_clear_reason(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub
) -> None:
    tid = fab.submit("read this", target="tester", refs=["gopher://old.example/doc"]).task_id
    with start(settings, wcards, gateway_env(stub)):
        wait_until(lambda: state_of(fab, tid) == State.DEAD, what="dead letter")
    cur = fab.board.read(tid).current
    assert cur is not None and "unknown scheme 'gopher'" in (cur.reason or "")
    assert stub.chat_requests() == [], "no paid call for a task that cannot be resolved"


def test_results_can_go_to_a_directory(
    fab: Fabric, settings: Settings, wcards: CardSet, stub: OpenAIStub, tmp_path: Path
) -> None:
    tid = fab.submit("write it down", target="tester").task_id
    env = gateway_env(stub, AGAP_RESULT_STORE="dir", AGAP_RESULT_DIR=str(tmp_path / "results"))
    with start(settings, wcards, env):
        wait_until(lambda: state_of(fab, tid) == State.DONE, what="done")
    view = fab.board.read(tid)
    ref = view.current.result_ref  # type: ignore[union-attr]
    assert ref == (tmp_path / "results" / str(view.uid) / "result-e1.md").as_uri()
    assert Path(ref[len("file://") :]).read_text().startswith("stub reply to:")


def test_the_board_going_down_mid_task_loses_nothing(
    embedded_board: EmbeddedBoard,
    fab: Fabric,
    settings: Settings,
    wcards: CardSet,
    stub: OpenAIStub,
    tmp_path: Path,
) -> None:
    started, answer = threading.Event(), threading.Event()

    def slow_reply(body: dict[str, Any]) -> str:
        started.set()
        answer.wait(30)  # the model answers when the test says so
        return "slow but sure"

    stub.reply = slow_reply
    tid = fab.submit("survive the outage", target="tester").task_id
    db, port, token = embedded_board.store.path, embedded_board.port, embedded_board.token
    # The outage stays within the grace however slowly this machine runs.
    worker = build_worker("tester", settings, wcards, env=gateway_env(stub, AGAP_OUTAGE_GRACE="5m"))
    assert isinstance(worker.executor, ModelExecutor)
    store = worker.executor.results = FailuresCounted(worker.executor.results)
    with Running(worker):
        assert started.wait(20), "the model call never started"
        embedded_board.stop()  # the board dies while the model is thinking
        answer.set()
        wait_until(lambda: store.failures >= 2, timeout=30, what="the result held while the board is away")
        revived = EmbeddedBoard(db, port=port, token=token).start()
        wait_until(
            lambda: state_of(fab, tid) == State.DONE, timeout=30, what="done after the board came back"
        )
    ops = [r.op for _, r in sorted(fab.board.read(tid).records.items())]
    revived.stop()
    # A short outage (within the grace): the result was held and stored on reconnect.
    assert ops == ["submit", "claim", "complete"], "no requeue, no second execution"
    assert len(stub.chat_requests()) == 1


class FailuresCounted:
    """A result store that counts the puts the board refused (it was away)."""

    def __init__(self, inner: ResultStore) -> None:
        self.inner = inner
        self.failures = 0

    def put(self, lease: Lease, text: str) -> str:
        try:
            return self.inner.put(lease, text)
        except BoardError:
            self.failures += 1
            raise

    def get(self, ref: str) -> str:
        return self.inner.get(ref)


def test_sigterm_finishes_the_current_task_and_exits_zero(
    fab: Fabric, settings: Settings, stub: OpenAIStub, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys

    started, answer = threading.Event(), threading.Event()

    def slow_reply(body: dict[str, Any]) -> str:
        started.set()
        answer.wait(30)  # answers once the worker has taken the SIGTERM in
        return "finished after SIGTERM"

    stub.reply = slow_reply
    tid = fab.submit("long task", target="tester").task_id
    other = fab.submit("next task", target="tester").task_id
    env = {
        **os.environ,
        **gateway_env(stub),
        "KANBOARD_URL": settings.board_url,
        "KANBOARD_API_TOKEN": settings.board_token,
        "AGAP_CARDS_DIR": str(CARDS),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "c"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "worker", "--agent", "tester", "--concurrency", "1"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = Lines(proc.stderr)
    try:
        assert started.wait(30), "the worker never called the model"
        proc.send_signal(signal.SIGTERM)
        lines.wait_for("finishing the current task", timeout=30)
        answer.set()
        proc.wait(30)
    finally:
        proc.kill()
    err = lines.close()
    assert proc.returncode == 0, err
    # Equal priorities are spread at random: whichever task it took, it finished it,
    # and started nothing new after SIGTERM.
    states = sorted([state_of(fab, tid), state_of(fab, other)])  # type: ignore[type-var]
    assert states == [State.DONE, State.QUEUED], (states, err)
    assert "1 completed" in err
    assert (tmp_path / "state" / "availability-tester.json").exists(), "counters saved"
