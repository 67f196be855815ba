"""Live event schema, version 1: what a worker tells watchers about one task.

An event is advisory: the board stays the authority. Each event names its task, the
epoch whose record it reports, and a ``seq`` that orders all events of the task::

    seq = epoch * SEQ_STRIDE + counter

The epoch is the ledger's: every transition wins the next epoch, and exactly one actor
wins it, so the epoch-major part never collides across owners and a higher epoch always
wins. The counter orders events inside one epoch; only the owner of a working epoch
emits more than one event in it (``started`` is counter 0, then ``progress`` 1, 2, …),
so an in-process counter is enough. Events that report a transition (``completed``,
``failed``, ``input_required``, ``canceled``, a requeue) carry the epoch the transition
wrote, with counter 0. Watchers keep the highest seq they accepted and ignore anything
at or below it: duplicates and late deliveries from older epochs fall away.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION: Literal[1] = 1
SEQ_STRIDE = 1_000_000  # counters per epoch: seq 3000007 is epoch 3, counter 7
DETAIL_MAX = 200
DATA_MAX_ITEMS = 16
DATA_VALUE_MAX = 200

Scalar = str | int | float | bool | None


class EventType(StrEnum):
    SUBMITTED = "submitted"
    STARTED = "started"
    PROGRESS = "progress"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL_EVENTS = frozenset({EventType.COMPLETED, EventType.FAILED, EventType.CANCELED})


def make_seq(epoch: int, counter: int) -> int:
    """The ordering number of event ``counter`` within ``epoch``."""
    if not 0 <= counter < SEQ_STRIDE:
        raise ValueError(f"counter {counter} is outside 0..{SEQ_STRIDE - 1}")
    return epoch * SEQ_STRIDE + counter


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
    """One live event (schema v1). The wire form adds ``sig``; see :mod:`.signing`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = SCHEMA_VERSION
    task_id: int = Field(ge=1)
    seq: int = Field(ge=0)
    epoch: int = Field(ge=0)
    type: EventType
    at: str
    detail: str = Field(default="", max_length=DETAIL_MAX)
    data: dict[str, Scalar] = Field(default_factory=dict)

    @field_validator("at")
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
    def _seq_in_epoch(self) -> Event:
        if self.seq // SEQ_STRIDE != self.epoch:
            raise ValueError(f"seq {self.seq} is not in epoch {self.epoch}")
        return self

    @property
    def counter(self) -> int:
        return self.seq % SEQ_STRIDE

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS

    @classmethod
    def make(
        cls,
        task_id: int,
        epoch: int,
        counter: int,
        type: EventType | str,
        detail: str = "",
        data: dict[str, Scalar] | None = None,
        *,
        at: float | None = None,
    ) -> Event:
        """Build an event, cleaning ``detail`` so it is safe to publish."""
        return cls(
            task_id=task_id,
            seq=make_seq(epoch, counter),
            epoch=epoch,
            type=EventType(type),
            at=utc_stamp(at),
            detail=safe_detail(detail),
            data=dict(data or {}),
        )

    def body(self) -> dict[str, Any]:
        """The signed fields, as plain JSON data."""
        return self.model_dump(mode="json")


__all__ = [
    "DETAIL_MAX",
    "SCHEMA_VERSION",
    "SEQ_STRIDE",
    "TERMINAL_EVENTS",
    "Event",
    "EventType",
    "make_seq",
    "publishable_ref",
    "safe_detail",
    "utc_stamp",
]
