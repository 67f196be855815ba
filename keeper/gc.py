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
from dataclasses import dataclass, field
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.layout import META_ORPHANS, META_UID, TERMINAL, is_uid, receipt_lock
from fabric.kanboard.port import Call
from fabric.kanboard.taskboard import parse_view
from fabric.submit import parse_description

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
    row: dict[str, Any]
    uid: str | None
    receipt: str | None


def _identify(row: dict[str, Any], key: bytes) -> _Task:
    """A task's uid and receipt tag, from the description's spec block or its reference."""
    parsed = parse_description(str(row.get("description") or ""), key)
    if parsed is not None:
        uid, spec, _ = parsed
        rcpt = receipt_lock(spec.actor, spec.action_id) if spec.action_id else None
        return _Task(row, uid, rcpt)
    ref = str(row.get("reference") or "")
    if ref.startswith("uid:") and is_uid(ref[4:]):  # layout.uid_reference
        return _Task(row, ref[4:], None)
    return _Task(row, None, None)


def collect(fab: Fabric, *, retention: float) -> GcReport:
    """Remove lock tags of long-closed or deleted tasks (see the module doc)."""
    report = GcReport()
    layout = fab.board.layout
    now = fab.clock()
    out = fab.port.batch(
        [
            Call("getTagsByProject", {"project_id": layout.locks_project_id}),
            Call("searchTasks", {"project_id": layout.project_id, "query": ""}),
            Call("getProjectMetadata", {"project_id": layout.locks_project_id}),
        ]
    )
    report.trips += 1
    tags: list[dict[str, Any]] = list(out[0].unwrap() or [])
    tasks = [_identify(r, fab.board.seal_key) for r in out[1].unwrap() or []]
    raw = out[2].unwrap()
    try:
        seen: dict[str, float] = (
            json.loads((raw or {}).get(META_ORPHANS) or "{}") if isinstance(raw, dict) else {}
        )
    except ValueError:
        seen = {}
    # Tasks the description does not identify (edited by hand): read their uid.
    unknown = [t for t in tasks if t.uid is None]
    if unknown:
        res = fab.port.batch([Call("getTaskMetadata", {"task_id": int(t.row["id"])}) for t in unknown])
        report.trips += 1
        for t, o in zip(unknown, res, strict=True):
            meta = o.unwrap()
            t.uid = str(meta.get(META_UID) or "") or None if isinstance(meta, dict) else None
    by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    receipts: dict[str, dict[str, Any]] = {}
    for tag in tags:
        name = str(tag.get("name") or "")
        if name.startswith("rcpt/"):
            receipts[name] = tag
        elif "/e" in name and is_uid(name.split("/e", 1)[0]):
            by_uid[name.split("/e", 1)[0]].append(tag)
    task_of_uid = {t.uid: t for t in tasks if t.uid}
    task_of_rcpt = {t.receipt: t for t in tasks if t.receipt}
    cutoff = now - retention
    # Closed long enough on the board: confirm with the records before removing.
    candidates = [
        t
        for t in tasks
        if t.uid
        and not int(t.row.get("is_active") or 0)
        and 0 < float(t.row.get("date_completed") or 0) < cutoff
        and (t.uid in by_uid or (t.receipt in receipts))
    ]
    doomed: list[dict[str, Any]] = []
    if candidates:
        res = fab.port.batch([Call("getTaskMetadata", {"task_id": int(t.row["id"])}) for t in candidates])
        report.trips += 1
        for t, o in zip(candidates, res, strict=True):
            view = parse_view(int(t.row["id"]), t.row, o.unwrap(), now)
            cur = view.current
            if view.problems or cur is None or view.uid != t.uid:
                report.problems[view.id] = view.problems or ["no readable record"]
                continue
            if cur.state in TERMINAL and cur.at < cutoff:
                doomed += by_uid.get(t.uid or "", [])
                if t.receipt in receipts:
                    doomed.append(receipts[t.receipt or ""])
            else:
                report.kept += 1
    # Orphans: tags no task on the board owns (the task was deleted).
    orphans = {
        name
        for uid, ts in by_uid.items()
        if uid not in task_of_uid
        for name in (str(x.get("name")) for x in ts)
    }
    orphans |= {name for name in receipts if name not in task_of_rcpt}
    new_seen = {name: float(seen.get(name, now)) for name in orphans}
    report.orphans_seen = len(orphans)
    all_tags = {str(t.get("name")): t for t in tags}
    doomed += [all_tags[n] for n, first in new_seen.items() if first < cutoff]
    calls = [Call("removeTag", {"tag_id": int(t["id"])}) for t in doomed]
    left = {n: ts for n, ts in new_seen.items() if ts >= cutoff}
    if left != seen:
        calls.append(
            Call(
                "saveProjectMetadata",
                {"project_id": layout.locks_project_id, "values": {META_ORPHANS: json.dumps(left)}},
            )
        )
    if calls:
        res = fab.port.batch(calls)
        report.trips += 1
        for tag, o in zip(doomed, res, strict=False):
            if o.error is None and o.value:
                report.removed.append(str(tag.get("name")))
    log.info("gc: removed %d lock tags, %d orphans tracked", len(report.removed), len(left))
    return report
