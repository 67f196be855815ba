"""One quota across hosts: the slot logic of the shared quota ledger, as plain functions.

Storage is :mod:`fabric.kanboard.quotas` (slot tags in the quota project, taken with the
tag test-and-set the epoch ledger uses). This module decides, over a read of those tags
and an explicit ``now``:

* which slots of each cap are busy, which are free, and when the next one frees
  (:class:`SlotTable`) — a slot is busy while its newest generation is inside the cap's
  window and not given back, so the N slots of a cap hold at most N calls per window;
* which reservations the keeper gives back (:func:`returnable`): those whose task lease
  died (the keeper requeued it, or it is past its ``lease_until``) before the call was
  recorded done — a host killed holding a reservation gives it back;
* which superseded generations the keeper may remove (:func:`collectable`): never one
  a host's view could still build on (see :data:`VIEW_MAX_AGE`).

The reservation a call takes is tied to the task lease it runs under: the executor names
that lease in :data:`HOLDER` while it admits the call.
"""

from __future__ import annotations

import contextvars
import itertools
import random
from collections.abc import Mapping, Sequence

from fabric.availability import fmt_duration
from fabric.kanboard.quotas import QuotaHolder, SlotRef, SlotTag
from fabric.kanboard.views import TaskView
from fabric.plain import Plain
from fabric.task import State

__all__ = [
    "COLLECT_AFTER",
    "HOLDER",
    "VIEW_MAX_AGE",
    "Cap",
    "SlotTable",
    "collectable",
    "returnable",
]

#: The task lease a call being admitted runs under (None: a call with no lease).
HOLDER: contextvars.ContextVar[QuotaHolder | None] = contextvars.ContextVar("agap_quota_holder", default=None)

#: A view of the slots older than this is read again before a slot is taken from it.
VIEW_MAX_AGE = 300.0
#: A superseded generation is removed only once its successor is this old, far longer than
#: any view may be (:data:`VIEW_MAX_AGE`): no host can try to create it again from a view
#: that still shows its predecessor as the newest.
COLLECT_AFTER = 3600.0

#: The side effect whose receipt says a task's model call ran (workers.executor).
MODEL_CALL = "model-call"


class Cap(Plain):
    """``limit`` calls per rolling ``window`` seconds."""

    limit: int
    window: float


class SlotTable(Plain, frozen=False):
    """The newest generation of every slot of one model's caps, as last read or taken."""

    caps: Sequence[Cap]
    heads: dict[tuple[int, int], SlotTag]

    @classmethod
    def of(cls, caps: Sequence[Cap], tags: Sequence[SlotTag]) -> SlotTable:
        heads: dict[tuple[int, int], SlotTag] = {}
        for tag in tags:
            k = (tag.ref.cap, tag.ref.slot)
            if k not in heads or tag.ref.gen > heads[k].ref.gen:
                heads[k] = tag
        return cls(list(caps), heads)

    def busy(self, cap: int, now: float) -> list[SlotTag]:
        """The reservations holding a slot of ``cap`` at ``now``."""
        window = self.caps[cap].window
        return [
            t
            for (c, s), t in self.heads.items()
            if c == cap and s < self.caps[cap].limit and not t.returned and t.at + window > now
        ]

    def free(self, cap: int, now: float) -> list[SlotRef]:
        """The next generation of every free slot of ``cap``."""
        taken = {t.ref.slot for t in self.busy(cap, now)}
        out = []
        for slot in range(self.caps[cap].limit):
            if slot in taken:
                continue
            head = self.heads.get((cap, slot))
            out.append(SlotRef(cap, slot, 0 if head is None else head.ref.gen + 1))
        return out

    def frees_at(self, cap: int, now: float, count: int = 1) -> float | None:
        """When ``count`` more slots of ``cap`` will have freed (None: unknown)."""
        ends = sorted(t.at + self.caps[cap].window for t in self.busy(cap, now))
        return ends[count - 1] if 0 < count <= len(ends) else None

    def pick(
        self, now: float, reserve: Sequence[int], rng: random.Random
    ) -> tuple[list[SlotRef], str, float | None]:
        """One free slot of every cap, chosen at random (two hosts rarely race for one),
        or no slots and why (``"<kind>: <detail>"``), with when that may change.
        ``reserve[i]``: slots of cap i that only interactive work may take."""
        picks: list[SlotRef] = []
        for i, cap in enumerate(self.caps):
            free = self.free(i, now)
            if len(free) <= reserve[i]:
                per = fmt_duration(cap.window)
                until = self.frees_at(i, now, reserve[i] - len(free) + 1)
                if free:
                    # The head before the ":" is the one the local reserve gives: the
                    # worker's loop lets interactive work through on it (reason_key).
                    left = f"{len(free)} of {cap.limit} left per {per} across hosts"
                    why = f"reserved for interactive work: {left}"
                else:
                    why = f"quota spent across hosts: {cap.limit} of {cap.limit} per {per}"
                return [], why, until
            picks.append(rng.choice(free))
        return picks, "", None

    def put(self, tag: SlotTag) -> None:
        """A reservation this host made or saw."""
        k = (tag.ref.cap, tag.ref.slot)
        if k not in self.heads or tag.ref.gen >= self.heads[k].ref.gen:
            self.heads[k] = tag

    def given_back(self, ref: SlotRef) -> None:
        head = self.heads.get((ref.cap, ref.slot))
        if head is not None and head.ref == ref:
            self.heads[(ref.cap, ref.slot)] = SlotTag(
                head.key, ref, head.at, head.holder, head.color, head.tag_id, True, head.marker_id
            )


def returnable(tag: SlotTag, view: TaskView | None, now: float) -> bool:
    """Whether the keeper gives ``tag`` back: its task lease died before the call was
    recorded done. ``view`` is its task as read now (None: the task is gone).

    Kept when the lease ended normally (the holder finished, failed or released the task:
    it settled or refunded the call itself), when the epoch's record carries the model
    call's receipt (the call ran), and when nothing can be told (no holder, an unreadable
    record): a slot kept by mistake costs one call for one window, a slot given back by
    mistake may cost a provider 429.
    """
    holder = tag.holder
    if tag.returned or holder is None:
        return False
    if view is None or (view.uid is not None and view.uid != holder.uid):
        return True  # the task was deleted (its id may be another task's now)
    if view.problems:
        return False
    rec = view.records.get(holder.epoch)
    if rec is None or rec.state != State.WORKING or rec.owner is None:
        return False
    if (rec.receipts or {}).get(MODEL_CALL):
        return False
    after = view.records.get(holder.epoch + 1)
    if after is not None:
        return after.op == "requeue"  # the keeper found the lease expired
    return rec.lease_until is not None and rec.lease_until < now


def collectable(tags: Sequence[SlotTag], now: float) -> list[int]:
    """Tag ids of superseded generations (and their markers) safe to remove: each has a
    successor created more than :data:`COLLECT_AFTER` ago. The newest generation of a
    slot is never removed."""
    by_slot: dict[tuple[int, int], list[SlotTag]] = {}
    for t in tags:
        by_slot.setdefault((t.ref.cap, t.ref.slot), []).append(t)
    out: list[int] = []
    for gens in by_slot.values():
        gens.sort(key=lambda t: t.ref.gen)
        for older, newer in itertools.pairwise(gens):
            if newer.at != float("inf") and newer.at < now - COLLECT_AFTER:
                out.append(older.tag_id)
                if older.marker_id is not None:
                    out.append(older.marker_id)
    return out


def holders(
    tables: Mapping[str, Sequence[SlotTag]], windows: Mapping[str, float], now: float
) -> list[SlotTag]:
    """The reservations tied to a lease that still hold a slot (what the keeper checks):
    inside their model's longest window, not given back."""
    out = []
    for key, tags in tables.items():
        window = windows.get(key)
        if window is None:
            continue
        out += [t for t in tags if t.holder is not None and not t.returned and t.at + window > now]
    return out


def in_use(tables: Mapping[str, Sequence[SlotTag]], caps: Mapping[str, Sequence[Cap]], now: float) -> int:
    """How many slots hold a call now, over every cap of every model in ``caps`` (each cap
    judged by its own window: the keeper's gauge)."""
    total = 0
    for key, model_caps in caps.items():
        table = SlotTable.of(model_caps, tables.get(key, []))
        total += sum(len(table.busy(i, now)) for i in range(len(model_caps)))
    return total
