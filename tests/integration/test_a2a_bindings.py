"""The HTTP+JSON (REST) and gRPC bindings: the real ``a2a-sdk`` clients over loopback.

The same server as :mod:`tests.integration.test_a2a_interop` (the embedded board over
HTTP, the OpenAI-protocol stand-in, a real worker), with its gRPC listener on: every
binding must give the same auth, caller scoping, board-backed tasks and push.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import A2AClientError
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
)
from a2a.types.a2a_pb2 import TaskState as S
from a2a.utils.errors import TaskNotFoundError

from fabric.apps.a2a.client import FabricA2AClient, push_config, task_text, text_message
from fabric.apps.a2a.grpc_server import GrpcListener
from fabric.apps.a2a.server import ServerThread, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from tests.integration.test_a2a_interop import ALICE, BOB, TOKENS, Receiver, reply, run, setup_env
from workers.assembly import build_worker

REST, GRPC = "HTTP+JSON", "GRPC"
BINDINGS = [REST, GRPC]


@dataclass
class Env:
    server: ServerThread
    grpc: GrpcListener
    fab: Fabric
    stub: OpenAIStub
    settings: Settings
    cards: CardSet
    env: dict[str, str]
    board: EmbeddedBoard

    @property
    def url(self) -> str:
        return f"{self.server.url}/helper"

    async def client(self, binding: str, token: str = ALICE, agent: str = "helper") -> FabricA2AClient:
        return await FabricA2AClient.open(
            f"{self.server.url}/{agent}",
            token,
            timeout=30,
            binding=binding,
            grpc_channel=grpc.aio.insecure_channel,
        )

    def worker(self) -> Running:
        return Running(build_worker("helper", self.settings, self.cards, env=self.env))

    def board_state(self, task_id: str) -> State | None:
        cur = self.fab.board.read(int(task_id.split("-")[0])).current
        return cur.state if cur else None

    def open_tasks(self) -> int:
        return len(self.fab.board.search('status:open swimlane:"helper"'))


def start(settings: Settings, cards: CardSet, env: dict[str, str], board: EmbeddedBoard) -> ServerThread:
    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=KanboardClient(board.url, board.token))

    service = make_service(
        settings,
        cards,
        env,
        connect=connect,
        config=ServiceConfig(watch_seconds=0.1, journal_retry_seconds=0.5, push_base_delay=0.05),
    )
    listener = GrpcListener(TOKENS, host="127.0.0.1", port=0)
    return ServerThread(service, ["helper", "alvis"], TOKENS, grpc=listener).start()


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub(reply=reply) as s:
        yield s


@pytest.fixture
def a2a(embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub) -> Iterator[Env]:
    settings, cards, env, fab = setup_env(embedded_board, tmp_path, stub)
    server = start(settings, cards, env, embedded_board)
    assert server.grpc is not None
    try:
        yield Env(server, server.grpc, fab, stub, settings, cards, env, embedded_board)
    finally:
        server.stop()


def raw_stub(e: Env) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(e.grpc.address)
    return channel, a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]


# -- the card ---------------------------------------------------------------------------------


def test_the_card_lists_json_rpc_rest_and_grpc(a2a: Env) -> None:
    card = httpx.get(f"{a2a.url}/.well-known/agent-card.json").json()
    got = [(i["protocolBinding"], i["url"], i.get("tenant", "")) for i in card["supportedInterfaces"]]
    assert got == [
        ("JSONRPC", a2a.url, ""),
        ("HTTP+JSON", a2a.url, ""),
        ("GRPC", a2a.grpc.address, "helper"),
    ]
    assert a2a.grpc.address.startswith("127.0.0.1:")
    assert {i["protocolVersion"] for i in card["supportedInterfaces"]} == {"1.0"}


# -- a task on the board, completed by a worker ---------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
def test_an_async_send_is_a_board_task_a_worker_completes(a2a: Env, binding: str) -> None:
    async def go() -> tuple[Any, Any, Any]:
        async with await a2a.client(binding) as c:
            sent = await c.send(text_message(f"Summarise the week over {binding}"), return_immediately=True)
            assert sent.status.state == S.TASK_STATE_SUBMITTED
            assert a2a.board_state(sent.id) == State.QUEUED
            with a2a.worker():
                done = await c.wait(sent.id, timeout=30)
            return sent, done, await c.list()

    sent, done, listed = run(go())
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert task_text(done).startswith(f"stub reply to: Summarise the week over {binding}")
    assert a2a.board_state(sent.id) == State.DONE
    view = a2a.fab.board.read(int(sent.id.split("-")[0]))
    assert view.spec is not None and view.spec.actor == "a2a:alice"
    assert sent.id in [t.id for t in listed.tasks]


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_sync_send_and_a_stream(a2a: Env, binding: str) -> None:
    async def go() -> tuple[Any, list[Any]]:
        async with await a2a.client(binding) as c:
            task = await c.send(text_message("Say hello"))
        c2 = await FabricA2AClient.open(
            a2a.url,
            ALICE,
            timeout=30,
            streaming=True,
            binding=binding,
            grpc_channel=grpc.aio.insecure_channel,
        )
        async with c2:
            return task, await c2.stream(text_message("stream me"))

    task, events = run(go())
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert task_text(task).startswith("stub reply to: Say hello")
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and "artifact_update" in kinds
    assert events[-1].status_update.status.state == S.TASK_STATE_COMPLETED


# -- auth -------------------------------------------------------------------------------------


def test_rest_without_a_valid_token_is_401_and_runs_nothing(a2a: Env) -> None:
    before = a2a.open_tasks()
    body = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    for headers in ({}, {"Authorization": "Bearer nope-not-a-token-at-all"}):
        r = httpx.post(f"{a2a.url}/message:send", json=body, headers={"A2A-Version": "1.0", **headers})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith('Bearer realm="agap"')
        assert httpx.get(f"{a2a.url}/tasks", headers=headers).status_code == 401
    ok = httpx.get(f"{a2a.url}/tasks", headers={"A2A-Version": "1.0", "Authorization": f"Bearer {ALICE}"})
    assert ok.status_code == 200 and "tasks" in ok.json()
    assert a2a.stub.chat_requests() == [] and a2a.open_tasks() == before


def test_grpc_without_a_valid_token_is_unauthenticated_and_runs_nothing(a2a: Env) -> None:
    before = a2a.open_tasks()
    channel, stub = raw_stub(a2a)
    req = SendMessageRequest(message=text_message("hi"))
    with channel:
        for metadata in (
            (),
            (("authorization", "Bearer nope-not-a-token-at-all"),),
            (("authorization", ALICE),),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.SendMessage(req, metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in str(err.value.details())
            with pytest.raises(grpc.RpcError) as err:
                list(stub.SendStreamingMessage(req, metadata=metadata, timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bearer = (("authorization", f"Bearer {ALICE}"),)
        ok = stub.ListTasks(ListTasksRequest(tenant="helper"), metadata=bearer, timeout=10)
        assert list(ok.tasks) == []

    async def sdk() -> None:
        async with await a2a.client(GRPC, token="wrong-token-but-long-enough") as c:
            with pytest.raises(A2AClientError, match="UNAUTHENTICATED"):
                await c.send(text_message("hello"))

    run(sdk())
    assert a2a.stub.chat_requests() == [] and a2a.open_tasks() == before


# -- caller scoping ---------------------------------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
def test_another_callers_task_looks_like_not_found(a2a: Env, binding: str) -> None:
    async def go() -> str:
        async with await a2a.client(binding, ALICE) as alice, await a2a.client(binding, BOB) as bob:
            later = await alice.send(text_message("mine"), return_immediately=True)
            with pytest.raises(TaskNotFoundError):
                await bob.get(later.id)
            with pytest.raises(TaskNotFoundError):
                await bob.cancel(later.id)
            with pytest.raises(TaskNotFoundError):
                await bob.client.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=later.id, url="http://127.0.0.1:9/hook")
                )
            assert list((await bob.list()).tasks) == []
            assert (await alice.get(later.id)).status.state == S.TASK_STATE_SUBMITTED
            return later.id

    tid = run(go())
    assert a2a.board_state(tid) == State.QUEUED  # bob's cancel changed nothing


@pytest.mark.parametrize("binding", BINDINGS)
def test_cancel_is_a_ledger_transition(a2a: Env, binding: str) -> None:
    async def go() -> tuple[str, Any]:
        async with await a2a.client(binding) as c:
            sent = await c.send(text_message("never mind"), return_immediately=True)
            return sent.id, await c.cancel(sent.id)

    tid, canceled = run(go())
    assert canceled.status.state == S.TASK_STATE_CANCELED
    assert a2a.board_state(tid) == State.CANCELED


# -- push -------------------------------------------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_push_config_set_over_the_binding_is_delivered(a2a: Env, binding: str) -> None:
    rx = Receiver()
    try:

        async def go() -> tuple[str, list[Any]]:
            async with await a2a.client(binding) as c:
                sent = await c.send(text_message("notify me"), return_immediately=True)
                cfg = push_config(rx.url, token="tok-1", scheme="Bearer", credentials="push-secret")
                cfg.task_id = sent.id
                stored = await c.client.create_task_push_notification_config(cfg)
                assert stored.id and stored.url == rx.url
                from a2a.types.a2a_pb2 import ListTaskPushNotificationConfigsRequest

                listed = await c.client.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=sent.id)
                )
                with a2a.worker():
                    await c.wait(sent.id, timeout=30)
                return sent.id, list(listed.configs)

        tid, configs = run(go())
        assert [c.url for c in configs] == [rx.url]
        post = wait_until(
            lambda: [p for p in rx.posts if p[1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"],
            what="completed push",
        )
        headers, body = post[0]
        assert headers["authorization"] == "Bearer push-secret"
        assert headers["x-a2a-notification-token"] == "tok-1"
        assert body["task"]["id"] == tid
    finally:
        rx.close()


# -- bad input: the binding's error, one message, nothing on the board --------------------------


def test_rest_bad_input_gets_the_bindings_errors(a2a: Env) -> None:
    h = {"A2A-Version": "1.0", "Authorization": f"Bearer {ALICE}"}
    before = a2a.open_tasks()
    stale = httpx.get(f"{a2a.url}/tasks/99999-0123456789abcdef", headers=h)
    assert stale.status_code == 404
    assert stale.json()["error"]["status"] == "NOT_FOUND"
    assert stale.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    bad = httpx.post(
        f"{a2a.url}/message:send", content=b"{not json", headers={**h, "content-type": "application/json"}
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    unknown = httpx.post(f"{a2a.url}/message:shout", json={}, headers=h)
    assert unknown.status_code in (404, 405)
    assert a2a.open_tasks() == before and a2a.stub.chat_requests() == []


def test_grpc_bad_input_gets_the_bindings_errors(a2a: Env) -> None:
    before = a2a.open_tasks()
    md = (("authorization", f"Bearer {ALICE}"),)
    channel, stub = raw_stub(a2a)
    with channel:
        with pytest.raises(grpc.RpcError) as err:
            stub.GetTask(
                GetTaskRequest(id="99999-0123456789abcdef", tenant="helper"), metadata=md, timeout=10
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            stub.CancelTask(
                CancelTaskRequest(id="99999-0123456789abcdef", tenant="nobody"), metadata=md, timeout=10
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown tenant 'nobody'" in str(err.value.details())
        # two agents: a request must say which (the SDK's client copies the card's tenant)
        with pytest.raises(grpc.RpcError) as err:
            stub.ListTasks(ListTasksRequest(), metadata=md, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.ListTasks(
                ListTasksRequest(tenant="helper"), metadata=(*md, ("a2a-version", "9.9")), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "A2A-Version 9.9 is not supported" in str(err.value.details())
        unknown: Any = channel.unary_unary("/lf.a2a.v1.A2AService/Shout")
        with pytest.raises(grpc.RpcError) as err:
            unknown(b"", metadata=md, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        garbage: Any = channel.unary_unary("/lf.a2a.v1.A2AService/SendMessage")
        with pytest.raises(grpc.RpcError) as err:
            garbage(b"\xff\xff\xff", metadata=md, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(err.value.details()).startswith("malformed request: ")
    assert a2a.open_tasks() == before and a2a.stub.chat_requests() == []


def test_errors_carry_the_specs_status_on_rest_and_grpc(a2a: Env) -> None:
    """A2A v1.0 section 5.4 maps each A2A error to an HTTP and a gRPC status; the SDK's own
    table differs for some (400 for a task that cannot be canceled and for a part the agent
    does not take, FAILED_PRECONDITION for an unsupported operation). The server answers
    the spec's: 409 / FAILED_PRECONDITION, 415 / INVALID_ARGUMENT, 400 and gRPC
    UNIMPLEMENTED, with the same reason, and nothing more reaches the board."""
    h = {"A2A-Version": "1.0", "Authorization": f"Bearer {ALICE}"}
    md = (("authorization", f"Bearer {ALICE}"), ("a2a-version", "1.0"))

    def text(mid: str, task: str = "") -> dict[str, Any]:
        message: dict[str, Any] = {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "hello"}]}
        return {"message": {**message, "taskId": task} if task else message}

    done = httpx.post(f"{a2a.url}/message:send", json=text("spec-err-1"), headers=h, timeout=30)
    assert done.status_code == 200, done.text
    task = done.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    wait_until(lambda: a2a.open_tasks() == 1, 10, "the sync call journaled to the board")
    before, chats = a2a.open_tasks(), len(a2a.stub.chat_requests())

    def rest(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = httpx.post(f"{a2a.url}{path}", json=body, headers=h, timeout=30)
        error = r.json()["error"]
        return r.status_code, {k: error[k] for k in ("code", "status")} | error["details"][0]

    raw_part = {"raw": "dGNr", "mediaType": "application/x-tck"}
    raw = {"message": {"messageId": "spec-err-2", "role": "ROLE_USER", "parts": [raw_part]}}
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "domain": "a2a-protocol.org", "metadata": {}}
    assert rest("/message:send", raw) == (
        415,
        {"code": 415, "status": "INVALID_ARGUMENT", "reason": "CONTENT_TYPE_NOT_SUPPORTED", **info},
    )
    assert rest(f"/tasks/{task['id']}:cancel", {}) == (
        409,
        {"code": 409, "status": "FAILED_PRECONDITION", "reason": "TASK_NOT_CANCELABLE", **info},
    )
    assert rest("/message:send", text("spec-err-3", task["id"])) == (
        400,
        {"code": 400, "status": "UNIMPLEMENTED", "reason": "UNSUPPORTED_OPERATION", **info},
    )

    def grpc_message(mid: str, part: Part, task_id: str = "") -> SendMessageRequest:
        message = Message(message_id=mid, role=Role.ROLE_USER, parts=[part], task_id=task_id)
        return SendMessageRequest(message=message, tenant="helper")

    channel, stub = raw_stub(a2a)
    with channel:
        codes = []
        for call, request in (
            (stub.SendMessage, grpc_message("spec-err-4", Part(raw=b"tck", media_type="application/x-tck"))),
            (stub.CancelTask, CancelTaskRequest(id=task["id"], tenant="helper")),
            (stub.SendMessage, grpc_message("spec-err-5", Part(text="hello"), task["id"])),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=md, timeout=10)
            codes.append(err.value.code())
    assert codes == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
    ]
    assert a2a.open_tasks() == before and len(a2a.stub.chat_requests()) == chats


# -- durability -------------------------------------------------------------------------------


def test_a_task_sent_over_grpc_outlives_a_restart(
    embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub
) -> None:
    settings, cards, env, _ = setup_env(embedded_board, tmp_path, stub)

    async def send(server: ServerThread) -> str:
        c = await FabricA2AClient.open(
            f"{server.url}/helper", ALICE, timeout=30, binding=GRPC, grpc_channel=grpc.aio.insecure_channel
        )
        async with c:
            return (await c.send(text_message("keep me"), return_immediately=True)).id

    first = start(settings, cards, env, embedded_board)
    try:
        tid = run(send(first))
    finally:
        first.stop()
    second = start(settings, cards, env, embedded_board)
    try:

        async def after() -> Any:
            c = await FabricA2AClient.open(
                f"{second.url}/helper",
                ALICE,
                timeout=30,
                binding=GRPC,
                grpc_channel=grpc.aio.insecure_channel,
            )
            async with c:
                assert (await c.get(tid)).status.state == S.TASK_STATE_SUBMITTED
                with Running(build_worker("helper", settings, cards, env=env)):
                    return await c.wait(tid, timeout=30)

        done = run(after())
    finally:
        second.stop()
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert task_text(done).startswith("stub reply to: keep me")
