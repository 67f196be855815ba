"""The epoch ledger: atomic transitions on a store with no compare-and-set.

A task moves through epochs 0, 1, 2, … Winning epoch n+1 means creating the lock tag
``<uid>/e<n+1>`` in the locks project: Kanboard's UNIQUE(project_id, name) index lets
exactly one concurrent caller create it. Only the winner writes the record for n+1; the
current state is the record with the highest epoch, so a late write for an old epoch
can never clobber a newer one.

The promise is exactly-once *ownership* per epoch and at-least-once *execution*. Side
effects get idempotency keys that stay stable across owners (see :meth:`Ledger.effect`).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from fabric.errors import EXIT_LOST, FabricError, InvalidInput
from fabric.kanboard.layout import META_GAP, effect_key, epoch_lock, evidence_key, record_key
from fabric.kanboard.port import BoardError
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.taskboard import TaskBoard, TaskView
from fabric.plain import Plain
from fabric.task import TERMINAL, Record, State, TaskSpec

Clock = Callable[[], float]


class LedgerError(FabricError):
    """A transition could not be made."""


class LostRace(LedgerError):
    """Someone else won epoch n+1 first (or its lock is held with no record yet: a gap)."""

    exit_code = EXIT_LOST

    def __init__(self, task_id: int, epoch: int, *, gap: bool = False) -> None:
        self.task_id = task_id
        self.epoch = epoch
        self.gap = gap
        what = (
            f"epoch {epoch} is locked but has no record yet (a gap; it resolves by itself)"
            if gap
            else f"another actor made transition to epoch {epoch} first"
        )
        super().__init__(what, where=f"task #{task_id}", hint="read the task again")


class Fenced(LedgerError):
    """The caller's lease is gone: a higher epoch exists. Stop; nothing more is accepted."""

    exit_code = EXIT_LOST

    def __init__(self, task_id: int, held: int, current: int) -> None:
        self.task_id = task_id
        self.held = held
        self.current = current
        super().__init__(
            f"lease on epoch {held} is fenced (the task is at epoch {current})",
            where=f"task #{task_id}",
            hint="stop working on it; late output is kept only as evidence",
        )


class IllegalTransition(LedgerError):
    """The move is not allowed from the task's state, or not by this actor."""


class NotHolder(LedgerError):
    """The caller names a lease it does not hold (wrong owner or epoch): a fencing outcome."""

    exit_code = EXIT_LOST


# The state machine: which operation may leave which state.
LEGAL: dict[str, frozenset[State]] = {
    "claim": frozenset({State.QUEUED}),
    "complete": frozenset({State.WORKING}),
    "fail": frozenset({State.WORKING}),
    "ask": frozenset({State.WORKING}),
    "release": frozenset({State.WORKING}),
    "resume": frozenset({State.INPUT_REQUIRED}),
    "requeue": frozenset({State.WORKING}),
    "cancel": frozenset({State.QUEUED, State.WORKING, State.INPUT_REQUIRED}),
    "dead_letter": frozenset({State.QUEUED, State.WORKING, State.INPUT_REQUIRED}),
    "verify": frozenset({State.DONE}),
    "reopen": frozenset({State.DONE}),
    "revive": frozenset({State.DEAD}),
    "drop": frozenset({State.DEAD}),
}
# The result a person's approval of a gate records: the approval is the work, so the
# approver may also close it (verify), unlike a producer its own result.
APPROVAL_REF = "kanboard:approved"
OWNER_OPS = frozenset({"complete", "fail", "ask", "release"})


class Lease(Plain):
    """Ownership of a task's working epoch, held by one worker until fenced or released."""

    task_id: int
    uid: str
    epoch: int
    owner: str
    lease_until: float
    attempt: int
    spec: TaskSpec
    # Questions asked and answers given in earlier epochs, oldest first:
    # (("question", text), ("answer", text), …). The executor shows them to the model.
    conversation: tuple[tuple[str, str], ...] = ()
    # Where to resume: the latest checkpoint carried to this epoch (None = from scratch).
    checkpoint: str | None = None
    # The length the lease was claimed for; a renewal that names none keeps it.
    lease_seconds: float | None = None
    # Receipts that count for this round of work (op, receipt), carried in the records.
    receipts: tuple[tuple[str, str], ...] = ()
    # False while only the epoch's lock is won (a claim with ``record_later``): the
    # owner's first write of any kind carries its working record.
    recorded: bool = True

    def receipt(self, op: str) -> str | None:
        """The receipt of side effect ``op`` this lease may rely on (None: not done)."""
        return dict(self.receipts).get(op)

    def idempotency_key(self, op: str) -> str:
        """A key for side effect ``op`` in this epoch: (task uid, epoch, operation)."""
        return f"{self.uid}:e{self.epoch}:{op}"


class Effect(Plain):
    """A side effect's identity, and its receipt if an earlier owner already applied it."""

    op: str
    key: str
    receipt: str | None

    @property
    def done(self) -> bool:
        return self.receipt is not None


def backoff_delay(base: float, attempt: int, *, cap: float = 3600.0) -> float:
    """Exponential backoff with jitter for retry ``attempt`` (1 = first retry)."""
    delay: float = min(cap, base * (2 ** max(0, attempt - 1)))
    return float(delay * random.uniform(0.8, 1.2))


class Ledger:
    """Transitions, leases, fencing and side-effect keys over a :class:`TaskBoard`."""

    def __init__(
        self,
        board: TaskBoard,
        *,
        clock: Clock = time.time,
        gap_timeout: float = 30.0,
        gap_grace: float = 2.0,
        recheck_after: float = 3600.0,
        verifier: Callable[[TaskSpec], str | None] | None = None,
    ) -> None:
        self.board = board
        # Who verifies a done task (a person's Kanboard username): its card is assigned to
        # them, so "please verify" is in their "My tasks". The Fabric sets it from the cards.
        self.verifier = verifier
        self.clock = clock
        self.gap_timeout = gap_timeout
        self.gap_grace = gap_grace
        self._suspects: dict[tuple[int, int], float] = {}
        # Lock tags are garbage-collected only for tasks closed longer than a retention
        # period (days). A transition whose basis read is older than this re-checks
        # for a newer record before writing (docs/DESIGN.md, the epoch ledger, rule 7).
        self.recheck_after = recheck_after

    # -- reading --------------------------------------------------------------------

    def read(self, task_id: int) -> TaskView:
        """The task as the board has it now."""
        view = self.board.read(task_id)
        return view

    def _require(self, view: TaskView) -> tuple[str, Record]:
        if view.uid is None or view.current is None:
            raise LedgerError(
                "the task has no fabric records (not a fabric task, or its submit is still in flight)",
                where=f"task #{view.id}",
            )
        # Its epoch locks are its own project's: another project's task (a confined
        # agent's home) is never moved from here, or an epoch could be won twice.
        self.board.check_own(view)
        return view.uid, view.current

    # -- the transition core ----------------------------------------------------------

    def _transition(
        self,
        view: TaskView,
        op: str,
        by: str,
        make: Callable[[int, Record], Record],
        *,
        comment: str | None = None,
        close: bool = False,
        reopen: bool = False,
        files: Iterable[tuple[str, str]] = (),
        extra_meta: dict[str, str] | None = None,
        result_url: str | None = None,
        held: int | None = None,
        record_later: bool = False,
    ) -> Record:
        """Win epoch n+1 with its lock tag, then write its record and projections (the
        board rewrites the card when what it asks of a person changes: same round trip).

        ``held``: this caller already won that epoch's lock (TaskBoard.read_and_lock, on
        a basis read before it); it must be n+1. ``record_later``: win the lock only and
        return the record unwritten (see :meth:`claim`).
        """
        uid, current = self._require(view)
        if current.state not in LEGAL[op]:
            raise IllegalTransition(
                f"cannot {op.replace('_', ' ')} a task that is {current.state.value}",
                where=f"task #{view.id} (epoch {current.epoch})",
                hint=f"{op} is allowed from: {', '.join(sorted(s.value for s in LEGAL[op]))}",
            )
        nxt = current.epoch + 1
        if held is not None:
            if held != nxt:
                raise LostRace(view.id, nxt)  # a basis other than the one the lock was won on
        elif not self.board.lock(epoch_lock(uid, nxt)):
            self._after_lost_lock(view, nxt)
        if self.clock() - view.read_at > self.recheck_after:
            fresh = self.board.read(view.id)
            if fresh.epoch >= nxt:
                raise LostRace(view.id, nxt)
        record = make(nxt, current)
        if record_later:
            return record
        self._write(
            view,
            record,
            comment=comment,
            close=close,
            reopen=reopen,
            files=tuple(files),
            extra_meta=extra_meta,
            result_url=result_url,
        )
        return record

    def _write(self, view: TaskView, record: Record, **kw: Any) -> None:
        # Writing our own epoch's record is idempotent, so an ambiguous failure may be
        # retried; if it never lands, the epoch is a gap and resolves as one.
        for attempt in range(3):
            try:
                self.board.write_record(view, record, **kw)
                return
            except BoardError:
                if attempt == 2:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _after_lost_lock(self, view: TaskView, nxt: int) -> None:
        """We lost epoch ``nxt``: a live winner, or a winner that died before its record.

        A live winner writes its record right after its lock, so one loss proves nothing:
        it is remembered. Only when the same epoch is still unrecorded at a later loss,
        ``gap_grace`` seconds on, is the gap noted on the task for anyone to resolve.
        """
        self.lost(self.board.read(view.id), nxt)

    def lost(self, fresh: TaskView, nxt: int) -> None:
        """Epoch ``nxt`` was lost, and ``fresh`` was read no earlier than the losing
        attempt's basis (:meth:`_after_lost_lock` reads it anew; a read-and-lock's own read
        will do): raise :class:`LostRace`, noting a gap as :meth:`_after_lost_lock` says."""
        if fresh.epoch >= nxt:
            raise LostRace(fresh.id, nxt)
        view = fresh
        now = self.clock()
        note = fresh.gap
        if note is not None and note.epoch == nxt:
            raise LostRace(view.id, nxt, gap=True)
        first = self._suspects.setdefault((view.id, nxt), now)
        if now - first >= self.gap_grace:
            self.board.save_meta(view.id, {META_GAP: json.dumps({"epoch": nxt, "seen": first})})
            self._suspects.pop((view.id, nxt), None)
        if len(self._suspects) > 10_000:  # a bounded memory of suspicions
            self._suspects.clear()
        raise LostRace(view.id, nxt, gap=True)

    def _record(self, nxt: int, prev: Record, state: State, op: str, by: str, **fields: Any) -> Record:
        base: dict[str, Any] = {
            "attempt": prev.attempt,
            "checkpoint": prev.checkpoint,
            "receipts": prev.receipts,
        }
        base.update(fields)
        return Record(epoch=nxt, state=state, op=op, by=by, at=self.clock(), **base)

    # -- worker transitions ----------------------------------------------------------

    def claim(
        self,
        view: TaskView,
        worker: str,
        *,
        lease_seconds: float,
        held: int | None = None,
        record_later: bool = False,
    ) -> Lease:
        """Take a queued task: win the next epoch (or use the one ``held``), start an
        attempt, hold a lease.

        ``record_later``: win the epoch's lock and write nothing. The lock alone makes
        the claim (only its winner may write the epoch), and until its record lands the
        task reads as a young gap, which nobody resolves before ``gap_timeout``. The
        owner's first write carries the record: :meth:`show` once the work outlasts a
        moment, a renewal, a checkpoint or an effect's check, or the outcome's own
        batch. Work done sooner costs its claim no write at all.
        """
        uid, current = self._require(view)
        assert view.spec is not None
        now = self.clock()
        if current.state == State.QUEUED and current.not_before and current.not_before > now:
            raise IllegalTransition(
                "the task is not due yet",
                where=f"task #{view.id}",
                hint=f"it may start after {current.not_before:.0f}",
            )
        lease_until = now + lease_seconds
        rec = self._transition(
            view,
            "claim",
            worker,
            lambda n, p: self._record(
                n,
                p,
                State.WORKING,
                "claim",
                worker,
                owner=worker,
                lease_until=lease_until,
                attempt=p.attempt + 1,
                lease_seconds=lease_seconds,
            ),
            comment=None,
            held=held,
            record_later=record_later,
        )
        return Lease(
            view.id,
            uid,
            rec.epoch,
            worker,
            lease_until,
            rec.attempt,
            view.spec,
            conversation(view),
            rec.checkpoint,
            lease_seconds,
            _pairs(rec.receipts),
            recorded=not record_later,
        )

    def show(self, lease: Lease) -> Lease:
        """Move a ``record_later`` claim's card to Working, its record written first if
        it is not yet.

        That record is written and read back (:meth:`_write_own`: raises
        :class:`Fenced`), so the card moves only for an epoch still the highest; the
        move is stamped as the fabric's own (TaskBoard.show_working). A move that fails
        is left to the keeper, which puts a card lagging its record right: the lease
        returned is recorded either way.
        """
        if not lease.recorded:
            lease = self._write_own(lease)
        with contextlib.suppress(BoardError):
            self.board.show_working(lease.task_id, lease.epoch)
        return lease

    def held(self, view: TaskView, epoch: int, owner: str) -> Lease:
        """The lease ``owner`` holds on ``epoch`` of a task, rebuilt from its records.

        For callers that keep no lease object between commands (``agap complete``, an
        external runtime): refuses when that owner holds no working lease on that epoch.
        The lease carries the checkpoint and conversation, so a renewal or completion
        under it never drops where the work had got to.
        """
        rec = view.records.get(epoch)
        if (
            rec is None
            or rec.state != State.WORKING
            or rec.owner != owner
            or view.uid is None
            or view.spec is None
        ):
            raise NotHolder(
                f"{owner!r} holds no working lease on epoch {epoch}",
                where=f"task #{view.id}",
                hint="use the epoch and owner that `agap claim` printed",
            )
        return Lease(
            view.id,
            view.uid,
            epoch,
            owner,
            rec.lease_until or 0.0,
            rec.attempt,
            view.spec,
            conversation(view),
            rec.checkpoint,
            rec.lease_seconds,
            _pairs(rec.receipts),
        )

    def check(self, lease: Lease) -> TaskView:
        """Raise :class:`Fenced` unless ``lease`` still holds the highest epoch.

        A lease whose record is not written yet writes it in the same round trip as the
        read (its epoch would otherwise read as not yet reached)."""
        if lease.recorded:
            view = self.board.read(lease.task_id)
        else:
            view = self.board.save_meta_and_read(
                lease.task_id, {record_key(lease.epoch): self._own_record(lease).to_meta()}
            )
        if view.epoch != lease.epoch:
            raise Fenced(lease.task_id, lease.epoch, view.epoch)
        return view

    def renew(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """Extend the lease by rewriting the owner's own record; raise :class:`Fenced`.

        Without ``lease_seconds`` the lease is renewed for the length it was claimed for.
        The rewrite and the check share one round trip: rewriting one's own epoch record
        can never change the current state, so writing it when already fenced is harmless.
        """
        length = lease_seconds if lease_seconds is not None else lease.lease_seconds
        if length is None:
            raise InvalidInput(
                "this lease records no length to keep",
                where=f"task #{lease.task_id}",
                hint="pass the lease length (--lease SECONDS)",
            )
        until = self.clock() + length
        return self._rewrite_own(lease, until, lease.checkpoint)

    def checkpoint(self, lease: Lease, ref: str) -> Lease:
        """Record where the work has got to (a ref), under the owner's epoch.

        It is written into the owner's own record, like a renewal. Transitions carry the
        checkpoint they read into the next record, so a new owner after a requeue resumes
        from it, and one written after the epoch ended (a fenced owner's) is never carried:
        this call raises :class:`Fenced` then, and the write is inert.
        """
        return self._rewrite_own(lease, lease.lease_until, ref)

    def _rewrite_own(self, lease: Lease, until: float, checkpoint: str | None) -> Lease:
        return self._write_own(replace(lease, lease_until=until, checkpoint=checkpoint))

    def _write_own(self, lease: Lease) -> Lease:
        """Rewrite the owner's record as ``lease`` says; raise :class:`Fenced` if it is not current.

        One round trip writes and reads back: a record rewritten for an epoch that is no
        longer the highest changes nothing, and the read says so.
        """
        record = self._own_record(lease)
        view = self.board.save_meta_and_read(lease.task_id, {record_key(lease.epoch): record.to_meta()})
        if view.epoch != lease.epoch:
            raise Fenced(lease.task_id, lease.epoch, view.epoch)
        return lease if lease.recorded else replace(lease, recorded=True)

    def _own_record(self, lease: Lease) -> Record:
        """The working record ``lease`` stands for."""
        return Record(
            epoch=lease.epoch,
            state=State.WORKING,
            op="claim",
            by=lease.owner,
            at=self.clock(),
            owner=lease.owner,
            lease_until=lease.lease_until,
            attempt=lease.attempt,
            checkpoint=lease.checkpoint,
            lease_seconds=lease.lease_seconds,
            receipts=dict(lease.receipts) or None,
        )

    def _owner_view(self, lease: Lease) -> TaskView:
        """A view good enough to transition from the lease's epoch (no extra read).

        If anyone moved past our epoch, its lock exists and our transition loses: the lock
        is the check, so the owner's transitions cost no read.
        """
        record = self._own_record(lease)
        return TaskView(
            id=lease.task_id,
            task=BoardTask(id=lease.task_id),
            uid=lease.uid,
            spec=lease.spec,
            records={lease.epoch: record},
            meta={},
            read_at=self.clock(),
        )

    def _as_owner(self, lease: Lease, op: str, make: Callable[[int, Record], Record], **kw: Any) -> Record:
        if not lease.recorded:
            # The claim's record rides in the outcome's own metadata write (one call).
            own = {record_key(lease.epoch): self._own_record(lease).to_meta()}
            kw["extra_meta"] = {**own, **(kw.get("extra_meta") or {})}
        try:
            return self._transition(self._owner_view(lease), op, lease.owner, make, **kw)
        except LostRace as exc:
            if exc.gap:
                raise
            current = self.board.read(lease.task_id).epoch
            raise Fenced(lease.task_id, lease.epoch, current) from None

    def complete(
        self,
        lease: Lease,
        result_ref: str,
        *,
        note: str | None = None,
        files: Iterable[tuple[str, str]] = (),
        extra_meta: dict[str, str] | None = None,
        result_url: str | None = None,
    ) -> Record:
        """Done, unverified: the owner reports its result by reference.

        The card goes to the person who verifies it (:attr:`verifier`) and its description
        links the result (``result_url``: the attachment's page, when the caller knows it).
        """
        text = f"Done by {lease.owner} (epoch {lease.epoch + 1}). Result: {result_ref}"
        if result_url:
            text += f" ([open]({result_url}))"
        verifier = self.verifier(lease.spec) if self.verifier is not None else None
        return self._as_owner(
            lease,
            "complete",
            lambda n, p: self._record(
                n,
                p,
                State.DONE,
                "complete",
                lease.owner,
                result_ref=result_ref,
                reason=note,
                assignee=verifier,
            ),
            comment=text + (f"\n\n{note}" if note else ""),
            files=files,
            extra_meta=extra_meta,
            result_url=result_url,
        )

    def fail(self, lease: Lease, reason: str, *, poison: bool = False, backoff_base: float = 5.0) -> Record:
        """Failed attempt: retry after a backoff, or dead letter when attempts are spent."""
        spec = lease.spec
        dead = poison or lease.attempt >= spec.max_attempts
        if dead:
            why = "poison" if poison else f"attempts exhausted ({lease.attempt}/{spec.max_attempts})"
            return self._as_owner(
                lease,
                "fail",
                lambda n, p: self._record(n, p, State.DEAD, "fail", lease.owner, reason=f"{why}: {reason}"),
                comment=f"Dead letter ({why}): {reason}",
            )
        not_before = self.clock() + backoff_delay(backoff_base, lease.attempt)
        return self._as_owner(
            lease,
            "fail",
            lambda n, p: self._record(
                n, p, State.QUEUED, "fail", lease.owner, reason=reason, not_before=not_before
            ),
            comment=(
                f"Attempt {lease.attempt}/{spec.max_attempts} failed: {reason}. Retrying after a backoff."
            ),
        )

    def ask(self, lease: Lease, question: str, human: str) -> Record:
        """Input required: the task waits in ``human``'s inbox with the question."""
        return self._as_owner(
            lease,
            "ask",
            # Asking is not a failed attempt: give the attempt back, as release does.
            lambda n, p: self._record(
                n,
                p,
                State.INPUT_REQUIRED,
                "ask",
                lease.owner,
                assignee=human,
                reason=question,
                attempt=max(0, p.attempt - 1),
            ),
            comment=f"Question for @{human}: {question}\n\n(Answer in a comment, then move "
            f"the card back to Queued.)",
        )

    def release(self, lease: Lease, reason: str = "worker stopping") -> Record:
        """Give the task back to the queue without counting a failure (clean shutdown)."""
        return self._as_owner(
            lease,
            "release",
            lambda n, p: self._record(
                n, p, State.QUEUED, "release", lease.owner, attempt=max(0, p.attempt - 1), reason=reason
            ),
            comment=f"Released by {lease.owner}: {reason}",
        )

    # -- everyone else's transitions --------------------------------------------------

    def resume(
        self, task_id: int, by: str, answer: str | None = None, view: TaskView | None = None
    ) -> Record:
        """A human answered: the task goes back to its queue."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "resume",
            by,
            lambda n, p: self._record(n, p, State.QUEUED, "resume", by, reason=answer),
            comment=f"Resumed by {by}" + (f": {answer}" if answer else ""),
        )

    def cancel(self, task_id: int, by: str, reason: str = "", view: TaskView | None = None) -> Record:
        """Stop the task for good (closed, state canceled). A working owner gets fenced."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "cancel",
            by,
            lambda n, p: self._record(n, p, State.CANCELED, "cancel", by, reason=reason),
            comment=f"Canceled by {by}" + (f": {reason}" if reason else ""),
            close=True,
        )

    def requeue_expired(self, view: TaskView, by: str = "keeper") -> Record:
        """The owner's lease ran out: back to the queue, or dead letter if attempts are spent."""
        _, current = self._require(view)
        if current.state != State.WORKING:
            raise IllegalTransition(
                f"cannot requeue a task that is {current.state.value}", where=f"task #{view.id}"
            )
        now = self.clock()
        if current.lease_until is not None and current.lease_until > now:
            raise IllegalTransition(
                "the lease has not expired",
                where=f"task #{view.id}",
                hint=f"it runs until {current.lease_until:.0f}",
            )
        assert view.spec is not None
        if current.attempt >= view.spec.max_attempts:
            return self._transition(
                view,
                "requeue",
                by,
                lambda n, p: self._record(
                    n, p, State.DEAD, "requeue", by, reason=f"lease of {p.owner} expired on the last attempt"
                ),
                comment=f"Dead letter: the lease of {current.owner} expired on attempt "
                f"{current.attempt}/{view.spec.max_attempts}.",
            )
        return self._transition(
            view,
            "requeue",
            by,
            lambda n, p: self._record(
                n, p, State.QUEUED, "requeue", by, reason=f"lease of {p.owner} expired"
            ),
            comment=f"Requeued: the lease of {current.owner} expired (attempt "
            f"{current.attempt}/{view.spec.max_attempts}).",
        )

    def dead_letter(
        self, task_id: int, by: str, reason: str, view: TaskView | None = None, *, held: int | None = None
    ) -> Record:
        """Move a task to the dead letter column (poison, or given up on)."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "dead_letter",
            by,
            lambda n, p: self._record(n, p, State.DEAD, "dead_letter", by, reason=reason),
            comment=f"Dead letter ({by}): {reason}",
            held=held,
        )

    def restate(self, view: TaskView, held: int, by: str, reason: str) -> Record:
        """Write the epoch ``held`` (won, but not to be used: e.g. a claim whose basis
        turned out not claimable) as the task's current state again, so it is no gap."""
        _, current = self._require(view)
        if held != current.epoch + 1:
            raise LostRace(view.id, current.epoch + 1)
        record = self._record(
            held,
            current,
            current.state,
            "restate",
            by,
            owner=current.owner,
            lease_until=current.lease_until,
            not_before=current.not_before,
            assignee=current.assignee,
            result_ref=current.result_ref,
            lease_seconds=current.lease_seconds,
            reason=reason,
        )
        self._write(view, record)
        return record

    def verify(self, task_id: int, by: str, note: str = "", view: TaskView | None = None) -> Record:
        """Close a done task as verified. The producer may not verify its own work.

        The producer is an agent, not one process of it: the agent whose queue ran the task,
        and the one named by the completing owner (``agent@host:pid``), whatever instance
        asks.
        """
        view = view or self.board.read(task_id)
        _, current = self._require(view)
        approval = current.result_ref == APPROVAL_REF
        if current.state == State.DONE and not approval and _agent(by) in _producers(current, view.spec):
            raise IllegalTransition(
                "the producer may not verify its own result",
                where=f"task #{task_id}",
                hint="the submitter, a human or a reviewer closes it",
            )
        return self._transition(
            view,
            "verify",
            by,
            lambda n, p: self._record(
                n, p, State.CLOSED, "verify", by, result_ref=p.result_ref, reason=note or None
            ),
            comment=f"Verified by {by}" + (f": {note}" if note else ""),
            close=True,
        )

    def reopen(self, task_id: int, by: str, reason: str, view: TaskView | None = None) -> Record:
        """Verification failed: the done task goes back to its queue."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "reopen",
            by,
            # A new round of work: the rejected round's receipts are not carried.
            lambda n, p: self._record(n, p, State.QUEUED, "reopen", by, reason=reason, receipts=None),
            comment=f"Reopened by {by}: {reason}",
        )

    def revive(self, task_id: int, by: str, reason: str = "", view: TaskView | None = None) -> Record:
        """Give a dead-lettered task a fresh set of attempts."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "revive",
            by,
            lambda n, p: self._record(n, p, State.QUEUED, "revive", by, attempt=0, reason=reason or None),
            comment=f"Revived by {by}" + (f": {reason}" if reason else ""),
        )

    def drop(self, task_id: int, by: str, reason: str = "", view: TaskView | None = None) -> Record:
        """Give up on a dead letter for good: closed, state dropped (not canceled)."""
        view = view or self.board.read(task_id)
        return self._transition(
            view,
            "drop",
            by,
            lambda n, p: self._record(n, p, State.DROPPED, "drop", by, reason=reason or None),
            comment=f"Dropped by {by}" + (f": {reason}" if reason else ""),
            close=True,
        )

    # -- gaps ---------------------------------------------------------------------------

    def gap_due(self, view: TaskView) -> bool:
        """True when the task has a gap (lock without record) older than the timeout."""
        note = view.gap
        return (
            note is not None and note.epoch == view.epoch + 1 and self.clock() - note.seen >= self.gap_timeout
        )

    def resolve_gap(self, view: TaskView, by: str = "keeper") -> Record:
        """Step over a gap: win epoch n+2 and restate the task (working becomes queued)."""
        uid, current = self._require(view)
        note = view.gap
        if note is None or note.epoch != current.epoch + 1:
            raise IllegalTransition("the task has no gap to resolve", where=f"task #{view.id}")
        nxt = note.epoch + 1
        if not self.board.lock(epoch_lock(uid, nxt)):
            raise LostRace(view.id, nxt)
        if current.state == State.WORKING:
            state, attempt, owner, lease = State.QUEUED, current.attempt, None, None
        else:
            state, attempt = current.state, current.attempt
            owner, lease = current.owner, current.lease_until
        record = Record(
            epoch=nxt,
            state=state,
            op="resolve_gap",
            by=by,
            at=self.clock(),
            owner=owner,
            lease_until=lease,
            attempt=attempt,
            not_before=current.not_before,
            assignee=current.assignee,
            result_ref=current.result_ref,
            checkpoint=current.checkpoint,
            receipts=current.receipts,
            reason=f"epoch {note.epoch} was locked but never recorded",
        )
        self._write(
            view,
            record,
            comment=f"Gap at epoch {note.epoch} resolved by {by}: the task is "
            f"{state.value} again (epoch {nxt}).",
        )
        return record

    # -- side effects ----------------------------------------------------------------

    def effect(self, lease: Lease, op: str) -> Effect:
        """Before a side effect: check ownership, record the intent, get a stable key.

        The key comes from the first epoch of this round of work that recorded an intent
        for ``op``, so a new owner after a requeue reuses it and the receiving system can
        deduplicate; a reopen starts a new round, with a new key. The effect is already
        done only when the current record carries its receipt (see :meth:`effect_done`).
        """
        view = self.check(lease)
        current = view.records[lease.epoch]
        key = _intent_key(view, op)
        receipt = (current.receipts or {}).get(op)
        if key is not None or receipt is not None:
            return Effect(op, key or lease.idempotency_key(op), receipt)
        key = lease.idempotency_key(op)
        view = self.board.save_meta_and_read(
            lease.task_id,
            {effect_key(op): json.dumps({"key": key, "epoch": lease.epoch, "intent_at": self.clock()})},
        )
        if view.epoch != lease.epoch:
            raise Fenced(lease.task_id, lease.epoch, view.epoch)
        return Effect(op, key, None)

    def effect_done(self, lease: Lease, effect: Effect, receipt: str) -> Lease:
        """After a side effect: keep its receipt, with authority, so no later owner repeats it.

        The receipt goes into the owner's own record in the round trip that checks the
        epoch is still the highest, as a renewal does. Written in time, the next transition
        carries it; written after the epoch ended, it is never carried, and this raises
        :class:`Fenced`: a fenced owner's receipt is evidence, not a result to adopt.
        Returns the lease with the receipt (renewals must keep it).
        """
        receipts = dict(lease.receipts)
        receipts[effect.op] = receipt
        return self._write_own(replace(lease, receipts=tuple(sorted(receipts.items()))))

    def keep_evidence(self, lease: Lease, text: str, *, stored: str | None = None) -> None:
        """Keep a fenced owner's late output as evidence, never as the result.

        ``stored`` names a copy the owner already stored (a ``result-e<n>`` file): the
        comment says it is not the result.
        """
        self.board.save_meta(lease.task_id, {evidence_key(lease.epoch): text[:8000]})
        copy = f" Its stored copy {stored} is not the result either." if stored else ""
        self.board.comment(
            lease.task_id,
            f"Late output from {lease.owner} (epoch "
            f"{lease.epoch}, fenced): kept as evidence, not as the result.{copy}",
        )


def conversation(view: TaskView) -> tuple[tuple[str, str], ...]:
    """What the work has been told so far, in order: questions asked (``ask``), answers
    given (``resume``) and the reasons a result was sent back (``reopen``)."""
    kinds = {"ask": "question", "resume": "answer", "reopen": "reopen"}
    lines: list[tuple[str, str]] = []
    for _, rec in sorted(view.records.items()):
        if rec.op in kinds and rec.reason:
            lines.append((kinds[rec.op], rec.reason))
    return tuple(lines)


def _intent_key(view: TaskView, op: str) -> str | None:
    """The key an earlier owner of this round of work recorded for ``op`` (None: none yet).

    An intent recorded before the latest reopen belongs to the rejected round: a new key,
    so the receiving system does not answer the rework with the rejected call's result.
    """
    raw = view.meta.get(effect_key(op))
    if not raw:
        return None
    try:
        known = json.loads(raw)
        key, epoch = str(known["key"]), int(known.get("epoch", 0))
    except (ValueError, KeyError, TypeError):
        return None
    reopened = max((e for e, r in view.records.items() if r.op == "reopen"), default=-1)
    return key if epoch > reopened else None


def _pairs(receipts: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((receipts or {}).items()))


def is_terminal(record: Record | None) -> bool:
    """True when no further work will happen (canceled, verified or dropped)."""
    return record is not None and record.state in TERMINAL


def _agent(identity: str) -> str:
    """The agent behind a worker identity: ``kimi@host:42`` is ``kimi``."""
    return identity.partition("@")[0]


def _producers(done: Record, spec: TaskSpec | None) -> set[str]:
    """Who made a done task's result: its completing owner, as an agent, and its target."""
    found = {done.by, _agent(done.by)}
    if done.owner:
        found.add(_agent(done.owner))
    if spec is not None:
        found.add(spec.target)
    return found
