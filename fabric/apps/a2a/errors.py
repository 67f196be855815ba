"""The spec's status for each A2A error, on the HTTP+JSON and gRPC bindings.

A2A v1.0, section 5.4 ("Error Code Mappings"), says every A2A error MUST be mapped to the
binding's representation and gives the table. ``a2a-sdk`` 1.3.0 maps some errors
otherwise: a task that cannot be canceled is 400 (the spec: 409), a part the agent does not
take is 400 (415), an invalid agent response 500 (502), and an unsupported operation, push
notifications not supported and an unsupported version are FAILED_PRECONDITION (the spec:
UNIMPLEMENTED, over gRPC and in the REST body's ``status``). The reason in the error's
``google.rpc.ErrorInfo`` is the same either way, and the SDK's clients read only that.

:class:`SpecErrorStatus` corrects an HTTP+JSON error response the SDK built (its status
line, ``error.code`` and ``error.status``); :func:`spec_grpc_status` is what the gRPC
servicer aborts with instead (``grpc_server.SpecGrpcHandler``). The JSON-RPC codes are the
SDK's, and the spec's.
"""

from __future__ import annotations

import json
from typing import Any

from .auth import ASGIApp, Message, Receive, Scope, Send

DOMAIN = "a2a-protocol.org"

#: reason (ErrorInfo) -> (HTTP status, gRPC status name), where the spec's differs from the SDK's.
SPEC_STATUS: dict[str, tuple[int, str]] = {
    "TASK_NOT_CANCELABLE": (409, "FAILED_PRECONDITION"),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": (400, "UNIMPLEMENTED"),
    "UNSUPPORTED_OPERATION": (400, "UNIMPLEMENTED"),
    "CONTENT_TYPE_NOT_SUPPORTED": (415, "INVALID_ARGUMENT"),
    "INVALID_AGENT_RESPONSE": (502, "INTERNAL"),
    "VERSION_NOT_SUPPORTED": (400, "UNIMPLEMENTED"),
}


def spec_grpc_status(reason: str) -> str | None:
    """The gRPC status name the spec gives the error with this reason, where it differs."""
    spec = SPEC_STATUS.get(reason)
    return spec[1] if spec else None


def spec_rest_error(status: int, raw: bytes) -> tuple[int, bytes]:
    """An HTTP+JSON error response (status, body) with the spec's status for its reason;
    anything else (not JSON, not an A2A error, already right) comes back as it was."""
    try:
        payload = json.loads(raw)
        error = payload["error"]
        info = error["details"][0]
        reason, domain = info["reason"], info["domain"]
    except (ValueError, KeyError, IndexError, TypeError):
        return status, raw
    spec = SPEC_STATUS.get(reason) if domain == DOMAIN else None
    if spec is None or (status, error.get("code"), error.get("status")) == (spec[0], *spec):
        return status, raw
    error["code"], error["status"] = spec
    return spec[0], json.dumps(payload).encode()


class SpecErrorStatus:
    """ASGI middleware: an HTTP+JSON error gets the spec's status (see the module).

    Only a JSON response of status 400 or more is held back, until its body is complete
    (the SDK's error bodies are one small message); every other message passes as sent.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def relay(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] >= 400 and _json(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            status, body = spec_rest_error(held["status"], b"".join(chunks))
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send(
                {
                    **held,
                    "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, relay)


def _json(start: Message) -> bool:
    headers: Any = start.get("headers", [])
    return any(
        k.lower() == b"content-type" and v.split(b";")[0].strip().endswith(b"json") for k, v in headers
    )
