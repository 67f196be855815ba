"""The card moves one board connection made, checked once competing moves have committed.

The fabric moves a card with ``moveTaskToProject`` to its own project (:data:`MOVE`): one
row updated, so its moves neither cost what a column holds nor lose each other. But a
person's drag in Kanboard's UI is ``moveTaskPosition``, which rewrites the position and
column of every open card in the cells it touches, from a snapshot that may predate the
fabric's commit, so a card the fabric just moved can land back where it was. So every
move the fabric makes is remembered here, read back once ``VERIFY_AFTER`` has passed (in the round
trip of the connection's next search, or when it closes), and sent again up to
``MOVE_TRIES`` times, only while the record it projects is still the task's latest (a
later transition's writer checks its own) and no person has moved the card since (a
person's move is a gesture, the keeper's to read).

A card moved no later than its record's time plus ``MOVE_TOLERANCE`` is the fabric's own
move. Someone else's card is put right only when its record is ``REPAIR_AGE`` old, so
that its writer's own check comes first. Nothing outside :mod:`fabric.kanboard` knows
any of this: a connection settles what it owes the board when it is closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from fabric.kanboard.port import Call, Outcome
from fabric.kanboard.rows import BoardTask, activity_rows
from fabric.plain import Plain

MOVE_TOLERANCE = 15.0  # covers a write batch's own re-sends (deadlocks cost ~1 s each)
VERIFY_AFTER = 0.5
MOVE_TRIES = 5
REPAIR_AGE = 2.0
MEMORY = 1000  # moves remembered at most: the keeper's sweep is the backstop
ACTIVITY_WINDOW = 50  # the rows getProjectActivity gives (Kanboard's limit), newest first
# How the fabric moves a card: to its own project, in one row (see the module doc).
MOVE = "moveTaskToProject"


class Move(Plain, frozen=False):
    """A card this connection moved, to be checked once competing moves have committed."""

    column_id: int
    swimlane_id: int
    epoch: int  # the record this move projects
    at: float  # the fabric's clock, to compare with the card's date_moved
    due: float  # time.monotonic() after which competing moves have committed
    tries: int = 1
    made: float = 0.0  # time.monotonic() when it was remembered
    doubted: bool = False  # the board did not answer the move true: read it back


class Again(Plain):
    """A lost move to send again: the card, where it belongs, and the record it projects."""

    task_id: int
    column_id: int
    swimlane_id: int
    epoch: int


class MoveTracker:
    """The moves one connection made and has not seen land yet."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._moved: dict[int, Move] = {}
        # A worker records one task's outcome while it claims the next on the same
        # connection (fabric.kanboard.gather): one thread remembers while another checks.
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._moved)

    def remember(
        self, calls: Sequence[Call], task_id: int, epoch: int, out: Sequence[Outcome] | None = None
    ) -> None:
        """Note the card moves among ``calls`` (made for record ``epoch`` of ``task_id``);
        ``out``: their outcomes, when known (a move the board did not answer true is read
        back whatever the activity shows)."""
        with self._lock:
            for i, c in enumerate(calls):
                if c.method == MOVE and isinstance(c.params, dict):
                    answered = (
                        out is not None and i < len(out) and out[i].error is None and bool(out[i].value)
                    )
                    self._moved[task_id] = self._new(
                        int(c.params["column_id"]),
                        int(c.params.get("swimlane_id", 0)),
                        epoch,
                        doubted=not answered,
                    )
            if len(self._moved) > MEMORY:
                self._moved.clear()

    def unseen(self, task_ids: Sequence[int], activity: Outcome, *, asked: float) -> list[int]:
        """Which of ``task_ids``' moves must be read back, given the project's activity
        (``activity``: a ``getProjectActivity`` outcome asked for at ``asked``).

        Only a person's drag undoes a move the board answered true, and Kanboard writes
        an activity row for every signed-in user's move (never for the application
        token): with no move in the activity since the oldest of these moves (less
        ``MOVE_TOLERANCE``: the board's clock may differ), they all stand and are
        forgotten unread. A move not answered true, an unreadable activity, or one whose
        window (Kanboard gives the newest ``ACTIVITY_WINDOW`` rows) may hide such a drag,
        and every move is read back.
        """
        with self._lock:
            moves = {
                tid: m for tid in task_ids if (m := self._moved.get(tid)) is not None and m.made <= asked
            }
        if not moves:
            return []
        since = min(m.at for m in moves.values()) - MOVE_TOLERANCE
        rows = (
            activity_rows(activity.value)
            if activity.error is None and isinstance(activity.value, list)
            else None
        )
        hidden = rows is None or (len(rows) >= ACTIVITY_WINDOW and rows[-1].at >= since)
        if hidden or any(r.kind == "move" and r.at >= since for r in rows or []):
            return list(moves)
        with self._lock:
            for tid, m in moves.items():
                if self._moved.get(tid) is m and not m.doubted:
                    del self._moved[tid]
        return [tid for tid, m in moves.items() if m.doubted]

    def due(self, *, every: bool = False) -> list[int]:
        """The cards whose competing moves have committed by now (all of them: ``every``)."""
        now = time.monotonic()
        with self._lock:
            return [tid for tid, m in self._moved.items() if every or now >= m.due]

    def wait(self) -> float:
        """Seconds until the last remembered move may be checked (0: now)."""
        with self._lock:
            if not self._moved:
                return 0.0
            return max(0.0, max(m.due for m in self._moved.values()) - time.monotonic())

    def recheck(
        self,
        task_ids: Sequence[int],
        out: Sequence[Outcome],
        *,
        people: set[int],
        epoch_of: Callable[[int, BoardTask, object], int],
        asked: float,
    ) -> list[Again]:
        """The lost moves among ``task_ids``, given their row and metadata reads (``out``:
        a row and a metadata outcome per card, then the project's activity, asked for at
        ``asked``, a time.monotonic()); each one sent again is remembered for another
        check, up to ``MOVE_TRIES``."""
        again: list[Again] = []
        by_people = _moved_by_people(out[-1], people) if task_ids else {}
        for i, tid in enumerate(task_ids):
            with self._lock:
                move = self._moved.get(tid)
                if move is None or move.made > asked:
                    # Checked meanwhile, or moved again since this read was asked for
                    # (a worker records one task while it claims the next): not this read's.
                    continue
                del self._moved[tid]
            row, meta = out[2 * i], out[2 * i + 1]
            if row.error is not None or meta.error is not None or not isinstance(row.value, dict):
                continue  # gone, or unreadable: the keeper's sweep is the backstop
            task = BoardTask.parse(row.value)
            if task.column_id == move.column_id or not task.is_open:
                continue  # where we put it, or closed since: a close is a gesture or a transition
            if task.moved_at > move.at + MOVE_TOLERANCE or by_people.get(tid, -1) >= int(move.at):
                continue  # moved again since (a person's gesture): theirs to keep
            if epoch_of(tid, task, meta.value) != move.epoch:
                continue  # a later transition: its writer projects it
            again.append(Again(tid, move.column_id, move.swimlane_id, move.epoch))
            if move.tries < MOVE_TRIES:
                # Sent again after a loss: read back, not taken on trust.
                again_move = self._new(
                    move.column_id, move.swimlane_id, move.epoch, tries=move.tries + 1, doubted=True
                )
                with self._lock:
                    self._moved.setdefault(tid, again_move)
        return again

    def _new(
        self, column_id: int, swimlane_id: int, epoch: int, *, tries: int = 1, doubted: bool = False
    ) -> Move:
        now = time.monotonic()
        return Move(column_id, swimlane_id, epoch, self.clock(), now + VERIFY_AFTER, tries, now, doubted)


def _moved_by_people(out: Outcome, people: set[int]) -> dict[int, int]:
    """Task id -> when a project member (a person) last moved it, from the activity."""
    found: dict[int, int] = {}
    for row in activity_rows(out.value if out.error is None else None):
        if row.kind == "move" and row.user_id in people:
            found.setdefault(row.task_id, row.at)
    return found


__all__ = [
    "ACTIVITY_WINDOW",
    "MOVE",
    "MOVE_TOLERANCE",
    "MOVE_TRIES",
    "REPAIR_AGE",
    "VERIFY_AFTER",
    "Again",
    "MoveTracker",
]
