"""Garbage-collect lock tags of tasks closed longer than the retention period.

Lock tags live in the locks project: epoch locks ``<uid>/e<n>`` and submit receipts
``rcpt/<hash>``. A tag is removed only when

* its task is closed on the board *and* its current record is terminal (closed or
  canceled), and both happened longer than the retention ago; or
* no task on the board carries its uid or receipt (a deleted task), and the keeper has
  seen it orphaned for longer than the retention (first sightings are kept in the locks
  project's metadata).

Tags of open tasks are never touched, nor those of a task whose metadata cannot be read.

Trade-off: a receipt removed after the retention lets the same (actor, action id) create a
new task. Keep the retention longer than any submitter's retry horizon. The ledger's own
rule covers the epoch locks: a transition whose basis read is older than
``Ledger.recheck_after`` re-reads the task before writing.

This job lists every tag and every task once a day: it is the one duty whose cost grows
with history, and it runs off the hot path.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from fabric.core import Fabric
from fabric.kanboard.keeperstore import KeeperStore
from fabric.kanboard.layout import META_ORPHANS, is_uid, receipt_lock
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.rows import BoardTag, BoardTask
from fabric.task import TERMINAL

log = logging.getLogger("agap.keeper.gc")


@dataclass
class GcReport:
    removed: list[str] = field(default_factory=list)
    kept: int = 0
    orphans_seen: int = 0
    problems: dict[int, list[str]] = field(default_factory=dict)
    trips: int = 0


@dataclass
class _Task:
    task: BoardTask
    uid: str | None
    receipt: str | None


@dataclass
class _Locks:
    """The locks project's tags by owner: epoch locks per uid, receipts by name."""

    by_uid: dict[str, list[BoardTag]]
    receipts: dict[str, BoardTag]

    @classmethod
    def of(cls, tags: Sequence[BoardTag]) -> _Locks:
        by_uid: dict[str, list[BoardTag]] = defaultdict(list)
        receipts: dict[str, BoardTag] = {}
        for tag in tags:
            if tag.name.startswith("rcpt/"):
                receipts[tag.name] = tag
            elif "/e" in tag.name and is_uid(tag.name.split("/e", 1)[0]):
                by_uid[tag.name.split("/e", 1)[0]].append(tag)
        return cls(by_uid, receipts)

    def of_task(self, t: _Task) -> list[BoardTag]:
        """The task's epoch locks and its receipt."""
        own = list(self.by_uid.get(t.uid or "", []))
        if t.receipt in self.receipts:
            own.append(self.receipts[t.receipt or ""])
        return own

    def orphans(self, tasks: Sequence[_Task]) -> set[str]:
        """Names of the tags no task on the board owns (the task was deleted)."""
        uids = {t.uid for t in tasks if t.uid}
        receipts = {t.receipt for t in tasks if t.receipt}
        names = {x.name for uid, ts in self.by_uid.items() if uid not in uids for x in ts}
        return names | {name for name in self.receipts if name not in receipts}


def _identify(row: BoardTask, board: ReadOnlyBoard) -> _Task:
    """A task's uid and receipt tag, from the description's spec block or its reference."""
    parsed = board.sealed(row.description)
    if parsed is not None:
        uid, spec, _ = parsed
        rcpt = receipt_lock(spec.actor, spec.action_id) if spec.action_id else None
        return _Task(row, uid, rcpt)
    ref = row.reference
    if ref.startswith("uid:") and is_uid(ref[4:]):  # layout.uid_reference
        return _Task(row, ref[4:], None)
    return _Task(row, None, None)


def _orphans_seen(meta: dict[str, str]) -> dict[str, float]:
    """When the keeper first saw each orphaned tag (kept in the locks project's metadata)."""
    try:
        seen: dict[str, float] = json.loads(meta.get(META_ORPHANS) or "{}")
    except ValueError:
        return {}
    return seen


def collect(fab: Fabric, *, retention: float) -> GcReport:
    """Remove lock tags of long-closed or deleted tasks (see the module doc)."""
    report = GcReport()
    store = KeeperStore(fab.board)
    now = fab.clock()
    cutoff = now - retention
    inventory = store.lock_inventory()
    report.trips += 1
    tasks = [_identify(r, fab.board) for r in inventory.tasks]
    seen = _orphans_seen(inventory.meta)
    _read_uids(fab, [t for t in tasks if t.uid is None], report)
    locks = _Locks.of(inventory.tags)
    doomed = _expired(fab, tasks, locks, cutoff, report)
    orphans = locks.orphans(tasks)
    new_seen = {name: float(seen.get(name, now)) for name in orphans}
    report.orphans_seen = len(orphans)
    all_tags = {t.name: t for t in inventory.tags}
    doomed += [all_tags[n] for n, first in new_seen.items() if first < cutoff]
    left = {n: ts for n, ts in new_seen.items() if ts >= cutoff}
    if doomed or left != seen:
        removed = store.remove_tags(
            doomed, locks_meta={META_ORPHANS: json.dumps(left)} if left != seen else None
        )
        report.trips += 1
        report.removed += [t.name for t in removed]
    log.info("gc: removed %d lock tags, %d orphans tracked", len(report.removed), len(left))
    return report


def _read_uids(fab: Fabric, unknown: Sequence[_Task], report: GcReport) -> None:
    """Tasks the description does not identify (edited by hand): read their uid."""
    if not unknown:
        return
    views = fab.board.read_meta_many([t.task for t in unknown])
    report.trips += 1
    for t, view in zip(unknown, views, strict=True):
        t.uid = view.uid


def _expired(
    fab: Fabric, tasks: Sequence[_Task], locks: _Locks, cutoff: float, report: GcReport
) -> list[BoardTag]:
    """Tags of tasks closed on the board before ``cutoff`` whose records agree (terminal
    before ``cutoff`` too): one metadata read for the candidates."""
    candidates = [
        t
        for t in tasks
        if t.uid
        and not t.task.is_open
        and 0 < t.task.completed_at < cutoff
        and (t.uid in locks.by_uid or (t.receipt in locks.receipts))
    ]
    if not candidates:
        return []
    views = fab.board.read_meta_many([t.task for t in candidates])
    report.trips += 1
    doomed: list[BoardTag] = []
    for t, view in zip(candidates, views, strict=True):
        cur = view.current
        if view.problems or cur is None or view.uid != t.uid:
            report.problems[view.id] = view.problems or ["no readable record"]
        elif cur.state in TERMINAL and cur.at < cutoff:
            doomed += locks.of_task(t)
        else:
            report.kept += 1
    return doomed
