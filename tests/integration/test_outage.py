"""Bounded outage rules: the board is cut while a worker holds a task.

While the board is unreachable a worker finishes only what is already running, starts
nothing new, makes no externally visible call without a lease it can check, and
reconciles (is it still the owner?) when the board returns.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from tests.integration.test_worker import (
    CARDS,
    fab,  # noqa: F401  (fixture)
    gateway_env,
    settings,  # noqa: F401  (fixture)
    state_of,
    stub,  # noqa: F401  (fixture)
    wcards,  # noqa: F401  (fixture)
)
from workers.assembly import build_worker


class SlowDoc:
    """A loopback document server whose answer waits for a gate (a slow context ref)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.gate = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.asked.set()
                outer.gate.wait(30)
                body = b"the document"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/doc"

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def doc() -> Iterator[SlowDoc]:
    d = SlowDoc()
    yield d
    d.close()


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """True once a worker thread has logged ``text`` (the worker's own account of a step)."""
    return any(text in r.getMessage() for r in list(caplog.records))


def _cut(board: EmbeddedBoard) -> tuple[str, int, str]:
    db, port, token = board.store.path, board.port, board.token
    board.stop()
    return db, port, token


def _owning_the_doc(embedded_board: EmbeddedBoard, doc: SlowDoc, tmp: Path) -> tuple[Fabric, Settings, Any]:
    """The worker cards with a policy rule that names the slow document's owner: a loopback
    URL belongs to nobody visible until a rule says whose it is (docs/POLICY.md §3)."""
    cards_dir = tmp / "cards"
    shutil.copytree(CARDS, cards_dir)
    (cards_dir / "_policy.yaml").write_text(f'domains:\n  "{doc.url.rsplit("/", 1)[0]}/": shared\n')
    cards = load_cards(cards_dir, base_dir=cards_dir)
    owned = Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=cards_dir,
        state_dir=tmp / "state",
    )
    port = KanboardClient(embedded_board.url, embedded_board.token)
    return make_fabric(port, cards, settings=owned), owned, cards


def test_no_model_call_starts_while_the_board_is_cut(
    embedded_board: EmbeddedBoard,
    stub: OpenAIStub,  # noqa: F811
    doc: SlowDoc,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    board_fab, owned, owned_cards = _owning_the_doc(embedded_board, doc, tmp_path)
    caplog.set_level(logging.INFO)
    tid = board_fab.submit("read and answer", target="tester", refs=[doc.url]).task_id
    with Running(build_worker("tester", owned, owned_cards, env=gateway_env(stub))):
        assert doc.asked.wait(20), "the worker never resolved the ref"
        db, port, token = _cut(embedded_board)  # the board goes away mid-task
        doc.gate.set()  # the executor moves on to its ownership check: unreachable
        # The executor gave the task back (no lease check, no call); the worker now waits
        # to record that release.
        wait_until(lambda: logged(caplog, f"task #{tid}: board away ("), timeout=30, what="the release held")
        assert stub.chat_requests() == [], "no externally visible call without a lease check"
        revived = EmbeddedBoard(db, port=port, token=token).start()
        wait_until(lambda: state_of(board_fab, tid) == State.DONE, timeout=30, what="done after reconnect")
    ops = [r.op for _, r in sorted(board_fab.board.read(tid).records.items())]
    revived.stop()
    assert ops == ["submit", "claim", "release", "claim", "complete"], ops
    assert len(stub.chat_requests()) == 1


def test_an_outage_past_the_grace_redoes_the_call_with_the_same_key(
    embedded_board: EmbeddedBoard,
    fab: Fabric,  # noqa: F811
    settings: Settings,  # noqa: F811
    wcards: Any,  # noqa: F811
    stub: OpenAIStub,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    started, answer = threading.Event(), threading.Event()

    def slow(body: dict[str, Any]) -> str:
        started.set()
        answer.wait(30)  # the model answers when the test says so
        return "answer"

    stub.reply = slow
    tid = fab.submit("a long call", target="tester").task_id
    env = gateway_env(stub, AGAP_OUTAGE_GRACE="0.5")
    with Running(build_worker("tester", settings, wcards, env=env)):
        assert started.wait(20)
        db, port, token = _cut(embedded_board)
        wait_until(lambda: logged(caplog, "past the outage grace"), timeout=30, what="the grace to pass")
        answer.set()  # the call returns after the grace: its result cannot be stored
        wait_until(lambda: logged(caplog, f"task #{tid}: board away ("), timeout=30, what="the release held")
        stub.reply = None
        revived = EmbeddedBoard(db, port=port, token=token).start()
        wait_until(lambda: state_of(fab, tid) == State.DONE, timeout=40, what="done after reconnect")
    ops = [r.op for _, r in sorted(fab.board.read(tid).records.items())]
    revived.stop()
    keys = [r.headers["idempotency-key"] for r in stub.chat_requests()]
    assert len(keys) == 2 and keys[0] == keys[1], "the redo reuses the first call's key"
    assert ops == ["submit", "claim", "release", "claim", "complete"], ops
