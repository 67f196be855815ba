"""What one agent may do on the fabric: the operations behind the MCP tools.

Each operation is the CLI's path with the agent fixed. ``submit`` is ``Fabric.submit`` with
the card as the actor; ``claim`` is the worker's ``QueueReader.claim_next`` with the
worker's claim-time policy; ``heartbeat``, ``complete``, ``fail`` and ``ask`` are the
ledger's owner transitions under the lease this server holds; text results go to the
workers' result store. Nothing here re-implements a transition, and every refusal is the
library's :class:`~fabric.errors.FabricError`, turned into one tool-error line by
:func:`tool_error`.

**Scope.** The server acts as its card, as a worker does:

* it claims only from the card's queue, under the worker's claim check (the task is for
  this queue, its refs lie in the card's privacy domains, its trust floor is met, no
  ungated taint); a task refused there is dead-lettered with the reason, as a worker does;
* it reads (``get_task``, the task resource) only fabric tasks of the work project that
  are in its queue or that it submitted, and only when their refs lie in its privacy
  domains; the result of another agent's untrusted work is withheld (the taint rule);
* it submits as its card, so the creation quota, depth cap, cycle and taint rules apply
  to it; it may pass only refs in its own privacy domains, an untrusted card may submit
  only to itself or to a person, and a ``parent`` must be a task it may read.

**Leases.** The server keeps the leases it claimed (owner ``AGAP_WORKER_ID`` or
``<agent>@<host>:<pid>``), so the model names only the task. While it holds one, the
renewer rewrites it every third of its length (one round trip, as a worker's heartbeat)
for up to the card's ``runtime.timeout_seconds`` after the claim or the model's last
heartbeat; past that only an explicit heartbeat keeps it alive, so a stuck model loses its
task to the keeper. A renewal that finds a newer epoch marks the task fenced, and the next
call about it is refused with the fence. On shutdown the leases still held are released.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric.apps import leasing
from fabric.apps.leasing import held_lease, person_to_ask, read_result_file, result_uri
from fabric.cards import Card
from fabric.core import Fabric
from fabric.errors import EXIT_CODES, ConfigError, FabricError, InvalidInput
from fabric.kanboard.port import BoardError
from fabric.kanboard.views import TaskView
from fabric.ledger import Fenced, Lease, NotHolder, conversation
from fabric.people import find_person
from fabric.policy import (
    GateRequest,
    PolicyContext,
    PolicyRefused,
    TaintRefused,
    check_domains,
)
from fabric.policy_file import PolicyConfig
from fabric.results import ResultStore, read_result
from fabric.slots import MissedSlot
from fabric.taint import is_tainted
from fabric.task import PRIORITY_NAMES, State, TaskSpec
from workers.queue import QueueReader

from .targets import AUTO, target_ids, target_rows

log = logging.getLogger("agap.mcp")

# A result read back into a model's context is cut here: a model reads a summary, not a
# book; the whole result stays behind its ref.
RESULT_CHARS = 20_000
# The card schema's floor for a lease, and a day as the ceiling a tool call may ask for.
LEASE_MIN, LEASE_MAX = 5.0, 86_400.0
_ATTACHMENT = re.compile(r"^kanboard://task/(\d+)/file/[^/]+$")

# What each exit code means for a model reading a tool error (the CLI's table, by name).
_LABELS = {
    1: "TRANSITION_FAILED",
    2: "INVALID",
    3: "BOARD_UNAVAILABLE",
    4: "LOST_RACE",
    5: "COLLISION",
    6: "REFUSED",
    7: "BOARD_REFUSED",
}
# The CLI's flag names in error lines, as the tools' argument names.
_ARGS = {"--ref": "refs", "--actor": "agent"}
_FLAG = re.compile(r"--([a-z][a-z-]*)")


class OutOfScope(PolicyRefused):
    """A task this agent may not read or act on through MCP."""

    code = "OUT_OF_SCOPE"


def tool_error(exc: FabricError) -> str:
    """The error line a tool returns: a label, the CLI's line (arguments named as the tool
    names them) and the exit code; a fenced lease says to stop."""
    where = _FLAG.sub(lambda m: _ARGS.get(m.group(0), m.group(1).replace("-", "_")), exc.where)
    line = f"{where}: {exc.what}" if where else exc.what
    if exc.hint:
        line += f" — {exc.hint}"
    code = exc.exit_code
    if isinstance(exc, Fenced):
        return (
            f"FENCED (exit {code}): {line}. Stop working on task #{exc.task_id}: do not call "
            "complete_task, fail_task or ask_human for it again; claim_task gives new work."
        )
    label = MissedSlot.code if isinstance(exc, MissedSlot) else _LABELS.get(code, "ERROR")
    return f"{label} (exit {code}: {EXIT_CODES.get(code, 'error')}): {line}"


def _text(value: str | None, name: str) -> str:
    """A required free-text argument, stripped; empty is refused like the CLI's --intent."""
    if value is None or not value.strip():
        raise InvalidInput(f"the {name.replace('_', ' ')} is empty", where=name)
    return value.strip()


def lease_length(value: float | None, card: Card) -> float:
    """A lease length asked for by a tool call: the card's when None, else within bounds."""
    if value is None:
        return float(card.runtime.lease_seconds)
    if not LEASE_MIN <= value <= LEASE_MAX:
        raise InvalidInput(
            f"lease of {value:g} s is out of range",
            where="lease_seconds",
            hint=f"use {LEASE_MIN:g} to {LEASE_MAX:g} seconds, or leave it out for the card's "
            f"{card.runtime.lease_seconds} s",
        )
    return float(value)


def check_read(card: Card, view: TaskView, lanes: Collection[int], cfg: PolicyConfig) -> None:
    """Refuse a task ``card`` may not read: outside the work project, neither in its queue
    nor submitted by it, or with refs outside its privacy domains."""
    spec = view.spec
    where = f"task #{view.id}"
    limit = f"queue {card.queue_name!r}, or tasks {card.id} submitted"
    if spec is None or view.task.swimlane_id not in lanes:
        raise OutOfScope("mcp.read", "it is not a fabric task of the work project", limit=limit, where=where)
    if spec.queue != card.queue_name and spec.actor != card.id:
        raise OutOfScope(
            "mcp.read",
            f"{card.id} may not read it (queue {spec.queue!r}, submitted by {spec.actor!r})",
            limit=limit,
            where=where,
        )
    check_domains(card, spec.refs, cfg)


class AgentSubmitScope:
    """The submit policy of an agent acting through MCP (runs before the others).

    Its refs must lie in its own privacy domains (it may not hand on what it may not see),
    and an untrusted card's words reach only itself or a person: anything it writes is
    output of untrusted work. Other actors (the gate tasks the policy submits) pass.
    """

    def __init__(self, card: Card) -> None:
        self.card = card

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        if spec.actor != self.card.id:
            return None
        check_domains(self.card, spec.refs, ctx.config)
        if self.card.trust == "untrusted" and card.id != self.card.id and not card.is_human:
            raise TaintRefused(
                "taint.mcp-submit",
                f"{self.card.id} is untrusted: what it writes may reach {card.id} only through a person",
                limit="an untrusted agent submits to itself or to a human",
                where="target",
                hint="ask a person with ask_human, or submit to a human card",
            )
        return None


@dataclass
class _Held:
    """A lease this server holds, its length, and when it was last renewed and touched."""

    lease: Lease
    seconds: float
    renewed_at: float
    touched_at: float


def _conversation(lease_or_view: Lease | TaskView) -> list[dict[str, str]]:
    pairs = lease_or_view.conversation if isinstance(lease_or_view, Lease) else conversation(lease_or_view)
    return [{"kind": kind, "text": text} for kind, text in pairs]


def _spec_data(spec: TaskSpec) -> dict[str, Any]:
    return {
        "intent": spec.intent,
        "refs": list(spec.refs),
        "target": spec.target,
        "queue": spec.queue,
        "priority": PRIORITY_NAMES.get(spec.priority, str(spec.priority)),
        "deadline": spec.deadline,
        "not_before": spec.not_before,
        "submitted_by": spec.actor,
        "max_attempts": spec.max_attempts,
    }


class AgentTools:
    """One agent card's operations on the fabric, for the MCP tools (thread-safe).

    The SDK runs each tool call in a worker thread; one lock keeps the fabric connection
    (which is single-threaded) and the lease table consistent, renewer included.
    """

    def __init__(
        self,
        fab: Fabric,
        agent: str,
        *,
        owner: str,
        results: ResultStore,
        result_dir: str | None = None,
        renew_for: float | None = None,
        user: str | None = None,
    ) -> None:
        card = fab.cards.get(agent)
        if card.is_human or card.kind == "router":
            raise ConfigError(
                f"{agent!r} is a {card.kind} card: it takes no work from a queue",
                where="--agent",
                hint="serve an agent that drains a queue (a persona or model card)",
            )
        self.fab = fab
        self.card = card
        self.owner = owner
        self.results = results
        self.result_dir = result_dir
        # The Kanboard username of the person using the MCP client (AGAP_MCP_USER), or None.
        self.user = user
        self.renew_for = float(card.runtime.timeout_seconds if renew_for is None else renew_for)
        fab.policies.insert(0, AgentSubmitScope(card))
        self._reader = QueueReader.for_agent(fab, card)
        self._lock = threading.RLock()
        self._held: dict[int, _Held] = {}
        self._fenced: dict[int, Fenced] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- scope ----------------------------------------------------------------------

    def _read(self, task_id: int) -> TaskView:
        view = self.fab.show(task_id)
        # The confined agents' homes are the fabric's too (fabric.kanboard.principals).
        check_read(self.card, view, self.fab.lanes(), self.fab.policy_context().config)
        return view

    # -- submit and read ------------------------------------------------------------

    def submit(
        self,
        intent: str,
        *,
        target: str | None = None,
        constraints: str | None = None,
        refs: list[str] | tuple[str, ...] = (),
        priority: str = "normal",
        deadline: str | None = None,
        not_before: str | None = None,
        key: str | None = None,
        parent: int | None = None,
        slot: str | None = None,
        timezone: str | None = None,
    ) -> dict[str, Any]:
        """``agap submit`` as this agent; ``parent`` defaults to the one task it holds."""
        intent = _text(intent, "intent")
        if target:
            self._known_target(target.strip())
        with self._lock:
            if parent is None and len(self._held) == 1:
                parent = next(iter(self._held))
            if parent is not None:
                self._read(parent)
            receipt = self.fab.submit(
                intent,
                target=target or None,
                constraints=constraints or None,
                refs=tuple(refs),
                priority=priority,
                deadline=deadline or None,
                not_before=not_before or None,
                key=key,
                actor=self.card.id,
                parent=parent,
                slot=slot or None,
                timezone=timezone or None,
            )
        return {
            "task_id": receipt.task_id,
            "ref": receipt.ref,
            "uid": receipt.uid,
            "queue": receipt.queue,
            "created": receipt.created,
            "parent": parent,
        }

    def _known_target(self, target: str) -> None:
        """Refuse a target that is no card, in one line that lists the ones to use."""
        if target == AUTO or target in self.fab.cards:
            return
        ids = target_ids(self.card, self.fab.cards)
        raise InvalidInput(
            f"unknown target {target!r}",
            where="target",
            hint=f"you may target: {', '.join(ids)}; list_targets (or the agap://targets resource) "
            "says what each is for and whether it is available now",
        )

    def targets(self) -> dict[str, Any]:
        """Who this agent may submit to: id, what each is for, kind, trust, availability now."""
        with self._lock:
            parks = self.fab.reader().park_states()
            now = self.fab.clock()
        return {
            "you": self.card.id,
            "targets": target_rows(self.card, self.fab.cards, parks, now),
            "how": "pass one id as submit_task's target (or constraints instead, e.g. "
            "'tier>=large,cap=reflect'); a person gets the task in their Kanboard inbox",
        }

    def get_task(self, task_id: int) -> dict[str, Any]:
        """A task this agent may read: its state, lease, conversation and result."""
        with self._lock:
            view = self._read(task_id)
            data = self._view_data(view)
            data.update(self._result(view))
        return data

    def _view_data(self, view: TaskView) -> dict[str, Any]:
        cur = view.current
        assert view.spec is not None and cur is not None  # check_read let only fabric tasks by
        held = self._held.get(view.id)
        return {
            "task_id": view.id,
            "title": view.task.title,
            "state": cur.state.value,
            "epoch": view.epoch,
            "open": view.is_open,
            "owner": cur.owner if cur.state == State.WORKING else None,
            "lease_until": cur.lease_until if cur.state == State.WORKING else None,
            "attempt": cur.attempt,
            "waiting_on": cur.assignee if cur.state == State.INPUT_REQUIRED else None,
            "reason": cur.reason,
            "held_by_you": held is not None and held.lease.epoch == view.epoch,
            **_spec_data(view.spec),
            "conversation": _conversation(view),
            "problems": list(view.problems),
        }

    def _result(self, view: TaskView) -> dict[str, Any]:
        """The result ref, and its text when this agent may read it and the store has it."""
        cur, spec = view.current, view.spec
        assert cur is not None and spec is not None
        ref = cur.result_ref
        if not ref:
            return {"result_ref": None, "result": None}
        if is_tainted(self.fab.cards, spec) and spec.target != self.card.id and not self.card.is_human:
            return {
                "result_ref": ref,
                "result": None,
                "result_note": f"output of untrusted work by {spec.target}: it reaches {self.card.id} only "
                f"through a gate a person approves (submit with ref task:{view.id} to ask for one)",
            }
        try:
            text = self._fetch(view.id, ref)
        except FabricError as exc:
            return {"result_ref": ref, "result": None, "result_note": f"could not read it: {exc.line()}"}
        if text is None:
            return {
                "result_ref": ref,
                "result": None,
                "result_note": "not stored by the fabric: open the ref",
            }
        cut = len(text) > RESULT_CHARS
        return {"result_ref": ref, "result": text[:RESULT_CHARS], "result_truncated": cut}

    def _fetch(self, task_id: int, ref: str) -> str | None:
        return read_result(self.fab.board, task_id, ref, self.result_dir)

    def queue(self) -> dict[str, Any]:
        """This agent's queue: its open tasks (one search) and the claims this server holds."""
        with self._lock:
            rows = [r for r in self.fab.listing() if r["queue"] == self.card.queue_name]
            park = self.fab.parks.get(self.card.queue_name) or {}
            held = [self._held_data(h) for h in self._held.values()]
        for r in rows:
            r["priority"] = PRIORITY_NAMES.get(int(r["priority"]), str(r["priority"]))
        return {
            "agent": self.card.id,
            "queue": self.card.queue_name,
            "parked": bool(park.get("parked")),
            "park": park or None,
            "tasks": rows,
            "held": held,
        }

    def _held_data(self, h: _Held) -> dict[str, Any]:
        return {
            "task_id": h.lease.task_id,
            "epoch": h.lease.epoch,
            "owner": h.lease.owner,
            "lease_until": h.lease.lease_until,
            "auto_renew_until": h.touched_at + self.renew_for,
        }

    # -- the lease ------------------------------------------------------------------

    def claim(self, lease_seconds: float | None = None) -> dict[str, Any]:
        """Claim the next due task of this agent's queue, or say there is none."""
        seconds = lease_length(lease_seconds, self.card)
        with self._lock:
            limit = self.card.runtime.concurrency
            if len(self._held) >= limit:
                raise InvalidInput(
                    f"this agent already holds {len(self._held)} task(s), its card's concurrency",
                    where="claim_task",
                    hint="finish one with complete_task, fail_task or ask_human first: "
                    + ", ".join(f"#{t}" for t in sorted(self._held)),
                )
            lease = self._reader.claim_next(self.owner, lease_seconds=seconds)
            if lease is None:
                return {"claimed": False, "message": f"nothing to claim in queue {self.card.queue_name!r}"}
            now = self.fab.clock()
            self._held[lease.task_id] = _Held(lease, seconds, now, now)
            self._wake.set()
        return {
            "claimed": True,
            "task_id": lease.task_id,
            "epoch": lease.epoch,
            "owner": lease.owner,
            "lease_until": lease.lease_until,
            "lease_seconds": seconds,
            "auto_renew_until": now + self.renew_for,
            "attempt": lease.attempt,
            "checkpoint": lease.checkpoint,
            **_spec_data(lease.spec),
            "conversation": _conversation(lease),
            "next": f"work on it, then call complete_task, fail_task or ask_human with task_id "
            f"{lease.task_id}; heartbeat_task keeps the lease past auto_renew_until",
        }

    def _entry(self, task_id: int, epoch: int | None) -> _Held:
        """The lease held on ``task_id``: this server's, or rebuilt from the records when it
        names this owner (a restarted server with a fixed AGAP_WORKER_ID)."""
        fenced = self._fenced.pop(task_id, None)
        if fenced is not None:
            raise fenced
        held = self._held.get(task_id)
        if held is not None:
            if epoch is not None and epoch != held.lease.epoch:
                raise InvalidInput(
                    f"this server holds epoch {held.lease.epoch}, not {epoch}",
                    where=f"task #{task_id}",
                    hint="leave epoch out, or pass the one claim_task returned",
                )
            return held
        view = self._read(task_id)
        rec = view.records.get(epoch) if epoch is not None else None
        if epoch is not None and epoch < view.epoch and rec is not None and rec.owner == self.owner:
            raise Fenced(task_id, epoch, view.epoch)
        try:
            lease, _ = held_lease(self.fab, task_id, view.epoch if epoch is None else epoch, self.owner)
        except NotHolder as exc:  # the CLI's line; the hint names the tool instead of the flags
            raise NotHolder(exc.what, where=exc.where, hint="claim it with claim_task first") from None
        now = self.fab.clock()
        held = _Held(lease, float(self.card.runtime.lease_seconds), now, now)
        self._held[task_id] = held
        return held

    def _owner_op(self, task_id: int, epoch: int | None, op: Callable[[_Held], Any]) -> Any:
        """Run an owner transition under the held lease; a fence drops the lease."""
        with self._lock:
            held = self._entry(task_id, epoch)
            try:
                return op(held)
            except Fenced:
                self._held.pop(task_id, None)
                raise

    def heartbeat(self, task_id: int, epoch: int | None = None) -> dict[str, Any]:
        """Renew the lease now (``agap heartbeat``), and restart the auto-renew window."""

        def renew(held: _Held) -> dict[str, Any]:
            held.lease = self.fab.ledger.renew(held.lease, lease_seconds=held.seconds)
            held.renewed_at = held.touched_at = self.fab.clock()
            return {
                "task_id": task_id,
                "epoch": held.lease.epoch,
                "lease_until": held.lease.lease_until,
                "auto_renew_until": held.touched_at + self.renew_for,
            }

        return dict(self._owner_op(task_id, epoch, renew))

    def complete(
        self,
        task_id: int,
        *,
        result: str | None = None,
        result_file: str | None = None,
        result_ref: str | None = None,
        note: str | None = None,
        epoch: int | None = None,
    ) -> dict[str, Any]:
        """Done (unverified), with the result as text, a file, or a ref (``agap complete``)."""
        given = [x for x in (result, result_file, result_ref) if x is not None]
        if len(given) != 1:
            raise InvalidInput(
                "give exactly one of result (text), result_file (a path) or result_ref (a URI)",
                where="complete_task",
            )
        text = self._result_input(result, result_file, result_ref)

        def done(held: _Held) -> dict[str, Any]:
            given = result_ref.strip() if result_ref is not None else None
            rec, ref = leasing.complete(self.fab, held.lease, self.results, ref=given, text=text, note=note)
            self._held.pop(task_id, None)
            return {"task_id": task_id, "state": rec.state.value, "epoch": rec.epoch, "result_ref": ref}

        return dict(self._owner_op(task_id, epoch, done))

    def _result_input(
        self, result: str | None, result_file: str | None, result_ref: str | None
    ) -> str | None:
        """The result text to store (None for a ref), validated before anything is written."""
        if result is not None:
            _text(result, "result")
            return result  # as written: only refused when blank
        if result_ref is not None:
            result_uri(result_ref, "result_ref")
            return None
        assert result_file is not None
        return self._read_result_file(result_file)

    def _read_result_file(self, name: str) -> str:
        path = Path(name)
        if not path.is_absolute():
            raise InvalidInput(f"{name!r} is not an absolute path", where="result_file")

        def in_domains(p: Path) -> None:
            check_domains(self.card, [p.as_uri()], self.fab.policy_context().config)

        return read_result_file(path, "result_file", check=in_domains)

    def fail(
        self, task_id: int, reason: str, *, poison: bool = False, epoch: int | None = None
    ) -> dict[str, Any]:
        """A failed attempt: retried after a backoff, or dead-lettered (``agap fail``)."""
        reason = _text(reason, "reason")

        def failed(held: _Held) -> dict[str, Any]:
            lease = held.lease
            card = self.fab.cards.get(lease.spec.target)
            rec = self.fab.ledger.fail(
                lease, reason, poison=poison, backoff_base=card.runtime.backoff_seconds
            )
            self._held.pop(task_id, None)
            return {
                "task_id": task_id,
                "state": rec.state.value,
                "epoch": rec.epoch,
                "retried": rec.state == State.QUEUED,
                "not_before": rec.not_before,
            }

        return dict(self._owner_op(task_id, epoch, failed))

    def ask(
        self, task_id: int, question: str, *, human: str | None = None, epoch: int | None = None
    ) -> dict[str, Any]:
        """Ask a person: the task waits in their inbox and comes back with the answer."""
        question = _text(question, "question")

        def asked(held: _Held) -> dict[str, Any]:
            username = self._human(human, held.lease.spec)
            rec = self.fab.ledger.ask(held.lease, question, username)
            self._held.pop(task_id, None)
            return {
                "task_id": task_id,
                "state": rec.state.value,
                "epoch": rec.epoch,
                "asked": username,
                "next": f"the task waits in {username}'s inbox; once answered it is queued again "
                "and claim_task returns it with the answer in its conversation",
            }

        return dict(self._owner_op(task_id, epoch, asked))

    def _human(self, name: str | None, spec: TaskSpec) -> str:
        """Who a question goes to: the person named; else the submitter when a person; else
        this client's own user when known; else the household's first person."""
        if not name and self.user is not None and not self._by_person(spec):
            return self.user
        return person_to_ask(self.fab.cards, name, spec, where="human")

    def _by_person(self, spec: TaskSpec) -> bool:
        card = find_person(self.fab.cards, spec.actor)
        return card is not None and card.human is not None

    def ask_target(self, task_id: int, human: str | None, epoch: int | None = None) -> tuple[str, bool]:
        """Who ``ask`` would ask about a held task, and whether that is this client's own user
        (whose questions may go to the client as elicitation). Writes nothing."""
        with self._lock:
            held = self._entry(task_id, epoch)
            username = self._human(human, held.lease.spec)
        return username, self.user is not None and username == self.user

    def ask_answered(
        self, task_id: int, question: str, answer: str, *, epoch: int | None = None
    ) -> dict[str, Any]:
        """A question this client's user answered at once (elicitation): journaled as asked
        and answered, the way a person's answer in the inbox is; the task is queued again."""
        question = _text(question, "question")
        answer = _text(answer, "answer")
        user = self.user
        if user is None:
            raise InvalidInput("no AGAP_MCP_USER: nobody to answer at the client", where="ask_human")

        def asked(held: _Held) -> dict[str, Any]:
            self.fab.ledger.ask(held.lease, question, user)
            self._held.pop(task_id, None)
            rec = self.fab.ledger.resume(task_id, user, answer)
            return {
                "task_id": task_id,
                "state": rec.state.value,
                "epoch": rec.epoch,
                "asked": user,
                "answered": True,
                "answer": answer,
                "next": "the answer is in the task's conversation; it is queued again and claim_task "
                "returns it",
            }

        return dict(self._owner_op(task_id, epoch, asked))

    # -- the renewer -------------------------------------------------------------------

    def renew_due(self) -> list[int]:
        """Renew every held lease a third of whose length has passed, within the auto-renew
        window; returns the tasks renewed. A fence is kept for the next call about the task."""
        renewed: list[int] = []
        with self._lock:
            now = self.fab.clock()
            for task_id, held in list(self._held.items()):
                if now - held.renewed_at < held.seconds / 3 or now - held.touched_at >= self.renew_for:
                    continue
                try:
                    held.lease = self.fab.ledger.renew(held.lease, lease_seconds=held.seconds)
                except Fenced as exc:
                    log.warning("task #%s: fenced (%s); the next call about it is refused", task_id, exc)
                    self._held.pop(task_id, None)
                    self._fenced[task_id] = exc
                    continue
                except BoardError as exc:  # the next tick tries again; the lease has time left
                    log.warning("task #%s: lease renewal failed: %s", task_id, exc.line())
                    continue
                held.renewed_at = now
                renewed.append(task_id)
        return renewed

    def _tick(self) -> float:
        with self._lock:
            lengths = [h.seconds for h in self._held.values()]
        return max(0.5, min(lengths) / 6) if lengths else 5.0

    def _run(self) -> None:
        while True:
            self._wake.wait(self._tick())
            self._wake.clear()
            if self._stopping:
                return
            try:
                self.renew_due()
            except Exception:  # the renewer must outlive one bad round; the lease has slack
                log.exception("lease renewal round failed")

    def start(self) -> None:
        """Start the renewer thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agap-mcp-renewer", daemon=True)
            self._thread.start()

    def close(self) -> list[int]:
        """Stop the renewer and release the leases still held (as a stopping worker does)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        released: list[int] = []
        with self._lock:
            for task_id, held in list(self._held.items()):
                with contextlib.suppress(FabricError):
                    self.fab.ledger.release(held.lease, "the MCP server stopped")
                    released.append(task_id)
            self._held.clear()
        return released


def as_json(data: Any) -> str:
    """A tool's or resource's answer as JSON text."""
    return json.dumps(data, indent=2, sort_keys=True, default=str)


__all__ = ["AgentSubmitScope", "AgentTools", "OutOfScope", "as_json", "check_read", "tool_error"]
