"""The v1 event (seed 003's wire schema): seq within epochs, safe details, the signature.

The event is a plain dataclass checked by hand (fabric/events/schema.py); ``RefEvent`` here
is the pydantic model it replaced, kept as the reference: every payload reads as it did,
or is refused as it was."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator
from pydantic import model_validator as after

from fabric.events.schema import (
    DATA_MAX_ITEMS,
    DATA_VALUE_MAX,
    DETAIL_MAX,
    KIND_FIELD,
    SEQ_STRIDE,
    WIRE_EVENT,
    Event,
    EventError,
    EventType,
    Scalar,
    WireEvent,
    make_seq,
    publishable_ref,
    safe_detail,
)
from fabric.events.signing import Dropped, canonical, open_sealed, seal, signature, task_token

SECRET = b"unit-test-secret-0123456789"


def test_seq_is_epoch_major() -> None:
    assert make_seq(3, 7) == 3 * SEQ_STRIDE + 8
    assert make_seq(0, 0) == 1  # a task's first event (submitted) is seq 1
    assert make_seq(2, SEQ_STRIDE - 1) < make_seq(3, 0)
    with pytest.raises(ValueError):
        make_seq(1, SEQ_STRIDE)
    e = Event.make(5, 3, 7, "progress", "half way")
    assert (e.seq, e.epoch, e.counter, e.terminal) == (3_000_008, 3, 7, False)
    assert Event.make(5, 4, 0, EventType.COMPLETED).terminal
    assert Event.make(5, 4, 0, EventType.CANCELED).terminal


def test_the_fabric_kinds_map_onto_the_seed_events() -> None:
    wire = {k: Event.make(5, 1, 0, k).event.value for k in EventType}
    assert wire == {
        "submitted": "progress",
        "started": "started",
        "progress": "progress",
        "input_required": "permission_required",
        "completed": "completed",
        "failed": "error",
        "canceled": "error",
    }
    body = Event.make(5, 1, 0, "failed", "it broke").body()
    assert set(body) == {"schema_version", "seq", "job_id", "event", "timestamp", "detail", "data"}
    assert (body["schema_version"], body["job_id"], body["data"]) == (1, "5", {"kind": "failed"})
    # a seed-only publisher sends no kind: the event says what it is
    bare = Event.from_body({**body, "data": {}})
    assert (bare.kind, bare.terminal) == (EventType.FAILED, True)


def test_an_event_whose_seq_is_outside_its_epoch_is_invalid() -> None:
    body = Event.make(5, 3, 7, "progress").body()
    for bad in (
        {"seq": 0},
        {"seq": "3000008"},
        {"job_id": 5},
        {"job_id": "05"},
        {"timestamp": "2026-01-01T00:00:00+02:00"},
        {"extra": 1},
        {"event": "failed"},  # a kind, not a wire event
        {"data": {"kind": "completed"}},  # a kind of another event
        {"data": {"kind": 3}},
    ):
        with pytest.raises(EventError):
            Event.from_body({**body, **bad})


@pytest.mark.parametrize(
    ("text", "absent"),
    [
        ("wrote /home/alice/work/report.md and ~/notes.txt", ["/home", "alice", "notes"]),
        ("read file:///etc/passwd", ["/etc", "passwd"]),
        ("saved to C:\\Users\\bob\\x.txt", ["Users", "bob"]),
        ("password=hunter2 token: abc123 api_key=zzz", ["hunter2", "abc123", "zzz"]),
        ("using sk-live_0123456789abcdef now", ["sk-live"]),
        ("url https://user:pa55@example.com/x", ["pa55"]),
        ("blob " + "A" * 40, ["AAAA"]),
    ],
)
def test_details_lose_paths_and_secrets(text: str, absent: list[str]) -> None:
    out = safe_detail(text)
    for word in absent:
        assert word not in out, out


def test_details_are_short_single_lines_and_keep_urls() -> None:
    out = safe_detail("line one\nline two " + "x " * 300)
    assert "\n" not in out and len(out) <= 200 and out.endswith("…")
    assert safe_detail("see https://example.com/a/b") == "see https://example.com/a/b"
    assert Event.make(1, 1, 0, "progress", "at /tmp/secret/dir").detail == "at [path]"


def test_only_non_local_result_refs_are_published() -> None:
    assert publishable_ref("kanboard://task/3/file/result-e1.md") == "kanboard://task/3/file/result-e1.md"
    assert publishable_ref("file:///home/me/result.md") is None
    assert publishable_ref("/srv/results/x.md") is None
    assert publishable_ref(None) is None


def test_sealed_events_open_again_and_carry_no_secret() -> None:
    e = Event.make(9, 1, 0, "started", "attempt 1", {"attempt": 1})
    wire = seal(e, SECRET)
    assert SECRET not in wire and task_token(SECRET, 9).encode() not in wire
    assert open_sealed(wire, SECRET, expected_task=9) == e
    assert task_token(SECRET, 9) != task_token(SECRET, 10)
    assert len(task_token(SECRET, 9)) == 43  # 32 bytes, base64url without padding
    assert wire.isascii() and wire == canonical(json.loads(wire))  # the wire is the canonical form


def _reason(raw: bytes, expected: int | None = 9, secret: bytes = SECRET) -> str:
    with pytest.raises(Dropped) as err:
        open_sealed(raw, secret, expected_task=expected)
    return err.value.reason


def test_bad_payloads_are_dropped_with_a_reason() -> None:
    e = Event.make(9, 2, 0, "completed", "done")
    body = json.loads(seal(e, SECRET))

    def dump(d: dict[str, object]) -> bytes:
        return json.dumps(d).encode()

    assert _reason(dump({**body, "detail": "forged"})) == "bad signature"
    assert _reason(dump({**body, "data": {"kind": "completed"}})) == "unsigned"
    assert _reason(dump({k: v for k, v in body.items() if k != "data"})) == "unsigned"
    assert _reason(dump({**body, "schema_version": 2})) == "wrong version"
    assert _reason(dump({**body, "schema_version": True})) == "wrong version"
    assert _reason(seal(e, b"some-other-secret-value")) == "bad signature"
    assert _reason(seal(e, SECRET), expected=10) == "unexpected task"
    assert _reason(b"\xff\xfe") == "not json"
    assert _reason(b"[1, 2]") == "not an object"
    assert _reason(b"x" * 10_000) == "oversized"
    # a field the signature covers but the schema refuses: signed garbage is still garbage
    odd = {**body, "data": {"kind": "completed"}, "seq": 0}
    sig = signature(task_token(SECRET, 9), odd)
    assert _reason(canonical({**odd, "data": {"kind": "completed", "hmac_sig": sig}})) == "malformed"


class RefEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    seq: StrictInt = Field(ge=1)
    job_id: StrictStr = Field(pattern=r"^[1-9][0-9]{0,17}$")
    event: WireEvent
    timestamp: StrictStr
    detail: StrictStr = Field(default="", max_length=DETAIL_MAX)
    data: dict[str, Scalar] = Field(default_factory=dict)

    @field_validator("timestamp")
    @classmethod
    def _utc(cls, value: str) -> str:
        if not value.endswith("Z"):
            raise ValueError("timestamp must be UTC with a trailing Z")
        datetime.fromisoformat(value)
        return value

    @field_validator("data")
    @classmethod
    def _small(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        if len(value) > DATA_MAX_ITEMS:
            raise ValueError(f"at most {DATA_MAX_ITEMS} data items")
        for k, item in value.items():
            if len(k) > 64 or (isinstance(item, str) and len(item) > DATA_VALUE_MAX):
                raise ValueError(f"data item {k[:64]!r} is too long")
        return value

    @after(mode="after")
    def _kind_fits_event(self) -> RefEvent:
        kind = self.data.get(KIND_FIELD)
        if kind is None:
            return self
        kinds = {k.value for k in EventType}
        if not isinstance(kind, str) or kind not in kinds or WIRE_EVENT[EventType(kind)] != self.event:
            raise ValueError(f"data.kind {kind!r} is not a kind of {self.event.value!r} event")
        return self


BODY = Event.make(5, 3, 7, "progress", "half way", {"queue": "q"}).body()
CASES: list[dict[str, Any]] = [
    {},
    {"schema_version": 1.0},
    {"schema_version": True},
    {"schema_version": "1"},
    {"schema_version": 1.5},
    {"schema_version": None},
    {"seq": 1},
    {"seq": 0},
    {"seq": -3},
    {"seq": True},
    {"seq": 3000008.0},
    {"seq": "3000008"},
    {"seq": 10**30},
    {"job_id": "5"},
    {"job_id": "05"},
    {"job_id": "5\n"},
    {"job_id": "1" * 18},
    {"job_id": "1" * 19},
    {"job_id": "\uff15"},  # a fullwidth digit five
    {"job_id": 5},
    {"event": "progress"},
    {"event": "PROGRESS"},
    {"event": "failed"},
    {"event": "error", "data": {"kind": "canceled"}},
    {"event": "error", "data": {"kind": "failed"}},
    {"event": "error", "data": {"kind": "completed"}},
    {"event": 1},
    {"event": None},
    {"timestamp": "2026-01-01T00:00:00Z"},
    {"timestamp": "2026-01-01T00:00:00.123Z"},
    {"timestamp": "2026-01-01Z"},
    {"timestamp": "garbageZ"},
    {"timestamp": "2026-01-01T00:00:00+02:00"},
    {"timestamp": 1},
    {"detail": ""},
    {"detail": "x" * DETAIL_MAX},
    {"detail": "x" * (DETAIL_MAX + 1)},
    {"detail": "é" * DETAIL_MAX},
    {"detail": b"x"},
    {"detail": None},
    {"data": {}},
    {"data": None},
    {"data": []},
    {"data": {"kind": 3}},
    {"data": {"kind": "completed"}},
    {"data": {"kind": None}},
    {"data": {"a": 1.5, "b": True, "c": None, "d": "x", "e": 7, "f": 1.0}},
    {"data": {"a": [1]}},
    {"data": {"a": {"b": 1}}},
    {"data": {"a": b"x"}},
    {"data": {"a": b"\xff"}},
    {"data": {b"k": 1}},
    {"data": {1: 1}},
    {"data": {"k" * 64: 1}},
    {"data": {"k" * 65: 1}},
    {"data": {"v": "x" * DATA_VALUE_MAX}},
    {"data": {"v": "x" * (DATA_VALUE_MAX + 1)}},
    {"data": {str(i): i for i in range(DATA_MAX_ITEMS)}},
    {"data": {str(i): i for i in range(DATA_MAX_ITEMS + 1)}},
    {"data": {"kind": b"progress"}},
    {"extra": 1},
    {"seq": 0, "job_id": 5, "extra": 1},
]


def _as_dict(e: Event | RefEvent) -> dict[str, Any]:
    return asdict(e) if isinstance(e, Event) else e.model_dump()


def _both(body: dict[str, Any]) -> tuple[Any, Any]:
    """What the plain event and the reference make of ``body``: its fields, or "refused"."""
    try:
        want: Any = _as_dict(RefEvent.model_validate(body))
    except ValidationError:
        want = "refused"
    try:
        got: Any = _as_dict(Event.from_body(body))
    except EventError:
        got = "refused"
    return got, want


@pytest.mark.parametrize("case", CASES, ids=lambda c: repr(c)[:60])
def test_a_payload_reads_as_the_pydantic_model_read_it(case: dict[str, Any]) -> None:
    got, want = _both({**BODY, **case})
    assert got == want
    if got != "refused":
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


@pytest.mark.parametrize("missing", list(BODY))
def test_a_payload_without_a_field_reads_as_the_pydantic_model_read_it(missing: str) -> None:
    got, want = _both({k: v for k, v in BODY.items() if k != missing})
    assert got == want


def test_an_event_is_checked_when_made_and_its_body_is_the_models() -> None:
    with pytest.raises(EventError, match="at most 16 data items"):
        Event.make(5, 1, 0, "progress", "", {str(i): i for i in range(DATA_MAX_ITEMS)})
    e = Event.make(5, 1, 0, "failed", "it broke", {"attempt": 2, "ok": False, "x": None, "f": 0.5})
    assert e.body() == RefEvent.model_validate(e.body()).model_dump(mode="json")
