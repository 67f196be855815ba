# ruff: noqa: F811 (the fixtures env and fab come from test_mcp and are parameters here)
"""The MCP tasks extension (SEP-2663) and elicitation, end to end: the official SDK's client
against ``agap mcp serve`` over stdio, on the embedded board over HTTP.

The worker side (claim, ask, complete, the keeper's dead letter) is the test's own
connection to the board through the ledger, as a worker process would do it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult

from fabric.apps.mcp.tasks_client import (
    TASKS,
    CreateTask,
    TaskParams,
    TasksCancel,
    TasksExtension,
    TasksGet,
    TasksUpdate,
    rpc,
)
from fabric.core import Fabric
from fabric.ledger import Lease
from fabric.task import State
from tests.conftest import ROOT
from tests.integration.test_mcp import (  # noqa: F401 (fixtures)
    HttpServer,
    call,
    env,
    fab,
    http_server,
    run,
    serve_args,
)
from tests.mcp_wire import TOKEN

KEY = "task-key-" + "k" * 30


@asynccontextmanager
async def client(
    env: dict[str, str],
    agent: str = "claude-coder",
    *,
    tasks: bool = True,
    mode: str = "auto",
    elicit: Any = None,
    ext: TasksExtension | None = None,
    **extra_env: str,
) -> AsyncIterator[Client]:
    server_env = {**env, "AGAP_MCP_TASK_KEY": KEY, **extra_env}
    params = StdioServerParameters(
        command=sys.executable, args=serve_args(agent), env=server_env, cwd=str(ROOT)
    )
    extensions = [ext or TasksExtension()] if tasks else []
    async with Client(params, mode=mode, extensions=extensions, elicitation_callback=elicit) as c:
        yield c


async def submit(c: Client, **args: Any) -> CreateTask:
    result = await c.session.call_tool("submit_task", args, allow_claimed=True)
    assert isinstance(result, CreateTask), result
    return result


async def get(c: Client, handle: str) -> dict[str, Any]:
    return await rpc(c, TasksGet(params=TaskParams(task_id=handle)))


async def error_of(c: Client, request: Any) -> MCPError:
    with pytest.raises(MCPError) as info:
        await rpc(c, request)
    return info.value


def board_id(handle: str) -> int:
    return int(handle.split("-")[1])


def worker(fab: Fabric, agent: str = "researcher") -> Fabric:
    """The board as ``agent``'s worker sees it (a confined agent's queue is in its home)."""
    return fab.home_fabric(fab.cards.get(agent))


def claim(fab: Fabric, task_id: int, agent: str = "researcher") -> Lease:
    w = worker(fab, agent)
    return w.ledger.claim(w.show(task_id), "worker-1", lease_seconds=300)


def snapshot(fab: Fabric, task_id: int) -> tuple[State, int]:
    view = fab.show(task_id)
    assert view.current is not None
    return view.current.state, view.epoch


# -- the lifecycle --------------------------------------------------------------------------


def test_a_submitted_task_is_a_handle_from_working_to_completed(env: dict[str, str], fab: Fabric) -> None:
    """Committed before the handle; working while queued and claimed; a household person's
    question is input_required with nothing to answer here; completed with the result."""

    async def go() -> list[Any]:
        async with client(env) as c:
            assert c.protocol_version == "2026-07-28"
            assert TASKS in (c.server_capabilities.extensions or {})
            seed = await submit(c, intent="Summarise the boiler manual", target="researcher", deadline="+2h")
            tid = board_id(seed.task_id)
            committed = snapshot(fab, tid)  # the board had the task when the handle came back
            queued = await get(c, seed.task_id)
            lease = claim(fab, tid)
            working = await get(c, seed.task_id)
            worker(fab).ledger.ask(lease, "Which boiler, upstairs or downstairs?", "elizaveta")
            waiting = await get(c, seed.task_id)
            key = f"answer-{fab.show(tid).epoch}"
            await rpc(
                c,
                TasksUpdate(
                    params=TaskParams(
                        task_id=seed.task_id,
                        input_responses={key: {"action": "accept", "content": {"answer": "mine"}}},
                    )
                ),
            )
            untouched = snapshot(fab, tid)
            worker(fab).ledger.resume(tid, "elizaveta", "downstairs")
            lease = claim(fab, tid)
            worker(fab).ledger.complete(lease, result_ref="https://docs.example/boiler-summary")
            done = await get(c, seed.task_id)
            return [seed, committed, queued, working, waiting, untouched, done]

    seed, committed, queued, working, waiting, untouched, done = run(go())
    assert seed.status == "working" and seed.task_id.startswith("agap-")
    assert committed[0] == State.QUEUED
    extra = seed.model_extra or {}
    assert 2 * 3600 * 1000 - 120_000 <= extra["ttlMs"] <= 2 * 3600 * 1000  # the deadline, from the submit
    assert extra["pollIntervalMs"] >= 1000 and extra["createdAt"].endswith("Z")
    assert queued["status"] == "working" and queued["resultType"] == "complete"
    assert working["status"] == "working" and "worker-1" in working["statusMessage"]
    assert waiting["status"] == "input_required" and waiting["inputRequests"] == {}
    assert "elizaveta's Kanboard inbox" in waiting["statusMessage"]
    assert untouched[0] == State.INPUT_REQUIRED  # not this client's question: the answer was ignored
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert done["result"]["content"][0]["text"] == "https://docs.example/boiler-summary"


def test_the_clients_own_users_question_is_answered_with_tasks_update(
    env: dict[str, str], fab: Fabric
) -> None:
    """AGAP_MCP_USER's question is an elicitation in inputRequests; a malformed answer is
    -32602 and changes nothing; a good one resumes the task as that person's answer does."""

    async def go() -> list[Any]:
        async with client(env, AGAP_MCP_USER="alvis") as c:
            seed = await submit(c, intent="Order the filters", target="researcher")
            tid = board_id(seed.task_id)
            worker(fab).ledger.ask(claim(fab, tid), "Which size, 16x25 or 20x25?", "alvis")
            waiting = await get(c, seed.task_id)
            key = next(iter(waiting["inputRequests"]))
            bad = await error_of(
                c,
                TasksUpdate(
                    params=TaskParams(task_id=seed.task_id, input_responses={key: {"action": "accept"}})
                ),
            )
            before = snapshot(fab, tid)
            good = {key: {"action": "accept", "content": {"answer": "20x25"}}}
            ack = await rpc(c, TasksUpdate(params=TaskParams(task_id=seed.task_id, input_responses=good)))
            again = await rpc(c, TasksUpdate(params=TaskParams(task_id=seed.task_id, input_responses=good)))
            after = await get(c, seed.task_id)
            return [waiting, key, bad, before, ack, again, after, tid]

    waiting, key, bad, before, ack, again, after, tid = run(go())
    request = waiting["inputRequests"][key]
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form"
    assert request["params"]["message"] == "Which size, 16x25 or 20x25?"
    assert bad.error.code == -32602 and "content.answer" in bad.error.message
    assert before[0] == State.INPUT_REQUIRED
    assert ack["resultType"] == "complete" and again["resultType"] == "complete"  # the second: ignored
    view = fab.show(tid)
    assert view.current is not None and view.current.state == State.QUEUED
    assert view.current.by == "alvis" and view.current.reason == "20x25"
    assert [r.op for r in view.records.values()].count("resume") == 1
    assert after["status"] == "working"


def test_cancel_and_dead_letter(env: dict[str, str], fab: Fabric) -> None:
    async def go() -> list[Any]:
        async with client(env) as c:
            one = await submit(c, intent="Compare two routers", target="researcher")
            ack = await rpc(c, TasksCancel(params=TaskParams(task_id=one.task_id)))
            cancelled = await get(c, one.task_id)
            two = await submit(c, intent="Scrape a page", target="researcher")
            worker(fab).ledger.fail(claim(fab, board_id(two.task_id)), "the page is gone", poison=True)
            failed = await get(c, two.task_id)
            return [one, ack, cancelled, failed]

    one, ack, cancelled, failed = run(go())
    assert ack["resultType"] == "complete"
    assert snapshot(fab, board_id(one.task_id))[0] == State.CANCELED
    assert cancelled["status"] == "cancelled"
    assert failed["status"] == "failed" and failed["error"]["code"] == -32603
    assert "the page is gone" in failed["error"]["message"]


def test_an_ask_human_handle_completes_with_the_answer(env: dict[str, str], fab: Fabric) -> None:
    async def go() -> list[Any]:
        async with client(env, AGAP_MCP_USER="alvis") as c:
            await c.session.call_tool(
                "submit_task", {"intent": "Tidy the notes", "target": "claude-coder"}, allow_claimed=True
            )
            lease = await call(c, "claim_task")
            asked = await c.session.call_tool(
                "ask_human",
                {"task_id": lease["task_id"], "question": "Keep the 2019 notes?"},
                allow_claimed=True,
            )
            assert isinstance(asked, CreateTask), asked
            waiting = await get(c, asked.task_id)
            key = next(iter(waiting["inputRequests"]))
            answer = {key: {"action": "accept", "content": {"answer": "no, archive them"}}}
            await rpc(c, TasksUpdate(params=TaskParams(task_id=asked.task_id, input_responses=answer)))
            answered = await get(c, asked.task_id)
            return [asked, waiting, answered]

    asked, waiting, answered = run(go())
    assert asked.status == "input_required" and "-a" in asked.task_id
    assert waiting["inputRequests"][next(iter(waiting["inputRequests"]))]["params"]["message"] == (
        "Keep the 2019 notes?"
    )
    assert answered["status"] == "completed"
    assert answered["result"]["structuredContent"]["answer"] == "no, archive them"


def test_call_tool_follows_the_handle_to_the_result(env: dict[str, str], fab: Fabric) -> None:
    """With the client side of the extension, call_tool reads like a blocking call: it
    follows the handle with tasks/get until the worker completed the task."""

    async def go() -> tuple[Any, int]:
        ext = TasksExtension(poll_ms=20)
        async with client(env, ext=ext) as c:
            call = c.call_tool("submit_task", {"intent": "Measure the flat", "target": "researcher"})
            async with anyio.create_task_group() as tg:
                tg.start_soon(_complete_when_queued, fab, "Measure the flat")
                result = await call
            return result, ext.polls

    result, polls = run(go())
    assert result.is_error is False and polls >= 1
    assert result.content[0].text == "https://docs.example/flat"
    assert result.structured_content["state"] == "done"


async def _complete_when_queued(fab: Fabric, intent: str) -> None:
    w = worker(fab)
    with anyio.fail_after(30):
        while not (rows := [r for r in w.listing() if r["title"].startswith(intent)]):
            await anyio.sleep(0.02)
    lease = await anyio.to_thread.run_sync(claim, fab, rows[0]["id"])
    await anyio.to_thread.run_sync(lambda: w.ledger.complete(lease, result_ref="https://docs.example/flat"))


# -- who may use a handle (CVE-2026-52870) ----------------------------------------------------


def test_another_caller_with_a_handle_gets_not_found_and_nothing_changes(
    env: dict[str, str], fab: Fabric
) -> None:
    """B serves the agent the task was submitted to (it may read the task), with the same
    key: the handle is A's, so B's get, update and cancel are -32602 and the board keeps it."""

    async def go() -> list[Any]:
        async with client(env, AGAP_MCP_USER="alvis") as a:
            seed = await submit(a, intent="Find a plumber", target="researcher")
        tid = board_id(seed.task_id)
        worker(fab).ledger.ask(claim(fab, tid), "Budget?", "alvis")
        before = fab.show(tid)
        errors = []
        async with client(env, "researcher", AGAP_MCP_USER="alvis") as b:
            key = f"answer-{before.epoch}"
            answer = {key: {"action": "accept", "content": {"answer": "unlimited"}}}
            for request in (
                TasksGet(params=TaskParams(task_id=seed.task_id)),
                TasksUpdate(params=TaskParams(task_id=seed.task_id, input_responses=answer)),
                TasksCancel(params=TaskParams(task_id=seed.task_id)),
                TasksGet(params=TaskParams(task_id=seed.task_id[:-4] + "AAAA")),  # a forged mac
                TasksGet(params=TaskParams(task_id="786512e2-9e0d-44bd-8f29-789f320fe840")),
                TasksGet(params=TaskParams(task_id=f"agap-{tid + 1000}-s0-" + "A" * 32)),
            ):
                errors.append(await error_of(b, request))
            readable = await call(b, "get_task", task_id=tid)  # B may read the task itself
        return [before, errors, readable]

    before, errors, readable = run(go())
    assert readable["task_id"] == before.id
    assert [e.error.code for e in errors] == [-32602] * 6
    assert all("task not found" in e.error.message for e in errors)
    after = fab.show(before.id)
    assert after.epoch == before.epoch and after.current == before.current  # nothing changed


# -- what other clients get -------------------------------------------------------------------


def test_a_2025_11_25_client_gets_plain_results_and_no_tasks_methods(env: dict[str, str]) -> None:
    async def go() -> tuple[str, Any, MCPError]:
        async with client(env, mode="legacy") as c:
            sub = await call(c, "submit_task", intent="Water the plants", target="researcher")
            handle = f"agap-{sub['task_id']}-s0-" + "A" * 32
            return c.protocol_version, sub, await error_of(c, TasksGet(params=TaskParams(task_id=handle)))

    version, sub, error = run(go())
    assert version == "2025-11-25"
    assert isinstance(sub["task_id"], int) and sub["ref"] == f"task:{sub['task_id']}"
    assert error.error.code == -32601  # tasks/* are not served on the handshake wire


def test_a_2026_client_that_did_not_declare_the_extension(env: dict[str, str]) -> None:
    async def go() -> tuple[dict[str, Any], MCPError]:
        async with client(env, tasks=False) as c:
            sub = await call(c, "submit_task", intent="Water the plants", target="researcher")
            handle = f"agap-{sub['task_id']}-s0-" + "A" * 32
            return sub, await error_of(c, TasksGet(params=TaskParams(task_id=handle)))

    sub, error = run(go())
    assert isinstance(sub["task_id"], int)
    assert error.error.code == -32021
    assert error.error.data["requiredCapabilities"]["extensions"] == {TASKS: {}}


# -- elicitation ------------------------------------------------------------------------------


def test_a_question_for_the_clients_user_is_elicited_one_for_a_household_person_is_not(
    env: dict[str, str], fab: Fabric
) -> None:
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"answer": "the blue one"})

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with client(env, tasks=False, mode="legacy", elicit=answer, AGAP_MCP_USER="alvis") as c:
            await call(c, "submit_task", intent="Paint the shed", target="claude-coder")
            lease = await call(c, "claim_task")
            own = await call(c, "ask_human", task_id=lease["task_id"], question="Which colour?")
            again = await call(c, "claim_task")
            other = await call(
                c, "ask_human", task_id=again["task_id"], question="May I buy paint?", human="elizaveta"
            )
            return own, other

    own, other = run(go())
    assert asked == ["Which colour?"]  # elizaveta's question never reached the client
    assert own["answered"] is True and own["answer"] == "the blue one" and own["state"] == "queued"
    view = fab.show(own["task_id"])
    ops = [(r.op, r.by, r.reason) for r in view.records.values()]
    assert ("resume", "alvis", "the blue one") in ops
    assert any(op == "ask" and reason == "Which colour?" for op, _, reason in ops)
    assert other["state"] == "input_required" and other["asked"] == "elizaveta"
    cur = fab.show(other["task_id"]).current
    assert cur is not None and cur.state == State.INPUT_REQUIRED and cur.assignee == "elizaveta"


def test_elicitation_declined_leaves_the_question_in_the_inbox(env: dict[str, str], fab: Fabric) -> None:
    async def decline(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="decline")

    async def go() -> dict[str, Any]:
        async with client(env, tasks=False, mode="legacy", elicit=decline, AGAP_MCP_USER="alvis") as c:
            await call(c, "submit_task", intent="Fix the gate", target="claude-coder")
            lease = await call(c, "claim_task")
            return await call(c, "ask_human", task_id=lease["task_id"], question="Today or tomorrow?")

    out = run(go())
    assert out["state"] == "input_required" and out["asked"] == "alvis" and "answered" not in out
    cur = fab.show(out["task_id"]).current
    assert cur is not None and cur.state == State.INPUT_REQUIRED and cur.assignee == "alvis"
    assert json.dumps(out)  # the plain tool result


# -- over streamable HTTP ---------------------------------------------------------------------


def test_task_handles_over_streamable_http(http_server: HttpServer, fab: Fabric) -> None:
    """The same over HTTP (2026-07-28, the Mcp-Name routing header), where the caller is
    the bearer token's principal."""

    async def go() -> tuple[str, CreateTask, dict[str, Any]]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            Client(
                streamable_http_client(http_server.url, http_client=http), extensions=[TasksExtension()]
            ) as c,
        ):
            seed = await submit(c, intent="Label the fuse box", target="researcher")
            await rpc(c, TasksCancel(params=TaskParams(task_id=seed.task_id)))
            return c.protocol_version, seed, await get(c, seed.task_id)

    version, seed, after = run(go())
    assert version == "2026-07-28" and seed.status == "working"
    assert after["status"] == "cancelled"
    assert snapshot(fab, board_id(seed.task_id))[0] == State.CANCELED
