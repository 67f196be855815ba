"""The keeper's share of the quotas kept across hosts: give back what dead leases hold.

A call that a worker admits under a quota declared ``across_hosts`` takes a slot on the
board tied to its task lease (:mod:`fabric.sharedquota`). A worker that lives settles or
refunds its slots itself; one killed between admitting and finishing cannot. So, with the
lease sweep, the keeper reads the slots (one round trip), looks at the tasks their
holders worked on (the sweep's own snapshot, plus one batched read for tasks no longer
active), and gives back every slot whose lease died before the call was recorded done
(one round trip per model). It also removes superseded generations of slots.

Nothing here runs, and nothing touches the board, when no card keeps a quota across
hosts. Without the keeper a dead host's slot stays busy until its window ends: the
quota is short by one call for one window, never over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fabric.cards import CardSet, QuotaSpec
from fabric.core import Fabric
from fabric.kanboard.quotas import QuotaStore, SlotTag, model_key
from fabric.kanboard.views import TaskView
from fabric.sharedquota import Cap, collectable, holders, in_use, returnable

log = logging.getLogger("agap.keeper")

__all__ = ["QuotaReport", "shared_caps", "shared_windows", "sweep_quotas"]


@dataclass
class QuotaReport:
    """What one quota sweep saw and did."""

    held: int = 0
    in_use: int = 0  # reservations holding a slot, tied to a lease or not
    returned: list[str] = field(default_factory=list)
    removed: int = 0
    trips: int = 0


def shared_caps(cards: CardSet) -> dict[str, list[Cap]]:
    """Model key -> the caps of its quotas kept across hosts."""
    out: dict[str, list[Cap]] = {}
    for card in cards:
        for spec in card.availability:
            if isinstance(spec, QuotaSpec) and spec.across_hosts:
                caps = out.setdefault(model_key(card.id), [])
                caps.append(Cap(spec.limit, spec.window_seconds))
                if spec.second_limit is not None and spec.second_window_seconds is not None:
                    caps.append(Cap(spec.second_limit, spec.second_window_seconds))
    return out


def shared_windows(cards: CardSet) -> dict[str, float]:
    """Model key -> the longest window of its quotas kept across hosts."""
    out: dict[str, float] = {}
    for card in cards:
        for spec in card.availability:
            if isinstance(spec, QuotaSpec) and spec.across_hosts:
                longest = max(spec.window_seconds, spec.second_window_seconds or 0.0)
                key = model_key(card.id)
                out[key] = max(out.get(key, 0.0), longest)
    return out


def sweep_quotas(
    fab: Fabric,
    active: Sequence[TaskView],
    *,
    store: QuotaStore | None = None,
    settled: set[int] | None = None,
) -> QuotaReport:
    """Give back the slots of dead leases; collect superseded ones. ``active``: the lease
    sweep's snapshot (read again only for tasks not in it). ``settled``: tag ids already
    found kept for good (the holder finished), so they are not read again."""
    report = QuotaReport()
    windows = shared_windows(fab.cards)
    if not windows:
        return report
    store = store or QuotaStore(fab.port, fab.settings.quota_project)
    settled = settled if settled is not None else set()
    now = fab.clock()
    tables = store.read()
    report.trips += 1
    pending = [t for t in holders(tables, windows, now) if t.tag_id not in settled]
    report.held = len(pending)
    views = {v.id: v for v in active}
    missing = sorted({t.holder.task_id for t in pending if t.holder and t.holder.task_id not in views})
    if missing:
        views.update(fab.board.read_many(missing))
        report.trips += 1
    give: dict[str, list[SlotTag]] = {}
    for tag in pending:
        assert tag.holder is not None
        view = views.get(tag.holder.task_id)
        if returnable(tag, view, now):
            give.setdefault(tag.key, []).append(tag)
        elif view is not None and view.epoch > tag.holder.epoch:
            settled.add(tag.tag_id)  # its epoch ended and the slot stays: decided for good
    for key, tags in give.items():
        store.give_back(key, [t.ref for t in tags], "k", now)
        report.trips += 1
        report.returned += [t.ref.name(key) for t in tags]
        log.info("quota %s: gave back %d slots of dead leases", key, len(tags))
        gone = {t.tag_id for t in tags}  # the gauge below counts them free, as the next read will
        tables[key] = [replace(x, returned=True) if x.tag_id in gone else x for x in tables[key]]
    report.in_use = in_use(tables, shared_caps(fab.cards), now)
    doomed = [i for key, tags in tables.items() if key in windows for i in collectable(tags, now)]
    if doomed:
        store.remove(doomed)
        report.trips += 1
        report.removed = len(doomed)
        settled.difference_update(doomed)
    return report
