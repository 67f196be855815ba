"""Sending a batch of writes again after an ambiguous failure, as far as that is safe.

Kanboard can report "database is locked" (code 0) after committing, and a batch can be
lost in transit after some of its items ran. A write that is safe to repeat (an upsert,
a move, a close) is sent again; one that is not (a comment: a duplicate line in the
journal) is sent once and its outcome reported as unknown.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from fabric.kanboard.port import Call, MaybeDone, Outcome, RpcError, RpcPort
from fabric.signals import stop_requested

RETRIES = 8  # re-sends of an idempotent write that failed ambiguously

# Writes that are safe to send again: upserts, moves, closes. Comments are not (a
# duplicate line in the journal); files are re-sent (a duplicate beats a lost result).
# removeTag is not: SQLite may give a removed tag's id to the next tag created, so a
# late re-send could remove someone else's lock.
IDEMPOTENT = frozenset(
    {
        "saveTaskMetadata",
        "saveProjectMetadata",
        "moveTaskPosition",
        "moveTaskToProject",
        "updateTask",
        "closeTask",
        "openTask",
        "createTaskFile",
        "removeTaskMetadata",
    }
)


def backoff(attempt: int) -> None:
    """Backoff between re-sends: exponential, jittered, capped at a second.

    Real Kanboard on SQLite answers "database is locked" while another PHP worker
    writes; spreading the re-sends out is what gets them through. A process told to
    stop still re-sends (a write left out could leave a step half-done), but at most
    0.05 s apart, so its stop stays bounded (:mod:`fabric.signals`).
    """
    cap = 0.05 if stop_requested() else 1.0
    time.sleep(min(cap, 0.05 * 2**attempt) * random.uniform(0.5, 1.5))


def send(port: RpcPort, calls: Sequence[Call]) -> list[Outcome]:
    """Run a batch; re-send its idempotent items that failed ambiguously.

    Only the failed items are sent again (a batch is not atomic: the others ran), with
    the reads that came after the first of them: a read placed after a write is there to
    see what the write left, which the first answer cannot show if the write had not
    landed (a renewal read back as fenced because its record was not there yet). A whole
    batch lost in transit is re-sent without its non-idempotent items.
    """
    try:
        out = port.batch(calls)
    except MaybeDone:
        kept = [c for c in calls if c.method in IDEMPOTENT or c.is_read]
        out = _resend(port, calls, kept)
    for attempt in range(RETRIES):
        redo = [
            i
            for i, o in enumerate(out)
            if o.error is not None and o.error.maybe_done and calls[i].method in IDEMPOTENT
        ]
        if not redo:
            break
        redo = sorted({*redo, *(i for i, c in enumerate(calls) if c.is_read and i > redo[0])})
        backoff(attempt)
        try:
            again = port.batch([calls[i] for i in redo])
        except MaybeDone:
            continue
        for i, o in zip(redo, again, strict=True):
            out[i] = o
    return out


def _resend(port: RpcPort, calls: Sequence[Call], kept: Sequence[Call]) -> list[Outcome]:
    for attempt in range(RETRIES):
        backoff(attempt)
        try:
            again = iter(port.batch(kept))
        except MaybeDone:
            continue
        # Items not re-sent (comments) report "unknown": treated as best effort.
        unknown = RpcError(-32000, "not re-sent after an ambiguous failure")
        return [
            next(again) if (c.method in IDEMPOTENT or c.is_read) else Outcome(c, error=unknown) for c in calls
        ]
    raise MaybeDone("the board kept failing ambiguously", calls=calls)


__all__ = ["IDEMPOTENT", "RETRIES", "backoff", "send"]
