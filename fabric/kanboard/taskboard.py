"""The fabric's view of a Kanboard board: tasks, their metadata, lock tags, projections.

Only :mod:`fabric.kanboard` knows Kanboard's method names and field names; the rest of
the fabric speaks in tasks, epochs and records, and reads typed rows
(:mod:`fabric.kanboard.rows`). Independent calls are batched: each public method here
costs one round trip unless it says otherwise. The keeper's wide reads and repairs are
in :mod:`fabric.kanboard.keeperstore`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from fabric.errors import ConfigError, InvalidInput
from fabric.kanboard.card import Sealed, derive_seal_key, parse_description, readable, render_description
from fabric.kanboard.cardtext import human_text, needs_rewrite, result_file, result_link_in, shows
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.fit import fit
from fabric.kanboard.layout import (
    META_PROJECTED,
    META_SPEC,
    META_UID,
    Column,
    column_fits,
    cron_key,
    epoch_lock,
    park_key,
    projected_column,
    receipt_reference,
    record_key,
)
from fabric.kanboard.moves import MOVE, MOVE_TOLERANCE, MOVE_TRIES, REPAIR_AGE, VERIFY_AFTER, MoveTracker
from fabric.kanboard.port import (
    BoardError,
    BoardRefused,
    BoardUnavailable,
    Call,
    MaybeDone,
    Outcome,
    RpcError,
    RpcPort,
)
from fabric.kanboard.resend import RETRIES, backoff, send
from fabric.kanboard.rows import (
    BoardComment,
    BoardFile,
    BoardTask,
    comment_rows,
    file_rows,
    meta_map,
    tag_rows,
    task_rows,
)
from fabric.kanboard.views import BoardLayout, TaskView, parse_cron_states, parse_park_states, parse_view
from fabric.kanboard.weblinks import WebLinks
from fabric.signals import pause
from fabric.task import Record, State, TaskSpec

# The views live in fabric.kanboard.views; most of the fabric imports them from here.
__all__ = [
    "BoardLayout",
    "TaskBoard",
    "TaskNotFound",
    "TaskView",
    "parse_park_states",
    "parse_view",
]


class TaskNotFound(InvalidInput):
    """No task with this id on the board."""

    def __init__(self, task_id: int) -> None:
        super().__init__(
            f"task #{task_id} does not exist", where="board", hint="`agap ls --all` lists the tasks"
        )
        self.task_id = task_id


def keep_closed(view: TaskView, calls: Sequence[Call], *, reopen: bool) -> bool:
    """True when ``calls`` move a closed card that is to stay closed: the fabric's move
    (``moveTaskToProject``) reopens a card, so the batch must close it again after."""
    return not view.is_open and not reopen and any(c.method == MOVE for c in calls)


#: The states whose card the keeper redraws when it lags its record (TaskBoard.redraw):
#: the ones a worker's own transition reaches that ask something of a person.
REDRAWN = frozenset({State.DONE, State.INPUT_REQUIRED})

MOVE_CHUNK = 50  # card moves a request of move_cards carries


class TaskBoard:
    """Fabric operations on one work project and its locks project."""

    def __init__(
        self,
        port: RpcPort,
        layout: BoardLayout,
        *,
        clock: Any = time.time,
        secret: str = "",
        links: WebLinks | None = None,
    ) -> None:
        # Every value goes through the fitting port: records, specs and answers longer
        # than a PostgreSQL/MySQL metadata column are stored in chunks (fabric.kanboard.fit).
        self.port = fit(port)
        self.layout = layout
        self.clock = clock
        # Seals the spec block of descriptions (fabric.kanboard.card): only the fabric's
        # own blocks are ever trusted to rebuild a task. Derived from the app token;
        # without it (a confined agent's board user) cards are written as they are.
        self._seal = derive_seal_key(secret) if secret else b""
        # Kanboard's pages for a task and its files, for the links on cards (None: the
        # board has no web address, e.g. one reached in process).
        self.links = links
        # The cards this connection moved, checked once competing moves have committed.
        self._moves = MoveTracker(clock)

    def sibling(self, layout: BoardLayout) -> TaskBoard:
        """The same connection on another project (a confined agent's home, the work one)."""
        twin = TaskBoard(self.port, layout, clock=self.clock, links=self.links)
        twin._seal = self._seal
        return twin

    # -- the card -------------------------------------------------------------------

    def sealed(self, description: str) -> Sealed | None:
        """The uid, spec and first assignee the fabric sealed into ``description``, or
        None (no block, or one whose seal this fabric did not make)."""
        return parse_description(description, self._seal)

    def readable(self, description: str) -> str:
        """A card's description as a person reads it in Kanboard (no sealed spec)."""
        return readable(description)

    def body(self, view: TaskView) -> str:
        """The card's Markdown without what it asks of a person and without the sealed spec:
        for a view that offers its own way to act (the read-only board view)."""
        spec, rec = view.spec, view.current
        if spec is None:
            return readable(view.task.description)
        url = result_link_in(view.task.description, rec.result_ref) if rec and rec.result_ref else None
        return "\n".join(human_text(spec, rec, links=self.links, result_url=url, asks=False))

    def describe(
        self,
        spec: TaskSpec,
        uid: str,
        *,
        assignee: str | None = None,
        record: Record | None = None,
        result_url: str | None = None,
    ) -> str:
        """The card's description for ``spec`` as ``record`` shows it (None: as submitted)."""
        return render_description(
            spec,
            uid,
            assignee=assignee,
            key=self._seal,
            record=record,
            links=self.links,
            result_url=result_url,
        )

    def _rewritten(self, view: TaskView, record: Record, result_url: str | None) -> str | None:
        """The description a transition to ``record`` gives the card, or None to keep it:
        rewritten when what the card asks of a person changes (a question, a result to
        verify, a dead letter), never without the seal (a rewrite nobody could verify)."""
        spec, uid = view.spec, view.uid
        if not self._seal or spec is None or uid is None or not needs_rewrite(spec, view.current, record):
            return None
        if result_url is None and record.result_ref:
            # Keep the link the card already gives: the file id is known only to the
            # process that attached it.
            result_url = result_link_in(view.task.description, record.result_ref)
        first = view.records.get(0)
        return self.describe(
            spec, uid, assignee=first.assignee if first else None, record=record, result_url=result_url
        )

    def redraw(self, views: Iterable[TaskView]) -> list[int]:
        """Rewrite the description of each open card that does not show what its record
        asks (:data:`REDRAWN`: a result to verify, a question): the ids redrawn.

        A confined agent's worker signs in as its own user and has no seal key, so it
        writes its records but leaves the card as it was submitted; the keeper, which has
        the key, draws it as any other card of that state reads. Nothing is read when no
        card lags; else one round trip for the result files' ids (for the viewer link) and
        one for the rewrites, each re-reading its task: a transition that landed meanwhile
        is drawn at once (a rewrite of ours must never stand for an older state).
        """
        if not self._seal:
            return []
        stale = [
            v
            for v in views
            if v.is_open
            and v.spec is not None
            and v.uid is not None
            and v.current is not None
            and v.current.state in REDRAWN
            and not shows(v.spec, v.current, v.task.description)
        ]
        if not stale:
            return []
        urls = self._result_urls(stale)
        calls = [c for v in stale for c in (self._redraw_call(v, urls.get(v.id)), *self.read_calls([v.id]))]
        out = self._batch(calls)
        moved = []
        for i, v in enumerate(stale):
            row, meta = out[3 * i + 1].unwrap(), out[3 * i + 2].unwrap()
            if row:
                now = parse_view(v.id, row, meta, self.clock())
                if now.epoch != v.epoch and now.spec is not None and now.uid is not None:
                    moved.append(now)
        if moved:
            urls = self._result_urls(moved)
            self._batch([self._redraw_call(v, urls.get(v.id)) for v in moved])
        return [v.id for v in stale]

    def _redraw_call(self, view: TaskView, result_url: str | None) -> Call:
        return Call("updateTask", {"id": view.id, "description": self.drawing(view, result_url)})

    def drawing(self, view: TaskView, result_url: str | None, record: Record | None = None) -> str:
        """The description the fabric draws for ``view`` as ``record`` (default: its current
        one) shows it, with the spec as ``view`` carries it (a person's terms included)."""
        assert view.spec is not None and view.uid is not None
        first = view.records.get(0)
        return self.describe(
            view.spec,
            view.uid,
            assignee=first.assignee if first else None,
            record=view.current if record is None else record,
            result_url=result_url,
        )

    def result_urls(self, views: Sequence[TaskView]) -> dict[int, str]:
        """The viewer links of the views' results, found from their attachments (never
        from what a card's text says: a person may have written it)."""
        return self._result_urls(views, keep=False)

    def _result_urls(self, views: Sequence[TaskView], *, keep: bool = True) -> dict[int, str]:
        """The viewer links of the views' results attached to their own tasks (one round
        trip, none when there is nothing to link); ``keep``: the link a card already gives,
        when it gives one (not for a description a person wrote)."""
        urls: dict[int, str] = {}
        wanted: dict[int, str] = {}  # task id -> the attachment whose file id is needed
        for v in views:
            ref = v.current.result_ref if v.current else None
            if not ref or self.links is None:
                continue
            if keep and (kept := result_link_in(v.task.description, ref)):
                urls[v.id] = kept
            elif (name := result_file(ref, v.id)) is not None:
                wanted[v.id] = name
        if not wanted or self.links is None:
            return urls
        out = self.port.batch([Call("getAllTaskFiles", {"task_id": t}) for t in wanted])
        for (tid, name), o in zip(wanted.items(), out, strict=True):
            ids = [f.id for f in file_rows(o.unwrap()) if f.name == name]
            if ids:
                urls[tid] = self.links.file(tid, max(ids))  # the newest of that name
        return urls

    # -- reading --------------------------------------------------------------------

    def read(self, task_id: int) -> TaskView:
        """The task's row and metadata (one round trip); :class:`TaskNotFound` if gone."""
        views = self.read_many([task_id])
        if task_id not in views:
            raise TaskNotFound(task_id)
        return views[task_id]

    def read_many(self, task_ids: Sequence[int]) -> dict[int, TaskView]:
        """Several tasks' rows and metadata in one round trip; missing tasks are omitted."""
        # Kanboard's ids are 32-bit: PostgreSQL refuses a larger one with an SQL error,
        # where it simply names no task.
        task_ids = [t for t in task_ids if 0 < t < 2**31]
        if not task_ids:
            return {}
        out = self.port.batch(self.read_calls(task_ids))
        now = self.clock()
        views: dict[int, TaskView] = {}
        for i, tid in enumerate(task_ids):
            row, meta = out[2 * i].unwrap(), out[2 * i + 1].unwrap()
            if row:
                views[tid] = parse_view(tid, row, meta, now)
        return views

    def read_meta_many(self, rows: Sequence[BoardTask]) -> list[TaskView]:
        """Views for rows already fetched (e.g. by a search): only metadata is read."""
        if not rows:
            return []
        out = self.port.batch(self.meta_calls(rows))
        now = self.clock()
        return [parse_view(r.id, r, o.unwrap(), now) for r, o in zip(rows, out, strict=True)]

    @staticmethod
    def meta_calls(rows: Sequence[BoardTask]) -> list[Call]:
        """Each row's metadata read: what a view of a fetched row still needs."""
        return [Call("getTaskMetadata", {"task_id": r.id}) for r in rows]

    def search(self, query: str) -> list[BoardTask]:
        """``searchTasks`` in the work project (unordered, unlimited, as Kanboard gives it).

        The same round trip reads back the cards this connection moved a moment ago, and
        moves again any whose move was lost (see MOVE_TOLERANCE).
        """
        asked, due = time.monotonic(), self._moves.due()
        calls = [Call("searchTasks", {"project_id": self.layout.project_id, "query": query})]
        if due:
            calls.append(self.activity_call())
        out = self.port.batch(calls)
        if due:
            self._check_moves(due, out[1], asked)
        return task_rows(out[0].unwrap())

    def activity_call(self) -> Call:
        return Call("getProjectActivity", {"project_id": self.layout.project_id})

    def _check_moves(self, due: Sequence[int], activity: Outcome, asked: float) -> None:
        """Settle this connection's due moves from the project's activity, reading back
        (one more round trip) only those a person's drag may have undone."""
        doubtful = self._moves.unseen(due, activity, asked=asked)
        if doubtful:
            # The activity is read again beside the cards: a drag between the two reads
            # must show in the one the rows are judged by.
            asked = time.monotonic()
            self._resend_lost(doubtful, self.port.batch(self.recheck_calls(doubtful)), asked)

    @staticmethod
    def read_calls(task_ids: Sequence[int]) -> list[Call]:
        """A task's row and metadata, per task: what a view is made of."""
        calls: list[Call] = []
        for tid in task_ids:
            calls += [Call("getTask", {"task_id": tid}), Call("getTaskMetadata", {"task_id": tid})]
        return calls

    def recheck_calls(self, task_ids: Sequence[int]) -> list[Call]:
        """The reads that check this connection's recent moves: each card, and the project's
        activity (a person's move since ours is theirs to keep, however soon it came)."""
        if not task_ids:
            return []
        return [*self.read_calls(task_ids), self.activity_call()]

    def _resend_lost(self, task_ids: Sequence[int], out: Sequence[Outcome], asked: float) -> None:
        """Send again the moves among ``task_ids`` that did not land (fabric.kanboard.moves)."""
        lost = self._moves.recheck(
            task_ids,
            out,
            people=set(self.layout.users.values()),
            epoch_of=lambda tid, task, meta: parse_view(tid, task, meta, 0.0).epoch,
            asked=asked,
        )
        calls: list[Call] = []
        for m in lost:
            calls += [
                self.stamp_call(m.task_id, m.epoch),
                self.move_call(m.task_id, m.column_id, m.swimlane_id),
            ]
        if calls:
            self._batch(calls)

    def close(self) -> None:
        """Settle what this connection owes the board before it goes: every card it moved
        is checked (waiting for competing moves to commit, VERIFY_AFTER per try) and moved
        again if the move was lost. A process told to stop looks once, at once, and
        leaves the rest to the keeper's sweep. Never raises a board error."""
        with contextlib.suppress(BoardError):
            for _ in range(MOVE_TRIES):
                if not self._moves:
                    return
                # Not jittered: the fabric's moves are one row each (MOVE), so workers
                # leaving together cannot lose each other's moves; only a person's drag
                # can, and waiting until the last move is due lets one in flight commit.
                stopping = pause(min(self._moves.wait(), VERIFY_AFTER))
                asked, due = time.monotonic(), self._moves.due(every=True)
                self._check_moves(due, self.port.batch([self.activity_call()])[0], asked)
                if stopping:
                    return

    def writer_first(self, record: Record) -> bool:
        """Whether ``record`` is too young for anyone but its writer to project: its
        writer's own move (a claim's may be made late, :meth:`show_working`) or its own
        check of that move comes first (REPAIR_AGE)."""
        return bool(self.clock() - record.at < REPAIR_AGE)

    def repair_projection(self, view: TaskView) -> bool:
        """Move a card a lost move left behind to its record's column (True if moved).

        ``view`` may be stale (a poll's row): the task is read again first, and moved only
        if its latest record is still ``view``'s, at least REPAIR_AGE old (its writer has
        had its own check), and the card was last moved no later than that record plus
        MOVE_TOLERANCE (a later move is a person's gesture, the keeper's to read).
        """
        if view.current is None or self.writer_first(view.current):
            return False
        fresh = self.read_many([view.id]).get(view.id)
        rec = fresh.current if fresh is not None else None
        if fresh is None or rec is None or fresh.epoch != view.epoch:
            return False
        calls = [c for c in self._projection_calls(fresh, rec, description=None) if c.method == MOVE]
        if not calls or not fresh.is_open or fresh.task.moved_at > fresh.fabric_moved_at + MOVE_TOLERANCE:
            return False
        self._stamped(fresh.id, rec.epoch, calls)
        return True

    def _stamped(self, task_id: int, epoch: int, moves: list[Call]) -> None:
        """Send moves made outside a record's batch, stamped (:meth:`stamp_call`), and
        remember them for this connection's check."""
        out = self._batch([self.stamp_call(task_id, epoch), *moves])
        self._moves.remember(moves, task_id, epoch, out[1:])

    def show_working(self, task_id: int, epoch: int) -> None:
        """Move a claimed card to Working, its claim's move made late (Ledger.show).

        Stamped (:meth:`stamp_call`), so the card's later ``date_moved`` reads as the
        fabric's own move, never as a person's; checked like any move of this connection.
        """
        self._stamped(task_id, epoch, [self.move_call(task_id, self.layout.columns[Column.WORKING], 0)])

    def put_back(
        self,
        view: TaskView,
        epoch: int,
        column: Column,
        *,
        is_open: bool,
        comment: str | None = None,
        queue: str | None = None,
    ) -> None:
        """Put a card where record ``epoch`` says: in ``column`` (and ``queue``'s swimlane,
        if given; a stamped move, see :meth:`stamp_call`), open or closed, with a line for
        the journal if given.

        One round trip, none when the card is already right and there is nothing to say.
        """
        want = self.layout.columns[column]
        lane = self.layout.swimlanes.get(queue or "", view.task.swimlane_id)
        calls: list[Call] = []
        if (view.task.column_id, view.task.swimlane_id) != (want, lane):
            calls += [self.stamp_call(view.id, epoch), self.move_call(view.id, want, lane)]
        if not is_open and (view.is_open or keep_closed(view, calls, reopen=False)):
            calls.append(Call("closeTask", {"task_id": view.id}))
        elif not view.is_open and is_open:
            calls.append(Call("openTask", {"task_id": view.id}))
        if comment:
            calls.append(self.comment_call(view.id, comment))
        if calls:
            self._batch(calls)

    def move_cards(self, moves: Sequence[tuple[int, Column, int]]) -> None:
        """Move open cards (id, column, swimlane) without a transition: the keeper keeping
        a lane's Queued cell short (keeper.backlog). One row a card, ``MOVE_CHUNK`` cards
        a round trip (a move costs Kanboard on PostgreSQL ~20 ms: a request stays well
        inside the client's timeout)."""
        calls = [self.move_call(tid, self.layout.columns[col], lane) for tid, col, lane in moves]
        for at in range(0, len(calls), MOVE_CHUNK):
            self._batch(calls[at : at + MOVE_CHUNK])

    def stamp_call(self, task_id: int, epoch: int) -> Call:
        """Mark a move the fabric makes outside a record's batch (see META_PROJECTED).

        Sent in the same batch, just before the move, so the card's ``date_moved`` and
        the stamp are the same moment.
        """
        return Call(
            "saveTaskMetadata",
            {"task_id": task_id, "values": {META_PROJECTED: f"{epoch}:{self.clock():.3f}"}},
        )

    def move_call(self, task_id: int, column_id: int, swimlane_id: int) -> Call:
        """Move a card to a cell of the work project (swimlane 0: the lane it is in).

        ``moveTaskToProject`` to its own project, not ``moveTaskPosition``: Kanboard
        updates this one row (at the bottom of the column, reopened, ``date_moved`` left
        as it was), where ``moveTaskPosition`` rewrites the position of every open card in
        both cells, so a move cost what the columns held, and concurrent moves on
        PostgreSQL deadlocked or lost each other's updates. A closed card is closed again
        in the same batch by whoever moves it (:func:`keep_closed`).
        """
        params: dict[str, Any] = {
            "task_id": task_id,
            "project_id": self.layout.project_id,
            "column_id": column_id,
        }
        if swimlane_id:
            params["swimlane_id"] = swimlane_id
        return Call(MOVE, params)

    def open_in(self, columns: Iterable[Column], queue: str | None = None) -> list[BoardTask]:
        """Open tasks in the given columns (and queue): what polls and sweeps look at."""
        terms = ["status:open"] + [f'column:"{c.value}"' for c in columns]
        if queue is not None:
            terms.append(f'swimlane:"{queue}"')
        return self.search(" ".join(terms))

    # -- locks ----------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> bool:
        """Try to create lock tag ``name``: True if this caller created it.

        With ``owner`` (a fixed colour naming who may hold it), also True when the tag
        already names that owner: an earlier call of the same owner created it.

        ``createTag`` is a plain INSERT under UNIQUE(project_id, name), so exactly one
        concurrent caller wins. The tag's ``color_id`` carries a nonce naming its creator
        (Kanboard stores it verbatim), so an ambiguous failure — Kanboard can report
        "database is locked" after inserting — is settled by reading the tag back: our
        nonce means we won, another means we lost, none means the insert never happened
        and may be tried again. If even that cannot be read, it counts as a loss; a lock
        that was in fact won then shows up as a gap and is resolved like one.
        """
        nonce = owner or secrets.token_hex(6)
        params = {"project_id": self.layout.locks_project_id, "tag": name, "color_id": nonce}
        for attempt in range(RETRIES):
            try:
                if self.port.call("createTag", params):
                    return True
                if owner is None:
                    return False
            except (MaybeDone, RpcError) as exc:
                if isinstance(exc, RpcError) and not exc.maybe_done:
                    return False
            try:
                holder = self._lock_holder(name)
            except (BoardUnavailable, RpcError):
                return False
            if holder is not None:
                return holder == nonce
            backoff(attempt)
        return False

    def owns(self, view: TaskView) -> bool:
        """Whether ``view`` is a task of this board's project, wherever its card is now: its
        uid is bound here (the ``<uid>/e0`` tag of this locks project names it). Reads
        every lock tag: only for a card seen in another project."""
        return view.uid is not None and self._lock_holder(epoch_lock(view.uid, 0)) == f"t{view.id}"

    def read_and_lock(self, row: BoardTask | int, uid: str, epoch: int) -> tuple[TaskView, bool]:
        """Read a task's records (and its row, given only its id), then try to win epoch
        ``epoch`` of task ``uid``, in one round trip: the view as it was read *before* the
        attempt, and whether this caller created the lock tag (an ambiguous failure is
        settled as :meth:`lock` settles it).

        The read comes first in the batch (Kanboard runs a batch's items in order), so a
        won tag is won on a basis read before it, as the epoch ledger requires.
        """
        nonce, name = secrets.token_hex(6), epoch_lock(uid, epoch)
        create = Call(
            "createTag", {"project_id": self.layout.locks_project_id, "tag": name, "color_id": nonce}
        )
        tid = row if isinstance(row, int) else row.id
        reads = self.read_calls([tid]) if isinstance(row, int) else self.meta_calls([row])
        try:
            *out, tag = self.port.batch([*reads, create])
        except MaybeDone:  # lost in transit: whether the tag was made is read back
            won = self._settled(name, nonce)
            return self.read_many([tid]).get(tid) or parse_view(tid, None, {}, self.clock()), won
        task = out[0].value if isinstance(row, int) else row
        view = parse_view(tid, task if task else None, out[-1].unwrap(), self.clock())
        if tag.error is None:
            return view, bool(tag.value)
        return view, tag.error.maybe_done and self._settled(name, nonce)

    def _settled(self, name: str, nonce: str) -> bool:
        """Whether an ambiguous ``createTag`` of ours made lock tag ``name``."""
        try:
            return self._lock_holder(name) == nonce
        except (BoardUnavailable, RpcError):
            return False  # counted as lost; a won lock then shows up as a gap

    def _lock_holder(self, name: str) -> str | None:
        """The nonce of lock tag ``name``'s creator, or None if the tag does not exist.

        Reads every tag of the locks project: used only to settle an ambiguous write.
        """
        tags = self.port.call("getTagsByProject", {"project_id": self.layout.locks_project_id})
        for tag in tag_rows(tags):
            if tag.name == name:
                return tag.color
        return None

    def _batch(self, calls: Sequence[Call]) -> list[Outcome]:
        """Run a batch, re-sending its idempotent items that fail ambiguously (resend)."""
        return send(self.port, calls)

    # -- writing --------------------------------------------------------------------

    def create_task(
        self,
        spec: TaskSpec,
        *,
        uid: str,
        reference: str,
        assignee: str | None = None,
        owner_id: int = 0,
        receipt: str | None = None,
    ) -> tuple[int, bool]:
        """Create the Kanboard task (one round trip): returns (task id, receipt won).

        With ``receipt``, the receipt's lock tag is created in the same batch, before the
        task; when the lock is lost the caller must remove the task (it has no records
        yet, so nothing can claim it meanwhile).
        """
        description = self.describe(spec, uid, assignee=assignee)
        params = self._task_params(spec, description=description, reference=reference, owner_id=owner_id)
        calls = [Call("createTask", params)]
        nonce = secrets.token_hex(6)
        if receipt is not None:
            calls.insert(
                0,
                Call(
                    "createTag",
                    {"project_id": self.layout.locks_project_id, "tag": receipt, "color_id": nonce},
                ),
            )
        try:
            out = self.port.batch(calls)
        except MaybeDone:
            out = [Outcome(c, error=RpcError(0, "lost in transit", method=c.method)) for c in calls]
        won = True if receipt is None else self._receipt_won(out[0], receipt, nonce)
        created = out[-1]
        if created.error is not None and created.error.maybe_done:
            # The reference is unique to this submit: look before creating again.
            task_id = self._created_or_retry(params)
        elif created.error is None and created.value:
            task_id = int(created.value)
        else:
            self._not_created(created, out[0] if receipt is not None and won else None, spec.queue)
        if not task_id:
            raise BoardRefused("createTask", task_id, f"create the task for queue {spec.queue!r}")
        return task_id, won

    def _task_params(
        self, spec: TaskSpec, *, description: str, reference: str, owner_id: int
    ) -> dict[str, Any]:
        """``createTask``'s parameters for a new fabric task."""
        params: dict[str, Any] = {
            "title": spec.title(),
            "project_id": self.layout.project_id,
            # A task for a person waits in their inbox from the start.
            "column_id": self.layout.columns[Column.WAITING if owner_id else Column.QUEUED],
            "swimlane_id": self.layout.swimlane(spec.queue),
            "description": description,
            "priority": spec.priority,
            "reference": reference,
        }
        if owner_id:
            params["owner_id"] = owner_id
        if spec.deadline:
            params["date_due"] = format_input_date(spec.deadline)
        if spec.not_before and (not spec.deadline or spec.not_before <= spec.deadline):
            params["date_started"] = format_input_date(spec.not_before)
        return params

    def _receipt_won(self, tag: Outcome, receipt: str, nonce: str) -> bool:
        """Whether the receipt's ``createTag`` in a create batch was ours."""
        if tag.error is not None and tag.error.maybe_done:
            return self._lock_holder(receipt) == nonce
        return bool(tag.value) and tag.error is None

    def _not_created(self, created: Outcome, receipt_tag: Outcome | None, queue: str) -> NoReturn:
        """``createTask`` certainly did nothing: give the receipt back, then raise why."""
        # Give the receipt back, or the action id is stuck.
        if receipt_tag is not None and isinstance(receipt_tag.value, int):
            self.port.call("removeTag", {"tag_id": receipt_tag.value})
        if created.error is not None and not created.error.refused:
            created.unwrap()
        # A missing project or column is 0 on every backend (an SQL error without a
        # column): the cached layout is stale, which the caller can repair.
        self._check_project(self.port.call("getProjectById", {"project_id": self.layout.project_id}))
        created.unwrap()
        raise BoardRefused("createTask", created.value, f"create the task for queue {queue!r}")

    def _created_or_retry(self, params: dict[str, Any]) -> int:
        """Settle an ambiguous ``createTask`` by its (unique) reference."""
        for attempt in range(RETRIES):
            row = self.find_by_reference(str(params["reference"]))
            if row is not None:
                return row.id
            backoff(attempt)
            try:
                result = self.port.call("createTask", params)
            except (MaybeDone, RpcError) as exc:
                if isinstance(exc, RpcError) and not exc.maybe_done:
                    raise
                continue
            return int(result or 0)
        raise MaybeDone("createTask kept failing ambiguously", calls=[Call("createTask", params)])

    def write_initial(self, task_id: int, uid: str, spec: TaskSpec, record: Record) -> None:
        """Bind the uid, write the spec and the epoch-0 record (one round trip, with a
        project check)."""
        calls = [
            self._bind_call(uid, task_id),
            Call(
                "saveTaskMetadata",
                {
                    "task_id": task_id,
                    "values": {
                        META_UID: uid,
                        META_SPEC: spec.to_meta(),
                        record_key(0): record.to_meta(),
                    },
                },
            ),
            Call("getProjectById", {"project_id": self.layout.project_id}),
        ]
        out = self._batch(calls)
        # The binding tag may already exist (a repair bound it first): that is fine.
        if not out[1].unwrap():
            raise BoardRefused("saveTaskMetadata", out[1].value, f"write task #{task_id}'s records")
        self._check_project(out[2].unwrap())

    def _bind_call(self, uid: str, task_id: int) -> Call:
        return Call(
            "createTag",
            {
                "project_id": self.layout.locks_project_id,
                "tag": epoch_lock(uid, 0),
                "color_id": f"t{task_id}",
            },
        )

    def bind_uid(self, uid: str, task_id: int) -> bool:
        """True when ``uid`` belongs to task ``task_id``: its ``<uid>/e0`` tag names it.

        Creates the tag when there is none. A block copied into another card names a uid
        already bound to its real task, so the copy is never adopted.
        """
        return self.lock(epoch_lock(uid, 0), owner=f"t{task_id}")

    def _check_project(self, project: Any) -> None:
        if (
            not isinstance(project, dict)
            or int(project.get("id", 0)) != self.layout.project_id
            or project.get("name") != self.layout.project_name
        ):
            raise ConfigError(
                f"project #{self.layout.project_id} is gone from the board",
                hint="the cached board layout is stale: run `agap init`",
            )

    def remove_task(self, task_id: int) -> None:
        """Remove a task (used to undo a submit that lost its receipt)."""
        self.port.call("removeTask", {"task_id": task_id})

    def find_by_reference(self, reference: str) -> BoardTask | None:
        """The first task with this exact reference, or None."""
        row = self.port.call(
            "getTaskByReference", {"project_id": self.layout.project_id, "reference": reference}
        )
        return BoardTask.parse(row) if isinstance(row, dict) else None

    def check_own(self, view: TaskView) -> None:
        """Refuse a task of another project: its lock tags, columns and lanes are that
        project's (a confined agent's home: fabric.kanboard.principals)."""
        pid = view.task.raw.get("project_id")
        if pid is None or int(pid) == self.layout.project_id:
            return
        home = next((h for h in self.layout.homes.values() if h.project_id == int(pid)), None)
        where = home.project_name if home else f"project #{pid}"
        raise ConfigError(
            f"task #{view.id} is in {where!r}, not in {self.layout.project_name!r}",
            where=f"task #{view.id}",
            hint="set AGAP_PROJECT and AGAP_LOCKS_PROJECT to that project and its locks project",
        )

    def write_record(
        self,
        view: TaskView,
        record: Record,
        *,
        comment: str | None = None,
        extra_meta: dict[str, str] | None = None,
        close: bool = False,
        reopen: bool = False,
        files: Sequence[tuple[str, str]] = (),
        result_url: str | None = None,
    ) -> None:
        """Write ``record`` and update the projection, all in one round trip.

        The record comes first: it is the truth. Column, assignee, description, comment
        and the rest are projections for humans and polls; their failures (e.g.
        ``moveTaskPosition`` answering false because the card is already there) do not
        matter. ``result_url`` is where the card links the result (its attachment's page).
        """
        self.check_own(view)
        description = self._rewritten(view, record, result_url)
        values = {record_key(record.epoch): record.to_meta(), **(extra_meta or {})}
        calls = [Call("saveTaskMetadata", {"task_id": view.id, "values": values})]
        calls += [self.file_call(view.id, name, blob) for name, blob in files]
        calls.extend(self._projection_calls(view, record, description=description))
        if comment:
            calls.append(self.comment_call(view.id, comment))
        if close or keep_closed(view, calls, reopen=reopen):
            calls.append(Call("closeTask", {"task_id": view.id}))
        if reopen:
            calls.append(Call("openTask", {"task_id": view.id}))
        out = self._batch(calls)
        saved = out[0].unwrap()
        if not saved:
            raise BoardRefused("saveTaskMetadata", saved, f"write record e{record.epoch} of task #{view.id}")
        self._moves.remember(calls, view.id, record.epoch, out)
        for o in out[1 : 1 + len(files)]:
            if not o.unwrap():
                raise BoardRefused("createTaskFile", o.value, f"attach a file to task #{view.id}")

    def _projection_calls(self, view: TaskView, record: Record, *, description: str | None) -> list[Call]:
        column = projected_column(record.state, record.assignee)
        calls = []
        if not column_fits(self.layout.column_of(view.task.column_id), record.state, record.assignee):
            calls.append(self.move_call(view.id, self.layout.columns[column], view.task.swimlane_id))
        update: dict[str, Any] = {}
        owner = self.layout.users.get(record.assignee or "", 0)
        if view.task.owner_id != owner:
            update["owner_id"] = owner
        if record.not_before and record.state == State.QUEUED:
            due = view.task.due_at
            if not due or record.not_before <= due:
                update["date_started"] = format_input_date(record.not_before)
        if description is not None:
            update["description"] = description
        if update:
            calls.append(Call("updateTask", {"id": view.id, **update}))
        return calls

    def save_meta(self, task_id: int, values: dict[str, str], *, comment: str | None = None) -> None:
        """Upsert metadata keys, with a line for the journal if given (one round trip).

        The metadata is checked; the line is best effort (a comment is never sent twice).
        """
        calls = [Call("saveTaskMetadata", {"task_id": task_id, "values": values})]
        if comment:
            calls.append(self.comment_call(task_id, comment))
        out = self._batch(calls)
        if not out[0].unwrap():
            raise BoardRefused("saveTaskMetadata", False, f"save metadata on task #{task_id}")

    def save_meta_and_read(self, task_id: int, values: dict[str, str]) -> TaskView:
        """Upsert metadata keys, then read the task back, in one round trip."""
        out = self._batch(
            [
                Call("saveTaskMetadata", {"task_id": task_id, "values": values}),
                Call("getTask", {"task_id": task_id}),
                Call("getTaskMetadata", {"task_id": task_id}),
            ]
        )
        if not out[0].unwrap():
            raise BoardRefused("saveTaskMetadata", out[0].value, f"save metadata on task #{task_id}")
        return parse_view(task_id, out[1].unwrap(), out[2].unwrap(), self.clock())

    # -- queue park state (project metadata) -------------------------------------------

    def publish_park(self, queue: str, state: dict[str, Any]) -> None:
        """Publish a queue's park state (only on changes: it is a projection for humans)."""
        self._batch(
            [
                Call(
                    "saveProjectMetadata",
                    {
                        "project_id": self.layout.project_id,
                        "values": {park_key(queue): json.dumps({**state, "queue": queue}, sort_keys=True)},
                    },
                )
            ]
        )

    def save_project_meta(self, values: dict[str, str]) -> None:
        """Upsert work-project metadata keys (one round trip)."""
        out = self._batch(
            [Call("saveProjectMetadata", {"project_id": self.layout.project_id, "values": values})]
        )
        if not out[0].unwrap():
            raise BoardRefused("saveProjectMetadata", out[0].value, "save project metadata")

    def project_meta(self) -> dict[str, str]:
        """The work project's metadata (one round trip)."""
        return meta_map(self.port.call("getProjectMetadata", {"project_id": self.layout.project_id}))

    def park_states(self) -> dict[str, dict[str, Any]]:
        """Every queue's last published park state (one round trip)."""
        meta = self.port.call("getProjectMetadata", {"project_id": self.layout.project_id})
        return parse_park_states(meta)

    # -- cron schedules (project metadata) ---------------------------------------------

    def schedule_states(self) -> dict[str, dict[str, Any]]:
        """Every schedule's state as its cron submitter published it, by name (one round trip)."""
        meta = self.port.call("getProjectMetadata", {"project_id": self.layout.project_id})
        return parse_cron_states(meta)

    def publish_schedules(self, states: dict[str, dict[str, Any]]) -> None:
        """Publish schedules' states (``fabric.cron.<name>``; each value names its schedule)."""
        self.save_project_meta(
            {
                cron_key(name): json.dumps({**st, "schedule": name}, sort_keys=True)
                for name, st in states.items()
            }
        )

    def tasks_by_keys(self, keys: Sequence[tuple[str, str]], *, per_batch: int = 100) -> list[int | None]:
        """For each (actor, action id): the id of the task submitted under it, or None.

        One round trip per ``per_batch`` keys (the lookup is by the receipt's reference).
        """
        out: list[int | None] = []
        for i in range(0, len(keys), per_batch):
            calls = [
                Call(
                    "getTaskByReference",
                    {"project_id": self.layout.project_id, "reference": receipt_reference(actor, key)},
                )
                for actor, key in keys[i : i + per_batch]
            ]
            for o in self.port.batch(calls):
                row = o.unwrap()
                out.append(BoardTask.parse(row).id if isinstance(row, dict) else None)
        return out

    def search_with_parks(self, query: str) -> tuple[list[BoardTask], dict[str, dict[str, Any]]]:
        """A search and the park states together, in one round trip."""
        out = self.port.batch(
            [
                Call("searchTasks", {"project_id": self.layout.project_id, "query": query}),
                Call("getProjectMetadata", {"project_id": self.layout.project_id}),
            ]
        )
        return task_rows(out[0].unwrap()), parse_park_states(out[1].unwrap())

    # -- journal and files ------------------------------------------------------------

    def comment_call(self, task_id: int, text: str) -> Call:
        """A line for the task's journal, written as the signed-in user (0: the
        application; Kanboard lets a user comment only in its own name)."""
        return Call("createComment", {"task_id": task_id, "user_id": self.layout.me, "content": text})

    def file_call(self, task_id: int, name: str, blob: str) -> Call:
        """Attach a file (``blob`` is its content, base64)."""
        return Call(
            "createTaskFile",
            {"project_id": self.layout.project_id, "task_id": task_id, "filename": name, "blob": blob},
        )

    def comment(self, task_id: int, text: str) -> None:
        """Append a line to the task's journal (its comments)."""
        call = self.comment_call(task_id, text)
        self.port.call(call.method, call.params)

    def comments(self, task_id: int) -> list[BoardComment]:
        """The task's journal, oldest first."""
        return comment_rows(self.port.call("getAllComments", {"task_id": task_id}))

    def attach_file(self, task_id: int, name: str, blob: str, *, what: str = "a file") -> int:
        """Attach a file (``blob``: base64) to a task; returns its file id (one round trip).

        Re-sent after an ambiguous failure: a duplicate file beats a lost one.
        """
        out = self._batch([self.file_call(task_id, name, blob)])
        file_id = out[0].unwrap()
        if not file_id:
            raise BoardRefused("createTaskFile", file_id, f"attach {what} to task #{task_id}")
        return int(file_id)

    def files(self, task_id: int) -> list[BoardFile]:
        return file_rows(self.port.call("getAllTaskFiles", {"task_id": task_id}))

    def download(self, file_id: int) -> str:
        return str(self.port.call("downloadTaskFile", {"file_id": file_id}) or "")

    def search_many(self, queries: Sequence[str]) -> list[list[BoardTask]]:
        """Several searches in the work project, in one round trip (answers in order)."""
        if not queries:
            return []
        out = self.port.batch(
            [Call("searchTasks", {"project_id": self.layout.project_id, "query": q}) for q in queries]
        )
        return [task_rows(o.unwrap()) for o in out]
