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
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

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

_URL_CREDS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+@")
_SECRET_WORD = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|apikey|auth(?:orization)?|"
    r"bearer|credentials?)\b(\s*[:=]\s*|\s+)[^\s,;]+"
)
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk|ghp|gho|xox[abp])[-_][A-Za-z0-9_\-]{8,}\b")
_LONG_OPAQUE = re.compile(r"[A-Za-z0-9+/_=\-]{32,}")
_FILE_URI = re.compile(r"(?i)\bfile://\S*")
_POSIX_PATH = re.compile(r"(?<![\w.:/~-])~?/(?:[\w.@+\-]+/?)+")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\\S*")
_SPACE = re.compile(r"\s+")


def safe_detail(text: str, limit: int = DETAIL_MAX) -> str:
    """A short, single-line detail with local paths and secret-looking words removed."""
    out = _URL_CREDS.sub(r"\1[redacted]@", text)
    out = _SECRET_WORD.sub(lambda m: f"{m.group(1)}=[redacted]", out)
    out = _KEY_LIKE.sub("[redacted]", out)
    out = _FILE_URI.sub("[path]", out)
    out = _WINDOWS_PATH.sub("[path]", out)
    out = _POSIX_PATH.sub("[path]", out)
    out = _LONG_OPAQUE.sub("[redacted]", out)
    out = _SPACE.sub(" ", out).strip()
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


class Event(BaseModel):
    """One live event, field for field as on the wire (without ``data.hmac_sig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    schema_version: Literal[1] = SCHEMA_VERSION
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

    @model_validator(mode="after")
    def _kind_fits_event(self) -> Event:
        kind = self.data.get(KIND_FIELD)
        if kind is None:
            return self
        if not isinstance(kind, str) or kind not in _KINDS or WIRE_EVENT[EventType(kind)] != self.event:
            raise ValueError(f"data.kind {kind!r} is not a kind of {self.event.value!r} event")
        return self

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
        return self.model_dump(mode="json")


__all__ = [
    "DETAIL_MAX",
    "KIND_FIELD",
    "SCHEMA_VERSION",
    "SEQ_STRIDE",
    "TERMINAL_EVENTS",
    "WIRE_EVENT",
    "Event",
    "EventType",
    "WireEvent",
    "make_seq",
    "publishable_ref",
    "safe_detail",
    "utc_stamp",
]
