"""Keeping each lane's Queued cell short: the rest of a long queue waits in Backlog.

A worker polls its lane's Queued cell and Kanboard returns every card in it, so a queue
of thousands would make every poll carry thousands of rows. The keeper keeps a lane's
Queued cell at most :data:`~fabric.kanboard.layout.QUEUED_CELL` cards: the best of the
queue by the workers' own order (priority, deadline, age; cards not due yet last), the
rest in Backlog. It tops the cell up when it holds fewer than half that, and swaps a
Backlog card that outranks one in Queued (a new submit lands in Queued; an older task of
the same priority waiting in Backlog goes first). Each move is one row
(:data:`~fabric.kanboard.moves.MOVE`), whatever the cells hold.

The moves are projections of queued records, not transitions: a card is moved only when
its record, read just before, says it is queued and not waiting on a person. A worker that
claims it at the same moment moves it to Working after or before; the claim's own move
check and the gesture sweep put a lagging card right.

:func:`plan` is the policy (rows in, moves out); :func:`balance` reads and moves.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice

from fabric.core import Fabric
from fabric.kanboard.layout import QUEUED_CELL, Column
from fabric.kanboard.rows import BoardTask
from fabric.task import State


@dataclass
class BacklogReport:
    """What one balancing did, by task id."""

    demoted: list[int] = field(default_factory=list)  # Queued -> Backlog
    promoted: list[int] = field(default_factory=list)  # Backlog -> Queued
    skipped: list[int] = field(default_factory=list)  # planned, but its record said no
    trips: int = 0


# A balancing moves at most this many cards (promotions first). After a burst of 2,000
# submits, Kanboard on PostgreSQL took over 10 s (the client's timeout) for one request of
# 1,500 moves, and a keeper run that long holds up its lease sweeps; the rest of a burst is
# moved at the next runs, every AGAP_KEEPER_BACKLOG_EVERY.
MOVES_PER_RUN = 200


def rank(row: BoardTask, now: float) -> tuple[bool, int, float, int, int]:
    """A card's place in its queue, best first: due before not yet due (a delayed start or a
    retry backoff), then the workers' order (workers.queue.order_key)."""
    due = float(row.due_at) if row.due_at else float("inf")
    return (row.start_at > now, -row.priority, due, row.created_at, row.id)


def plan(
    queued: Sequence[BoardTask], backlog: Sequence[BoardTask], now: float, *, cell: int = QUEUED_CELL
) -> tuple[list[BoardTask], list[BoardTask]]:
    """(cards to move to Backlog, cards to move to Queued) for one lane.

    Nothing moves while the Queued cell holds between half of ``cell`` and ``cell`` cards
    and no Backlog card outranks one of them; otherwise the cell is made the best ``cell``
    of the whole queue, moving as few cards as that takes.
    """
    ordered = sorted([*queued, *backlog], key=lambda r: rank(r, now))
    in_queued = {r.id for r in queued}
    worst_queued = max((rank(r, now) for r in queued), default=None)
    best_backlog = min((rank(r, now) for r in backlog), default=None)
    out_of_order = worst_queued is not None and best_backlog is not None and best_backlog < worst_queued
    short = len(queued) < cell // 2 and bool(backlog)
    if not out_of_order and not short and len(queued) <= cell:
        return [], []
    keep = {r.id for r in ordered[:cell]}
    demote = [r for r in queued if r.id not in keep]
    promote = [r for r in ordered[:cell] if r.id not in in_queued]
    return demote, promote


def balance(fab: Fabric, queued: Sequence[BoardTask], backlog: Sequence[BoardTask]) -> BacklogReport:
    """Plan every lane of the work project and make the moves (reads and moves: two round
    trips when anything moves, none otherwise). No Backlog column, nothing to do."""
    report = BacklogReport()
    layout = fab.board.layout
    if Column.BACKLOG not in layout.columns:
        return report
    now = fab.clock()
    by_lane: dict[int, tuple[list[BoardTask], list[BoardTask]]] = defaultdict(lambda: ([], []))
    for r in queued:
        by_lane[r.swimlane_id][0].append(r)
    for r in backlog:
        by_lane[r.swimlane_id][1].append(r)
    promotions: dict[int, Column] = {}
    demotions: dict[int, Column] = {}
    for lane, (q, b) in by_lane.items():
        if layout.queue_of(lane) is None:
            continue  # a lane of no queue: the gesture sweep's business
        demote, promote = plan(q, b, now)
        demotions.update({r.id: Column.BACKLOG for r in demote})
        promotions.update({r.id: Column.QUEUED for r in promote})
    # Cards a worker is waiting for first; the rest of a burst at the next runs.
    wanted = dict(islice({**promotions, **demotions}.items(), MOVES_PER_RUN))
    if not wanted:
        return report
    rows = {r.id: r for r in (*queued, *backlog) if r.id in wanted}
    views = fab.board.read_meta_many(list(rows.values()))
    report.trips += 1
    moves: list[tuple[int, Column, int]] = []
    for view in views:
        cur = view.current
        if cur is None or cur.state != State.QUEUED or cur.assignee or view.problems:
            report.skipped.append(view.id)
            continue
        col = wanted[view.id]
        moves.append((view.id, col, rows[view.id].swimlane_id))
        (report.demoted if col == Column.BACKLOG else report.promoted).append(view.id)
    if moves:
        fab.board.move_cards(moves)
        report.trips += 1
    return report


# Backlog is read again at least this often (a person may drag cards into it), and
# otherwise only when a lane that had cards there runs short.
REFRESH = 30.0


@dataclass
class BacklogWatch:
    """What the keeper knows of each lane's Backlog between reads: how many cards it holds
    and the best of them (as many as a Queued cell), so that a balancing reads the whole
    Backlog only when it cannot do without: REFRESH has passed (a person may drag cards
    there), or a lane needs more cards than it knows of. A newer submit that ranks below
    a known Backlog card is swapped with it without a read."""

    known: dict[int, int] = field(default_factory=dict)  # swimlane id -> cards in Backlog
    top: dict[int, list[BoardTask]] = field(default_factory=dict)  # swimlane id -> its best
    read_at: float = float("-inf")

    def needs_read(self, queued: Sequence[BoardTask], now: float) -> bool:
        if now - self.read_at >= REFRESH:
            return True
        held = Counter(r.swimlane_id for r in queued)
        for lane, n in self.known.items():
            best = len(self.top.get(lane, ()))
            if n > best and held[lane] < QUEUED_CELL // 2 and QUEUED_CELL - held[lane] > best:
                return True
        return False

    def cached(self) -> list[BoardTask]:
        """The best Backlog cards the keeper knows of, every lane."""
        return [r for rows in self.top.values() for r in rows]

    def read(self, backlog: Sequence[BoardTask], now: float) -> None:
        by_lane: dict[int, list[BoardTask]] = defaultdict(list)
        for r in backlog:
            by_lane[r.swimlane_id].append(r)
        self.known = {lane: len(rows) for lane, rows in by_lane.items()}
        self.top = {
            lane: sorted(rows, key=lambda r: rank(r, now))[:QUEUED_CELL] for lane, rows in by_lane.items()
        }
        self.read_at = now

    def moved(self, report: BacklogReport, rows: dict[int, BoardTask], now: float) -> None:
        """Count the moves just made (``rows``: the cards by id)."""
        for tid in report.demoted:
            lane = rows[tid].swimlane_id
            self.known[lane] = self.known.get(lane, 0) + 1
            best = sorted([*self.top.get(lane, []), rows[tid]], key=lambda r: rank(r, now))
            self.top[lane] = best[:QUEUED_CELL]
        for tid in report.promoted:
            lane = rows[tid].swimlane_id
            self.known[lane] = max(0, self.known.get(lane, 0) - 1)
            self.top[lane] = [r for r in self.top.get(lane, []) if r.id != tid]


__all__ = ["REFRESH", "BacklogReport", "BacklogWatch", "balance", "plan", "rank"]
