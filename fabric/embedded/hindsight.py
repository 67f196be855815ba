"""A stand-in for Hindsight's memory API on 127.0.0.1, for ``agap up`` and the tests.

It speaks the part of Hindsight's HTTP API the fabric uses, with Hindsight's paths and
JSON shapes:

* ``POST /v1/default/banks/{bank_id}/memories/recall`` with ``{"query", "budget",
  "max_tokens", ...}`` answers ``{"results": [{"id", "text", "type", "context",
  "mentioned_at", "document_id", ...}]}``; an unknown bank is a 404, a body without a
  query or with another budget than low, mid or high a 422 (FastAPI's shapes);
* ``GET /health`` answers ``{"status": "healthy"}``.

What it is not: Hindsight's retrieval. A recall ranks a bank's memories by how many of
the query's words (four letters or more) they contain, newest first among equals; a
query that matches no word returns the newest memories (where Hindsight's temporal
strategy would find something). Results stop at ``max_tokens`` (a word counts as one
token). With ``api_key`` set, every request must send ``Authorization: Bearer <key>``
(else 401). The last :data:`KEPT` requests are kept in :attr:`HindsightStandIn.requests`.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEMO_MEMORIES", "HindsightStandIn", "Memory", "RecallCall"]

_RECALL = re.compile(r"^/v1/default/banks/([^/?#]+)/memories/recall$")
_WORD = re.compile(r"[a-z0-9]{4,}")
BUDGETS = ("low", "mid", "high")
KEPT = 1000  # requests remembered: `agap up` runs the stand-in for days


@dataclass(frozen=True)
class Memory:
    """One memory unit, as a recall returns it."""

    id: str
    text: str
    type: str = "world"
    context: str | None = None
    mentioned_at: str | None = None
    document_id: str | None = None

    def as_result(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "type": self.type,
            "entities": None,
            "context": self.context,
            "occurred_start": None,
            "occurred_end": None,
            "mentioned_at": self.mentioned_at,
            "document_id": self.document_id,
            "metadata": None,
            "chunk_id": None,
            "tags": None,
        }


#: What ``agap up``'s stand-in starts with: a few household memories per bank the cards'
#: policy names (``cards/_policy.yaml``), so the shipped reflect schedule has something.
DEMO_MEMORIES: dict[str, tuple[Memory, ...]] = {
    "adolf-alvis": (
        Memory(
            "demo-a1",
            "Alvis booked the dentist for Monday at 09:00.",
            "experience",
            "calendar",
            "2026-11-30T18:05:00Z",
            "demo-chat-1",
        ),
        Memory(
            "demo-a2",
            "Alvis takes the train to Berlin on Wednesday morning.",
            "experience",
            "travel",
            "2026-11-30T18:07:00Z",
            "demo-chat-1",
        ),
        Memory(
            "demo-a3",
            "Alvis wants the household budget reviewed every Friday.",
            "world",
            "habits",
            "2026-11-29T09:12:00Z",
            "demo-chat-0",
        ),
    ),
    "adolf-elizaveta": (
        Memory(
            "demo-e1",
            "Elizaveta's piano lesson moved to Thursday 17:30.",
            "experience",
            "calendar",
            "2026-11-30T16:40:00Z",
            "demo-chat-2",
        ),
    ),
}


@dataclass(frozen=True)
class RecallCall:
    """One request the stand-in received."""

    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class HindsightStandIn:
    """The stand-in server: ``start()``, ``url``, ``add()``, ``stop()``."""

    banks: dict[str, list[Memory]] = field(default_factory=dict)
    api_key: str = ""
    port: int = 0
    requests: deque[RecallCall] = field(default_factory=lambda: deque(maxlen=KEPT))
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def with_demo_memories(cls, port: int = 0) -> HindsightStandIn:
        return cls({bank: list(m) for bank, m in DEMO_MEMORIES.items()}, port=port)

    def add(self, bank: str, memory: Memory) -> None:
        with self._lock:
            self.banks.setdefault(bank, []).append(memory)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HindsightStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever,
            name="hindsight-stand-in",
            kwargs={"poll_interval": 0.05},
            daemon=True,
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HindsightStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a request gets ---------------------------------------------------------

    def answer(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any]:
        """(status, JSON) for one request; a subclass may answer otherwise (failures)."""
        with self._lock:
            self.requests.append(RecallCall(method, path, authorization, body))
        if self.api_key and authorization != f"Bearer {self.api_key}":
            return 401, {"detail": "Invalid or missing API key"}
        if method == "GET" and path == "/health":
            return 200, {"status": "healthy", "database": "stand-in"}
        m = _RECALL.match(path)
        if method != "POST" or m is None:
            return 404, {"detail": "Not Found"}
        return self._recall(m.group(1), body)

    def _recall(self, bank: str, body: Any) -> tuple[int, Any]:
        problem = _invalid(body)
        if problem:
            return 422, {"detail": [{"type": "value_error", "loc": ["body", problem[0]], "msg": problem[1]}]}
        with self._lock:
            memories = list(self.banks.get(bank, ()))
            known = bank in self.banks
        if not known:
            return 404, {"detail": f"Bank '{bank}' not found"}
        picked = _rank(memories, str(body["query"]), int(body.get("max_tokens", 4096)))
        return 200, {
            "results": [m.as_result() for m in picked],
            "trace": None,
            "entities": None,
            "chunks": None,
        }


def _invalid(body: Any) -> tuple[str, str] | None:
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return "query", "Field required"
    if body.get("budget", "mid") not in BUDGETS:
        return "budget", "Input should be 'low', 'mid' or 'high'"
    if not isinstance(body.get("max_tokens", 4096), int):
        return "max_tokens", "Input should be a valid integer"
    return None


def _rank(memories: list[Memory], query: str, max_tokens: int) -> list[Memory]:
    """Keyword overlap first, newest first among equals; the newest when nothing matches."""
    words = set(_WORD.findall(query.lower()))

    def hits(m: Memory) -> int:
        return len(words & set(_WORD.findall(f"{m.text} {m.context or ''}".lower())))

    newest = sorted(memories, key=lambda m: m.mentioned_at or "", reverse=True)
    ranked = sorted((m for m in newest if hits(m)), key=hits, reverse=True) or newest
    out, used = [], 0
    for m in ranked:
        used += len(m.text.split())
        if used > max_tokens:
            break
        out.append(m)
    return out


def _handler_for(stand_in: HindsightStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            self._serve("GET", None)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = None
            self._serve("POST", body)

        def _serve(self, method: str, body: Any) -> None:
            status, payload = stand_in.answer(method, self.path, self.headers.get("Authorization"), body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
