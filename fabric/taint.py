"""Taint: which refs point at output of untrusted work, and which gate lets it through.

A task that ran on an untrusted agent produced tainted output; a ref points at it when it
names the task (``task:12``, ``kanboard://task/12/…``), a file under the task's uid, or a
prefix the policy file lists as tainted. Such output may go back only to its producer or
to a human, unless an approved gate task for exactly these refs into this target is cited
among the refs. :class:`fabric.policy.TaintGate` asks for the gate; this module only reads
(at most two round trips, none when no ref names a task).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

from fabric.cards import Card, CardSet
from fabric.kanboard.layout import is_uid
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.views import TaskView
from fabric.plain import Plain
from fabric.policy_file import PolicyConfig
from fabric.task import GATE_ACTOR, State, TaskSpec

_TASK_REF = re.compile(r"^(?:kanboard://task/|task:)#?(\d+)(?:/.*)?$")


def task_of_ref(ref: str) -> tuple[str, int | str] | None:
    """("id", n) for a task ref, ("uid", u) for a file under a task's uid, else None."""
    m = _TASK_REF.match(ref)
    if m:
        return "id", int(m.group(1))
    if ref.startswith("file:"):
        for part in reversed(unquote(urlsplit(ref).path).split("/")):
            if is_uid(part):
                return "uid", part
    return None


def find_by_uid(board: ReadOnlyBoard, uids: Iterable[str]) -> dict[str, tuple[int, TaskSpec, str | None]]:
    """uid -> (task id, spec, assignee), from task descriptions (one round trip).

    A task's description embeds its spec and uid; descendants mention the uid too, so the
    hits are filtered on the embedded uid.
    """
    wanted = sorted(set(uids))
    if not wanted:
        return {}
    found: dict[str, tuple[int, TaskSpec, str | None]] = {}
    for rows in board.search_many([f"desc:{u}" for u in wanted]):
        for row in rows:
            parsed = board.sealed(row.description)
            if parsed and parsed[0] in wanted:
                found[parsed[0]] = (row.id, parsed[1], parsed[2])
    return found


class TaintedRef(Plain):
    """A ref to output of untrusted work, the agent that produced it, and its task."""

    ref: str
    producer: str
    task_id: int | None = None


def is_tainted(cards: CardSet, spec: TaskSpec) -> bool:
    """Whether a task's output is tainted: it ran on an untrusted agent."""
    if spec.constraints.get("taint"):
        return True
    return spec.target in cards and cards.get(spec.target).trust == "untrusted"


def tainted_refs(
    cards: CardSet,
    board: ReadOnlyBoard,
    cfg: PolicyConfig,
    refs: Sequence[str],
    views: dict[int, TaskView] | None = None,
) -> list[TaintedRef]:
    """The refs that point at tainted output (at most two round trips, none without task refs).

    ``views`` collects the tasks read on the way (the gates among them are looked at next).
    """
    out, ids, uids = _sort_refs(refs, cfg)
    if ids:
        out += _tainted_by_id(cards, board, ids, views)
    if uids:
        out += _tainted_by_uid(cards, board, uids)
    return out


def _sort_refs(
    refs: Sequence[str], cfg: PolicyConfig
) -> tuple[list[TaintedRef], dict[str, int], dict[str, str]]:
    """(refs under a configured tainted prefix, refs to a task id, refs to a task uid)."""
    out: list[TaintedRef] = []
    ids: dict[str, int] = {}
    uids: dict[str, str] = {}
    for ref in refs:
        hit = next((p for pre, p in cfg.tainted if ref.startswith(pre)), None)
        if hit is not None:
            out.append(TaintedRef(ref, hit))
            continue
        t = task_of_ref(ref)
        if t is not None and t[0] == "id":
            ids[ref] = int(t[1])
        elif t is not None:
            uids[ref] = str(t[1])
    return out, ids, uids


def _tainted_by_id(
    cards: CardSet, board: ReadOnlyBoard, ids: dict[str, int], views: dict[int, TaskView] | None
) -> list[TaintedRef]:
    read = board.read_many(sorted(set(ids.values())))
    if views is not None:
        views.update(read)
    out: list[TaintedRef] = []
    for ref, tid in ids.items():
        v = read.get(tid)
        if v is not None and v.spec is not None and is_tainted(cards, v.spec):
            out.append(TaintedRef(ref, v.spec.target, tid))
    return out


def _tainted_by_uid(cards: CardSet, board: ReadOnlyBoard, uids: dict[str, str]) -> list[TaintedRef]:
    found = find_by_uid(board, uids.values())
    return [
        TaintedRef(ref, found[uid][1].target, found[uid][0])
        for ref, uid in uids.items()
        if uid in found and is_tainted(cards, found[uid][1])
    ]


def gate_key(target: str, tainted: Sequence[TaintedRef], intent: str = "") -> str:
    """The action id of the gate for promoting ``tainted`` into ``target``."""
    refs = hashlib.sha256("\n".join(sorted(t.ref for t in tainted)).encode()).hexdigest()[:16]
    prefix = f"taint-gate/{target}/{refs}/"
    return prefix + hashlib.sha256(intent.encode()).hexdigest()[:12] if intent else prefix


def ungated_taint(
    cards: CardSet, board: ReadOnlyBoard, cfg: PolicyConfig, spec: TaskSpec, card: Card
) -> list[TaintedRef]:
    """The tainted refs of ``spec`` that may not reach ``card``: not its own output, not
    for a human, and not covered by an approved gate cited among the refs."""
    if card.is_human:
        return []
    views: dict[int, TaskView] = {}
    tainted = [t for t in tainted_refs(cards, board, cfg, spec.refs, views) if t.producer != card.id]
    if not tainted:
        return []
    prefix = gate_key(card.id, tainted)
    for v in views.values():
        s, cur = v.spec, v.current
        if (
            s is not None
            and cur is not None
            and s.actor == GATE_ACTOR
            and (s.action_id or "").startswith(prefix)
            and cur.state in (State.DONE, State.CLOSED)
        ):
            return []  # an approved gate covers exactly these refs into this target
    return tainted


__all__ = [
    "GATE_ACTOR",
    "TaintedRef",
    "find_by_uid",
    "gate_key",
    "is_tainted",
    "tainted_refs",
    "task_of_ref",
    "ungated_taint",
]
