"""MCP task handles: fabric tasks seen as tasks of the MCP tasks extension (SEP-2663).

No MCP SDK here: :mod:`fabric.apps.mcp.tasks` puts this on the wire.

**Handles.** A handle names one fabric task (``s``: a task this agent submitted) or one
question (``a``: the question ``ask_human`` put at an epoch of a task it held), and is
bound to the caller: ``agap-<task>-<kind><epoch>-<mac>``, where the mac is an HMAC-SHA256
over the caller's identity, the kind, the epoch, the task id and the task's uid. It is
unguessable without the key, a caller with another identity cannot use it (its mac does
not verify: "not found", as for an id that never existed), and it outlives the
connection: the state lives on the board, the handle only points at it.

**Status.** From the task's current record (for a question, the record after it):
queued/working → ``working``; input_required → ``input_required`` with ``inputRequests``
(an elicitation of the answer when the question is for this client's own user, else
none: it waits in that person's Kanboard inbox); done/closed → ``completed`` with the
result as a tool result; dead/dropped → ``failed`` with the reason; canceled →
``cancelled``. ``ttlMs`` runs from the submit to the deadline (``null`` without one);
``pollIntervalMs`` is how soon the target worker picks work up: its ``poll_seconds``, or a
second while live events wake it (queued and working tasks).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fabric.errors import FabricError, InvalidInput
from fabric.kanboard.taskboard import TaskNotFound
from fabric.kanboard.views import TaskView
from fabric.ledger import IllegalTransition, Ledger
from fabric.policy import PolicyRefused
from fabric.task import TERMINAL, State, TaskSpec

from .agent import AgentTools

SUBMITTED, ASKED = "s", "a"
_HANDLE = re.compile(r"^agap-([1-9][0-9]{0,11})-([sa])([0-9]{1,9})-([A-Za-z0-9_-]{32})$")
# The answer a person gives, as an elicitation form (one text field).
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer", "minLength": 1}},
    "required": ["answer"],
}
MIN_POLL_MS = 1000


class HandleNotFound(InvalidInput):
    """A task handle that does not verify for this caller, or names no task it may read."""

    def __init__(self, handle: str) -> None:
        shown = handle if len(handle) <= 80 else handle[:77] + "..."
        super().__init__(
            f"task not found: {shown!r}", where="taskId", hint="use a taskId this server returned to you"
        )


@dataclass(frozen=True)
class Handle:
    task_id: int
    kind: str
    epoch: int
    mac: str


def _mac(key: bytes, identity: str, kind: str, epoch: int, task_id: int, uid: str | None) -> str:
    msg = "\0".join((identity, kind, str(epoch), str(task_id), uid or "")).encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode()[:32]


def make_handle(key: bytes, identity: str, view: TaskView, kind: str = SUBMITTED, epoch: int = 0) -> str:
    """The handle ``identity`` gets for ``view`` (a submitted task, or the question at ``epoch``)."""
    return f"agap-{view.id}-{kind}{epoch}-{_mac(key, identity, kind, epoch, view.id, view.uid)}"


def parse_handle(text: str) -> Handle:
    """The parts of a well-formed handle; anything else is not found."""
    m = _HANDLE.match(text or "")
    if m is None:
        raise HandleNotFound(text)
    return Handle(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4))


def verify(key: bytes, identity: str, handle: Handle, view: TaskView, text: str) -> None:
    """Refuse a handle whose mac is not this caller's for this task (compared in constant time)."""
    want = _mac(key, identity, handle.kind, handle.epoch, view.id, view.uid)
    if not hmac.compare_digest(want, handle.mac):
        raise HandleNotFound(text)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def answer_key(epoch: int) -> str:
    """The inputRequests key of the question asked at ``epoch``: unique over the task's life."""
    return f"answer-{epoch}"


def _result_payload(task: dict[str, Any]) -> dict[str, Any]:
    """A done task as the tool result the call would have returned (CallToolResult)."""
    text = task.get("result") or task.get("result_ref") or "done"
    return {"content": [{"type": "text", "text": text}], "structuredContent": task, "isError": False}


def detailed_task(
    handle: str,
    view: TaskView,
    parsed: Handle,
    *,
    user: str | None,
    poll_seconds: float,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The extension's DetailedTask for a handle: what tasks/get returns.

    ``result`` is the task as ``get_task`` reads it (result text withheld where the taint
    rule says so); ``user`` is this client's own user (the person whose questions it may
    answer), or None.
    """
    spec, cur = view.spec, view.current
    assert spec is not None and cur is not None
    first = view.records[min(view.records)]
    out: dict[str, Any] = {
        "taskId": handle,
        "createdAt": iso(first.at),
        "lastUpdatedAt": iso(cur.at),
        "ttlMs": _ttl_ms(spec, first.at),
        "pollIntervalMs": max(MIN_POLL_MS, int(poll_seconds * 1000)),
    }
    if parsed.kind == ASKED:
        out.update(_question_status(view, parsed.epoch, user))
        return out
    out.update(_task_status(view, user, result))
    return out


def _ttl_ms(spec: TaskSpec, created: float) -> int | None:
    return None if spec.deadline is None else max(0, int((spec.deadline - created) * 1000))


def _waiting(view: TaskView, user: str | None) -> dict[str, Any]:
    cur = view.current
    assert cur is not None
    who, question = cur.assignee or "a person", cur.reason or ""
    requests: dict[str, Any] = {}
    if user is not None and cur.assignee == user:
        requests[answer_key(view.epoch)] = {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": question, "requestedSchema": ANSWER_SCHEMA},
        }
        where = "you may answer it here (tasks/update), or in the Kanboard inbox"
    else:
        where = f"it waits in {who}'s Kanboard inbox"
    return {
        "status": "input_required",
        "statusMessage": f"waiting on {who}: {question} ({where})",
        "inputRequests": requests,
    }


def _task_status(view: TaskView, user: str | None, result: dict[str, Any] | None) -> dict[str, Any]:
    cur = view.current
    assert cur is not None
    state = cur.state
    if state == State.QUEUED:
        return {"status": "working", "statusMessage": f"queued for {view.spec.target if view.spec else '?'}"}
    if state == State.WORKING:
        return {"status": "working", "statusMessage": f"{cur.owner} is working on it (attempt {cur.attempt})"}
    if state == State.INPUT_REQUIRED:
        return _waiting(view, user)
    if state in (State.DONE, State.CLOSED):
        note = "done, verified" if state == State.CLOSED else "done (not verified yet)"
        return {"status": "completed", "statusMessage": note, "result": _result_payload(result or {})}
    if state in (State.DEAD, State.DROPPED):
        reason = cur.reason or state.value
        return {"status": "failed", "statusMessage": reason, "error": {"code": -32603, "message": reason}}
    return {"status": "cancelled", "statusMessage": cur.reason or f"canceled by {cur.by}"}


def _question_status(view: TaskView, epoch: int, user: str | None) -> dict[str, Any]:
    """A question's status: waiting while its epoch is current; then answered, or ended."""
    asked = view.records.get(epoch)
    if asked is None or asked.state != State.INPUT_REQUIRED:
        raise InvalidInput(f"task #{view.id} asked no question at epoch {epoch}", where="taskId")
    if view.epoch == epoch:
        return _waiting(view, user)
    after = view.records.get(epoch + 1)
    if after is not None and after.op == "resume":
        answer = after.reason or ""
        return {
            "status": "completed",
            "statusMessage": f"{after.by} answered",
            "result": {
                "content": [{"type": "text", "text": answer}],
                "structuredContent": {
                    "task_id": view.id,
                    "question": asked.reason,
                    "answer": answer,
                    "by": after.by,
                },
                "isError": False,
            },
        }
    if after is not None and after.state in (State.CANCELED, State.DROPPED):
        return {"status": "cancelled", "statusMessage": after.reason or f"canceled by {after.by}"}
    by = after.by if after is not None else "?"
    reason = f"the question ended without an answer ({after.op if after else '?'} by {by})"
    return {"status": "failed", "statusMessage": reason, "error": {"code": -32603, "message": reason}}


def checked_answer(response: Any, key: str) -> str | None:
    """The answer text in one inputResponses entry (None: declined or cancelled).

    Refused when malformed: an elicitation result is ``{"action": "accept", "content":
    {"answer": "..."}}`` (or ``decline`` / ``cancel``), and an answer is non-empty text,
    as a person's answer is.
    """
    where = f"inputResponses.{key}"
    if not isinstance(response, dict):
        raise InvalidInput("an input response is an elicitation result object", where=where)
    action = response.get("action")
    if action in ("decline", "cancel"):
        return None
    if action != "accept":
        raise InvalidInput(f"action {action!r} is not accept, decline or cancel", where=where)
    content = response.get("content")
    answer = content.get("answer") if isinstance(content, dict) else None
    if not isinstance(answer, str) or not answer.strip():
        raise InvalidInput(
            "an accepted answer needs content.answer, non-empty text", where=where, hint='{"answer": "..."}'
        )
    return answer.strip()


class TaskHandles:
    """The tasks extension's operations over one agent's tools (thread-safe through them).

    ``identity`` is the caller as authenticated (the card, and over HTTP the bearer
    token's principal); ``user`` is the Kanboard username of this client's own user
    (``AGAP_MCP_USER``), whose questions the client may answer, or None.
    """

    def __init__(self, tools: AgentTools, key: bytes, *, user: str | None = None, live: bool = False) -> None:
        self.tools = tools
        self.key = key
        self.user = user
        # Live events on: a worker wakes on the submit event, not on its poll_seconds.
        self.live = live
        # Told the task id after this server changed a task itself (tasks/update, tasks/cancel):
        # no live event may come for that (a person's answer publishes none).
        self.on_change: list[Callable[[int], None]] = []

    def _changed(self, task_id: int) -> None:
        for hook in list(self.on_change):
            hook(task_id)

    def issue(self, identity: str, task_id: int, kind: str = SUBMITTED, epoch: int = 0) -> dict[str, Any]:
        """A new handle on a task the board has committed: its DetailedTask (the seed state)."""
        with self.tools._lock:
            view = self.tools.fab.show(task_id)
            text = make_handle(self.key, identity, view, kind, epoch)
            return self._detailed(text, view, Handle(task_id, kind, epoch, ""))

    def _open(self, identity: str, text: str) -> tuple[Handle, TaskView]:
        handle = parse_handle(text)
        try:
            view = self.tools._read(handle.task_id)
        except (TaskNotFound, PolicyRefused):  # none, or not one this agent may read: alike
            raise HandleNotFound(text) from None
        verify(self.key, identity, handle, view, text)
        return handle, view

    def _detailed(self, text: str, view: TaskView, handle: Handle) -> dict[str, Any]:
        spec = view.spec
        assert spec is not None
        cur = view.current
        try:
            poll = float(self.tools.fab.cards.get(spec.target).runtime.poll_seconds)
        except FabricError:
            poll = 5.0
        if self.live and cur is not None and cur.state in (State.QUEUED, State.WORKING):
            poll = MIN_POLL_MS / 1000
        result = None
        if view.current is not None and view.current.state in (State.DONE, State.CLOSED):
            result = self.tools._view_data(view) | self.tools._result(view)
        return detailed_task(text, view, handle, user=self.user, poll_seconds=poll, result=result)

    def get(self, identity: str, text: str) -> dict[str, Any]:
        """tasks/get: the handle's DetailedTask now."""
        with self.tools._lock:
            handle, view = self._open(identity, text)
            return self._detailed(text, view, handle)

    def update(self, identity: str, text: str, responses: dict[str, Any]) -> list[str]:
        """tasks/update: answer the outstanding question, under a person's answer's rules.

        Only the question waiting now, and only when it is this client's user's, is
        outstanding; other keys are ignored (the spec's rule). A malformed answer to the
        outstanding question is refused before anything is written. Returns the keys taken.
        """
        if not isinstance(responses, dict):
            raise InvalidInput(
                "inputResponses is an object keyed by inputRequests keys", where="inputResponses"
            )
        with self.tools._lock:
            handle, view = self._open(identity, text)
            cur = view.current
            assert cur is not None
            key = answer_key(view.epoch)
            outstanding = (
                cur.state == State.INPUT_REQUIRED
                and self.user is not None
                and cur.assignee == self.user
                and (handle.kind == SUBMITTED or handle.epoch == view.epoch)
            )
            if not outstanding or key not in responses:
                return []
            answer = checked_answer(responses[key], key)
            if answer is None:  # declined: the question stays in the inbox
                return []
            assert self.user is not None
            self._ledger(view).resume(view.id, self.user, answer, view=view)
        self._changed(view.id)
        return [key]

    def _ledger(self, view: TaskView) -> Ledger:
        """The ledger of the task's project: a confined target's queue lives in its home."""
        assert view.spec is not None
        fab = self.tools.fab
        try:
            return fab.home_fabric(fab.cards.get(view.spec.target)).ledger
        except FabricError:  # the target's card is gone: the task is where this server works
            return fab.ledger

    def cancel(self, identity: str, text: str) -> bool:
        """tasks/cancel: ``agap cancel`` (a dead letter is dropped); False when already over."""
        with self.tools._lock:
            _, view = self._open(identity, text)
            cur = view.current
            assert cur is not None
            by = self.tools.card.id
            if cur.state in TERMINAL:
                return False
            reason = "canceled over MCP (tasks/cancel)"
            try:
                if cur.state == State.DEAD:
                    self._ledger(view).drop(view.id, by, reason, view=view)
                else:
                    self._ledger(view).cancel(view.id, by, reason, view=view)
            except IllegalTransition:  # it ended first: the spec's ack, nothing changed
                return False
        self._changed(view.id)
        return True


__all__ = [
    "ANSWER_SCHEMA",
    "ASKED",
    "SUBMITTED",
    "Handle",
    "HandleNotFound",
    "TaskHandles",
    "answer_key",
    "checked_answer",
    "detailed_task",
    "make_handle",
    "parse_handle",
    "verify",
]
