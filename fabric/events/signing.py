"""Sealing events with HMAC-SHA256 and opening them again.

The fabric secret (``AGAP_EVENTS_SECRET``) never travels. Each task gets its own key,
derived from the secret and the task id, and the signature covers the canonical JSON of
every field but ``sig`` (keys sorted, no spaces, UTF-8). A subscriber re-derives the key
for the task it expects and drops anything unsigned, badly signed, of another schema
version, for another task, or malformed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from pydantic import ValidationError

from fabric.events.schema import SCHEMA_VERSION, Event

SIG_FIELD = "sig"
_KEY_CONTEXT = b"agap-events/v1/task/"
MAX_WIRE_BYTES = 8192


class Dropped(Exception):
    """An incoming payload was refused; ``reason`` says why (for logs and counters)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def task_key(secret: bytes, task_id: int) -> bytes:
    """The per-task signing key: HMAC-SHA256(secret, context || task id)."""
    return hmac.new(secret, _KEY_CONTEXT + str(int(task_id)).encode(), hashlib.sha256).digest()


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes a signature covers (and the bytes sent)."""
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def signature(secret: bytes, task_id: int, body: dict[str, Any]) -> str:
    return hmac.new(task_key(secret, task_id), canonical(body), hashlib.sha256).hexdigest()


def seal(event: Event, secret: bytes) -> bytes:
    """The wire form of ``event``: its canonical JSON plus the signature."""
    body = event.body()
    return canonical({**body, SIG_FIELD: signature(secret, event.task_id, body)})


def open_sealed(raw: bytes, secret: bytes, *, expected_task: int | None = None) -> Event:
    """Verify and parse a wire payload, or raise :class:`Dropped` with the reason."""
    body = _body(raw)
    sig = body.pop(SIG_FIELD, None)
    if not isinstance(sig, str) or not sig:
        raise Dropped("unsigned")
    task_id = _task_id(body, expected_task)
    try:
        expected = signature(secret, task_id, body)
    except ValueError:
        raise Dropped("malformed") from None
    if not hmac.compare_digest(expected, sig):
        raise Dropped("bad signature")
    try:
        return Event.model_validate(body)
    except ValidationError:
        raise Dropped("malformed") from None


def _body(raw: bytes) -> dict[str, Any]:
    """The payload as a JSON object of this schema version (not yet verified)."""
    if len(raw) > MAX_WIRE_BYTES:
        raise Dropped("oversized")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Dropped("not json") from None
    if not isinstance(body, dict):
        raise Dropped("not an object")
    if body.get("v") != SCHEMA_VERSION:
        raise Dropped("wrong version")
    return body


def _task_id(body: dict[str, Any], expected_task: int | None) -> int:
    """The task the payload claims to be about (its key is derived from it)."""
    task_id = body.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool) or task_id < 1:
        raise Dropped("malformed")
    if expected_task is not None and task_id != expected_task:
        raise Dropped("unexpected task")
    return task_id


__all__ = ["Dropped", "canonical", "open_sealed", "seal", "signature", "task_key"]
