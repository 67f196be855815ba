"""The v1 event (seed 003's wire schema): seq within epochs, safe details, the signature."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fabric.events.schema import SEQ_STRIDE, Event, EventType, make_seq, publishable_ref, safe_detail
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
    bare = Event.model_validate({**body, "data": {}})
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
        with pytest.raises(ValidationError):
            Event.model_validate({**body, **bad})


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
