"""Live event schema, version 1: seed 003's wire schema, what watchers learn about one task.

Every payload is one JSON object with exactly these seven fields::

    schema_version  1
    seq             the ordering number (below), 1 or more
    job_id          the task id, as a decimal string ("42")
    event           started, progress, permission_required, completed or error
    timestamp       ISO-8601 UTC with a trailing Z (advisory: never used for timeouts)
    detail          one short line, with local paths and secret-looking words removed
    data            small scalar metadata: ``kind``, the fabric's own name for the event,
                    then e.g. ``queue``, ``attempt``, ``result_ref``; on the wire also
                    ``hmac_sig``, the signature (:mod:`.signing`)

The fabric's kinds map onto the five wire events (:data:`WIRE_EVENT`): ``submitted``
(and a requeue) is progress, ``input_required`` is permission_required, ``failed`` and
``canceled`` are error. ``completed`` and ``error`` are terminal. A payload without
``data.kind`` (a publisher that knows only the seed) gets the kind its event implies.

An event is advisory: the board stays the authority. ``seq`` orders all events of the
task and names the epoch whose record it reports::

    seq = epoch * SEQ_STRIDE + counter + 1

The epoch is the ledger's: every transition wins the next epoch, and exactly one actor
wins it, so the epoch-major part never collides across owners and a higher epoch always
wins. The counter orders events inside one epoch; only the owner of a working epoch
emits more than one event in it (``started`` is counter 0, then ``progress`` 1, 2, …),
so an in-process counter is enough. Events that report a transition (``completed``,
``failed``, ``input_required``, ``canceled``, a requeue) carry the epoch the transition
wrote, with counter 0. The ``+ 1`` makes the first event of a task (``submitted``,
epoch 0) seq 1. Watchers keep the highest seq they accepted and ignore anything at or
below it: duplicates and late deliveries from older epochs fall away.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from datetime import UTC, datetime
from enum import StrEnum
from functools import cache
from typing import Any, Literal

from fabric.plain import Plain

SCHEMA_VERSION: Literal[1] = 1
SEQ_STRIDE = 1_000_000  # seqs per epoch: seq 3000008 is epoch 3, counter 7
DETAIL_MAX = 200
DATA_MAX_ITEMS = 16
DATA_VALUE_MAX = 200
KIND_FIELD = "kind"  # in data: the fabric's own name for the event

Scalar = str | int | float | bool | None


class EventType(StrEnum):
    """The fabric's kinds of event (``data.kind``)."""

    SUBMITTED = "submitted"
    STARTED = "started"
    PROGRESS = "progress"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


class WireEvent(StrEnum):
    """Seed 003's event names (the ``event`` field)."""

    STARTED = "started"
    PROGRESS = "progress"
    PERMISSION_REQUIRED = "permission_required"
    COMPLETED = "completed"
    ERROR = "error"


WIRE_EVENT: dict[EventType, WireEvent] = {
    EventType.SUBMITTED: WireEvent.PROGRESS,
    EventType.STARTED: WireEvent.STARTED,
    EventType.PROGRESS: WireEvent.PROGRESS,
    EventType.INPUT_REQUIRED: WireEvent.PERMISSION_REQUIRED,
    EventType.COMPLETED: WireEvent.COMPLETED,
    EventType.FAILED: WireEvent.ERROR,
    EventType.CANCELED: WireEvent.ERROR,
}
# The kind a payload without data.kind has: what its event means to the fabric.
DEFAULT_KIND: dict[WireEvent, EventType] = {
    WireEvent.STARTED: EventType.STARTED,
    WireEvent.PROGRESS: EventType.PROGRESS,
    WireEvent.PERMISSION_REQUIRED: EventType.INPUT_REQUIRED,
    WireEvent.COMPLETED: EventType.COMPLETED,
    WireEvent.ERROR: EventType.FAILED,
}
TERMINAL_EVENTS = frozenset({WireEvent.COMPLETED, WireEvent.ERROR})
_KINDS = frozenset(k.value for k in EventType)


def make_seq(epoch: int, counter: int) -> int:
    """The ordering number of event ``counter`` within ``epoch``."""
    if not 0 <= counter < SEQ_STRIDE:
        raise ValueError(f"counter {counter} is outside 0..{SEQ_STRIDE - 1}")
    return epoch * SEQ_STRIDE + counter + 1


# -- keeping details safe to publish -------------------------------------------------


# Compiled on first use: a process that imports events but publishes none (a heartbeat, a
# worker without a broker) does not compile them.
@cache
def _redactions() -> tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...]:
    return (
        (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+@"), r"\1[redacted]@"),
        (
            re.compile(
                r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|apikey|auth(?:orization)?|"
                r"bearer|credentials?)\b(\s*[:=]\s*|\s+)[^\s,;]+"
            ),
            lambda m: f"{m.group(1)}=[redacted]",
        ),
        (re.compile(r"\b(?:sk|pk|rk|ghp|gho|xox[abp])[-_][A-Za-z0-9_\-]{8,}\b"), "[redacted]"),
        (re.compile(r"(?i)\bfile://\S*"), "[path]"),  # file URIs, Windows paths, then POSIX paths
        (re.compile(r"\b[A-Za-z]:\\\S*"), "[path]"),
        (re.compile(r"(?<![\w.:/~-])~?/(?:[\w.@+\-]+/?)+"), "[path]"),
        (re.compile(r"[A-Za-z0-9+/_=\-]{32,}"), "[redacted]"),  # long opaque tokens
        (re.compile(r"\s+"), " "),
    )


def safe_detail(text: str, limit: int = DETAIL_MAX) -> str:
    """A short, single-line detail with local paths and secret-looking words removed."""
    out = text
    for pattern, replacement in _redactions():
        out = pattern.sub(replacement, out)
    out = out.strip()
    if len(out) > limit:
        out = out[: limit - 1].rstrip() + "…"
    return out


def publishable_ref(ref: str | None) -> str | None:
    """A result ref fit for the wire: board refs and URLs pass, local paths do not."""
    if not ref:
        return None
    if ref.lower().startswith("file:") or ref.startswith(("/", "~")) or re.match(r"[A-Za-z]:\\", ref):
        return None
    cleaned = safe_detail(ref, limit=DATA_VALUE_MAX)
    return cleaned if cleaned == ref else None


def utc_stamp(at: float | None = None) -> str:
    """ISO-8601 UTC with milliseconds and a trailing Z (advisory; never used for timeouts)."""
    when = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class EventError(ValueError):
    """Not a v1 event: every ``(field, what)`` found."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


# A plain dataclass checked by hand: a worker publishes (and hears its wake-ups) on this
# path, and pydantic cost such a short-lived process more than all its other imports.
# Values are read as the pydantic model it replaced read them (lax: ``1.0`` is version 1,
# bytes in data are text; strict ``seq``, ``job_id``, ``timestamp`` and ``detail``), and
# tests/unit/test_events_schema.py holds that model as the reference.


class Event(Plain, kw_only=True):
    """One live event, field for field as on the wire (without ``data.hmac_sig``); checked
    when made: an event that exists is a valid one."""

    schema_version: Literal[1] = SCHEMA_VERSION
    seq: int
    job_id: str
    event: WireEvent
    timestamp: str
    detail: str = ""
    data: dict[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise EventError(problems)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Event:
        """The event a payload's fields (wire JSON, without the signature) make, or
        :class:`EventError`."""
        problems = [(k, "is not a field of an event") for k in body if k not in _FIELDS]
        problems += [(k, "is missing") for k in _REQUIRED if k not in body]
        if problems:
            raise EventError(problems)
        values = dict(body)
        values["schema_version"] = _version(values.get("schema_version", SCHEMA_VERSION))
        values["event"] = _wire_event(values["event"])
        if "data" in values:
            values["data"] = _data(values["data"])
        return cls(**values)

    @property
    def task_id(self) -> int:
        return int(self.job_id)

    @property
    def kind(self) -> EventType:
        """The fabric's name for the event (``data.kind``, else what ``event`` implies)."""
        kind = self.data.get(KIND_FIELD)
        return EventType(kind) if isinstance(kind, str) else DEFAULT_KIND[self.event]

    @property
    def epoch(self) -> int:
        return (self.seq - 1) // SEQ_STRIDE

    @property
    def counter(self) -> int:
        return (self.seq - 1) % SEQ_STRIDE

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS

    @classmethod
    def make(
        cls,
        task_id: int,
        epoch: int,
        counter: int,
        kind: EventType | str,
        detail: str = "",
        data: dict[str, Scalar] | None = None,
        *,
        at: float | None = None,
    ) -> Event:
        """Build an event, cleaning ``detail`` so it is safe to publish."""
        kind = EventType(kind)
        return cls(
            seq=make_seq(epoch, counter),
            job_id=str(int(task_id)),
            event=WIRE_EVENT[kind],
            timestamp=utc_stamp(at),
            detail=safe_detail(detail),
            data={KIND_FIELD: kind.value, **(data or {})},
        )

    def body(self) -> dict[str, Any]:
        """The signed fields, as plain JSON data."""
        return {
            "schema_version": self.schema_version,
            "seq": self.seq,
            "job_id": self.job_id,
            "event": self.event.value,
            "timestamp": self.timestamp,
            "detail": self.detail,
            "data": dict(self.data),
        }


_FIELDS = frozenset(f.name for f in fields(Event))
_REQUIRED = ("seq", "job_id", "event", "timestamp")
_JOB_ID = re.compile(r"[1-9][0-9]{0,17}")  # matched whole: "5\n" is not a job id


def _version(value: object) -> object:
    # As pydantic's Literal[1] read it: 1, 1.0 and True are version 1; "1" is not.
    return SCHEMA_VERSION if type(value) in (int, float, bool) and value == SCHEMA_VERSION else value


def _wire_event(value: object) -> object:
    if isinstance(value, str) and not isinstance(value, WireEvent) and value in _WIRE_VALUES:
        return WireEvent(value)
    return value


def _text(value: object) -> object:
    """A str as it is, bytes as text (pydantic's lax str); anything else unchanged (refused)."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return value
    return value


def _data(value: object) -> object:
    """``data`` with bytes keys and values read as text; anything else as given."""
    if not isinstance(value, Mapping):
        return value
    return {_text(k): v if isinstance(v, _SCALARS) else _text(v) for k, v in value.items()}


_WIRE_VALUES = frozenset(e.value for e in WireEvent)
_SCALARS = (str, int, float, type(None))  # bool is an int


def _problems(e: Event) -> list[tuple[str, str]]:
    p: list[tuple[str, str]] = []
    if type(e.schema_version) is not int or e.schema_version != SCHEMA_VERSION:
        p.append(("schema_version", f"must be {SCHEMA_VERSION}"))
    if not isinstance(e.seq, int) or isinstance(e.seq, bool) or e.seq < 1:
        p.append(("seq", "must be a whole number, 1 or more"))
    if not isinstance(e.job_id, str) or not _JOB_ID.fullmatch(e.job_id):
        p.append(("job_id", "must be a task id in decimal"))
    if not isinstance(e.event, WireEvent):
        p.append(("event", "must be one of " + ", ".join(sorted(_WIRE_VALUES))))
    if not isinstance(e.timestamp, str) or not _utc(e.timestamp):
        p.append(("timestamp", "must be ISO-8601 UTC with a trailing Z"))
    if not isinstance(e.detail, str) or len(e.detail) > DETAIL_MAX:
        p.append(("detail", f"must be text of at most {DETAIL_MAX} characters"))
    wrong = _data_problem(e.data)
    if wrong:
        p.append(("data", wrong))
    kind = e.data.get(KIND_FIELD) if not p else None
    if kind is not None and (
        not isinstance(kind, str) or kind not in _KINDS or WIRE_EVENT[EventType(kind)] != e.event
    ):
        p.append(("data.kind", f"{kind!r} is not a kind of {e.event.value!r} event"))
    return p


def _data_problem(data: object) -> str:
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        return "must map text to values"
    if not all(isinstance(v, _SCALARS) for v in data.values()):
        return "values must be text, numbers, true/false or null"
    if len(data) > DATA_MAX_ITEMS:
        return f"at most {DATA_MAX_ITEMS} data items"
    if any(len(k) > 64 or (isinstance(v, str) and len(v) > DATA_VALUE_MAX) for k, v in data.items()):
        return "an item is too long"
    return ""


def _utc(value: str) -> bool:
    if not value.endswith("Z"):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


__all__ = [
    "DETAIL_MAX",
    "KIND_FIELD",
    "SCHEMA_VERSION",
    "SEQ_STRIDE",
    "TERMINAL_EVENTS",
    "WIRE_EVENT",
    "Event",
    "EventError",
    "EventType",
    "WireEvent",
    "make_seq",
    "publishable_ref",
    "safe_detail",
    "utc_stamp",
]
