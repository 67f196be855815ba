"""Request checks the SDK's parsing cannot make: enum values protobuf would quietly zero.

The SDK parses JSON-RPC params with ``ignore_unknown_fields=True`` (forward compatibility),
which also turns an unknown enum name into 0. For ``ListTasks`` that makes
``"status": "TASK_STATE_BOGUS"`` read as "no filter": the caller gets every task and no
hint of the typo. :class:`EnumGuard` looks at the raw body first and answers such a call
with -32602 (invalid params) naming the value; everything else passes through untouched,
its body replayed to the app.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from email.utils import formatdate
from typing import Any

from a2a.types.a2a_pb2 import TaskState

from .auth import ASGIApp, Message, Receive, Scope, Send

INVALID_PARAMS = -32602
KNOWN = [n for n in TaskState.DESCRIPTOR.values_by_name if n != "TASK_STATE_UNSPECIFIED"]
#: (method, param) pairs whose value must be a TaskState name or number.
STATE_PARAMS = (("ListTasks", "status"),)


def bad_state(value: object) -> bool:
    """True unless ``value`` names a TaskState (by its name or its number)."""
    states = TaskState.DESCRIPTOR
    if isinstance(value, str):
        return value not in states.values_by_name
    if isinstance(value, int) and not isinstance(value, bool):
        return value not in states.values_by_number
    return True


def refusal(body: object) -> dict[str, Any] | None:
    """The JSON-RPC error for a call with an unknown state value, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("params"), dict):
        return None
    for method, param in STATE_PARAMS:
        value = body["params"].get(param)
        if body.get("method") == method and value is not None and bad_state(value):
            return {
                "jsonrpc": "2.0",
                "id": body.get("id"),
                "error": {
                    "code": INVALID_PARAMS,
                    "message": f"params.{param}: unknown task state {value!r} (one of {', '.join(KNOWN)})",
                },
            }
    return None


class EnumGuard:
    """ASGI middleware: refuse unknown state values before the SDK zeroes them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([msg]), send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            error = refusal(json.loads(raw))
        except ValueError:
            error = None  # not JSON: the SDK answers the parse error
        if error is not None:
            await _json(send, error)
            return
        await self.app(
            scope, _replay([{"type": "http.request", "body": raw, "more_body": False}], receive), send
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _json(send: Send, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class CardLastModified:
    """ASGI middleware: the agent cards say when they last changed (``Last-Modified``).

    A card changes only when the server starts with other fabric cards, so its time is
    the server's start; a client may cache it by date as well as by the SDK's ETag.
    """

    def __init__(self, app: ASGIApp, paths: Iterable[str], since: float) -> None:
        self.app = app
        self.paths = frozenset(paths)
        self.value = formatdate(since, usegmt=True).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return

        async def stamped(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", []))
                if not any(k.lower() == b"last-modified" for k, _ in headers):
                    headers.append((b"last-modified", self.value))
                msg = {**msg, "headers": headers}
            await send(msg)

        await self.app(scope, receive, stamped)
