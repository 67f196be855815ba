"""The v1 event: seq within epochs, safe details, and the wire signature."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fabric.events.schema import SEQ_STRIDE, Event, EventType, make_seq, publishable_ref, safe_detail
from fabric.events.signing import Dropped, open_sealed, seal, task_key

SECRET = b"unit-test-secret-0123456789"


def test_seq_is_epoch_major() -> None:
    assert make_seq(3, 7) == 3 * SEQ_STRIDE + 7
    assert make_seq(2, SEQ_STRIDE - 1) < make_seq(3, 0)
    with pytest.raises(ValueError):
        make_seq(1, SEQ_STRIDE)
    e = Event.make(5, 3, 7, "progress", "half way")
    assert (e.seq, e.epoch, e.counter, e.terminal) == (3_000_007, 3, 7, False)
    assert Event.make(5, 4, 0, EventType.COMPLETED).terminal


def test_an_event_whose_seq_is_outside_its_epoch_is_invalid() -> None:
    body = Event.make(5, 3, 7, "progress").body()
    with pytest.raises(ValidationError):
        Event.model_validate({**body, "epoch": 2})
    with pytest.raises(ValidationError):
        Event.model_validate({**body, "at": "2026-01-01T00:00:00+02:00"})
    with pytest.raises(ValidationError):
        Event.model_validate({**body, "extra": 1})
    with pytest.raises(ValidationError):
        Event.model_validate({**body, "type": "error"})


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
    assert SECRET not in wire and task_key(SECRET, 9).hex().encode() not in wire
    assert open_sealed(wire, SECRET, expected_task=9) == e
    assert task_key(SECRET, 9) != task_key(SECRET, 10)


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
    assert _reason(dump({k: v for k, v in body.items() if k != "sig"})) == "unsigned"
    assert _reason(dump({**body, "v": 2})) == "wrong version"
    assert _reason(seal(e, b"some-other-secret-value")) == "bad signature"
    assert _reason(seal(e, SECRET), expected=10) == "unexpected task"
    assert _reason(b"\xff\xfe") == "not json"
    assert _reason(b"[1, 2]") == "not an object"
    assert _reason(b"x" * 10_000) == "oversized"
    # a field the signature covers but the schema refuses: signed garbage is still garbage
    from fabric.events.signing import canonical, signature

    odd = {**{k: v for k, v in body.items() if k != "sig"}, "seq": 5}
    assert _reason(canonical({**odd, "sig": signature(SECRET, 9, odd)})) == "malformed"
