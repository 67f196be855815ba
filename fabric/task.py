"""The fabric's data: a task's spec (what to do) and its per-epoch state records.

Both are stored as compact JSON strings in Kanboard task metadata. The spec never
changes after submit; a new record is written for each epoch. A person may change a task's
priority and deadline on its card: those :class:`Terms` are kept beside the spec.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import field, fields, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from fabric.errors import InvalidInput
from fabric.plain import Plain


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


class SpecError(ValueError):
    """A spec or record that does not validate: every ``(field, message)`` found, in the
    fabric's words (the same words a card's problems use)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        field, message = problems[0]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{field or 'the value'}: {message}{more}")


# Plain dataclasses, checked by hand here: a worker, `agap claim` and `agap heartbeat`
# read records on every call, and pydantic cost them more than all their other imports.
# Values are read as pydantic's lax mode read them (``"2"`` is 2, ``2.0`` is 2, a list of
# refs is a tuple), and refused with the words pydantic's errors got in
# fabric.cards.problems; tests/unit/test_task_validation.py holds the two side by side.


_BAD_UTF8 = "input should be a valid string, unable to parse raw data as a unicode string"


def _text(v: Any, field: str, errs: list[tuple[str, str]]) -> Any:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode()
        except UnicodeDecodeError:
            errs.append(
                (field, "input should be a valid string, unable to parse raw data as a unicode string")
            )
            return v
    errs.append((field, "must be text"))
    return v


def _int(v: Any, field: str, errs: list[tuple[str, str]]) -> Any:
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        if v != v or v in (float("inf"), float("-inf")):
            errs.append((field, "input should be a finite number"))
        else:
            errs.append((field, "input should be a valid integer, got a number with a fractional part"))
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
        try:
            number = float(v.strip())
        except ValueError:
            number = 0.5
        if number.is_integer():
            return int(number)
        errs.append((field, "input should be a valid integer, unable to parse string as an integer"))
        return v
    errs.append((field, "must be a whole number"))
    return v


def _float(v: Any, field: str, errs: list[tuple[str, str]]) -> Any:
    if isinstance(v, bool | int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            errs.append((field, "input should be a valid number, unable to parse string as a number"))
            return v
    errs.append((field, "must be a number"))
    return v


def _bounded(v: Any, field: str, errs: list[tuple[str, str]], ge: int, le: int | None = None) -> Any:
    if not isinstance(v, int):
        return v  # its type is already refused
    if v < ge:
        errs.append((field, f"must be at least {ge}"))
    elif le is not None and v > le:
        errs.append((field, f"must be at most {le}"))
    return v


def _texts(v: Any, field: str, errs: list[tuple[str, str]]) -> Any:
    """A tuple of strings from any list, tuple or set."""
    if not isinstance(v, list | tuple | set | frozenset):
        errs.append((field, "input should be a valid tuple"))
        return v
    return tuple(_text(item, f"{field}.{i}", errs) for i, item in enumerate(v))


def _optional(check: Any, v: Any, field: str, errs: list[tuple[str, str]]) -> Any:
    return None if v is None else check(v, field, errs)


def _storable_field(v: Any, field: str, errs: list[tuple[str, str]]) -> bool:
    try:
        _storable(v, field)
    except ValueError as exc:
        errs.append((field, str(exc)))
        return False
    return True


_SPEC_TEXT = ("intent", "target", "queue", "actor")
_SPEC_OPTIONAL_TEXT = ("action_id", "parent")
_SPEC_STORABLE = (*_SPEC_TEXT, *_SPEC_OPTIONAL_TEXT, "refs", "constraints", "ancestry")


class TaskSpec(Plain, kw_only=True):
    """What a task asks for. Context travels by reference (URIs), never pasted."""

    intent: str  # 1..4000 characters, not blank (kept stripped)
    refs: tuple[str, ...] = ()
    target: str
    queue: str
    constraints: dict[str, Any] = field(default_factory=dict)
    priority: int = 1  # 0..3
    deadline: float | None = None  # unix seconds
    not_before: float | None = None  # unix seconds: do not start before
    actor: str = "cli"
    action_id: str | None = None
    parent: str | None = None  # uid of the task that submitted this one
    ancestry: tuple[str, ...] = ()  # uids from the root down to the parent
    max_attempts: int = 3  # 1..100
    submitted_at: float = 0.0

    def __post_init__(self) -> None:
        values, errs = self._values({f.name: getattr(self, f.name) for f in fields(self)})
        if errs:
            raise SpecError(errs)
        for name, v in values.items():
            object.__setattr__(self, name, v)

    @classmethod
    def _values(cls, given: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The fields of ``given`` as read, and the problems found, in field order (a
        required field missing from ``given`` is one)."""
        values: dict[str, Any] = {}
        errs: list[tuple[str, str]] = []
        for name in (f.name for f in fields(cls)):
            if name not in given:
                if name in ("intent", "target", "queue"):
                    errs.append((name, "required"))
                continue
            v = given[name]
            if name in _SPEC_STORABLE and not _storable_field(v, name, errs):
                continue
            values[name] = cls._checked(name, v, errs)
        return values, errs

    @staticmethod
    def _checked(name: str, v: Any, errs: list[tuple[str, str]]) -> Any:
        if name == "intent":
            return _intent(v, errs)
        if name in _SPEC_TEXT:
            return _text(v, name, errs)
        if name in _SPEC_OPTIONAL_TEXT:
            return _optional(_text, v, name, errs)
        if name in ("refs", "ancestry"):
            n = len(errs)
            v = _texts(v, name, errs)
            return _uris(v, errs) if name == "refs" and len(errs) == n else v
        if name == "constraints":
            return _mapping(v, name, errs)
        if name in ("priority", "max_attempts"):
            limits = (0, 3) if name == "priority" else (1, 100)
            n = len(errs)
            v = _int(v, name, errs)
            return _bounded(v, name, errs, *limits) if len(errs) == n else v
        if name in ("deadline", "not_before"):
            return _optional(_float, v, name, errs)
        return _float(v, name, errs)  # submitted_at

    @classmethod
    def from_dict(cls, data: Any) -> TaskSpec:
        """A spec from a JSON object: unknown keys and missing ones refused."""
        if not isinstance(data, dict):
            raise SpecError([("", "must be a mapping (key: value)")])
        _, errs = cls._values(data)
        known = {f.name for f in fields(cls)}
        errs += [(str(k), "is not a known field") for k in data if k not in known]
        if errs:
            raise SpecError(errs)
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """Every field (tuples stay tuples)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def evolve(self, **changes: Any) -> TaskSpec:
        """A copy with ``changes``, not checked (as pydantic's ``model_copy``): what reads it
        back (a submit, a reroute) checks it."""
        new = copy.copy(self)
        for name, v in changes.items():
            object.__setattr__(new, name, v)
        return new

    def title(self) -> str:
        """Kanboard title: the intent's first line, short."""
        line = self.intent.splitlines()[0]
        return line if len(line) <= 120 else line[:117] + "…"

    def canonical(self) -> str:
        """Canonical content for receipts: what makes two submits 'the same task'."""
        content = {k: v for k, v in self.as_dict().items() if k not in ("submitted_at", "queue")}
        return json.dumps(content, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical`."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def to_meta(self) -> str:
        return _json(self.as_dict())

    @classmethod
    def from_meta(cls, text: str) -> TaskSpec:
        return cls.from_dict(_loads(text))


def _intent(v: Any, errs: list[tuple[str, str]]) -> Any:
    n = len(errs)
    v = _text(v, "intent", errs)
    if len(errs) > n:
        return v
    if not v:
        errs.append(("intent", "must not be empty"))
    elif len(v) > 4000:
        errs.append(("intent", "is longer than 4000 characters (pass long text by reference)"))
    elif not v.strip():
        errs.append(("intent", "intent is empty"))
    else:
        return v.strip()
    return v


def _uris(refs: tuple[str, ...], errs: list[tuple[str, str]]) -> tuple[str, ...]:
    for ref in refs:
        if not _REF_SCHEME.match(ref):
            errs.append(("refs", f"ref {ref!r} is not a URI (expected scheme:..., e.g. file:///x)"))
            break
    return refs


def _mapping(v: Any, name: str, errs: list[tuple[str, str]]) -> Any:
    if not isinstance(v, dict):
        errs.append((name, "must be a mapping (key: value)"))
        return v
    for k in v:
        if not isinstance(k, str):
            errs.append((f"{name}.{k}.[key]", "must be text"))
    return dict(v)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SpecError([("", f"invalid JSON: {exc}")]) from None


def _json(data: dict[str, Any]) -> str:
    """Compact JSON, as the records have always been stored."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


_RECORD_REQUIRED = ("epoch", "state", "op", "by", "at")
_RECORD_OPTIONAL_TEXT = ("owner", "assignee", "result_ref", "reason", "checkpoint")
_RECORD_OPTIONAL_FLOAT = ("lease_until", "not_before", "lease_seconds")
_STATES = " or ".join([", ".join(f"'{s.value}'" for s in list(State)[:-1]), f"'{list(State)[-1].value}'"])


class Record(Plain, frozen=False, kw_only=True):
    """A task's state in one epoch. Only the winner of the epoch's lock writes it."""

    epoch: int  # >= 0
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

    def __post_init__(self) -> None:
        errs: list[tuple[str, str]] = []
        for f in fields(self):
            # Reasons, answers, owners and receipts are free text: keep them, minus what no
            # backend stores.
            v = getattr(self, f.name)
            if isinstance(v, dict):
                v = {storable_text(str(k)): storable_text(str(x)) for k, x in v.items()}
            elif isinstance(v, str):
                v = storable_text(v)
            setattr(self, f.name, self._checked(f.name, v, errs))
        if errs:
            raise SpecError(errs)

    @staticmethod
    def _checked(name: str, v: Any, errs: list[tuple[str, str]]) -> Any:
        if name in ("epoch", "attempt"):
            n = len(errs)
            v = _int(v, name, errs)
            return _bounded(v, name, errs, 0) if name == "epoch" and len(errs) == n else v
        if name == "state":
            try:
                return State(v)
            except ValueError:
                errs.append((name, f"input should be {_STATES}"))
                return v
        if name in ("op", "by"):
            return _text(v, name, errs)
        if name == "at":
            return _float(v, name, errs)
        if name in _RECORD_OPTIONAL_TEXT:
            return _optional(_text, v, name, errs)
        if name in _RECORD_OPTIONAL_FLOAT:
            return _optional(_float, v, name, errs)
        return None if v is None else _mapping(v, name, errs)  # receipts

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        """A record from a JSON object: unknown keys ignored, missing ones refused."""
        if not isinstance(data, dict):
            raise SpecError([("", "must be a mapping (key: value)")])
        missing = [(n, "required") for n in _RECORD_REQUIRED if n not in data]
        if missing:
            raise SpecError(missing)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_meta(self) -> str:
        return _json({k: v for k, v in self.as_dict().items() if v is not None})

    @classmethod
    def from_meta(cls, text: str) -> Record:
        return cls.from_dict(_loads(text))


class Terms(Plain, kw_only=True):
    """A task's priority and deadline as a person set them on its card (Kanboard's UI),
    attributed: they override the spec's, which keeps what was submitted (a retried
    submit with the same action id must still find the same task)."""

    priority: int
    deadline: float | None = None
    by: str  # the person (their card id)
    at: float

    def apply(self, spec: TaskSpec) -> TaskSpec:
        """``spec`` with these terms."""
        return replace(spec, priority=self.priority, deadline=self.deadline)

    def to_meta(self) -> str:
        return _json({"priority": self.priority, "deadline": self.deadline, "by": self.by, "at": self.at})

    @classmethod
    def from_meta(cls, text: str) -> Terms:
        data = _loads(text)
        if not isinstance(data, dict):
            raise SpecError([("", "must be a mapping (key: value)")])
        errs: list[tuple[str, str]] = []
        priority, by, at, deadline = (
            data.get("priority"),
            data.get("by"),
            data.get("at"),
            data.get("deadline"),
        )
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
            errs.append(("priority", "must be a whole number from 0 to 3"))
        if not isinstance(by, str):
            errs.append(("by", "must be text"))
        if isinstance(at, bool) or not isinstance(at, int | float):
            errs.append(("at", "must be a number"))
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int | float)):
            errs.append(("deadline", "must be a number"))
        if errs:
            raise SpecError(errs)
        return cls(
            priority=int(priority),  # type: ignore[arg-type]
            deadline=None if deadline is None else float(deadline),
            by=str(by),
            at=float(at),  # type: ignore[arg-type]
        )


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
