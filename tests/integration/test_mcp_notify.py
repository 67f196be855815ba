# ruff: noqa: F811 (the fixtures env, fab and shared_broker are parameters here)
"""Task status notifications (``notifications/tasks``, the tasks extension SEP-2663) over
real Streamable HTTP: ``agap mcp serve --transport http`` as a process, the wire spoken
with httpx2 (the SDK's client has no ``taskIds`` listen), the live events on the machine's
real brokers (Mosquitto, NATS), and the board polled when there is no broker or it died.

The worker side is the test's own connection to the board through the ledger, publishing
what a worker process publishes (workers.attach.WorkerEvents) on the broker.

With the broker up the server reads the board only on a wake (``AGAP_MCP_WATCH_EVERY``
is an hour there): every notification in those tests was driven by an event.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from click.testing import CliRunner
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ResourceUpdatedNotification

from fabric.apps.cli import main
from fabric.core import Fabric
from tests.helpers import wait_until
from tests.integration.test_events_helpers import (  # noqa: F401 (fixtures)
    Broker,
    OwnBroker,
    own_broker,
    shared_broker,
)
from tests.integration.test_mcp import env, fab  # noqa: F401 (fixtures)
from tests.mcp_wire import (
    SUB_META,
    TASKS,
    TOKEN,
    Listener,
    Server,
    WorkerSide,
    board_id,
    rpc,
    submit,
    tasks_get,
)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        try:
            s.stop()
        except subprocess.TimeoutExpired:
            s.kill()


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    opened: list[Listener] = []
    yield opened
    for listener in opened:
        listener.close()


# -- with the live events -----------------------------------------------------------------------


def test_the_status_of_a_task_arrives_from_the_live_events_in_order_once_each(
    env: dict[str, str],
    fab: Fabric,
    shared_broker: Broker,
    servers: list[Server],
    listeners: list[Listener],
) -> None:
    """working (when the stream opens), input_required (the client's own user's question),
    working (answered with tasks/update), completed: one each, in order, the same
    DetailedTask tasks/get returns; the claims in between (still working) send nothing."""
    for tid in range(1, 9):
        shared_broker.retained_tasks.append(tid)
    live = {**shared_broker.env(), "AGAP_MCP_WATCH_EVERY": "1h", "AGAP_MCP_USER": "alvis"}
    server = Server(env, **live)
    servers.append(server)
    worker = WorkerSide(fab, shared_broker.config)
    try:
        handle = submit(server.url, "Order the filters")
        tid = board_id(handle)
        forged = handle[:-4] + ("AAAA" if not handle.endswith("AAAA") else "BBBB")
        listener = Listener(server.url, [handle, forged])
        listeners.append(listener)
        first = listener.wait_for("working")
        ack = listener.ack
        assert ack is not None and ack["notifications"]["taskIds"] == [handle]  # the forged one: left out
        lease = worker.claim(tid)  # still working: nothing to say
        worker.ask(lease, "Which size, 16x25 or 20x25?", "alvis")
        waiting = listener.wait_for("input_required")
        key = next(iter(waiting["inputRequests"]))
        answer = {key: {"action": "accept", "content": {"answer": "20x25"}}}
        assert "result" in rpc(
            server.url, "tasks/update", {"taskId": handle, "inputResponses": answer}, name=handle
        )
        listener.wait_for("working", 2)
        lease = worker.claim(tid)
        worker.complete(lease, "https://docs.example/filters")
        done = listener.wait_for("completed")
        assert listener.ended.wait(20), "the stream ends once its one task ended"
        got = tasks_get(server.url, handle)
    finally:
        worker.close()
    assert listener.status == 200
    assert listener.statuses() == ["working", "input_required", "working", "completed"]
    assert first["taskId"] == handle and waiting["taskId"] == handle
    assert waiting["inputRequests"][key]["params"]["message"] == "Which size, 16x25 or 20x25?"
    assert done["result"]["content"][0]["text"] == "https://docs.example/filters"
    assert all(t["_meta"][SUB_META] == listener.listen_id for t in listener.tasks)
    assert {k: v for k, v in done.items() if k != "_meta"} == {
        k: v for k, v in got.items() if k not in ("_meta", "resultType")
    }
    end = listener.messages[-1]
    assert end["id"] == listener.listen_id and end["result"]["_meta"][SUB_META] == listener.listen_id
    assert "ttlMs" in done and done["ttlMs"] is None  # no deadline: null, as the spec has it


def test_another_callers_handle_is_never_notified(
    env: dict[str, str],
    fab: Fabric,
    shared_broker: Broker,
    servers: list[Server],
    listeners: list[Listener],
) -> None:
    """CVE-2026-52870: B serves the agent the task went to (it may read the task) with the
    same key; A's handle is left out of B's acknowledgement, and B's stream carries no
    notifications/tasks while A's hears the task end. Without the extension: -32021."""
    for tid in range(1, 9):
        shared_broker.retained_tasks.append(tid)
    live = {**shared_broker.env(), "AGAP_MCP_WATCH_EVERY": "1h"}
    a = Server(env, **live)
    b = Server(env, "researcher", **live)
    servers.extend([a, b])
    worker = WorkerSide(fab, shared_broker.config)
    try:
        handle = submit(a.url, "Find a plumber")
        theirs = Listener(b.url, [handle])
        mine = Listener(a.url, [handle], listen_id=42)
        listeners.extend([theirs, mine])
        assert theirs.ended.wait(20), "a stream with nothing honoured ends at once"
        mine.wait_for("working")
        worker.fail(worker.claim(board_id(handle)), "no plumber answers")
        failed = mine.wait_for("failed")
        undeclared = Listener(a.url, [handle], tasks=False, listen_id=43)
        listeners.append(undeclared)
        assert undeclared.ended.wait(20)
    finally:
        worker.close()
    assert theirs.ack is not None and theirs.ack["notifications"]["taskIds"] == []
    assert theirs.tasks == []
    assert mine.statuses() == ["working", "failed"]
    assert failed["error"]["code"] == -32603 and "no plumber answers" in failed["error"]["message"]
    error = next(m for m in undeclared.messages if m.get("id") == 43)["error"]
    assert error["code"] == -32021
    assert error["data"]["requiredCapabilities"]["extensions"] == {TASKS: {}}
    assert undeclared.tasks == [] and undeclared.ack is None


# -- without the broker: the board ------------------------------------------------------------


def test_without_live_events_the_board_is_polled(
    env: dict[str, str], fab: Fabric, servers: list[Server], listeners: list[Listener]
) -> None:
    """Events off: the same notifications, from board reads every AGAP_MCP_WATCH_EVERY;
    a cancel by a person and a dead letter are cancelled and failed."""
    server = Server(env, AGAP_MCP_WATCH_EVERY="0.2s")
    servers.append(server)
    worker = WorkerSide(fab, None)
    one, two = submit(server.url, "Compare two routers"), submit(server.url, "Scrape a page")
    listener = Listener(server.url, [one, two])
    listeners.append(listener)
    wait_until(lambda: len(listener.tasks) == 2, 20, "the two tasks' first status")
    worker.cancel(board_id(one))
    listener.wait_for("cancelled")
    lease = worker.claim(board_id(two))
    worker.ask(lease, "Which page?", "elizaveta")  # a household person's: nothing to answer here
    waiting = listener.wait_for("input_required")
    worker.fab.ledger.resume(board_id(two), "elizaveta", "the first one")
    listener.wait_for("working", 3)
    worker.fail(worker.claim(board_id(two)), "the page is gone")
    listener.wait_for("failed")
    assert listener.ended.wait(20)
    per_task = {h: [t["status"] for t in listener.tasks if t["taskId"] == h] for h in (one, two)}
    assert per_task == {
        one: ["working", "cancelled"],
        two: ["working", "input_required", "working", "failed"],
    }
    assert waiting["inputRequests"] == {} and "elizaveta's Kanboard inbox" in waiting["statusMessage"]


def test_when_the_broker_dies_the_board_takes_over(
    env: dict[str, str],
    fab: Fabric,
    own_broker: OwnBroker,
    servers: list[Server],
    listeners: list[Listener],
) -> None:
    """First transition from the event; then the broker is killed and the rest comes from
    board reads (AGAP_MCP_WATCH_EVERY) — still one notification per transition."""
    broker = own_broker.broker()
    server = Server(env, **broker.env(), AGAP_MCP_WATCH_EVERY="0.3s", AGAP_MCP_USER="alvis")
    servers.append(server)
    worker = WorkerSide(fab, broker.config)
    try:
        handle = submit(server.url, "Fix the gate")
        listener = Listener(server.url, [handle])
        listeners.append(listener)
        listener.wait_for("working")
        lease = worker.claim(board_id(handle))
        worker.ask(lease, "Today or tomorrow?", "alvis")
        listener.wait_for("input_required")
    finally:
        worker.close()
    own_broker.kill()
    after = WorkerSide(fab, None)
    after.fab.ledger.resume(board_id(handle), "alvis", "today")
    listener.wait_for("working", 2)
    after.complete(after.claim(board_id(handle)), "https://docs.example/gate")
    listener.wait_for("completed")
    assert listener.ended.wait(20)
    assert listener.statuses() == ["working", "input_required", "working", "completed"]


# -- a 2025-11-25 client ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")
def test_a_2025_11_25_client_gets_no_task_notifications(
    env: dict[str, str], fab: Fabric, servers: list[Server]
) -> None:
    """The handshake wire has no tasks extension: no handle, and while its subscribed
    resource says the task moved, no notifications/tasks (nor the old
    notifications/tasks/status) reach it."""

    server = Server(env, AGAP_MCP_WATCH_EVERY="0.2s")
    servers.append(server)
    worker = WorkerSide(fab, None)
    seen: list[Any] = []
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        seen.append(message)
        if isinstance(message, ResourceUpdatedNotification):
            updates.append(str(message.params.uri))

    async def go() -> tuple[str, dict[str, Any]]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            Client(
                streamable_http_client(server.url, http_client=http),
                mode="legacy",
                message_handler=on_message,
            ) as c,
        ):
            result = await c.call_tool("submit_task", {"intent": "Water the plants", "target": "researcher"})
            sub = result.structured_content or {}
            await c.subscribe_resource(f"agap://task/{sub['task_id']}")
            await anyio.to_thread.run_sync(lambda: worker.complete(worker.claim(sub["task_id"]), "done"))
            with anyio.fail_after(20):
                while f"agap://task/{sub['task_id']}" not in updates:
                    await anyio.sleep(0.05)
            return c.protocol_version, sub

    version, sub = asyncio.run(go())
    assert version == "2025-11-25" and isinstance(sub["task_id"], int)
    methods = {getattr(m, "method", type(m).__name__) for m in seen}
    assert not any(str(m).startswith("notifications/tasks") for m in methods), methods


def test_bad_input_on_listen(env: dict[str, str], servers: list[Server]) -> None:
    """taskIds that is not a list of strings, or names too many: -32602, one line."""
    server = Server(env)
    servers.append(server)
    out = rpc(server.url, "subscriptions/listen", {"notifications": {"taskIds": "agap-1-s0-x"}})
    assert out["error"]["code"] == -32602 and "taskIds" in out["error"]["message"]
    many = rpc(
        server.url,
        "subscriptions/listen",
        {"notifications": {"taskIds": [f"agap-{i}-s0-x" for i in range(101)]}},
    )
    assert many["error"]["code"] == -32602 and "at most 100" in many["error"]["message"]


@pytest.mark.parametrize("every", ["0", "-1s", "soon"])
def test_a_bad_watch_interval_refuses_to_start_with_one_line(env: dict[str, str], every: str) -> None:
    result = CliRunner().invoke(
        main, ["mcp", "serve", "--agent", "claude-coder"], env={**env, "AGAP_MCP_WATCH_EVERY": every}
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("agap: error: ") and "AGAP_MCP_WATCH_EVERY" in result.output
    assert result.output.count("\n") == 1
