"""Task status notifications of the MCP tasks extension (SEP-2663): ``notifications/tasks``.

The extension's way (2026-07-28): a client that declared ``io.modelcontextprotocol/tasks``
opens a ``subscriptions/listen`` stream with ``notifications.taskIds`` (handles this server
gave it); the acknowledgement names the task ids the server agreed to, and each
``notifications/tasks`` on the stream carries the task's full DetailedTask, what
``tasks/get`` would return at that moment. Here:

* only handles that verify for the listening caller are honoured (the identity the handle
  is bound to: the card and the bearer token's principal); another caller's handle, a
  forged or a stale one is left out of the acknowledgement and never notified (the
  CVE-2026-52870 rule, as for ``tasks/get``); ``taskIds`` from a request that did not
  declare the extension is -32021 (missing required client capability);
* the first notification of each task is its status when the stream opens (so one that
  moved between the handle and the listen is not missed), then one per change of status
  — working, input_required (again for each new question), completed, failed, cancelled
  — never two for one transition (a claim keeps it working: no notification);
* what drives it: the live events the worker publishes (MQTT/NATS: a wake-up; the board
  decides, read once per wake), this server's own ``tasks/update`` and ``tasks/cancel``,
  and, while live events are off or the broker is away, a board read every
  ``AGAP_MCP_WATCH_EVERY``;
* the stream ends (its ``SubscriptionsListenResult``) once every honoured task has ended
  and it asked for nothing else.

A listen without ``taskIds`` is the SDK's own (list changes, resource subscriptions).
A 2025-11-25 client has no tasks extension, so it gets no task handles and no
``notifications/tasks`` (the 2025-11-25 ``notifications/tasks/status`` of that revision's
experimental tasks is not served).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Literal, cast

import anyio
import anyio.streams.memory
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver.server import require_client_extension
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    Notification,
    ServerNotification,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from fabric.errors import FabricError

from .handles import TaskHandles, parse_handle
from .streams import TaskHints
from .tasks import TASKS, caller_identity

log = logging.getLogger("agap.mcp")

NOTIFY = "notifications/tasks"
FINAL = frozenset({"completed", "failed", "cancelled"})
# With the broker up the board is still read now and then: an event can be lost.
SAFETY_FACTOR = 30
MIN_SAFETY = 30.0
# Task ids one listen may name: each is a broker subscription and a board read per wake.
MAX_TASK_IDS = 100


class TaskNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """``notifications/tasks``: the params are a DetailedTask (``ttlMs`` may be null)."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def transition(task: dict[str, Any]) -> tuple[str, str]:
    """What one notification stands for: the status, and for input_required the question
    (its record's time: each question is a transition of its own)."""
    status = str(task.get("status"))
    return status, str(task.get("lastUpdatedAt", "")) if status == "input_required" else ""


def _standard(requested: SubscriptionFilter) -> SubscriptionFilter:
    """The SDK's kinds a listen asked for besides taskIds (each honoured as the SDK does)."""
    return SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=list(requested.resource_subscriptions)
        if requested.resource_subscriptions
        else None,
    )


class TaskListen:
    """Serves ``subscriptions/listen``: with ``taskIds``, task status notifications; without,
    the SDK's listen handler."""

    def __init__(
        self,
        handles: TaskHandles,
        bus: SubscriptionBus,
        *,
        events: Any = None,
        every: float = 1.0,
        max_buffered_events: int = 1024,
    ) -> None:
        self.handles = handles
        self.bus = bus
        self.events = events
        self.every = every
        self.safety = max(MIN_SAFETY, every * SAFETY_FACTOR)
        self.sdk = ListenHandler(bus, max_buffered_events=max_buffered_events)
        self._max_buffered = max_buffered_events

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        wanted = (params.notifications.model_extra or {}).get("taskIds")
        if wanted is None:
            return await self.sdk(ctx, params)
        require_client_extension(ctx, TASKS)
        if ctx.request_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if not isinstance(wanted, list) or not all(isinstance(h, str) for h in wanted):
            raise MCPError(INVALID_PARAMS, "notifications.taskIds is a list of taskId strings")
        if len(wanted) > MAX_TASK_IDS:
            raise MCPError(
                INVALID_PARAMS, f"notifications.taskIds names {len(wanted)} tasks: at most {MAX_TASK_IDS}"
            )
        identity = caller_identity(self.handles.tools.card.id)
        first = await anyio.to_thread.run_sync(self._read, identity, list(dict.fromkeys(wanted)))
        return await _Stream(self, ctx, identity, first, _standard(params.notifications)).run()

    def _read(self, identity: str, handles: list[str]) -> dict[str, dict[str, Any]]:
        """The DetailedTask of each handle this caller may use (others: left out)."""
        out: dict[str, dict[str, Any]] = {}
        for text in handles:
            try:
                out[text] = self.handles.get(identity, text)
            except FabricError as exc:  # foreign, forged, stale, or the board away this round
                log.debug("listen %s: %s", text[:40], exc.line())
        return out


class _Stream:
    """One listen stream with task ids."""

    def __init__(
        self,
        owner: TaskListen,
        ctx: ServerRequestContext[Any, Any],
        identity: str,
        first: dict[str, dict[str, Any]],
        standard: SubscriptionFilter,
    ) -> None:
        self.owner = owner
        self.ctx = ctx
        self.identity = identity
        self.first = first
        self.standard = standard
        self.meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.hints = TaskHints(owner.events, self._poke)
        self.ids = {text: parse_handle(text).task_id for text in first}

    def _poke(self) -> None:
        """From any thread: read the board now."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: the stream is over
            self.loop.call_soon_threadsafe(self.wake.set)

    def _local(self, task_id: int) -> None:
        if task_id in self.ids.values():
            self._poke()

    async def _send(self, note: Any) -> None:
        await self.ctx.session.send_notification(
            cast(ServerNotification, note), related_request_id=self.ctx.request_id
        )

    async def run(self) -> SubscriptionsListenResult:
        standard = self.standard
        wants_more = any(
            (
                standard.tools_list_changed,
                standard.prompts_list_changed,
                standard.resources_list_changed,
                standard.resource_subscriptions,
            )
        )
        uris = frozenset(standard.resource_subscriptions or ())
        send, recv = anyio.create_memory_object_stream[ServerEvent](self.owner._max_buffered)

        def deliver(event: ServerEvent) -> None:
            if event_matches(standard, uris, event):
                with contextlib.suppress(anyio.ClosedResourceError, anyio.WouldBlock):
                    send.send_nowait(event)

        honored = standard.model_dump(by_alias=True, exclude_none=True) | {"taskIds": list(self.first)}
        unsubscribe: Callable[[], None] | None = self.owner.bus.subscribe(deliver) if wants_more else None
        self.owner.handles.on_change.append(self._local)
        for text, task in self.first.items():
            if task["status"] not in FINAL:
                self.hints.add(self.ids[text])
        try:
            await self._send(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=SubscriptionFilter.model_validate(honored), _meta=self.meta
                    )
                )
            )
            async with anyio.create_task_group() as tg:
                if wants_more:
                    tg.start_soon(self._pump, recv)
                await self._follow()
                if not wants_more:
                    tg.cancel_scope.cancel()
        finally:
            with contextlib.suppress(ValueError):
                self.owner.handles.on_change.remove(self._local)
            self.hints.close()
            if unsubscribe is not None:
                unsubscribe()
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=self.meta)

    async def _pump(self, recv: anyio.streams.memory.MemoryObjectReceiveStream[ServerEvent]) -> None:
        async for event in recv:
            await self._send(event_to_notification(event, self.meta))

    async def _follow(self) -> None:
        """The status of each task when the stream opened, then one per change, until all ended."""
        last: dict[str, tuple[str, str]] = {}
        now = self.first
        while True:
            for text, task in now.items():
                step = transition(task)
                if last.get(text) == step:
                    continue
                last[text] = step
                await self._send(TaskNotification(params={**task, "_meta": self.meta}))
                if task["status"] in FINAL:
                    self.hints.remove(self.ids[text])
            open_ = [t for t in self.ids if last.get(t, ("", ""))[0] not in FINAL]
            if not open_:
                return
            period = self.owner.safety if self.hints.live() else self.owner.every
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), period)
            self.wake.clear()
            now = await anyio.to_thread.run_sync(self.owner._read, self.identity, open_)


__all__ = ["NOTIFY", "TaskListen", "TaskNotification", "transition"]
