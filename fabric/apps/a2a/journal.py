"""Journaling a finished sync call to the board, after the caller has its answer.

A sync ``SendMessage`` runs the agent directly; the board hears about it only afterwards,
as an ordinary fabric task with the normal receipt (actor ``a2a:<caller>``, action id =
the A2A ``messageId``) and a normal epoch history:

    e0 queued (submit) → e1 working (claim by ``a2a-sync@<host>``) → e2 done / dead / canceled

The lock of epoch 1 is taken *before* the epoch-0 record is written, so no worker can
claim the journal task in between and run the call a second time (a worker that tries
loses the lock and moves on). Six round trips in all, none of them on the caller's path.

Re-journaling is idempotent: the receipt lock names the task already written, and a
journal interrupted halfway (a crash) is finished from where it stopped.
"""

from __future__ import annotations

import base64
import logging
import socket
from dataclasses import dataclass

from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.layout import META_COST, Column, epoch_lock, receipt_lock, receipt_reference
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.taskboard import TaskView
from fabric.ledger import Lease
from fabric.submit import (
    build_spec,
    initial_record,
    new_uid,
    repair_unrecorded,
)
from fabric.task import Record, State, TaskSpec

from . import store as st

log = logging.getLogger("agap.a2a.journal")

MAX_INTENT = 4000
JOURNAL_LEASE_SECONDS = 300.0


def sync_owner() -> str:
    """The owner name sync calls are journaled under."""
    return f"a2a-sync@{socket.gethostname()}"


def actor_for(caller: str) -> str:
    """The fabric actor an A2A caller submits as."""
    return f"a2a:{caller}"


class JournalError(FabricError):
    """The journal task is in a state this journal cannot finish (someone else has it)."""


@dataclass(frozen=True)
class Journaled:
    task_id: int
    uid: str
    state: State


class Journal:
    """Writes terminal sync tasks to the board through one :class:`Fabric` (one thread)."""

    def __init__(self, fab: Fabric, *, owner: str | None = None) -> None:
        self.fab = fab
        self.owner = owner or sync_owner()

    # -- the spec ------------------------------------------------------------------------

    def spec_for(self, row: st.TaskRow) -> TaskSpec:
        card = self.fab.cards.get(row.agent)
        intent = row.intent.strip() or "(empty message)"
        if len(intent) > MAX_INTENT:
            intent = intent[: MAX_INTENT - 40] + "\n[... truncated by the A2A journal ...]"
        return build_spec(
            intent=intent,
            target=card.id,
            queue=card.queue_name,
            refs=tuple(row.refs),
            actor=actor_for(row.caller),
            action_id=row.message_id,
            max_attempts=card.runtime.max_attempts,
            now=row.created,
        )

    # -- writing -------------------------------------------------------------------------

    def record(self, row: st.TaskRow, *, cost_usd: float = 0.0) -> Journaled:
        """Put the terminal sync task ``row`` on the board; idempotent."""
        if row.state not in st.SYNC_TERMINAL:
            raise JournalError(f"sync task {row.task_id} is {row.state}, not finished", where="a2a journal")
        board = self.fab.board
        spec = self.spec_for(row)
        actor = actor_for(row.caller)
        uid = new_uid()
        task_id, won = board.create_task(
            spec,
            uid=uid,
            reference=receipt_reference(actor, row.message_id),
            receipt=receipt_lock(actor, row.message_id),
        )
        if not won:
            board.remove_task(task_id)
            return self._resume(row, spec, cost_usd)
        if not board.lock(epoch_lock(uid, 1)):  # nobody else knows this uid yet
            raise JournalError("could not lock epoch 1 of a fresh journal task", where=f"task #{task_id}")
        rec0 = initial_record(spec, assignee=None)
        board.write_initial(task_id, uid, spec, rec0)
        view = self._view(task_id, uid, spec, {0: rec0}, Column.QUEUED)
        return self._from_claim(view, row, spec, cost_usd)

    def _resume(self, row: st.TaskRow, spec: TaskSpec, cost_usd: float) -> Journaled:
        """The receipt was taken before (a retry, or a journal cut short): finish it."""
        reference = receipt_reference(actor_for(row.caller), row.message_id)
        found = self.fab.board.find_by_reference(reference)
        if found is None:
            raise JournalError(
                "the receipt is taken but no task carries it", where=f"message {row.message_id}"
            )
        view = self.fab.board.read(found.id)
        if view.current is None:
            view = repair_unrecorded(self.fab.board, view) or view
        cur, uid = view.current, view.uid
        if cur is None or uid is None or view.spec is None:
            raise JournalError("the journal task has no records", where=f"task #{view.id}")
        if cur.state == State.QUEUED and cur.epoch == 0:
            if not self.fab.board.lock(epoch_lock(uid, 1)):
                # Our own earlier attempt may hold e1 without a record: write it now.
                fresh = self.fab.board.read(view.id)
                if fresh.epoch >= 1:
                    return self._resume_from(fresh, row, cost_usd)
            return self._from_claim(view, row, view.spec, cost_usd)
        return self._resume_from(view, row, cost_usd)

    def _resume_from(self, view: TaskView, row: st.TaskRow, cost_usd: float) -> Journaled:
        cur = view.current
        assert cur is not None and view.uid is not None and view.spec is not None
        if cur.state == State.WORKING and cur.owner == self.owner and cur.epoch == 1:
            lease = Lease(view.id, view.uid, 1, self.owner, cur.lease_until or 0.0, cur.attempt, view.spec)
            return self._finish(lease, view, row, cost_usd)
        if cur.state == State.QUEUED and cur.epoch == 0:
            # e1 locked by our earlier attempt, never recorded: record it under our lock.
            return self._from_claim(view, row, view.spec, cost_usd, locked=True)
        if cur.state in (State.WORKING, State.QUEUED, State.INPUT_REQUIRED):
            raise JournalError(
                f"the journal task is {cur.state.value} under {cur.owner or cur.by}", where=f"task #{view.id}"
            )
        return Journaled(view.id, view.uid, cur.state)  # already finished

    def _from_claim(
        self, view: TaskView, row: st.TaskRow, spec: TaskSpec, cost_usd: float, *, locked: bool = True
    ) -> Journaled:
        assert view.uid is not None
        now = self.fab.clock()
        rec1 = Record(
            epoch=1,
            state=State.WORKING,
            op="claim",
            by=self.owner,
            at=now,
            owner=self.owner,
            lease_until=now + JOURNAL_LEASE_SECONDS,
            attempt=1,
        )
        self.fab.board.write_record(
            view,
            rec1,
            comment=f"Answered synchronously over A2A for `{row.caller}` by "
            f"{self.owner} (A2A task {row.task_id}); journaled afterwards.",
        )
        lease = Lease(view.id, view.uid, 1, self.owner, rec1.lease_until or now, 1, spec)
        working = self._view(
            view.id,
            view.uid,
            spec,
            {**view.records, 1: rec1},
            Column.WORKING,
            lane=view.task.swimlane_id,
        )
        return self._finish(lease, working, row, cost_usd)

    def _finish(self, lease: Lease, view: TaskView, row: st.TaskRow, cost_usd: float) -> Journaled:
        ledger = self.fab.ledger
        if row.state == st.COMPLETED:
            name = "result-e1.md"
            ref = f"kanboard://task/{lease.task_id}/file/{name}"
            blob = base64.b64encode((row.result or "").encode()).decode()
            ledger.complete(
                lease,
                ref,
                files=[(name, blob)],
                extra_meta={META_COST: f"{cost_usd:.6f}"} if cost_usd else None,
            )
            return Journaled(lease.task_id, lease.uid, State.DONE)
        if row.state == st.CANCELED:
            ledger.cancel(
                lease.task_id, actor_for(row.caller), row.error or "canceled by the A2A caller", view=view
            )
            return Journaled(lease.task_id, lease.uid, State.CANCELED)
        ledger.fail(lease, row.error or "the sync call failed", poison=True)
        return Journaled(lease.task_id, lease.uid, State.DEAD)

    def _view(
        self,
        task_id: int,
        uid: str,
        spec: TaskSpec,
        records: dict[int, Record],
        column: Column,
        *,
        lane: int = 0,
    ) -> TaskView:
        layout = self.fab.board.layout
        row = BoardTask(
            id=task_id, column_id=layout.columns[column], swimlane_id=lane or layout.swimlane(spec.queue)
        )
        return TaskView(
            id=task_id, task=row, uid=uid, spec=spec, records=records, meta={}, read_at=self.fab.clock()
        )


def reconcile(store: st.CallStore, journal: Journal, *, reason: str) -> dict[str, int]:
    """At start: sync calls left working by a dead server become failed; journal the rest.

    Returns counts: ``interrupted`` (working rows marked failed) and ``journaled``.
    Journal failures are logged and left pending (the server retries them later).
    """
    interrupted = 0
    for row in store.in_state(st.SYNC, st.WORKING):
        row.state, row.error, row.journal = st.FAILED, reason, st.J_PENDING
        store.save(row)
        interrupted += 1
    journaled = flush(store, journal)
    return {"interrupted": interrupted, "journaled": journaled}


def flush(store: st.CallStore, journal: Journal) -> int:
    """Journal every pending sync task; returns how many landed."""
    done = 0
    for row in store.unjournaled():
        try:
            j = journal.record(row)
        except FabricError as exc:
            log.warning("sync task %s: not journaled yet (%s)", row.task_id, exc.line())
            continue
        row.board_task_id, row.board_uid, row.journal = j.task_id, j.uid, st.J_DONE
        store.save(row, touch=False)
        done += 1
    return done
