"""Everything the fabric stores on the board, named in one place.

Columns, lock-tag names and metadata keys are the fabric's storage schema on Kanboard.
Nothing else in the code spells them out.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum

from fabric.task import State


class Column(StrEnum):
    """The work project's columns, in board order."""

    # Queued too, but not next: the keeper keeps each lane's Queued cell short
    # (QUEUED_CELL) and the rest of a long queue here, so neither a worker's poll nor its
    # moves cost what a backlog of thousands holds (keeper.backlog).
    BACKLOG = "Backlog"
    QUEUED = "Queued"
    WORKING = "Working"
    WAITING = "Waiting on me"
    DONE = "Done"
    DEAD = "Dead letter"


COLUMN_ORDER = (Column.BACKLOG, Column.QUEUED, Column.WORKING, Column.WAITING, Column.DONE, Column.DEAD)
# The columns a board must have for the fabric to run on it. Without Backlog (a board made
# before it, not yet brought up to date by `agap init`) a long queue stays in Queued.
REQUIRED_COLUMNS = COLUMN_ORDER[1:]

# The queued cards a lane's Queued cell holds at most once the keeper has balanced it; it
# tops the cell up from Backlog when it holds fewer than half as many. A worker reads its
# poll's best CANDIDATES (workers.queue) of these.
QUEUED_CELL = 32

# The projection: which column shows a task in each state.
COLUMN_OF_STATE = {
    State.QUEUED: Column.QUEUED,
    State.WORKING: Column.WORKING,
    State.INPUT_REQUIRED: Column.WAITING,
    State.DONE: Column.DONE,
    State.DEAD: Column.DEAD,
    State.CANCELED: Column.DONE,
    State.CLOSED: Column.DONE,
    State.DROPPED: Column.DONE,
}


def projected_column(state: State, assignee: str | None) -> Column:
    """The column a record shows in: a queued task for a person waits on that person."""
    if state == State.QUEUED and assignee:
        return Column.WAITING
    return COLUMN_OF_STATE[state]


def column_fits(column: Column | None, state: State, assignee: str | None) -> bool:
    """True when a card in ``column`` shows a record of ``state`` as it should: its
    projected column, or Backlog for a queued task (the keeper's overflow of Queued)."""
    want = projected_column(state, assignee)
    return column == want or (column == Column.BACKLOG and want == Column.QUEUED)


# -- task metadata keys (values are strings: Kanboard stores text) -----------------
# A name holds at most 46 characters (PostgreSQL and MySQL cap it at 50, less the
# chunk suffix); a value of any length is stored in 255-character chunks by the
# storage port (fabric/kanboard/fit.py). Names are lowercase: MySQL compares them
# case-insensitively.
META_UID = "fabric.uid"
META_SPEC = "fabric.spec"
META_RECORD_PREFIX = "fabric.e"  # fabric.e0, fabric.e1, … one record per epoch
META_EFFECT_PREFIX = "fabric.fx."  # fabric.fx.<op> = side-effect intent and receipt
META_EVIDENCE_PREFIX = "fabric.evidence.e"  # late output of a fenced owner
META_COST = "fabric.cost_usd"  # model spend on the task so far (the digest sums it)
META_GAP = "fabric.gap"  # an epoch seen locked with no record: {epoch, seen}
META_ESCALATED = "fabric.escalated"  # the keeper raised a decision task about this one
META_REMINDED = "fabric.reminded"  # when the keeper last reminded a gate's human
META_NOTIFIED = "fabric.notified"  # the epoch whose inbox notice was sent
# "<epoch>:<unix time>" of the fabric's latest move of the card made outside the record's
# own batch (a re-sent or repaired move): with the record's time, it tells the fabric's
# moves from a person's.
META_PROJECTED = "fabric.projected"
# The priority and deadline a person set on the card, attributed (fabric.task.Terms, JSON):
# they override the spec's (keeper/edits.py).
META_TERMS = "fabric.terms"
# The newest activity row of a person's edit of this card the keeper has handled (its id):
# each edit is handled once, across restarts (keeper/edits.py).
META_EDITED = "fabric.edited"
# The keeper told the person who made this card by hand where to make it instead (once).
META_HINTED = "fabric.hinted"
# The keeper's retain of the result into a Hindsight bank (a card's memory.retain): JSON
# {outcome, bank, document_id, attempts, at, error?, receipt?} (keeper/memory.py).
META_RETAINED = "fabric.retained"
# The last OpenClaw cron run that submitted this task, from its "run finished" webhook:
# JSON {job, run_id, status, completion, run_at, slot, error?, summary?} (keeper/openclaw.py).
META_OPENCLAW_RUN = "fabric.openclaw.run"

# -- project metadata keys ------------------------------------------------------------
META_PARK_PREFIX = "fabric.park."  # work project: fabric.park.<queue> = park state (JSON)
META_CRON_PREFIX = "fabric.cron."  # work project: fabric.cron.<schedule> = its firings
META_WATCH = "fabric.keeper.watch"  # work project: the ids the keeper watches for gestures
# A home's project: where its keeper receives the webhook events the main keeper forwards.
META_HOOK = "fabric.keeper.hook"
META_RETAINING = "fabric.keeper.retaining"  # work project: ids whose retain is tried again
META_MATRIX_SINCE_PREFIX = "fabric.keeper.matrix."  # + a bot's hash: its Matrix sync token
META_LAYOUT = "fabric.layout"  # work project: the storage layout version (see LAYOUT_VERSION)
META_ORPHANS = "fabric.gc.orphans"  # locks project: {tag name: first seen orphaned}
# A confined agent's home project: {username: user id} of the people it may assign, for
# its worker, whose board user may not list users (fabric.kanboard.principals).
META_MEMBERS = "fabric.members"

# Version 2 stores every value in 255-character chunks and hashes receipts into the
# reference; boards written by version 1 (long values, `actor:key` references) are
# rewritten by `agap migrate` (which `agap init` runs).
LAYOUT_VERSION = "2"
NAME_ROOM = 46


def _fitted(prefix: str, name: str) -> str:
    """``prefix + name``, or, when that is too long, a readable head and a hash of it all.

    Readers never parse the name back from such a key: the value carries it.
    """
    key = f"{prefix}{name}"
    if len(key) <= NAME_ROOM:
        return key
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{prefix}{name[: NAME_ROOM - len(prefix) - 11]}-{digest}"


def park_key(queue: str) -> str:
    """Project metadata key where a queue's worker publishes its park state."""
    return _fitted(META_PARK_PREFIX, queue)


def cron_key(schedule: str) -> str:
    """Project metadata key of a schedule's published state."""
    return _fitted(META_CRON_PREFIX, schedule)


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
    return _fitted(META_EFFECT_PREFIX, op)


def evidence_key(epoch: int) -> str:
    """Metadata key of a fenced owner's late output for ``epoch``."""
    return f"{META_EVIDENCE_PREFIX}{epoch}"


def is_uid(text: str) -> bool:
    """True for a fabric task uid (16 lowercase hex digits)."""
    return bool(_UID.match(text))


# -- lock tags, in the locks project ----------------------------------------------
# Lowercase ASCII and short: MySQL compares tag names case-insensitively and caps
# them at 255 characters.


def epoch_lock(uid: str, epoch: int) -> str:
    """The tag whose creation wins epoch ``epoch`` of task ``uid``."""
    return f"{uid}/e{epoch}"


def _receipt_digest(actor: str, action_id: str) -> str:
    return hashlib.sha256(f"{actor}\x00{action_id}".encode()).hexdigest()[:32]


def receipt_lock(actor: str, action_id: str) -> str:
    """The tag whose creation wins the receipt for (actor, action id)."""
    return f"rcpt/{_receipt_digest(actor, action_id)}"


def receipt_reference(actor: str, action_id: str) -> str:
    """The Kanboard ``reference`` a task submitted under (actor, action id) carries.

    A hash, not the key itself: Kanboard holds at most 191 characters in a reference, and
    MySQL compares references case-insensitively, so ``Key`` and ``key`` must not meet.
    The readable actor and key are in the description.
    """
    return f"rcpt:{_receipt_digest(actor, action_id)}"


def uid_reference(uid: str) -> str:
    """The ``reference`` of a task submitted without an action id: its own uid."""
    return f"uid:{uid}"


def legacy_receipt_reference(actor: str, action_id: str) -> str:
    """The reference layout version 1 gave a task (what `agap migrate` rewrites)."""
    return f"{actor}:{action_id}"
