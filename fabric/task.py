"""The fabric's data: a task's spec (what to do) and its per-epoch state records.

Both are stored as compact JSON strings in Kanboard task metadata. The spec never
changes after submit; a new record is written for each epoch. A person may change a task's
priority and deadline on its card: those :class:`Terms` are kept beside the spec.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fabric.errors import InvalidInput


class State(StrEnum):
    """A task's state in its current epoch record (the truth; columns are a projection)."""

    QUEUED = "queued"
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    DONE = "done"  # unverified: the worker says it finished
    DEAD = "dead"  # dead letter: attempts exhausted, poison, or given up
    CANCELED = "canceled"
    CLOSED = "closed"  # verified by someone other than the producer
    DROPPED = "dropped"  # a dead letter a person gave up on


TERMINAL = frozenset({State.CANCELED, State.CLOSED, State.DROPPED})

# Kanboard priorities run 0..3.
PRIORITY_LEVELS = {"low": 0, "normal": 1, "high": 2, "urgent": 3}
PRIORITY_NAMES = {v: k for k, v in PRIORITY_LEVELS.items()}

# No backend stores a NUL (PostgreSQL cuts text there) or a lone surrogate (what invalid
# UTF-8 in an argument decodes to; PHP's JSON refuses it).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(value: Any) -> Any:
    """``value`` with NULs and lone surrogates replaced, in strings at any depth."""
    if isinstance(value, str):
        return UNSTORABLE.sub("\ufffd", value) if UNSTORABLE.search(value) else value
    if isinstance(value, Mapping):
        return {clean_text(k): clean_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_text(v) for v in value]
    return value


_REF_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")

# Actors the fabric itself submits as: the policy's taint gates, the keeper's decisions
# and digests. A card's text says what such a task asks of its person.
GATE_ACTOR = "fabric-policy"
PROMOTE_ACTOR = "fabric-promote"  # the approval task `agap promote` files (fabric.promotion)
KEEPER_ACTOR = "keeper"


def _storable(value: Any, what: str) -> Any:
    if isinstance(value, str) and UNSTORABLE.search(value):
        raise ValueError(f"{what} contains a NUL or invalid UTF-8, which Kanboard cannot store")
    if isinstance(value, dict):
        for k, v in value.items():
            _storable(k, what)
            _storable(v, what)
    if isinstance(value, list | tuple):
        for v in value:
            _storable(v, what)
    return value


def storable_text(value: str) -> str:
    """``value`` with NULs and lone surrogates replaced by U+FFFD (for free text in records)."""
    return str(clean_text(value))


class TaskSpec(BaseModel):
    """What a task asks for. Context travels by reference (URIs), never pasted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intent: str = Field(min_length=1, max_length=4000)
    refs: tuple[str, ...] = ()
    target: str
    queue: str
    constraints: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=1, ge=0, le=3)
    deadline: float | None = None  # unix seconds
    not_before: float | None = None  # unix seconds: do not start before
    actor: str = "cli"
    action_id: str | None = None
    parent: str | None = None  # uid of the task that submitted this one
    ancestry: tuple[str, ...] = ()  # uids from the root down to the parent
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

    def title(self) -> str:
        """Kanboard title: the intent's first line, short."""
        line = self.intent.splitlines()[0]
        return line if len(line) <= 120 else line[:117] + "…"

    def canonical(self) -> str:
        """Canonical content for receipts: what makes two submits 'the same task'."""
        content = self.model_dump(exclude={"submitted_at", "queue"})
        return json.dumps(content, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical`."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def to_meta(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_meta(cls, text: str) -> TaskSpec:
        return cls.model_validate_json(text)


class Record(BaseModel):
    """A task's state in one epoch. Only the winner of the epoch's lock writes it."""

    model_config = ConfigDict(extra="ignore")

    epoch: int = Field(ge=0)
    state: State
    op: str  # the transition that produced this record (submit, claim, complete, …)
    by: str  # who made the transition (worker id, actor, "keeper", a human)
    at: float  # when (unix seconds, the writer's clock)
    owner: str | None = None  # the worker holding the lease while working
    lease_until: float | None = None
    attempt: int = 0  # attempts started so far
    not_before: float | None = None  # retry backoff or delayed start
    assignee: str | None = None  # Kanboard username of the human it waits on
    result_ref: str | None = None
    reason: str | None = None
    # The latest checkpoint (a ref) of the work so far. Each transition carries forward
    # the one it read, so a checkpoint written after its epoch ended is never picked up.
    checkpoint: str | None = None
    # How long each renewal of this working epoch's lease lasts (set by claim): a heartbeat
    # that names no length keeps it, so a 900 s claim is not cut to a default.
    lease_seconds: float | None = None
    # Side-effect receipts (operation -> receipt) that count for this task's current round
    # of work. An owner writes one into its own record, in the round trip that checks its
    # epoch is still current; transitions carry what they read, except a reopen (rework
    # never reuses the rejected result's receipts). So a receipt written after its epoch
    # ended (a fenced owner's) is never carried: it is evidence, and a new owner redoes it.
    receipts: dict[str, str] | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _storable_text(cls, v: Any) -> Any:
        # Reasons, answers, owners and receipts are free text: keep them, minus what no
        # backend stores.
        if isinstance(v, dict):
            return {storable_text(str(k)): storable_text(str(x)) for k, x in v.items()}
        return storable_text(v) if isinstance(v, str) else v

    def to_meta(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_meta(cls, text: str) -> Record:
        return cls.model_validate_json(text)


class Terms(BaseModel):
    """A task's priority and deadline as a person set them on its card (Kanboard's UI),
    attributed: they override the spec's, which keeps what was submitted (a retried
    submit with the same action id must still find the same task)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    priority: int = Field(ge=0, le=3)
    deadline: float | None = None
    by: str  # the person (their card id)
    at: float

    def apply(self, spec: TaskSpec) -> TaskSpec:
        """``spec`` with these terms."""
        return spec.model_copy(update={"priority": self.priority, "deadline": self.deadline})

    def to_meta(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_meta(cls, text: str) -> Terms:
        return cls.model_validate_json(text)


def parse_priority(text: str | int) -> int:
    """``low|normal|high|urgent`` (or 0..3) to Kanboard's priority number."""
    if isinstance(text, int) or str(text).isdigit():
        value = int(text)
        if 0 <= value <= 3:
            return value
    elif str(text).lower() in PRIORITY_LEVELS:
        return PRIORITY_LEVELS[str(text).lower()]
    raise InvalidInput(
        f"unknown priority {text!r}", where="--priority", hint="use low, normal, high or urgent"
    )


_DEADLINE_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d")
_RELATIVE = re.compile(r"^\+?(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _representable(when: float, text: str, where: str) -> float:
    """``when``, refused when no calendar date (up to the year 9999) can hold it."""
    try:
        datetime.fromtimestamp(when, UTC)
    except (ValueError, OverflowError, OSError):
        raise InvalidInput(
            f"{text!r} is too far away", where=where, hint="give a time before the year 9999"
        ) from None
    return when


def parse_when(text: str, *, now: float, where: str = "--deadline") -> float:
    """A point in time: ``YYYY-MM-DD[ HH:MM]`` (UTC), ISO-8601 with offset, or ``+2h``."""
    raw = text.strip()
    if m := _RELATIVE.match(raw):
        return _representable(now + float(m.group(1)) * _UNIT[m.group(2)], text, where)
    try:
        dt = datetime.fromisoformat(raw)
        if dt.tzinfo is not None:
            return dt.timestamp()
    except ValueError:
        pass
    for fmt in _DEADLINE_FORMATS:
        try:
            return datetime.strptime(raw, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    raise InvalidInput(
        f"cannot read {text!r} as a time",
        where=where,
        hint="use 'YYYY-MM-DD HH:MM' (UTC), ISO-8601 with an offset, or a delay like +2h",
    )
