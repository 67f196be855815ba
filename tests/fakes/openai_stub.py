"""A loopback stand-in for a model PROVIDER speaking the OpenAI chat-completions protocol.

It stands in for OpenAI (or any OpenAI-compatible provider: Moonshot/Kimi, vLLM, Ollama's
``/v1``) behind LiteLLM, and can also be called directly by a :class:`GatewayClient` as if it
were the LiteLLM proxy. It serves:

* ``POST /v1/chat/completions`` — a valid ``chat.completion`` with ``usage``; the answer is
  ``"stub reply to: <last user message, first 60 chars>"`` unless ``reply`` is set;
* ``GET /v1/models`` — one model, for health checks.

Every request must carry ``Authorization: Bearer <api_key>`` (else 401, in OpenAI's error
shape). :meth:`OpenAIStub.fail_next` makes the next N chat calls answer 429 (with
``Retry-After`` and ``x-ratelimit-reset-requests``), 500, 503, malformed JSON, or a body
without ``choices``. Every request received (method, path, lower-cased headers, parsed body)
is kept in :attr:`OpenAIStub.requests`. Binds 127.0.0.1 on an ephemeral port, serves from a
daemon thread, and stops cleanly (``with OpenAIStub() as stub: ...``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal

from tests.fakes.loopback import Loopback

Failure = Literal["429", "500", "503", "malformed", "no_choices", "budget"]

# What Anthropic answers when an account's usage limit is spent (a 400, no headers).
BUDGET_MESSAGE = (
    "You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC."
)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""
    peer: tuple[str, int] | None = None  # the client's address: one per connection


@dataclass
class _Plan:
    kind: Failure
    count: int
    retry_after: str | None = None
    reset_requests: str | None = None


@dataclass
class OpenAIStub:
    api_key: str = "sk-stub-provider-key"
    reply: Callable[[dict[str, Any]], str] | None = None
    requests: list[RecordedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: list[_Plan] = []
        self._http: Loopback | None = None
        self._ids = 0

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> OpenAIStub:
        self._http = Loopback(_make_handler(self), "openai-stub", _QuietServer).start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._http is not None, "the stub is not running"
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``), as LiteLLM's ``api_base`` wants it."""
        return f"{self.url}/v1"

    # -- steering and assertions ---------------------------------------------------

    def fail_next(
        self,
        kind: Failure,
        count: int = 1,
        *,
        retry_after: str | None = "7",
        reset_requests: str | None = "7s",
    ) -> None:
        """Answer the next ``count`` chat calls with ``kind`` instead of a completion."""
        with self._lock:
            self._plans.append(_Plan(kind, count, retry_after, reset_requests))

    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._plans.clear()

    # -- internals -----------------------------------------------------------------

    def _take_plan(self) -> _Plan | None:
        with self._lock:
            while self._plans and self._plans[0].count <= 0:
                self._plans.pop(0)
            if not self._plans:
                return None
            plan = self._plans[0]
            plan.count -= 1
            return plan

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)

    def _next_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"chatcmpl-stub-{self._ids}"

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        last_user = next(
            (
                str(m.get("content", ""))
                for m in reversed(messages)
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )
        text = self.reply(body) if self.reply else f"stub reply to: {last_user[:60]}"
        prompt_tokens = (
            sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict)) or 1
        )
        completion_tokens = len(text.split()) or 1
        return {
            "id": self._next_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "stub-model")),
            "system_fingerprint": "fp_stub",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


class _QuietServer(ThreadingHTTPServer):
    """A client that hung up (a timeout test) is not an error worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            super().handle_error(request, client_address)


def _make_handler(stub: OpenAIStub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.stub = stub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    """OpenAI's models and chat completions routes, answering as :attr:`stub` plans."""

    protocol_version = "HTTP/1.1"
    stub: ClassVar[OpenAIStub]

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(
        self,
        status: int,
        payload: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req-stub-{len(self.stub.requests)}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(
        self, status: int, message: str, etype: str, code: str, headers: dict[str, str] | None = None
    ) -> None:
        self._send(
            status,
            {"error": {"message": message, "type": etype, "param": None, "code": code}},
            headers=headers,
        )

    def _read(self) -> tuple[bytes, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.stub._record(
            RecordedRequest(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                body,
                raw,
                (str(self.client_address[0]), int(self.client_address[1])),
            )
        )
        return raw, body

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.stub.api_key}":
            return True
        self._error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        return False

    def do_GET(self) -> None:
        self._read()
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": "stub-model", "object": "model", "created": 0, "owned_by": "stub"}],
                },
            )
            return
        self._error(404, f"no route {self.path}", "invalid_request_error", "not_found")

    def do_POST(self) -> None:
        _, body = self._read()
        if not self._authorized():
            return
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}", "invalid_request_error", "not_found")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "'messages' is required", "invalid_request_error", "invalid_request")
            return
        self._answer(self.stub._take_plan(), body)

    def _answer(self, plan: _Plan | None, body: dict[str, Any]) -> None:
        """A completion, or the failure ``plan`` says is next."""
        if plan is None:
            self._send(200, self.stub._completion(body))
        elif plan.kind == "429":
            self._error(
                429,
                "Rate limit reached for requests",
                "requests",
                "rate_limit_exceeded",
                headers=_rate_limit_headers(plan),
            )
        elif plan.kind == "budget":
            self._error(400, BUDGET_MESSAGE, "invalid_request_error", "invalid_request_error")
        elif plan.kind in ("500", "503"):
            self._error(
                int(plan.kind),
                "The server had an error while processing your request.",
                "server_error",
                "server_error",
            )
        elif plan.kind == "malformed":
            self._send(200, raw=b'{"id": "chatcmpl-broken", "choices": [{"mess')
        else:  # no_choices
            completion = self.stub._completion(body)
            completion.pop("choices")
            self._send(200, completion)


def _rate_limit_headers(plan: _Plan) -> dict[str, str]:
    headers: dict[str, str] = {}
    if plan.retry_after is not None:
        headers["Retry-After"] = plan.retry_after
    if plan.reset_requests is not None:
        headers["x-ratelimit-reset-requests"] = plan.reset_requests
        headers["x-ratelimit-remaining-requests"] = "0"
        headers["x-ratelimit-limit-requests"] = "60"
    return headers
