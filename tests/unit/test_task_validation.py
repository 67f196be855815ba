"""TaskSpec and Record are checked by hand (fabric/task.py), without pydantic on a worker's
hot path. These are the pydantic models they replaced, kept here as the reference: every
input reads as it did (lax: ``"2"`` is 2) or is refused with the same words."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.cards.problems import error_message
from fabric.task import _REF_SCHEME, Record, SpecError, State, TaskSpec, _storable, storable_text


class RefSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    intent: str = Field(min_length=1, max_length=4000)
    refs: tuple[str, ...] = ()
    target: str
    queue: str
    constraints: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=1, ge=0, le=3)
    deadline: float | None = None
    not_before: float | None = None
    actor: str = "cli"
    action_id: str | None = None
    parent: str | None = None
    ancestry: tuple[str, ...] = ()
    max_attempts: int = Field(default=3, ge=1, le=100)
    submitted_at: float = 0.0

    @field_validator(
        "intent",
        "refs",
        "target",
        "queue",
        "constraints",
        "actor",
        "action_id",
        "parent",
        "ancestry",
        mode="before",
    )
    @classmethod
    def _only_storable(cls, v: Any, info: Any) -> Any:
        return _storable(v, info.field_name)

    @field_validator("intent")
    @classmethod
    def _intent_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("intent is empty")
        return v.strip()

    @field_validator("refs")
    @classmethod
    def _refs_are_uris(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for ref in v:
            if not _REF_SCHEME.match(ref):
                raise ValueError(f"ref {ref!r} is not a URI (expected scheme:..., e.g. file:///x)")
        return v


class RefRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    epoch: int = Field(ge=0)
    state: State
    op: str
    by: str
    at: float
    owner: str | None = None
    lease_until: float | None = None
    attempt: int = 0
    not_before: float | None = None
    assignee: str | None = None
    result_ref: str | None = None
    reason: str | None = None
    checkpoint: str | None = None
    lease_seconds: float | None = None
    receipts: dict[str, str] | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _storable_text(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {storable_text(str(k)): storable_text(str(x)) for k, x in v.items()}
        return storable_text(v) if isinstance(v, str) else v


def _reference(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data).model_dump()
    except ValidationError as exc:
        return [(".".join(str(p) for p in e["loc"]), error_message(e)) for e in exc.errors()]


def _ours(cls: Any, data: dict[str, Any]) -> Any:
    try:
        return cls.from_dict(data).as_dict()
    except SpecError as exc:
        return exc.problems


SPEC = {"intent": "do it", "target": "kimi", "queue": "kimi"}
SPEC_CASES: list[dict[str, Any]] = [
    {},
    {"intent": "  padded  ", "refs": ["file:///x", "https://a/b"], "constraints": {"tier": "large"}},
    {"refs": {"file:///x"}, "ancestry": ["a", "b"], "action_id": "k", "parent": "p"},
    {"priority": True},
    {"priority": "2"},
    {"priority": " 2 "},
    {"priority": 2.0},
    {"priority": "2.0"},
    {"priority": 2.5},
    {"priority": "x"},
    {"priority": None},
    {"priority": 7},
    {"priority": -1},
    {"max_attempts": 0},
    {"max_attempts": 101},
    {"max_attempts": "5"},
    {"deadline": True},
    {"deadline": "1.5"},
    {"deadline": "x"},
    {"deadline": 3},
    {"deadline": [1]},
    {"not_before": None},
    {"submitted_at": None},
    {"submitted_at": "1.25"},
    {"refs": "file:///x"},
    {"refs": [1]},
    {"refs": {"a": 1}},
    {"refs": None},
    {"refs": ["nope"]},
    {"refs": ["file:///x", "nope", "also nope"]},
    {"constraints": {1: 2}},
    {"constraints": []},
    {"constraints": {"k": "a\x00b"}},
    {"intent": 5},
    {"intent": ""},
    {"intent": "   "},
    {"intent": "y" * 4001},
    {"intent": "a\x00b"},
    {"intent": "\ud800"},
    {"target": None},
    {"queue": 3},
    {"action_id": 5},
    {"actor": "a\x00"},
    {"extra": 1},
    {"extra": 1, "priority": 9},
    {"priority": 9, "max_attempts": 0, "intent": ""},
]


@pytest.mark.parametrize("change", SPEC_CASES)
def test_a_spec_reads_as_pydantic_read_it(change: dict[str, Any]) -> None:
    data = {**SPEC, **change}
    assert _ours(TaskSpec, data) == _reference(RefSpec, data)


@pytest.mark.parametrize("missing", ["intent", "target", "queue"])
def test_a_spec_without_a_required_field_is_refused(missing: str) -> None:
    data = {k: v for k, v in SPEC.items() if k != missing}
    assert _ours(TaskSpec, data) == _reference(RefSpec, data) == [(missing, "required")]


RECORD = {"epoch": 1, "state": "queued", "op": "submit", "by": "cli", "at": 1.5}
RECORD_CASES: list[dict[str, Any]] = [
    {},
    {"epoch": "3"},
    {"epoch": -1},
    {"epoch": 2.0},
    {"epoch": 2.5},
    {"epoch": None},
    {"state": "nope"},
    {"state": 5},
    {"state": State.DONE},
    {"at": "1"},
    {"at": "x"},
    {"receipts": {"a": 1}},
    {"receipts": [1]},
    {"receipts": None},
    {"reason": 5},
    {"reason": "why\x00not"},
    {"owner": "w\ud800"},
    {"x": 1},
    {"lease_seconds": True},
    {"lease_until": "9.5", "not_before": 3, "attempt": "2", "assignee": "ana", "checkpoint": "file:///c"},
    {"attempt": "x", "op": 1, "by": None},
]


@pytest.mark.parametrize("change", RECORD_CASES)
def test_a_record_reads_as_pydantic_read_it(change: dict[str, Any]) -> None:
    data = {**RECORD, **change}
    assert _ours(Record, data) == _reference(RefRecord, data)


def test_a_record_missing_fields_names_each() -> None:
    assert _ours(Record, {}) == _reference(RefRecord, {})


def test_what_is_stored_reads_back_and_a_problem_is_one_line() -> None:
    spec = TaskSpec(intent="x", target="t", queue="q", refs=("a:b",), deadline=5)
    assert TaskSpec.from_meta(spec.to_meta()) == spec
    assert spec.to_meta() == RefSpec.model_validate(spec.as_dict()).model_dump_json()
    rec = Record(epoch=2, state=State.WORKING, op="claim", by="w", at=2.0, receipts={"k": "v"})
    assert Record.from_meta(rec.to_meta()) == rec
    assert rec.to_meta() == RefRecord.model_validate(rec.as_dict()).model_dump_json(exclude_none=True)
    with pytest.raises(SpecError) as bad:
        Record.from_meta('{"epoch": -1, "state": "x", "op": "o", "by": "b", "at": 1}')
    assert str(bad.value) == "epoch: must be at least 0 (+1 more)"
    with pytest.raises(SpecError, match=r"^the value: invalid JSON"):
        TaskSpec.from_meta("{")
