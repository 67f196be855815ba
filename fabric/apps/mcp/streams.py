"""Streamable HTTP done fully: resumable SSE streams, resource subscriptions, logging.

* :class:`ReplayBuffer` — the SDK's ``EventStore``: every SSE event gets an id, each
  stream opens with a priming event (an id and ``retry``), and a client that lost its
  stream reconnects with ``Last-Event-ID`` and gets what it missed. Bounded and in memory:
  a stream survives a dropped connection, not a restart of the server (the board keeps
  the state; the client reads it back).
* :class:`TaskHints` — the live events (MQTT/NATS) of a set of tasks as wake-ups, and
  whether the broker is there to give them (else the board is read on a timer);
* :class:`Watcher` — ``resources/subscribe`` on ``agap://task/{id}`` (and ``agap://queue``)
  on the handshake wire: a thread reads the watched tasks from the board when a live
  event about one arrives (MQTT/NATS, when events are on; a hint, the board decides) and
  every ``interval`` seconds anyway, and sends ``notifications/resources/updated`` when one
  moved; and
  ``logging/setLevel``: the server's own log lines (``agap.mcp``) at or above the level a
  session asked for go to it as ``notifications/message``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from mcp.server.session import ServerSession
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, JSONRPCMessage, LoggingLevel

from fabric.errors import FabricError
from fabric.events.transport import Signal, Subscription, Transport, task_topic

from .agent import AgentTools

log = logging.getLogger("agap.mcp")

# What a client that lost its stream is told to wait before reconnecting (SSE retry).
RETRY_MS = 1000
# Events kept for replay, all streams together: the oldest go first.
MAX_EVENTS = 10_000
TASK_URI = "agap://task/"
QUEUE_URI = "agap://queue"
_LEVEL_NAME: dict[int, LoggingLevel] = {10: "debug", 20: "info", 30: "warning", 40: "error"}
_PY_LEVEL = {"debug": 10, "info": 20, "notice": 25, "warning": 30, "error": 40, "critical": 50}


class ReplayBuffer(EventStore):
    """An in-memory event store: ids in order, per stream, the newest ``limit`` kept."""

    def __init__(self, limit: int = MAX_EVENTS) -> None:
        self._limit = limit
        self._events: OrderedDict[str, tuple[StreamId, JSONRPCMessage | None]] = OrderedDict()
        self._seq = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._seq))
        self._events[event_id] = (stream_id, message)
        while len(self._events) > self._limit:
            self._events.popitem(last=False)
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if last_event_id not in self._events:
            return None  # unknown or evicted: the client reads the state back instead
        stream = self._events[last_event_id][0]
        after = False
        for event_id, (sid, message) in list(self._events.items()):
            if after and sid == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream


def _task_of(uri: str) -> int | None:
    if uri == QUEUE_URI:
        return 0
    tail = uri[len(TASK_URI) :] if uri.startswith(TASK_URI) else ""
    return int(tail) if tail.isdigit() and int(tail) > 0 else None


class TaskHints:
    """Live events about some tasks, as wake-ups: a hint, never the state (the board decides,
    so a forged or stale payload costs one board read).

    ``wake`` is called (on the broker's thread: it must be quick) for each event about one
    of the tasks, when a subscription comes up (events may have been missed while it was
    down) and when one goes down (the caller's timer changes). :meth:`live` says whether
    every subscription is up: while it is not, the caller reads the board on its own timer.
    """

    def __init__(self, events: Transport | None, wake: Callable[[], None]) -> None:
        self.events = events
        self.wake = wake
        self._lock = threading.Lock()
        self._subs: dict[int, Subscription] = {}
        self._up: set[int] = set()

    def add(self, task_id: int) -> None:
        if self.events is None:
            return
        with self._lock:
            if task_id in self._subs:
                return
        sub = self.events.subscribe(task_topic(task_id), lambda sig: self._signal(task_id, sig))
        with self._lock:
            if task_id in self._subs:  # another add won: keep one subscription
                sub.close()
            else:
                self._subs[task_id] = sub

    def _signal(self, task_id: int, sig: Signal) -> None:
        with self._lock:
            if sig.kind == "up":
                self._up.add(task_id)
            elif sig.kind == "down":
                self._up.discard(task_id)
        self.wake()  # down too: the caller's timer is now the board's

    def remove(self, task_id: int) -> None:
        with self._lock:
            sub = self._subs.pop(task_id, None)
            self._up.discard(task_id)
        if sub is not None:
            sub.close()

    def live(self) -> bool:
        """Every watched task's subscription is up (False with events off)."""
        with self._lock:
            return self.events is not None and set(self._subs) <= self._up

    def close(self) -> None:
        with self._lock:
            ids = list(self._subs)
        for task_id in ids:
            self.remove(task_id)


class Watcher:
    """Resource subscriptions and log levels of the sessions on the handshake wire."""

    def __init__(self, tools: AgentTools, *, interval: float = 1.0, events: Transport | None = None) -> None:
        self.tools = tools
        self.interval = interval
        self.events = events
        self._wake = threading.Event()
        self._hints = TaskHints(events, self._wake.set)
        self._lock = threading.Lock()
        self._subs: dict[str, set[ServerSession]] = {}
        self._seen: dict[str, Any] = {}
        self._levels: dict[ServerSession, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- resources/subscribe ----------------------------------------------------------

    async def subscribe(self, session: ServerSession, uri: str) -> None:
        """Watch ``uri`` for ``session``; a task it may not read is refused (invalid params)."""
        task_id = _task_of(uri)
        if task_id is None:
            raise MCPError(code=INVALID_PARAMS, message=f"{uri!r} is not agap://queue or agap://task/<id>")
        try:
            seen = await asyncio.to_thread(self._version, uri)
        except FabricError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"{uri}: {exc.line()}") from None
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._subs.setdefault(uri, set()).add(session)
            self._seen.setdefault(uri, seen)
        if task_id:  # a live event about it reads the board now
            self._hints.add(task_id)
        self._start()

    async def unsubscribe(self, session: ServerSession, uri: str) -> None:
        with self._lock:
            subs = self._subs.get(uri)
            if subs is not None:
                subs.discard(session)
                if not subs:
                    del self._subs[uri]
                    self._seen.pop(uri, None)
                    task_id = _task_of(uri)
                    if task_id:
                        self._hints.remove(task_id)

    def _version(self, uri: str) -> Any:
        """What changes when the resource does: a task's epoch; the queue's open rows."""
        task_id = _task_of(uri)
        with self.tools._lock:
            if task_id:
                return self.tools._read(task_id).epoch
        return tuple((r["id"], r.get("column")) for r in self.tools.queue()["tasks"])

    def poll(self) -> list[str]:
        """One round: the watched resources that changed since the last (notified)."""
        with self._lock:
            uris = list(self._subs)
        changed: list[str] = []
        for uri in uris:
            try:
                now = self._version(uri)
            except FabricError as exc:  # the next round tries again
                log.debug("watch %s: %s", uri, exc.line())
                continue
            with self._lock:
                if uri in self._seen and self._seen[uri] != now:
                    changed.append(uri)
                self._seen[uri] = now
        for uri in changed:
            log.info("%s changed", uri)
            with self._lock:
                sessions = list(self._subs.get(uri, ()))
            for session in sessions:
                self._send(session.send_resource_updated(uri))
        return changed

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.poll()
            except Exception:  # the watcher outlives one bad round
                log.exception("watch round failed")

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agap-mcp-watch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._hints.close()

    def _send(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, loop)

    # -- logging/setLevel -------------------------------------------------------------

    async def set_level(self, session: ServerSession, level: str) -> None:
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._levels[session] = _PY_LEVEL.get(level, 50)

    def emit(self, record: logging.LogRecord) -> None:
        """A log line of this server, to every session whose level it meets."""
        with self._lock:
            targets = [s for s, level in self._levels.items() if record.levelno >= level]
        name: LoggingLevel = _LEVEL_NAME.get(record.levelno, "critical")
        for session in targets:
            with warnings.catch_warnings():  # deprecated in 2026-07-28; served on the handshake wire
                warnings.simplefilter("ignore")
                coro = session.send_log_message(name, record.getMessage(), logger=record.name)
            self._send(coro)


class SessionLog(logging.Handler):
    """Forwards the ``agap.mcp`` log to the sessions that set a level."""

    def __init__(self, watcher: Watcher) -> None:
        super().__init__(logging.DEBUG)
        self.watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        self.watcher.emit(record)


__all__ = ["RETRY_MS", "ReplayBuffer", "SessionLog", "TaskHints", "Watcher"]
