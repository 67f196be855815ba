"""Sealing events with HMAC-SHA256 (seed 003: ``data.hmac_sig``) and opening them again.

The fabric secret (``AGAP_EVENTS_SECRET``) never travels, and neither does a task's key.
Each task has its own token, the seed's ``auth_token``, derived from the secret and the
task id (``job_id``)::

    token = base64url(HMAC-SHA256(secret, "agap-events/v1/task/" + job_id)), no "=" padding

The signature is HMAC-SHA256 keyed with the token's bytes, over the payload with
``data.hmac_sig`` left out, serialized canonically: JSON, keys sorted at every level,
no whitespace, non-ASCII escaped (Python's ``json.dumps(p, sort_keys=True,
separators=(",", ":"))``), as lowercase hex. The wire bytes are that same serialization
of the whole payload, signature included. A subscriber derives the token of the task it
expects (or is handed it, and then needs no fabric secret) and drops anything unsigned,
badly signed, of another schema version, for another task, or malformed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from fabric.events.schema import SCHEMA_VERSION, Event, EventError

SIG_FIELD = "hmac_sig"  # inside data
_KEY_CONTEXT = b"agap-events/v1/task/"
MAX_WIRE_BYTES = 8192


class Dropped(Exception):
    """An incoming payload was refused; ``reason`` says why (for logs and counters)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def task_token(secret: bytes, task_id: int) -> str:
    """The task's signing token (seed 003's ``auth_token``), derived from the fabric secret."""
    digest = hmac.new(secret, _KEY_CONTEXT + str(int(task_id)).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def canonical(payload: dict[str, Any]) -> bytes:
    """The bytes a signature covers (and, signature included, the bytes sent)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def signature(token: str, payload: dict[str, Any]) -> str:
    """HMAC-SHA256 of ``payload`` (without ``data.hmac_sig``) under ``token``, in hex."""
    return hmac.new(token.encode("utf-8"), canonical(payload), hashlib.sha256).hexdigest()


def seal(event: Event, secret: bytes) -> bytes:
    """The wire form of ``event``: its canonical JSON with ``data.hmac_sig`` added."""
    body = event.body()
    sig = signature(task_token(secret, event.task_id), body)
    return canonical({**body, "data": {**body["data"], SIG_FIELD: sig}})


def open_sealed(raw: bytes, secret: bytes, *, expected_task: int | None = None) -> Event:
    """Verify and parse a wire payload, or raise :class:`Dropped` with the reason."""
    body = _body(raw)
    data = dict(body["data"])
    sig = data.pop(SIG_FIELD, None)
    if not isinstance(sig, str) or not sig:
        raise Dropped("unsigned")
    body["data"] = data
    task_id = _task_id(body, expected_task)
    try:
        expected = signature(task_token(secret, task_id), body)
    except ValueError:
        raise Dropped("malformed") from None
    if not hmac.compare_digest(expected, sig):
        raise Dropped("bad signature")
    try:
        return Event.from_body(body)
    except EventError:
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
    if body.get("schema_version") != SCHEMA_VERSION or isinstance(body.get("schema_version"), bool):
        raise Dropped("wrong version")
    if not isinstance(body.get("data"), dict):
        raise Dropped("unsigned")
    return body


def _task_id(body: dict[str, Any], expected_task: int | None) -> int:
    """The task the payload claims to be about (its token is derived from it)."""
    job_id = body.get("job_id")
    if not isinstance(job_id, str) or not job_id.isascii() or not job_id.isdigit() or job_id.startswith("0"):
        raise Dropped("malformed")
    task_id = int(job_id)
    if expected_task is not None and task_id != expected_task:
        raise Dropped("unexpected task")
    return task_id


__all__ = ["SIG_FIELD", "Dropped", "canonical", "open_sealed", "seal", "signature", "task_token"]
