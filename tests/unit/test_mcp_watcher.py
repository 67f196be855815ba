"""The resource watcher: a live event about a watched task makes it read the board now (the
board decides), an unwatched or unmoved task sends nothing, and it polls without events."""

from __future__ import annotations

import asyncio
from typing import Any

from fabric.apps.mcp.streams import Watcher
from fabric.core import Fabric
from fabric.events.transport import Signal, Sink, Topic
from tests.helpers import wait_until
from tests.unit.test_mcp_units import submit, tools_for

HOUR = 3600.0


class Hints:
    """A transport that only records subscriptions, so the test can deliver signals."""

    name = "hints"

    def __init__(self) -> None:
        self.sinks: dict[Topic, Sink] = {}

    def publish(self, topic: Topic, payload: bytes, *, retain: bool, timeout: float) -> None:
        raise AssertionError("the watcher publishes nothing")

    def subscribe(self, topic: Topic, sink: Sink) -> Any:
        self.sinks[topic] = sink
        return self

    def close(self) -> None:
        pass


class Session:
    """What the watcher needs of an SDK session: send_resource_updated."""

    def __init__(self) -> None:
        self.updated: list[str] = []

    async def send_resource_updated(self, uri: str) -> None:
        self.updated.append(uri)


def test_an_event_wakes_the_watcher_and_the_board_decides(local_fabric: Fabric) -> None:
    tools = tools_for(local_fabric, "claude-coder")
    hints = Hints()
    watcher = Watcher(tools, interval=HOUR, events=hints)  # no poll within the test: only events
    session = Session()
    tid = submit(local_fabric)

    async def go() -> None:
        await watcher.subscribe(session, f"agap://task/{tid}")  # type: ignore[arg-type]
        ((topic, sink),) = hints.sinks.items()
        assert topic.name == str(tid)
        sink(Signal("msg", b"not even signed"))  # a hint about an unmoved task: nothing to send
        await asyncio.to_thread(wait_until, lambda: not watcher._wake.is_set(), 10, "the round")
        tools.claim()  # the task moves
        sink(Signal("msg", b"{}"))
        await asyncio.to_thread(wait_until, lambda: session.updated, 10, "the update")

    try:
        asyncio.run(asyncio.wait_for(go(), 30))
    finally:
        watcher.close()
        tools.close()
    assert session.updated == [f"agap://task/{tid}"]
