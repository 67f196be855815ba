# ruff: noqa: F811 (the fixtures env, fab and http_server come from test_mcp and are parameters here)
"""Streamable HTTP done fully: a dropped SSE stream resumes with Last-Event-ID and loses
nothing; resource subscriptions on agap://task/{id}; the logging capability.

``agap mcp serve --transport http`` runs as a process on loopback; the stream test speaks
the wire itself (httpx2) so it can drop a stream at a chosen point, the others use the
official SDK's client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ResourceUpdatedNotification

from fabric.core import Fabric
from fabric.task import State
from tests.integration.test_mcp import (  # noqa: F401 (fixtures)
    HttpServer,
    call,
    env,
    fab,
    http_server,
    run,
)
from tests.mcp_wire import TOKEN

HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-11-25",
}


def events(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """SSE events (their fields) from a line iterator."""
    event: dict[str, str] = {}
    for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.partition(":")
        event[name] = event.get(name, "") + value.removeprefix(" ")


def initialize(http: httpx2.Client, url: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "resume-test", "version": "1"},
        },
    }
    r = http.post(url, json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    session = r.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert http.post(url, json=note, headers={**HEADERS, "Mcp-Session-Id": session}).status_code == 202
    return session


def test_a_dropped_stream_resumes_with_last_event_id_and_loses_nothing(
    http_server: HttpServer, fab: Fabric
) -> None:
    url = http_server.url
    with httpx2.Client(timeout=30) as http:
        session = initialize(http, url)
        headers = {**HEADERS, "Mcp-Session-Id": session}
        call_body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {
                "name": "submit_task",
                "arguments": {"intent": "Defrost the freezer", "target": "claude-coder"},
            },
        }
        # Read the priming event, then drop the stream before the result.
        with http.stream("POST", url, json=call_body, headers=headers) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            priming = next(events(r.iter_lines()))
        assert priming.get("data", "") == "" and priming["id"] and priming["retry"] == "1000"
        # Resume from the priming event: the result comes, once, with its own event id.
        got: list[dict[str, str]] = []
        resume = {**headers, "Last-Event-ID": priming["id"], "Accept": "text/event-stream"}
        with http.stream("GET", url, headers=resume) as r:
            assert r.status_code == 200
            for event in events(r.iter_lines()):
                got.append(event)
                if event.get("data") and json.loads(event["data"]).get("id") == 7:
                    break
    answer = json.loads(got[-1]["data"])
    assert got[-1]["id"] and got[-1]["id"] != priming["id"]
    task = answer["result"]["structuredContent"]
    view = fab.show(task["task_id"])
    assert view.current is not None and view.current.state == State.QUEUED
    # The tool ran once: one task with this intent on the board.
    assert [r["id"] for r in fab.listing() if r["title"].startswith("Defrost the freezer")] == [
        task["task_id"]
    ]


# Both are the 2025-11-25 wire's, deprecated (not gone) in 2026-07-28: served for handshake clients.
@pytest.mark.filterwarnings("ignore:resources/subscribe is removed", "ignore:The logging capability")
def test_subscribed_clients_hear_a_task_move_and_the_log(http_server: HttpServer, fab: Fabric) -> None:
    updates: list[str] = []
    logs: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            updates.append(str(message.params.uri))

    async def on_log(params: Any) -> None:
        logs.append(str(params.data))

    async def go() -> tuple[Any, int]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            Client(
                streamable_http_client(http_server.url, http_client=http),
                mode="legacy",
                message_handler=on_message,
                logging_callback=on_log,
            ) as client,
        ):
            caps = client.server_capabilities
            sub = await call(client, "submit_task", intent="Check the smoke alarms", target="claude-coder")
            tid = sub["task_id"]
            await client.subscribe_resource(f"agap://task/{tid}")
            await client.set_logging_level("info")
            await call(client, "claim_task")  # the task moves: queued → working
            await _wait(lambda: f"agap://task/{tid}" in updates and logs, "the update and the log line")
            return caps, tid

    caps, tid = run(go())
    assert caps.resources is not None and caps.resources.subscribe is True
    assert caps.logging is not None
    assert updates.count(f"agap://task/{tid}") >= 1
    assert any(f"agap://task/{tid} changed" in line for line in logs)


async def _wait(check: Any, what: str, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.05)
    assert check(), what
