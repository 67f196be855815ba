"""Everything the fabric stores on the board, named in one place.

Columns, lock-tag names and metadata keys are the fabric's storage schema on Kanboard.
Nothing else in the code spells them out.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum


class State(StrEnum):
    """A task's state in its current epoch record (the truth; columns are a projection)."""

    QUEUED = "queued"
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    DONE = "done"  # unverified: the worker says it finished
    DEAD = "dead"  # dead letter: attempts exhausted, poison, or given up
    CANCELED = "canceled"
    CLOSED = "closed"  # verified by someone other than the producer


TERMINAL = frozenset({State.CANCELED, State.CLOSED})


class Column(StrEnum):
    """The work project's columns, in board order."""

    QUEUED = "Queued"
    WORKING = "Working"
    WAITING = "Waiting on me"
    DONE = "Done"
    DEAD = "Dead letter"


COLUMN_ORDER = (Column.QUEUED, Column.WORKING, Column.WAITING, Column.DONE, Column.DEAD)

# The projection: which column shows a task in each state.
COLUMN_OF_STATE = {
    State.QUEUED: Column.QUEUED,
    State.WORKING: Column.WORKING,
    State.INPUT_REQUIRED: Column.WAITING,
    State.DONE: Column.DONE,
    State.DEAD: Column.DEAD,
    State.CANCELED: Column.DONE,
    State.CLOSED: Column.DONE,
}

# Kanboard priorities run 0..3.
PRIORITY_LEVELS = {"low": 0, "normal": 1, "high": 2, "urgent": 3}
PRIORITY_NAMES = {v: k for k, v in PRIORITY_LEVELS.items()}

# -- task metadata keys (values are strings: Kanboard stores text) -----------------
META_UID = "fabric.uid"
META_SPEC = "fabric.spec"
META_RECORD_PREFIX = "fabric.e"  # fabric.e0, fabric.e1, … one record per epoch
META_EFFECT_PREFIX = "fabric.fx."  # fabric.fx.<op> = side-effect intent and receipt
META_EVIDENCE_PREFIX = "fabric.evidence.e"  # late output of a fenced owner
META_COST = "fabric.cost_usd"  # model spend on the task so far (the digest sums it)

# -- project metadata keys (work project) ---------------------------------------------
META_PARK_PREFIX = "fabric.park."  # fabric.park.<queue> = the queue's park state (JSON)


def park_key(queue: str) -> str:
    """Project metadata key where a queue's worker publishes its park state."""
    return f"{META_PARK_PREFIX}{queue}"


_RECORD_KEY = re.compile(r"^fabric\.e(\d+)$")
_UID = re.compile(r"^[0-9a-f]{16}$")


def record_key(epoch: int) -> str:
    """Metadata key of the state record for ``epoch``."""
    return f"{META_RECORD_PREFIX}{epoch}"


def record_epoch(key: str) -> int | None:
    """The epoch a metadata key records, or None if it is not a record key."""
    m = _RECORD_KEY.match(key)
    return int(m.group(1)) if m else None


def effect_key(op: str) -> str:
    """Metadata key holding the intent and receipt of side effect ``op``."""
    return f"{META_EFFECT_PREFIX}{op}"


def is_uid(text: str) -> bool:
    """True for a fabric task uid (16 lowercase hex digits)."""
    return bool(_UID.match(text))


# -- lock tags, in the locks project ----------------------------------------------
# Lowercase ASCII and short: MySQL compares tag names case-insensitively and caps
# them at 255 characters.


def epoch_lock(uid: str, epoch: int) -> str:
    """The tag whose creation wins epoch ``epoch`` of task ``uid``."""
    return f"{uid}/e{epoch}"


def receipt_lock(actor: str, action_id: str) -> str:
    """The tag whose creation wins the receipt for (actor, action id)."""
    digest = hashlib.sha256(f"{actor}\x00{action_id}".encode()).hexdigest()[:32]
    return f"rcpt/{digest}"


def receipt_reference(actor: str, action_id: str) -> str:
    """The Kanboard ``reference`` a task submitted under (actor, action id) carries."""
    return f"{actor}:{action_id}"
