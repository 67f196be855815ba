"""A2A building blocks without a board: tokens, the gate, the call index, conversions, push."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import Task, TaskPushNotificationConfig, TaskState, TaskStatus
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from fabric.apps.a2a import convert as cv
from fabric.apps.a2a import store as st
from fabric.apps.a2a.auth import BearerGate, TokenTable, load_tokens
from fabric.apps.a2a.push import DurablePushConfigs, PushPolicy, RetryingPushSender
from fabric.cards import CardSet
from fabric.errors import ConfigError
from fabric.task import State

A = "alice-" + "a" * 20
B = "bob-" + "b" * 20


# -- tokens --------------------------------------------------------------------------------


def test_no_tokens_means_no_server() -> None:
    with pytest.raises(ConfigError) as err:
        load_tokens({})
    assert err.value.exit_code == 2 and "authentication" in err.value.what


def test_tokens_come_inline_or_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"# clients\ncron {B}\n\n")
    table = load_tokens({"AGAP_A2A_TOKENS": f"alice:{A}", "AGAP_A2A_TOKENS_FILE": str(f)})
    assert table.callers == ["alice", "cron"]
    assert table.caller_for(A) == "alice" and table.caller_for(B) == "cron"
    assert table.caller_for(A + "x") is None and table.caller_for("") is None
    assert A not in repr(table)


@pytest.mark.parametrize(
    "value, what",
    [
        ("alice:short", "shorter"),
        (f"alice:{A},bob:{A}", "another caller"),
        (f"al ice:{A}", "caller:token"),
        (f"bad/name:{A}", "bad caller"),
    ],
)
def test_bad_token_settings_are_refused(value: str, what: str) -> None:
    with pytest.raises(ConfigError, match=what):
        load_tokens({"AGAP_A2A_TOKENS": value})


def _gated() -> TestClient:
    async def whoami(request: Request) -> JSONResponse:
        user = request.scope.get("user")
        return JSONResponse({"user": user.display_name if user else None})

    app = Starlette(
        routes=[Route("/card", whoami, methods=["GET"]), Route("/rpc", whoami, methods=["POST"])],
        middleware=[
            Middleware(
                BearerGate, tokens=TokenTable.from_pairs([("alice", A)], where="t"), public_paths=["/card"]
            )
        ],
    )
    return TestClient(app)


def test_the_gate_lets_public_paths_through_and_challenges_the_rest() -> None:
    client = _gated()
    assert client.get("/card").json() == {"user": None}
    r = client.post("/rpc")
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="agap"'
    r = client.post("/rpc", headers={"Authorization": "Bearer " + "z" * 30})
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
    r = client.post("/card", headers={})  # public only for reads
    assert r.status_code == 401
    r = client.post("/rpc", headers={"Authorization": f"bearer {A}"})
    assert r.status_code == 200 and r.json() == {"user": "alice"}


# -- the call index ------------------------------------------------------------------------


def _row(tid: str, mid: str, caller: str = "alice", **kw: Any) -> st.TaskRow:
    return st.TaskRow(
        task_id=tid,
        caller=caller,
        agent="kimi",
        kind=st.SYNC,
        context_id="c",
        message_id=mid,
        intent="hi",
        **kw,
    )


def test_a_message_id_names_one_task_per_caller(tmp_path: Path) -> None:
    store = st.CallStore(tmp_path / "a2a.sqlite3")
    assert store.claim_message(_row("s-1", "m1")) is None
    again = store.claim_message(_row("s-2", "m1"))
    assert again is not None and again.task_id == "s-1"
    assert store.claim_message(_row("s-3", "m1", caller="bob")) is None
    answer = st.message_digest("s-1", "Paris", [])
    assert store.note_message("alice", "m2", "s-1", answer) is None
    assert store.note_message("alice", "m2", "s-1", answer) == answer  # a retry: same digest
    assert store.note_message("alice", "m1", "s-1", answer) == st.message_digest("", "hi", [])
    rows, total = store.list_for("alice", "kimi")
    assert total == 1 and rows[0].task_id == "s-1"
    assert store.list_for("bob", "kimi")[1] == 1


def test_working_rows_survive_a_restart_and_terminal_ones_queue_for_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "a2a.sqlite3"
    store = st.CallStore(path)
    store.claim_message(_row("s-1", "m1", conversation=[("question", "which?")]))
    done = _row("s-2", "m2", state=st.COMPLETED, result="ok", journal=st.J_PENDING)
    store.claim_message(done)
    store.close()
    store = st.CallStore(path)
    (working,) = store.in_state(st.SYNC, st.WORKING)
    assert working.task_id == "s-1" and working.conversation == [("question", "which?")]
    assert [r.task_id for r in store.unjournaled()] == ["s-2"]
    assert store.prune(older_than=1e12) == 0  # nothing journaled yet: nothing forgotten
    done.journal = st.J_DONE
    store.save(done)
    assert store.prune(older_than=1e12) == 1 and store.get("s-2") is None


def test_push_configs_survive_a_restart_until_their_task_end_is_pushed(tmp_path: Path) -> None:
    path = tmp_path / "a2a.sqlite3"
    configs = DurablePushConfigs(st.CallStore(path))
    ctx = ServerCallContext()
    cfg = TaskPushNotificationConfig(url="https://hooks.example/a", token="t")
    cfg.authentication.scheme, cfg.authentication.credentials = "Bearer", "secret"
    stored = asyncio.run(configs.set_info("7-abc", cfg, ctx))
    assert stored.id == "7-abc" and stored.task_id == "7-abc"
    asyncio.run(
        configs.set_info("7-abc", TaskPushNotificationConfig(id="b", url="https://hooks.example/b"), ctx)
    )
    configs.store.close()
    store = st.CallStore(path)  # a restart
    again = DurablePushConfigs(store)
    got = asyncio.run(again.get_info_for_dispatch("7-abc"))
    assert [(c.id, c.url) for c in got] == [
        ("7-abc", "https://hooks.example/a"),
        ("b", "https://hooks.example/b"),
    ]
    assert got[0].authentication.credentials == "secret"
    assert store.open_pushes() == ["7-abc"]
    store.push_finished("7-abc")
    assert store.open_pushes() == [] and len(asyncio.run(again.get_info("7-abc", ctx))) == 2
    asyncio.run(again.delete_info("7-abc", ctx, "b"))
    assert [c.id for c in asyncio.run(again.get_info("7-abc", ctx))] == ["7-abc"]


def test_an_index_written_before_digests_gains_the_column(tmp_path: Path) -> None:
    import sqlite3  # only this test writes an old-layout index by hand

    path = tmp_path / "a2a.sqlite3"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE messages (caller TEXT, message_id TEXT, task_id TEXT, PRIMARY KEY (caller, message_id))"
    )
    db.execute("INSERT INTO messages VALUES ('alice', 'm1', 's-1')")
    db.commit()
    db.close()
    store = st.CallStore(path)
    assert store.note_message("alice", "m1", "s-1", "d") == ""  # unknown digest: taken as a retry
    assert store.note_message("alice", "m2", "s-1", "d") is None


# -- conversions ----------------------------------------------------------------------------


def test_every_fabric_state_has_an_a2a_state() -> None:
    assert set(cv.STATE_MAP) == set(State)
    assert cv.STATE_MAP[State.QUEUED] == TaskState.TASK_STATE_SUBMITTED
    assert cv.STATE_MAP[State.CLOSED] == TaskState.TASK_STATE_COMPLETED
    assert cv.STATE_MAP[State.DEAD] == TaskState.TASK_STATE_FAILED
    assert set(cv.SYNC_STATE_MAP) == {st.WORKING, st.INPUT_REQUIRED, st.COMPLETED, st.FAILED, st.CANCELED}


def test_ids_say_which_kind_of_task_they_name() -> None:
    tid = cv.async_task_id(42, "0123456789abcdef")
    assert cv.parse_async_id(tid) == (42, "0123456789abcdef")
    assert cv.parse_async_id("42") is None and cv.parse_async_id("x-0123456789abcdef") is None
    assert cv.is_sync_id(cv.new_sync_id()) and not cv.is_sync_id(tid)


def test_the_agent_card_comes_from_the_fabric_card(cards: CardSet) -> None:
    kimi = cards.get("kimi")
    card = cv.agent_card(kimi, "https://fabric.lan:8765", version="1.2.3", mtls=True)
    assert card.name == kimi.name and card.version == "1.2.3"
    assert [s.id for s in card.skills] == list(kimi.capabilities)
    assert card.supported_interfaces[0].url == "https://fabric.lan:8765/kimi"
    assert set(card.security_schemes) == {"bearer", "mtls"}
    assert set(card.security_requirements[0].schemes) == {"bearer", "mtls"}
    assert cv.to_dict(card)["capabilities"] == {"streaming": True, "pushNotifications": True}


def test_a_sync_row_becomes_a_task() -> None:
    row = _row(
        "s-" + "0" * 32,
        "m1",
        state=st.INPUT_REQUIRED,
        conversation=[("question", "which city?")],
        refs=["file:///x"],
    )
    task = cv.sync_task(row)
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert task.status.message.parts[0].text == "which city?"
    assert [p.url for p in task.history[0].parts if p.url] == ["file:///x"]
    row.state, row.result, row.board_task_id = st.COMPLETED, "done!", 7
    task = cv.sync_task(row)
    assert task.artifacts[0].parts[0].text == "done!"
    assert task.artifacts[0].parts[1].url == "kanboard://task/7/file/result-e1.md"


# -- push ---------------------------------------------------------------------------------------


def test_private_push_targets_need_the_allow_list() -> None:
    async def go() -> None:
        none = PushPolicy.parse([])
        assert not await none.accepts("http://127.0.0.1:9/hook")
        assert not await none.accepts("http://10.1.2.3/hook")
        assert not await none.accepts("ftp://example.com/hook")
        assert await PushPolicy.parse(["127.0.0.1"]).accepts("http://127.0.0.1:9/hook")
        assert await PushPolicy.parse(["10.0.0.0/8"]).accepts("http://10.1.2.3/hook")
        assert not await PushPolicy.parse(["10.0.0.0/8"]).accepts("http://192.168.1.1/hook")
        assert await PushPolicy.parse(["localhost"]).accepts("http://localhost:1/x")

    asyncio.run(go())


class _Configs:
    def __init__(self, url: str) -> None:
        from fabric.apps.a2a.client import push_config

        self.cfg = push_config(url, scheme="Bearer", credentials="s3cret")

    async def get_info_for_dispatch(self, task_id: str) -> list[Any]:
        return [self.cfg]


def _send_with(statuses: list[int]) -> tuple[RetryingPushSender, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(statuses.pop(0) if statuses else 200)

    async def go() -> RetryingPushSender:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            sender = RetryingPushSender(
                http,
                _Configs("http://127.0.0.1/h"),  # type: ignore[arg-type]
                PushPolicy.parse(["127.0.0.1"]),
                attempts=4,
                base_delay=0.001,
            )
            task = Task(id="t", status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
            await sender.send_notification("t", task)
            return sender

    return asyncio.run(go()), seen


def test_push_is_retried_with_backoff_until_delivered() -> None:
    sender, seen = _send_with([503, 429, 200])
    assert len(seen) == 3 and sender.stats.delivered == 1
    assert seen[0].headers["authorization"] == "Bearer s3cret"


def test_a_refusing_receiver_is_not_retried() -> None:
    sender, seen = _send_with([404])
    assert len(seen) == 1 and sender.stats.failed == 1


def test_the_call_context_user_is_the_caller() -> None:
    from a2a.auth.user import UnauthenticatedUser

    from fabric.apps.a2a.handler import _caller

    with pytest.raises(Exception, match="unauthenticated"):
        _caller(ServerCallContext(user=UnauthenticatedUser()))
