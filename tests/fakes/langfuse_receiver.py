"""A loopback receiver standing in for Langfuse's ingestion API (the tracing backend).

LiteLLM's ``langfuse`` callback (litellm >= 1.8x with the v4 Langfuse SDK) exports every
completion as OpenTelemetry spans: ``POST {LANGFUSE_HOST}/api/public/otel/v1/traces``, an
OTLP/HTTP ``ExportTraceServiceRequest`` (binary protobuf, or JSON; optionally gzip), with
``Authorization: Basic base64(public_key:secret_key)``. Langfuse answers ``200 {}``. Older
clients post JSON batches to ``POST /api/public/ingestion`` (answered ``207`` with
``{"successes": [{"id", "status": 201}], "errors": []}``, as Langfuse does); both are served.
``GET /api/public/projects`` (the SDK's auth check) and ``GET /api/public/health`` answer too.

Requests with the wrong Basic credentials get 401. Every accepted payload is recorded:
:meth:`LangfuseReceiver.spans` returns the decoded spans (name, trace id, attributes with
JSON-looking strings left as they are) and :meth:`LangfuseReceiver.trace_tags` the union of
trace tags (``langfuse.trace.tags`` on OTLP spans, ``body.tags`` on ``trace-create`` events).
Decoding binary protobuf needs ``opentelemetry-proto`` (installed with ``langfuse``).
Binds 127.0.0.1 on an ephemeral port, serves from a daemon thread, stops cleanly.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

from tests.fakes.loopback import JsonHandler, Loopback

OTLP_PATH = "/api/public/otel/v1/traces"
INGESTION_PATH = "/api/public/ingestion"


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def tags(self) -> list[str]:
        raw = self.attributes.get("langfuse.trace.tags")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = [raw]
        return [str(t) for t in raw] if isinstance(raw, list) else []


@dataclass
class LangfuseReceiver:
    public_key: str = "pk-lf-test"
    secret_key: str = "sk-lf-test"
    requests: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._http: Loopback | None = None

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> LangfuseReceiver:
        self._http = Loopback(_make_handler(self), "langfuse-receiver").start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None

    def __enter__(self) -> LangfuseReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._http is not None, "the receiver is not running"
        return self._http.url

    def env(self) -> dict[str, str]:
        """The environment LiteLLM's Langfuse callback reads to reach this receiver."""
        return {
            "LANGFUSE_PUBLIC_KEY": self.public_key,
            "LANGFUSE_SECRET_KEY": self.secret_key,
            "LANGFUSE_HOST": self.url,
        }

    # -- assertions ----------------------------------------------------------------

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def trace_tags(self) -> set[str]:
        tags = {t for s in self.spans() for t in s.tags}
        with self._lock:
            for event in self.events:
                body = event.get("body") or {}
                if event.get("type") == "trace-create" and isinstance(body.get("tags"), list):
                    tags.update(str(t) for t in body["tags"])
        return tags

    def wait_for(self, predicate: Callable[[LangfuseReceiver], bool], timeout: float = 20.0) -> bool:
        """Poll ``predicate(self)`` until true or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.1)
        return predicate(self)

    # -- internals -----------------------------------------------------------------

    def _authorized(self, header: str | None) -> bool:
        expected = base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode()
        return header == f"Basic {expected}"

    def _record(
        self, entry: dict[str, Any], spans: Sequence[ReceivedSpan] = (), events: Sequence[dict[str, Any]] = ()
    ) -> None:
        with self._lock:
            self.requests.append(entry)
            self._spans.extend(spans)
            self.events.extend(events)


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return bytes(value.bytes_value).hex()
    return getattr(value, kind)


def decode_otlp(body: bytes, content_type: str) -> list[ReceivedSpan]:
    """The spans in an OTLP/HTTP trace export body (protobuf or JSON)."""
    from google.protobuf import json_format  # type: ignore[import-untyped,unused-ignore]  # optional dependency
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # type: ignore[import-untyped,unused-ignore]  # optional dependency
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    if "json" in content_type:
        json_format.Parse(body.decode(), request)
    else:
        request.ParseFromString(body)
    out: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=bytes(span.trace_id).hex(),
                        span_id=bytes(span.span_id).hex(),
                        attributes={kv.key: _any_value(kv.value) for kv in span.attributes},
                        resource=resource,
                    )
                )
    return out


def _make_handler(receiver: LangfuseReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.receiver = receiver
    return Handler


class _Handler(JsonHandler):
    """Langfuse's health, projects, OTLP and ingestion routes, for :attr:`receiver`."""

    protocol_version = "HTTP/1.1"
    receiver: ClassVar[LangfuseReceiver]

    def _send(self, status: int, payload: Any) -> None:
        self.send_json(status, payload)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
            raw = gzip.decompress(raw)
        return raw

    def _check(self) -> bool:
        if self.receiver._authorized(self.headers.get("Authorization")):
            return True
        self._send(401, {"message": "Invalid credentials. Confirm that you've configured the correct host."})
        return False

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if path == "/api/public/health":
            self._send(200, {"status": "OK", "version": "stub"})
            return
        if not self._check():
            return
        if path == "/api/public/projects":
            self._send(200, {"data": [{"id": "stub-project", "name": "agap-test", "metadata": {}}]})
            return
        self._send(404, {"message": f"no route {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        raw = self._body()
        if not self._check():
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        if path == OTLP_PATH:
            self._otlp(path, raw, headers)
        elif path == INGESTION_PATH:
            self._ingestion(path, raw, headers)
        else:
            self._send(404, {"message": f"no route {path}"})

    def _otlp(self, path: str, raw: bytes, headers: dict[str, str]) -> None:
        content_type = (self.headers.get("Content-Type") or "").lower()
        try:
            spans = decode_otlp(raw, content_type)
        except Exception as exc:  # a body we cannot read is the sender's bug
            self._send(400, {"message": f"invalid OTLP body: {exc}"})
            return
        self.receiver._record({"path": path, "headers": headers, "size": len(raw)}, spans)
        self._send(200, {})

    def _ingestion(self, path: str, raw: bytes, headers: dict[str, str]) -> None:
        try:
            data = json.loads(raw)
            batch = list(data.get("batch") or [])
        except (ValueError, AttributeError):
            self._send(400, {"message": "invalid JSON body"})
            return
        self.receiver._record({"path": path, "headers": headers, "body": data}, events=batch)
        self._send(
            207,
            {
                "successes": [{"id": e.get("id"), "status": 201} for e in batch if isinstance(e, dict)],
                "errors": [],
            },
        )
