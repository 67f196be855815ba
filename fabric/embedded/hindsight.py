"""A stand-in for Hindsight's memory API on 127.0.0.1, for ``agap up`` and the tests.

It speaks the part of Hindsight 1.1.0's HTTP API the fabric uses (:mod:`fabric.hindsight`),
with its paths, JSON shapes, status codes and error bodies, and it is never kinder than
Hindsight: where the two could differ it takes the stricter answer.

* ``POST /v1/default/banks/{bank_id}/memories/recall`` ``{"query", "budget", "max_tokens",
  "types", "query_timestamp", "temporal_window"}`` → ``{"results": [...]}``. A query with no
  word character is a 422, an unknown bank a 404, a bad budget or type a 422, an
  unreadable ``query_timestamp`` a 400. **A query that matches nothing returns ``[]``**.
* ``GET …/memories/list?type=&limit=&offset=`` → ``{"items", "total", "limit", "offset"}``,
  newest first by ``mentioned_at`` (its items say ``fact_type``, not ``type``).
* ``POST …/memories`` ``{"items": [{"content", "context", "timestamp", "document_id",
  "tags"}]}``: a retain, one memory per item (Hindsight's LLM would extract facts);
  the bank is made on first use, and a ``document_id`` retained again replaces its memories.
  An item Hindsight refuses is a 422: blank ``content``, a ``timestamp`` that is not ISO
  8601 (or ``unset``) or a placeholder year (1, 9999), a non-string context or document id.
* ``POST …/reflect`` ``{"query", "budget", "max_tokens"}`` → ``{"text", "based_on"}``: the
  matching memories, listed (Hindsight's LLM would write an answer from them). As in
  Hindsight 1.1.0, a reflect on a bank it does not know **makes the bank** and answers from
  nothing (no 404): :meth:`fabric.hindsight.HindsightClient.reflect` asks the list API first.
* ``POST …/consolidate`` → ``{"operation_id", "deduplicated"}`` (counted in
  :attr:`HindsightStandIn.consolidations`; nothing is merged).
* ``PUT /v1/default/banks/{bank_id}`` makes a bank; ``GET /health`` answers
  ``{"status": "healthy"}``.

Bank ids are case-sensitive and may hold ``::`` (any path segment, as in Hindsight).

What it is not: Hindsight's retrieval. A recall keeps the memories that share a word of
four letters or more with the query (text or context, case-insensitively) and ranks them
by how many, newest first among equals; ``temporal_window`` is accepted and, as in
Hindsight, does not filter. Results stop at ``max_tokens`` (a word counts as one token).
With ``api_key`` set, every request must send ``Authorization: Bearer <key>`` (else 401,
Hindsight's ApiKeyTenantExtension body). The last :data:`KEPT` requests are kept in
:attr:`HindsightStandIn.requests`.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from fabric.embedded.quiet import QuietServer

__all__ = ["DEMO_MEMORIES", "HindsightStandIn", "Memory", "RecallCall", "demo_memories"]

_BANK_PATH = re.compile(r"^/v1/default/banks/([^/]+)(?:/(.*))?$")
_WORD = re.compile(r"\w{4,}")
BUDGETS = ("low", "mid", "high")
FACT_TYPES = ("world", "experience", "observation")
KEPT = 1000  # requests remembered: `agap up` runs the stand-in for days
_AUTH_FAILED = {"detail": "Authentication failed: Invalid API key"}
_NO_WORD = "Value error, query must contain at least one word character after normalization"


@dataclass(frozen=True)
class Memory:
    """One memory unit, as a recall returns it."""

    id: str
    text: str
    type: str = "world"
    context: str | None = None
    mentioned_at: str | None = None
    document_id: str | None = None
    tags: tuple[str, ...] = ()

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
            "tags": list(self.tags) or None,
        }

    def as_item(self) -> dict[str, Any]:
        """The memory as the list API shows it."""
        return {
            "id": self.id,
            "text": self.text,
            "context": self.context or "",
            "date": self.mentioned_at or "",
            "fact_type": self.type,
            "document_id": self.document_id,
            "mentioned_at": self.mentioned_at,
            "entities": "",
            "tags": list(self.tags),
            "metadata": {},
        }


def _ago(now: float, hours: float) -> str:
    return datetime.fromtimestamp(now - hours * 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def demo_memories(now: float) -> dict[str, tuple[Memory, ...]]:
    """A few household memories per bank the cards' policy names (``cards/_policy.yaml``),
    dated hours before ``now``, so the shipped schedules find something in their windows."""
    return {
        "adolf-alvis": (
            Memory(
                "demo-a1",
                "Alvis booked the dentist for Monday at 09:00.",
                "experience",
                "calendar",
                _ago(now, 1),
                "demo-chat-1",
            ),
            Memory(
                "demo-a2",
                "Alvis takes the train to Berlin on Wednesday morning.",
                "experience",
                "travel",
                _ago(now, 2),
                "demo-chat-1",
            ),
            Memory(
                "demo-a3",
                "Alvis wants the household budget reviewed every Friday.",
                "world",
                "habits",
                _ago(now, 30),
                "demo-chat-0",
            ),
        ),
        "adolf-elizaveta": (
            Memory(
                "demo-e1",
                "Elizaveta's piano lesson moved to Thursday 17:30.",
                "experience",
                "calendar",
                _ago(now, 3),
                "demo-chat-2",
            ),
        ),
    }


#: :func:`demo_memories` as of import (the texts; their dates move with the clock).
DEMO_MEMORIES: dict[str, tuple[Memory, ...]] = demo_memories(time.time())


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
    clock: Callable[[], float] = time.time
    requests: deque[RecallCall] = field(default_factory=lambda: deque(maxlen=KEPT))
    consolidations: list[str] = field(default_factory=list)
    _server: QuietServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def with_demo_memories(cls, port: int = 0) -> HindsightStandIn:
        return cls({bank: list(m) for bank, m in demo_memories(time.time()).items()}, port=port)

    def add(self, bank: str, memory: Memory) -> None:
        with self._lock:
            self.banks.setdefault(bank, []).append(memory)

    def memories(self, bank: str) -> list[Memory]:
        with self._lock:
            return list(self.banks.get(bank, ()))

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HindsightStandIn:
        self._server = QuietServer(("127.0.0.1", self.port), _handler_for(self))
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
            return 401, _AUTH_FAILED
        parts = urlsplit(path)
        if method == "GET" and parts.path == "/health":
            return 200, {"status": "healthy", "database": "stand-in"}
        m = _BANK_PATH.match(parts.path)
        if m is None:
            return 404, {"detail": "Not Found"}
        bank, tail = unquote(m.group(1)), m.group(2)
        route = _ROUTES.get((method, tail))
        if route is None:
            return (404, {"detail": "Not Found"}) if (method, tail) not in _KNOWN else (405, _NOT_ALLOWED)
        return route(self, bank, body, parse_qs(parts.query))

    def _known(self, bank: str) -> tuple[int, Any] | None:
        with self._lock:
            known = bank in self.banks
        return None if known else (404, {"detail": f"Bank '{bank}' not found"})

    def _recall(self, bank: str, body: Any, _q: Any) -> tuple[int, Any]:
        problem = _invalid_recall(body)
        if problem:
            return problem
        missing = self._known(bank)
        if missing:
            return missing
        types = body.get("types") or FACT_TYPES
        memories = [m for m in self.memories(bank) if m.type in types]
        picked = _rank(memories, str(body["query"]), int(body.get("max_tokens", 4096)))
        return 200, {
            "results": [m.as_result() for m in picked],
            "trace": None,
            "entities": None,
            "chunks": None,
        }

    def _list(self, bank: str, _body: Any, query: dict[str, list[str]]) -> tuple[int, Any]:
        missing = self._known(bank)
        if missing:
            return missing
        limit, offset = _int_param(query, "limit", 100), _int_param(query, "offset", 0)
        if limit is None or offset is None:
            return 422, _validation(
                ["query", "limit" if limit is None else "offset"], "Input should be a valid integer"
            )
        fact_type = query["type"][0] if query.get("type") else None
        memories = [m for m in self.memories(bank) if fact_type in (None, m.type)]
        memories.sort(key=lambda m: m.mentioned_at or "", reverse=True)
        page = memories[offset : offset + limit]
        return 200, {
            "items": [m.as_item() for m in page],
            "total": len(memories),
            "limit": limit,
            "offset": offset,
        }

    def _retain(self, bank: str, body: Any, _q: Any) -> tuple[int, Any]:
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            return 422, _validation(["body", "items"], "Field required")
        for i, item in enumerate(items):
            problem = _invalid_item(i, item)
            if problem:
                return 422, problem
        now = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            # A document retained again replaces its memories (Hindsight upserts by document_id).
            again = {item.get("document_id") for item in items} - {None}
            memories = [m for m in self.banks.get(bank, []) if m.document_id not in again]
            self.banks[bank] = memories
            for item in items:
                memories.append(
                    Memory(
                        str(uuid.uuid4()),
                        str(item["content"]),
                        "world",  # what Hindsight's extraction makes of a plain statement
                        item.get("context"),
                        str(item.get("timestamp") or now),
                        item.get("document_id"),
                        tuple(item.get("tags") or ()),
                    )
                )
        return 200, {"success": True, "bank_id": bank, "items_count": len(items), "async": False}

    def _reflect(self, bank: str, body: Any, _q: Any) -> tuple[int, Any]:
        problem = _invalid_budget(body, need_query=True)
        if problem:
            return problem
        # As Hindsight 1.1.0: a reflect on a bank it does not know makes the bank (empty)
        # and answers from nothing, where a recall, a listing or a consolidation is a 404.
        with self._lock:
            self.banks.setdefault(bank, [])
        picked = _rank(self.memories(bank), str(body["query"]), int(body.get("max_tokens", 4096)))
        lines = [f"From {len(picked)} memor{'y' if len(picked) == 1 else 'ies'} of {bank}:"]
        lines += [f"- {m.text}" for m in picked]
        based_on = {"memories": [m.as_result() for m in picked]}
        return 200, {"text": "\n".join(lines), "based_on": based_on, "structured_output": None, "usage": None}

    def _consolidate(self, bank: str, _body: Any, _q: Any) -> tuple[int, Any]:
        missing = self._known(bank)
        if missing:
            return missing
        with self._lock:
            self.consolidations.append(bank)
        return 200, {"operation_id": str(uuid.uuid4()), "deduplicated": False}

    def _create(self, bank: str, _body: Any, _q: Any) -> tuple[int, Any]:
        with self._lock:
            self.banks.setdefault(bank, [])
        return 200, {"bank_id": bank, "name": bank, "mission": ""}


_Route = Callable[[HindsightStandIn, str, Any, dict[str, list[str]]], tuple[int, Any]]
_ROUTES: dict[tuple[str, str | None], _Route] = {
    ("POST", "memories/recall"): HindsightStandIn._recall,
    ("GET", "memories/list"): HindsightStandIn._list,
    ("POST", "memories"): HindsightStandIn._retain,
    ("POST", "reflect"): HindsightStandIn._reflect,
    ("POST", "consolidate"): HindsightStandIn._consolidate,
    ("PUT", None): HindsightStandIn._create,
}
_KNOWN = {(m, t) for t in {t for _, t in _ROUTES} for m in ("GET", "POST", "PUT", "PATCH", "DELETE")}
_NOT_ALLOWED = {"detail": "Method Not Allowed"}


def _validation(loc: list[Any], msg: str, value: Any = None) -> dict[str, Any]:
    """FastAPI's 422 body."""
    return {"detail": [{"type": "value_error", "loc": loc, "msg": msg, "input": value, "ctx": {"error": {}}}]}


def _invalid_item(i: int, item: Any) -> dict[str, Any] | None:
    """FastAPI's 422 body for a retain item Hindsight 1.1.0 refuses (None: a good one):
    content missing or blank, a timestamp that is not ISO 8601 (or ``unset``) or is a
    placeholder year (1, 9999), a context or document id that is not a string."""
    loc: list[Any] = ["body", "items", i]
    if not isinstance(item, dict) or "content" not in item:
        return _validation([*loc, "content"], "Field required")
    content = item["content"]
    if not isinstance(content, str):
        return _validation([*loc, "content", "str"], "Input should be a valid string", content)
    if not content.strip():
        return _validation([*loc, "content"], "Value error, content cannot be empty", content)
    for name in ("context", "document_id"):
        if item.get(name) is not None and not isinstance(item[name], str):
            return _validation([*loc, name], "Input should be a valid string", item[name])
    stamp = item.get("timestamp")
    if stamp not in (None, "") and str(stamp).lower() != "unset":
        try:
            year = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).year
        except ValueError:
            msg = f"Value error, Invalid timestamp/event_date format: '{stamp}'. Expected ISO format"
            return _validation([*loc, "timestamp"], msg, stamp)
        if year in (1, 9999):
            msg = f"Value error, timestamp year {year} is a placeholder, not a date"
            return _validation([*loc, "timestamp"], msg, stamp)
    return None


def _int_param(query: dict[str, list[str]], name: str, default: int) -> int | None:
    raw = (query.get(name) or [str(default)])[0]
    return int(raw) if raw.isdigit() else None


def _invalid_budget(body: Any, *, need_query: bool) -> tuple[int, Any] | None:
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return 422, _validation(["body", "query"], "Field required")
    if need_query and not re.sub(r"[^\w\s]", " ", body["query"].lower()).split():
        return 422, _validation(["body", "query"], _NO_WORD, body["query"])
    if body.get("budget", "mid") not in BUDGETS:
        detail = _validation(["body", "budget"], "Input should be 'low', 'mid' or 'high'", body.get("budget"))
        detail["detail"][0] |= {"type": "enum", "ctx": {"expected": "'low', 'mid' or 'high'"}}
        return 422, detail
    max_tokens = body.get("max_tokens", 4096)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return 422, _validation(["body", "max_tokens"], "Input should be a valid integer", max_tokens)
    return None


def _invalid_recall(body: Any) -> tuple[int, Any] | None:
    problem = _invalid_budget(body, need_query=True)
    if problem:
        return problem
    types = body.get("types")
    if types is not None and not isinstance(types, list):
        return 422, _validation(["body", "types"], "Input should be a valid list", types)
    wrong = sorted({str(t) for t in types or () if t not in FACT_TYPES})
    if wrong:
        allowed = ", ".join(sorted(FACT_TYPES))
        return 422, {"detail": f"Invalid fact type(s): {', '.join(wrong)}. Must be one of: {allowed}"}
    stamp = body.get("query_timestamp")
    if stamp is not None:
        try:
            datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError as exc:
            expected = "Expected ISO format (e.g., '2023-05-30T23:40:00')"
            return 400, {"detail": f"Invalid query_timestamp format. {expected}: {exc}"}
    window = body.get("temporal_window")
    if window is not None and not (isinstance(window, dict) and {"start", "end"} >= set(window)):
        return 422, _validation(["body", "temporal_window"], "Input should be a valid dictionary")
    return None


def _rank(memories: list[Memory], query: str, max_tokens: int) -> list[Memory]:
    """The memories sharing a word with the query, most shared first, newest first among
    equals; none when nothing matches (as Hindsight: never "the newest" instead)."""
    words = set(_WORD.findall(query.lower()))

    def hits(m: Memory) -> int:
        return len(words & set(_WORD.findall(f"{m.text} {m.context or ''}".lower())))

    newest = sorted(memories, key=lambda m: m.mentioned_at or "", reverse=True)
    ranked = sorted((m for m in newest if hits(m)), key=hits, reverse=True)
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
            self._serve("POST", self._body())

        def do_PUT(self) -> None:
            self._serve("PUT", self._body())

        def _body(self) -> Any:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                return json.loads(raw or b"null")
            except ValueError:
                return None

        def _serve(self, method: str, body: Any) -> None:
            status, payload = stand_in.answer(method, self.path, self.headers.get("Authorization"), body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
