"""A subscriber's checks of live events, written from seed 003's text alone.

Nothing here comes from the fabric (no ``fabric`` import): this is what a subscriber
built to the seed's event protocol accepts. From the seed, in short:

* a payload is one UTF-8 JSON object with seven fields: ``schema_version`` (the integer
  1: anything else is discarded), ``seq`` (an integer, growing with every publish,
  from 1), ``job_id`` (a string: the job asked for), ``event`` (started, progress,
  permission_required, completed, error), ``timestamp`` (ISO-8601 UTC ending in ``Z``),
  ``detail`` (a string) and ``data`` (an object);
* completed and error are terminal: the last event of a job, published retained;
* ``data.hmac_sig`` is HMAC-SHA256, keyed with the job's ``auth_token`` (which is
  never on the wire), over the serialized payload without the ``hmac_sig`` field; a
  missing or wrong signature means the message is thrown away.

The seed does not spell out the serialization the signature covers; this verifier
takes the usual canonical JSON: keys sorted, no whitespace (``json.dumps`` defaults
otherwise), UTF-8. It assumes a hex digest, as ``hexdigest()`` gives.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import datetime
from typing import Any

FIELDS = {"schema_version", "seq", "job_id", "event", "timestamp", "detail", "data"}
EVENTS = {"started", "progress", "permission_required", "completed", "error"}
TERMINAL = {"completed", "error"}


class Rejected(Exception):
    """The payload is not a genuine seed-003 event for the job; the reason says why."""


def _require(ok: bool, reason: str) -> None:
    if not ok:
        raise Rejected(reason)


def check(raw: bytes, auth_token: str, job_id: str) -> dict[str, Any]:
    """The event in ``raw`` if it is well formed, for ``job_id`` and correctly signed."""
    try:
        payload: dict[str, Any] = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Rejected(f"not UTF-8 JSON: {exc}") from None
    _require(isinstance(payload, dict), "not a JSON object")
    _require(set(payload) == FIELDS, f"fields {sorted(payload)}, not {sorted(FIELDS)}")
    version = payload["schema_version"]
    _require(type(version) is int and version == 1, f"schema_version {version!r}")
    _require(type(payload["seq"]) is int and payload["seq"] >= 1, f"seq {payload['seq']!r}")
    _require(payload["job_id"] == job_id, f"job_id {payload['job_id']!r}, expected {job_id!r}")
    _require(payload["event"] in EVENTS, f"event {payload['event']!r}")
    stamp = payload["timestamp"]
    _require(isinstance(stamp, str) and stamp.endswith("Z"), f"timestamp {stamp!r}")
    datetime.fromisoformat(stamp)
    _require(isinstance(payload["detail"], str), "detail is not a string")
    _require(isinstance(payload["data"], dict), "data is not an object")
    data = dict(payload["data"])
    sig = data.pop("hmac_sig", None)
    _require(isinstance(sig, str) and bool(sig), "no data.hmac_sig")
    signed = json.dumps({**payload, "data": data}, sort_keys=True, separators=(",", ":")).encode("utf-8")
    expected = hmac.new(auth_token.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    _require(hmac.compare_digest(expected, str(sig)), "HMAC verify failed")
    return payload


def check_stream(raws: list[bytes], auth_token: str, job_id: str) -> list[dict[str, Any]]:
    """A job's events as one subscriber saw them: each genuine, seq rising, one terminal, last."""
    events = [check(raw, auth_token, job_id) for raw in raws]
    seqs = [e["seq"] for e in events]
    _require(seqs == sorted(set(seqs)), f"seq not strictly rising: {seqs}")
    ends = [i for i, e in enumerate(events) if e["event"] in TERMINAL]
    _require(ends == [len(events) - 1], f"terminal events at {ends} of {len(events)}")
    return events


def readme_verifier(readme: str) -> dict[str, Any]:
    """The names the README's subscriber example defines, after running it as it is.

    The block is the one that defines ``task_token``; running it runs its own example.
    It is documentation for subscribers and, like this module, uses no fabric code.
    """
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (block,) = [b for b in blocks if "def task_token(" in b]
    namespace: dict[str, Any] = {}
    exec(compile(block, "README.md (live events)", "exec"), namespace)
    return namespace
