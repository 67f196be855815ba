"""A2A interop: the real ``a2a-sdk`` client against the real server on loopback.

The board is the embedded one over HTTP; the model plane is the OpenAI-protocol stand-in
(the workers' gateway path); async tasks are worked by a real worker in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

from fabric.apps.a2a import store as st
from fabric.apps.a2a.auth import TokenTable
from fabric.apps.a2a.client import FabricA2AClient, push_config, task_text, text_message
from fabric.apps.a2a.server import ServerThread, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from workers.assembly import build_worker

T = TypeVar("T")
ALICE, BOB = "alice-token-" + "a" * 24, "bob-token-" + "b" * 24
TOKENS = TokenTable.from_pairs([("alice", ALICE), ("bob", BOB)], where="test")
S = TaskState

HELPER = """
id: helper
kind: model
name: Helper model
description: A model agent for the A2A tests.
tier: medium
trust: trusted
capabilities: [chat, code]
runtime:
  mode: gateway
  model: openai/stub
  poll_seconds: 0.05
  lease_seconds: 10
  backoff_seconds: 0.1
  max_attempts: 3
"""
ALVIS = """
id: alvis
kind: human
name: Alvis
trust: human
runtime:
  mode: human
human:
  username: alvis
  display_name: Alvis
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


def reply(body: dict[str, Any]) -> str:
    user = str([m["content"] for m in body["messages"] if m["role"] == "user"][-1])
    if "[ask]" in user and "A person answered" not in user:
        return "QUESTION FOR HUMAN: which city?"
    if "A person answered" in user:
        return "answered with: " + user.split("A person answered:")[-1].strip()
    return "stub reply to: " + user.splitlines()[0][:60]


class Receiver:
    """A loopback webhook that records what it is sent; can fail the first N posts."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.fail_first = fail_first
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.posts.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                self.send_response(200)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Env:
    server: ServerThread
    fab: Fabric
    stub: OpenAIStub
    settings: Settings
    cards: CardSet
    env: dict[str, str]
    workers: list[threading.Thread] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.server.url}/helper"

    async def client(self, token: str = ALICE, *, streaming: bool = False) -> FabricA2AClient:
        return await FabricA2AClient.open(self.url, token, timeout=30, streaming=streaming)

    def worker(self) -> Running:
        return Running(build_worker("helper", self.settings, self.cards, env=self.env))

    def board_state(self, task_id: str) -> State | None:
        bid = int(task_id.split("-")[0])
        cur = self.fab.board.read(bid).current
        return cur.state if cur else None


def setup_env(
    board: EmbeddedBoard, tmp: Path, stub: OpenAIStub
) -> tuple[Settings, CardSet, dict[str, str], Fabric]:
    cards_dir = tmp / "cards"
    cards_dir.mkdir(exist_ok=True)
    (cards_dir / "helper.yaml").write_text(HELPER)
    (cards_dir / "alvis.yaml").write_text(ALVIS)
    cards = load_cards(cards_dir, base_dir=cards_dir)
    settings = Settings(
        board_url=board.url, board_token=board.token, cards_dir=cards_dir, state_dir=tmp / "state"
    )
    fab = make_fabric(KanboardClient(board.url, board.token), cards, settings=settings)
    env = {
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": stub.url,
        "AGAP_LITELLM_KEY": stub.api_key,
        "AGAP_A2A_PUSH_ALLOW": "127.0.0.1",
        "AGAP_POLL_SECONDS": "0.05",
    }
    return settings, cards, env, fab


def start_server(
    settings: Settings, cards: CardSet, env: dict[str, str], board: EmbeddedBoard
) -> ServerThread:
    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))

    service = make_service(
        settings,
        cards,
        env,
        connect=connect,
        config=ServiceConfig(
            watch_seconds=0.1, journal_retry_seconds=0.5, push_base_delay=0.05, follow_max_seconds=20
        ),
    )
    return ServerThread(service, ["helper", "alvis"], TOKENS).start()


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub(reply=reply) as s:
        yield s


@pytest.fixture
def a2a(embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub) -> Iterator[Env]:
    settings, cards, env, fab = setup_env(embedded_board, tmp_path, stub)
    server = start_server(settings, cards, env, embedded_board)
    try:
        yield Env(server, fab, stub, settings, cards, env)
    finally:
        server.stop()


def journaled(e: Env, task_id: str) -> st.TaskRow | None:
    row = e.server.service.store.get(task_id)
    return row if row is not None and row.journal == st.J_DONE else None


# -- the card and auth ----------------------------------------------------------------------


def test_the_card_is_public_and_declares_bearer_auth_and_skills(a2a: Env) -> None:
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, a2a.url).get_agent_card()
            human = await A2ACardResolver(http, f"{a2a.server.url}/alvis").get_agent_card()
        assert card.name == "Helper model"
        assert [s.id for s in card.skills] == ["chat", "code"]
        iface = card.supported_interfaces[0]
        assert (iface.url, iface.protocol_binding, iface.protocol_version) == (a2a.url, "JSONRPC", "1.0")
        scheme = card.security_schemes["bearer"].http_auth_security_scheme
        assert scheme.scheme == "bearer"
        assert "bearer" in card.security_requirements[0].schemes
        assert card.capabilities.streaming and card.capabilities.push_notifications
        assert human.name == "Alvis" and [s.id for s in human.skills] == ["alvis"]

    run(go())


def test_calls_without_a_valid_token_get_401_with_a_challenge(a2a: Env) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    for headers in (
        {},
        {"Authorization": "Bearer nope-not-a-token-at-all"},
        {"Authorization": f"Basic {ALICE}"},
    ):
        r = httpx.post(a2a.url, json=body, headers={"A2A-Version": "1.0", **headers})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith('Bearer realm="agap"')
    ok = httpx.post(a2a.url, json=body, headers={"A2A-Version": "1.0", "Authorization": f"Bearer {ALICE}"})
    assert ok.status_code == 200 and "result" in ok.json()

    async def go() -> None:
        c = await FabricA2AClient.open(a2a.url, "wrong-token-but-long-enough", timeout=10)
        async with c:
            with pytest.raises(A2AClientError, match="401"):
                await c.send(text_message("hello"))

    run(go())
    assert a2a.stub.chat_requests() == []


# -- sync ---------------------------------------------------------------------------------------


def test_a_sync_send_runs_the_model_directly_then_journals_it(a2a: Env) -> None:
    service = a2a.server.service
    mid = uuid.uuid4().hex

    async def go() -> tuple[Any, Any]:
        async with await a2a.client() as c:
            trips = service.board.trips()
            task = await c.send(text_message("Say hello", message_id=mid))
            assert service.board.trips() == trips  # only the journal, afterwards, writes
            return task, await c.get(task.id)

    task, again = run(go())
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert task_text(task).startswith("stub reply to: Say hello")
    (req,) = a2a.stub.chat_requests()
    assert req.headers["authorization"] == f"Bearer {a2a.stub.api_key}"
    assert req.headers["idempotency-key"] == f"a2a:alice:{mid}:0"
    assert "agent:helper" in req.body["metadata"]["tags"]
    assert again.id == task.id and again.status.state == S.TASK_STATE_COMPLETED
    row = wait_until(lambda: journaled(a2a, task.id), what="journaled")
    view = a2a.fab.board.read(row.board_task_id)
    assert view.current is not None and view.spec is not None
    assert view.current.state == State.DONE and view.current.by.startswith("a2a-sync@")
    assert view.spec.actor == "a2a:alice" and view.spec.action_id == mid
    assert [r.op for _, r in sorted(view.records.items())] == ["submit", "claim", "complete"]
    files = a2a.fab.board.files(view.id)
    text = base64.b64decode(a2a.fab.board.download(files[0].id)).decode()
    assert text == task_text(task)


def test_streaming_send_yields_working_then_the_result(a2a: Env) -> None:
    async def go() -> list[Any]:
        async with await a2a.client(streaming=True) as c:
            return await c.stream(text_message("stream me"))

    events = run(go())
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and events[0].task.status.state == S.TASK_STATE_WORKING
    assert "artifact_update" in kinds
    assert events[-1].status_update.status.state == S.TASK_STATE_COMPLETED


def test_a_sync_question_is_answered_by_a_follow_up_with_the_same_task_id(a2a: Env) -> None:
    async def go() -> tuple[Any, Any]:
        async with await a2a.client() as c:
            first = await c.send(text_message("[ask] book a table"))
            answer = text_message("Paris", task_id=first.id, context_id=first.context_id)
            return first, await c.send(answer)

    first, done = run(go())
    assert first.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert task_text(first) == "which city?"
    assert done.id == first.id and done.status.state == S.TASK_STATE_COMPLETED
    assert task_text(done).startswith("answered with: Paris")
    wait_until(lambda: journaled(a2a, first.id), what="journaled")


# -- async --------------------------------------------------------------------------------------


def test_an_async_send_becomes_a_fabric_task_that_a_worker_completes(a2a: Env) -> None:
    async def go() -> tuple[Any, Any, Any]:
        async with await a2a.client() as c:
            sent = await c.send(text_message("Summarise the week"), return_immediately=True)
            assert sent.status.state == S.TASK_STATE_SUBMITTED
            assert a2a.stub.chat_requests() == []
            with a2a.worker():
                done = await c.wait(sent.id, timeout=30)
            listed = await c.list()
            return sent, done, listed

    sent, done, listed = run(go())
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert task_text(done).startswith("stub reply to: Summarise the week")
    assert any(p.url.startswith("kanboard://task/") for p in done.artifacts[0].parts)
    assert a2a.board_state(sent.id) == State.DONE
    view = a2a.fab.board.read(int(sent.id.split("-")[0]))
    assert view.spec is not None and view.spec.actor == "a2a:alice"
    assert sent.id in [t.id for t in listed.tasks]


def test_cancel_is_a_ledger_transition(a2a: Env) -> None:
    async def go() -> tuple[Any, Any]:
        async with await a2a.client() as c:
            sent = await c.send(text_message("never mind"), return_immediately=True)
            canceled = await c.cancel(sent.id)
            with pytest.raises(TaskNotCancelableError):
                await c.cancel(sent.id)
            return sent, canceled

    sent, canceled = run(go())
    assert canceled.status.state == S.TASK_STATE_CANCELED
    assert a2a.board_state(sent.id) == State.CANCELED


def test_an_async_input_required_task_is_answered_by_a_follow_up(a2a: Env) -> None:
    async def go() -> tuple[Any, Any, Any]:
        async with await a2a.client() as c:
            sent = await c.send(text_message("[ask] plan a trip"), return_immediately=True)
            with a2a.worker():
                asked = await c.wait(sent.id, timeout=30)
                assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
                resumed = await c.send(text_message("Rome", task_id=sent.id))
                done = await c.wait(
                    sent.id, timeout=30, until=frozenset({S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED})
                )
            return asked, resumed, done

    asked, resumed, done = run(go())
    assert task_text(asked) == "which city?"
    assert resumed.status.state == S.TASK_STATE_SUBMITTED
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert task_text(done).startswith("answered with: Rome")


def test_a_human_agent_takes_async_messages_only(a2a: Env) -> None:
    async def go() -> Any:
        c = await FabricA2AClient.open(f"{a2a.server.url}/alvis", ALICE, timeout=10)
        async with c:
            with pytest.raises(Exception, match="returnImmediately"):
                await c.send(text_message("approve the budget"))
            return await c.send(text_message("approve the budget"), return_immediately=True)

    sent = run(go())
    assert sent.status.state == S.TASK_STATE_SUBMITTED
    assert a2a.board_state(sent.id) == State.QUEUED


# -- scope and dedupe -------------------------------------------------------------------------


def test_another_callers_task_looks_like_not_found(a2a: Env) -> None:
    async def go() -> None:
        async with await a2a.client(ALICE) as alice, await a2a.client(BOB) as bob:
            sync = await alice.send(text_message("mine"))
            later = await alice.send(text_message("mine too"), return_immediately=True)
            for tid in (sync.id, later.id):
                with pytest.raises(TaskNotFoundError):
                    await bob.get(tid)
                with pytest.raises(TaskNotFoundError):
                    await bob.cancel(tid)
                with pytest.raises(TaskNotFoundError):
                    await bob.send(text_message("hijack", task_id=tid))
            assert list((await bob.list()).tasks) == []
            mine = {t.id for t in (await alice.list()).tasks}
            assert {sync.id, later.id} <= mine
            other = await FabricA2AClient.open(f"{a2a.server.url}/alvis", ALICE, timeout=10)
            async with other:  # scoped to the agent too
                with pytest.raises(TaskNotFoundError):
                    await other.get(later.id)

    run(go())


def test_a_retried_message_id_returns_the_same_task(a2a: Env) -> None:
    async def go() -> None:
        async with await a2a.client() as c:
            mid = uuid.uuid4().hex
            a = await c.send(text_message("once only", message_id=mid))
            b = await c.send(text_message("once only", message_id=mid))
            assert a.id == b.id and b.status.state == S.TASK_STATE_COMPLETED
            assert len(a2a.stub.chat_requests()) == 1
            amid = uuid.uuid4().hex
            x = await c.send(text_message("async once", message_id=amid), return_immediately=True)
            y = await c.send(text_message("async once", message_id=amid), return_immediately=True)
            assert x.id == y.id
            # The board dedupes too (the local index forgotten: the receipt still holds).
            a2a.server.service.store.drop(x.id)
            z = await c.send(text_message("async once", message_id=amid), return_immediately=True)
            assert z.id == x.id
            with pytest.raises(InvalidParamsError):
                await c.send(text_message("different", message_id=amid), return_immediately=True)

    run(go())
    rows = a2a.fab.board.search('status:open swimlane:"helper"')
    assert len([r for r in rows if r.title == "async once"]) == 1


# -- push ----------------------------------------------------------------------------------------


def test_push_is_delivered_with_its_authentication_and_retried(a2a: Env) -> None:
    rx = Receiver(fail_first=1)
    try:

        async def go() -> Any:
            async with await a2a.client() as c:
                cfg = push_config(rx.url, token="tok-1", scheme="Bearer", credentials="push-secret")
                sent = await c.send(text_message("notify me"), return_immediately=True, push=cfg)
                with a2a.worker():
                    await c.wait(sent.id, timeout=30)
                return sent

        sent = run(go())
        post = wait_until(
            lambda: [p for p in rx.posts if p[1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"],
            what="completed push",
        )
        headers, body = post[0]
        assert headers["authorization"] == "Bearer push-secret"
        assert headers["x-a2a-notification-token"] == "tok-1"
        assert body["task"]["id"] == sent.id
        assert a2a.server.service.push is not None
        assert a2a.server.service.push.stats.attempts > a2a.server.service.push.stats.delivered
    finally:
        rx.close()


def test_a_loopback_push_target_is_refused_unless_allow_listed(
    embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub
) -> None:
    settings, cards, env, _ = setup_env(embedded_board, tmp_path, stub)
    env.pop("AGAP_A2A_PUSH_ALLOW")
    server = start_server(settings, cards, env, embedded_board)
    try:

        async def go() -> None:
            c = await FabricA2AClient.open(f"{server.url}/helper", ALICE, timeout=10)
            async with c:
                with pytest.raises(InvalidParamsError, match="push"):
                    await c.send(
                        text_message("x"),
                        return_immediately=True,
                        push=push_config("http://127.0.0.1:9/hook"),
                    )

        run(go())
    finally:
        server.stop()


# -- crash recovery --------------------------------------------------------------------------


def test_sync_calls_cut_short_by_a_crash_are_failed_and_journaled_at_start(
    embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub
) -> None:
    settings, cards, env, fab = setup_env(embedded_board, tmp_path, stub)
    store = st.CallStore(settings.state_dir / "a2a.sqlite3")
    row = st.TaskRow(
        task_id="s-" + "0" * 32,
        caller="alice",
        agent="helper",
        kind=st.SYNC,
        context_id="ctx",
        message_id="m-crash",
        intent="in flight at the crash",
        state=st.WORKING,
    )
    assert store.claim_message(row) is None
    store.close()
    server = start_server(settings, cards, env, embedded_board)
    try:
        assert server.service.last_reconcile == {"interrupted": 1, "journaled": 1}

        async def go() -> Any:
            c = await FabricA2AClient.open(f"{server.url}/helper", ALICE, timeout=10)
            async with c:
                return await c.get(row.task_id)

        task = run(go())
        assert task.status.state == S.TASK_STATE_FAILED
        assert "stopped during the sync call" in task_text(task)
        again = server.service.store.get(row.task_id)
        assert again is not None and again.board_task_id is not None
        view = fab.board.read(again.board_task_id)
        assert view.current is not None and view.current.state == State.DEAD
    finally:
        server.stop()


def test_with_the_board_down_sync_calls_still_answer_and_are_journaled_later(
    a2a: Env, embedded_board: EmbeddedBoard, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    db, port, token = embedded_board.store.path, embedded_board.port, embedded_board.token
    embedded_board.stop()  # Kanboard is down (connections dropped, port closed)
    mid = uuid.uuid4().hex

    async def go() -> Any:
        async with await a2a.client() as c:
            return await c.send(text_message("Answer while the board is away", message_id=mid))

    task = run(go())
    assert task.status.state == S.TASK_STATE_COMPLETED, "the sync path never waits on the board"
    assert task_text(task).startswith("stub reply to: Answer while the board is away")
    # The journaler tried, and deferred (the board is away): nothing is journaled yet.
    deferred = f"sync task {task.id}: journal deferred"
    wait_until(lambda: any(deferred in r.getMessage() for r in list(caplog.records)), 30, deferred)
    row = a2a.server.service.store.get(task.id)
    assert row is not None and row.journal == st.J_PENDING, "nothing can be journaled yet"
    revived = EmbeddedBoard(db, port=port, token=token).start()
    try:
        row = wait_until(lambda: journaled(a2a, task.id), timeout=30, what="journaled later")
        view = a2a.fab.board.read(row.board_task_id)
        assert view.current is not None and view.current.state == State.DONE
        assert view.spec is not None and view.spec.action_id == mid
    finally:
        revived.stop()


# -- spec fidelity ------------------------------------------------------------------------------


def rpc(e: Env, method: str, params: dict[str, Any], token: str = ALICE) -> dict[str, Any]:
    """One JSON-RPC call on the wire (what a client other than the SDK sends)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    out: dict[str, Any] = httpx.post(e.url, json=body, headers=headers, timeout=30).json()
    return out


def wire_message(text: str, **kw: Any) -> dict[str, Any]:
    parts = kw.pop("parts", [{"text": text}])
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": parts, **kw}


def test_list_tasks_is_ordered_by_the_last_status_change_newest_first(a2a: Env) -> None:
    async def go() -> tuple[list[str], list[str]]:
        async with await a2a.client() as c:
            first = await c.send(text_message("created first"), return_immediately=True)
            second = await c.send(text_message("created second"))
            third = await c.send(text_message("created third"))
            await c.cancel(first.id)  # the most recent status change
            listed = await c.list()
            return [first.id, second.id, third.id], [t.id for t in listed.tasks]

    (first, second, third), order = run(go())
    assert order == [first, third, second]
    stamps = [t["status"]["timestamp"] for t in rpc(a2a, "ListTasks", {})["result"]["tasks"]]
    assert stamps == sorted(stamps, reverse=True)


@pytest.mark.parametrize("status", ["TASK_STATE_BOGUS", 42, "completed"])
def test_an_unknown_status_filter_is_invalid_params(a2a: Env, status: object) -> None:
    out = rpc(a2a, "ListTasks", {"status": status})
    assert out["error"]["code"] == -32602 and "unknown task state" in out["error"]["message"]
    assert "result" in rpc(a2a, "ListTasks", {"status": "TASK_STATE_COMPLETED"})


def test_a_negative_history_length_is_invalid_params(a2a: Env) -> None:
    sent = rpc(a2a, "SendMessage", {"message": wire_message("hi")})["result"]["task"]
    for method, params in (
        ("GetTask", {"id": sent["id"], "historyLength": -1}),
        ("ListTasks", {"historyLength": -1}),
        ("SendMessage", {"message": wire_message("x"), "configuration": {"historyLength": -1}}),
    ):
        assert rpc(a2a, method, params)["error"]["code"] == -32602, method
    assert rpc(a2a, "GetTask", {"id": sent["id"], "historyLength": 0})["result"]["id"] == sent["id"]


@pytest.mark.parametrize(
    "parts",
    [
        [{"text": "see the data"}, {"data": {"k": 1}}],
        [{"raw": base64.b64encode(b"\x89PNG").decode(), "mediaType": "image/png"}],
    ],
)
def test_a_non_text_part_is_content_type_not_supported(a2a: Env, parts: list[dict[str, Any]]) -> None:
    out = rpc(a2a, "SendMessage", {"message": wire_message("", parts=parts)})
    assert out["error"]["code"] == -32005, out
    assert a2a.stub.chat_requests() == []


def test_the_card_is_served_with_cache_control(a2a: Env) -> None:
    r = httpx.get(f"{a2a.url}/.well-known/agent-card.json")
    assert r.status_code == 200 and "max-age=" in r.headers["cache-control"]
    again = httpx.get(f"{a2a.url}/.well-known/agent-card.json", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304
    # ...and says when it last changed (the server's start), as an HTTP date.
    assert parsedate_to_datetime(r.headers["last-modified"]).timestamp() <= time.time()


def test_an_answer_reusing_a_used_message_id_is_refused_not_dropped(a2a: Env) -> None:
    asked = rpc(a2a, "SendMessage", {"message": wire_message("[ask] book a table")})["result"]["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    first_id = asked["history"][0]["messageId"]
    reused = rpc(
        a2a, "SendMessage", {"message": wire_message("Paris", messageId=first_id, taskId=asked["id"])}
    )
    assert reused["error"]["code"] == -32602 and "already used" in reused["error"]["message"]
    answer = wire_message("Paris", taskId=asked["id"])
    done = rpc(a2a, "SendMessage", {"message": answer})["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    again = rpc(a2a, "SendMessage", {"message": answer})["result"]["task"]  # a retry: the same task
    assert again["id"] == asked["id"] and len(a2a.stub.chat_requests()) == 2
    other = rpc(a2a, "SendMessage", {"message": {**answer, "parts": [{"text": "Rome"}]}})
    assert other["error"]["code"] == -32602 and "already used" in other["error"]["message"]
