"""The wire as outsiders see it: seed 003's verifier and the README's example agree with the fabric."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fabric.events.schema import Event, EventType
from fabric.events.signing import seal, task_token
from tests import seed003

README = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOLS.md").read_text(encoding="utf-8")
SECRET = "unit-test-fabric-secret-0123"


@pytest.fixture(scope="module")
def readme() -> dict[str, Any]:
    return seed003.readme_verifier(README)  # runs the block, and so its own example


def test_the_readme_example_is_what_the_fabric_publishes(readme: dict[str, Any]) -> None:
    at = datetime(2026, 12, 1, 15, 0, tzinfo=UTC).timestamp()
    event = Event.make(42, 1, 0, EventType.STARTED, "attempt 1", {"attempt": 1}, at=at)
    assert seal(event, b"an-example-fabric-secret") == readme["EXAMPLE"]
    for tid in (1, 42, 10**12):
        assert readme["task_token"](SECRET, str(tid)) == task_token(SECRET.encode(), tid)


@pytest.mark.parametrize("kind", list(EventType))
def test_every_kind_passes_the_seed_verifier(kind: EventType, readme: dict[str, Any]) -> None:
    event = Event.make(7, 3, 2, kind, "détail … 完了 with /home/me/x", {"queue": "q", "n": 2, "ok": True})
    wire = seal(event, SECRET.encode())
    token = readme["task_token"](SECRET, "7")
    got = seed003.check(wire, token, "7")
    assert got["event"] == event.event.value and got["seq"] == event.seq
    assert readme["verify"](wire, token)["data"]["kind"] == kind.value


def test_the_seed_verifier_refuses_what_a_subscriber_must_drop(readme: dict[str, Any]) -> None:
    wire = seal(Event.make(7, 2, 0, EventType.COMPLETED, "done"), SECRET.encode())
    token = readme["task_token"](SECRET, "7")
    body = json.loads(wire)

    def dump(d: dict[str, Any]) -> bytes:
        return json.dumps(d).encode()

    bad = {
        "tampered": dump({**body, "detail": "forged"}),
        "other job": wire,
        "other task's token": wire,
        "version 2": dump({**body, "schema_version": 2}),
        "unsigned": dump({**body, "data": {"kind": "completed"}}),
    }
    for name, raw in bad.items():
        job = "8" if name == "other job" else "7"
        key = readme["task_token"](SECRET, "8") if name == "other task's token" else token
        with pytest.raises(seed003.Rejected):
            seed003.check(raw, key, job)
        if name in ("tampered", "other task's token", "version 2"):
            with pytest.raises(ValueError):
                readme["verify"](raw, key)
