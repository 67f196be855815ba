"""Storage of the shared quota ledger: slot tags in the quota project.

A quota of N calls per rolling window W that several hosts spend is kept as N **slots**
per cap (a card's ``limit``/``window``, and its ``second_limit``/``second_window``). A
call takes one slot of each cap. Each slot has generations 0, 1, 2, … and **taking a slot
means creating its next generation's tag** in the quota project::

    q/<model>/c<cap>/s<slot>/g<gen>          the reservation (colour: who, when)
    q/<model>/c<cap>/s<slot>/g<gen>/x        that reservation given back (colour: why, when)

Kanboard's UNIQUE(project_id, name) on tags makes ``createTag`` a test-and-set (the one
the epoch ledger's locks use): of all the hosts that read generation g of a slot and try
g+1, exactly one gets an id. A slot is busy while its newest generation is inside its
window and not given back, so the N slots hold at most N calls in any window W.

A reservation's colour (Kanboard stores ``color_id`` verbatim, 50 characters at most on
PostgreSQL and MySQL) says who holds it and when it was taken:
``<task uid>.<epoch>.<task id>.<ms>`` for a call made under a task lease (the keeper gives
it back when that lease dies), ``<nonce>.<ms>`` for a call with no lease (a sync A2A call).
It is also what settles an ambiguous ``createTag``: the colour is unique to the attempt.

The quota project holds nothing else, so a read (``getTagsByProject``) costs what the
shared quotas hold, never what the history of tasks holds. Humans never need to open it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence

from fabric.errors import ConfigError
from fabric.kanboard.port import BoardError, Call, MaybeDone, RpcError, RpcPort
from fabric.kanboard.rows import BoardTag, tag_rows
from fabric.plain import Plain

__all__ = [
    "QuotaHolder",
    "QuotaProjectMissing",
    "QuotaStore",
    "SlotRef",
    "SlotTag",
    "model_key",
    "moved_holder",
    "parse_slot_tags",
]

_PREFIX = "q/"
_NAME = re.compile(r"^q/([a-z0-9_.-]+)/c(\d+)/s(\d+)/g(\d+)(/x)?$")
_SAFE_KEY = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
COLOR_ROOM = 50  # tags.color_id is VARCHAR(50) on PostgreSQL and MySQL


def model_key(endpoint_id: str) -> str:
    """The model's name in its slot tags: the card id when it is short lowercase ASCII
    (MySQL compares tag names case-insensitively), else a hash of it."""
    if _SAFE_KEY.match(endpoint_id):
        return endpoint_id
    return "h" + hashlib.sha256(endpoint_id.encode()).hexdigest()[:16]


class QuotaHolder(Plain):
    """The task lease a reservation is tied to."""

    task_id: int
    uid: str
    epoch: int


class SlotRef(Plain):
    """One generation of one slot of one cap."""

    cap: int
    slot: int
    gen: int

    def name(self, key: str) -> str:
        return f"{_PREFIX}{key}/c{self.cap}/s{self.slot}/g{self.gen}"


class SlotTag(Plain):
    """A reservation as the board holds it (``returned``: its give-back marker exists)."""

    key: str
    ref: SlotRef
    at: float
    holder: QuotaHolder | None
    color: str
    tag_id: int
    returned: bool = False
    marker_id: int | None = None


def _holder_color(holder: QuotaHolder | None, at: float) -> str:
    ms = str(int(at * 1000))
    if holder is not None:
        color = f"{holder.uid}.{holder.epoch}.{holder.task_id}.{ms}"
        if len(color) <= COLOR_ROOM:
            return color
    return f"{secrets.token_hex(6)}.{ms}"


def _parse_color(color: str) -> tuple[float, QuotaHolder | None] | None:
    parts = color.split(".")
    try:
        if len(parts) == 4:
            uid, epoch, task_id, ms = parts
            return int(ms) / 1000.0, QuotaHolder(int(task_id), uid, int(epoch))
        if len(parts) == 2:
            return int(parts[1]) / 1000.0, None
    except ValueError:
        return None
    return None


def moved_holder(color: str, id_map: dict[int, int]) -> str:
    """A reservation's colour with its task's new id (a restore renumbers tasks; the uid
    and epoch stay). Other colours are returned as they are."""
    parsed = _parse_color(color)
    if parsed is None or parsed[1] is None or parsed[1].task_id not in id_map:
        return color
    uid, epoch, _, ms = color.split(".")
    return f"{uid}.{epoch}.{id_map[parsed[1].task_id]}.{ms}"


def parse_slot_tags(tags: Sequence[BoardTag]) -> dict[str, list[SlotTag]]:
    """The quota project's tags as reservations, by model key (other tags are ignored;
    a reservation whose colour does not parse counts as taken now: the safe reading)."""
    found: dict[tuple[str, SlotRef], SlotTag] = {}
    markers: dict[tuple[str, SlotRef], int] = {}
    for tag in tags:
        m = _NAME.match(tag.name)
        if m is None:
            continue
        key, ref = m.group(1), SlotRef(int(m.group(2)), int(m.group(3)), int(m.group(4)))
        if m.group(5):
            markers[(key, ref)] = tag.id
            continue
        parsed = _parse_color(tag.color)
        at, holder = parsed if parsed is not None else (float("inf"), None)
        found[(key, ref)] = SlotTag(key, ref, at, holder, tag.color, tag.id)
    out: dict[str, list[SlotTag]] = {}
    for (key, ref), slot in found.items():
        mark = markers.get((key, ref))
        if mark is not None:
            slot = SlotTag(key, ref, slot.at, slot.holder, slot.color, slot.tag_id, True, mark)
        out.setdefault(key, []).append(slot)
    return out


class QuotaProjectMissing(ConfigError):
    """The board has no quota project: `agap init` creates it for shared quotas."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the quota project {name!r} does not exist",
            where="AGAP_QUOTA_PROJECT",
            hint="run `agap init` (it creates the project when a card shares a quota across hosts)",
        )


class QuotaStore:
    """The shared quota ledger's round trips (each method is one, unless it says so)."""

    def __init__(self, port: RpcPort, project: str) -> None:
        self.port = port
        self.project = project
        self._pid: int | None = None

    def project_id(self) -> int:
        """The quota project's id (one round trip, once)."""
        if self._pid is None:
            found = self.port.call("getProjectByName", {"name": self.project})
            if not isinstance(found, dict) or not found.get("id"):
                raise QuotaProjectMissing(self.project)
            self._pid = int(found["id"])
        return self._pid

    def ensure_project(self) -> int:
        """Create the quota project unless it exists (``agap init``)."""
        try:
            return self.project_id()
        except QuotaProjectMissing:
            created = self.port.call("createProject", {"name": self.project})
            if not created:
                raise
            self._pid = int(created)
            return self._pid

    def read(self) -> dict[str, list[SlotTag]]:
        """Every reservation on the board, by model key."""
        pid = self.project_id()
        return parse_slot_tags(tag_rows(self.port.call("getTagsByProject", {"project_id": pid})))

    def take(
        self, key: str, refs: Sequence[SlotRef], holder: QuotaHolder | None, at: float
    ) -> list[SlotTag | None]:
        """Try to create each reservation (one batch); the ones won, None for the lost.

        An ambiguous answer (an error that may have committed) is settled by one read:
        the attempt's colour is unique, so the tag holding it is ours. If even that read
        fails the reservation counts as lost (a slot won that way stays busy for a window:
        the safe side)."""
        if not refs:
            return []
        pid = self.project_id()
        color = _holder_color(holder, at)
        calls = [Call("createTag", {"project_id": pid, "tag": r.name(key), "color_id": color}) for r in refs]
        try:
            outs = [o.value if o.error is None else o.error for o in self.port.batch(calls)]
        except MaybeDone:
            outs = [MaybeDone("batch lost in transit")] * len(refs)
        won: list[SlotTag | None] = []
        unsure: list[int] = []
        for i, (ref, out) in enumerate(zip(refs, outs, strict=True)):
            if isinstance(out, BoardError):
                if isinstance(out, MaybeDone) or (isinstance(out, RpcError) and out.maybe_done):
                    unsure.append(i)
                won.append(None)
            elif out:
                won.append(SlotTag(key, ref, at, holder, color, int(out)))
            else:
                won.append(None)
        if unsure:
            try:
                mine = {s.ref: s for s in self.read().get(key, []) if s.color == color}
            except BoardError:
                mine = {}
            for i in unsure:
                won[i] = mine.get(refs[i])
        return won

    def give_back(self, key: str, refs: Sequence[SlotRef], why: str, at: float) -> int:
        """Mark reservations given back (one batch); how many markers this call created.
        ``why``: ``r`` the holder refunded it, ``k`` the keeper returned a dead lease's."""
        if not refs:
            return 0
        pid = self.project_id()
        color = f"{why}.{int(at * 1000)}"
        calls = [
            Call("createTag", {"project_id": pid, "tag": f"{r.name(key)}/x", "color_id": color}) for r in refs
        ]
        return sum(1 for o in self.port.batch(calls) if o.error is None and o.value)

    def remove(self, tag_ids: Sequence[int]) -> None:
        """Remove superseded reservations (the keeper's collection; one batch, never re-sent:
        SQLite may hand a removed tag's id to the next one)."""
        if tag_ids:
            self.port.batch([Call("removeTag", {"tag_id": t}) for t in tag_ids])
