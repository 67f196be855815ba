"""``submit(task, target)``: validate, route, create the Kanboard task, return its ref.

A submit costs two round trips: (1) create the task, in the same batch as the
receipt's lock tag when an action id is given; (2) write its uid, spec and epoch-0
record. Until (2) lands the task has no records, so nothing can claim it.

The description ends with the spec as a JSON block. That makes a task whose submitter
died between (1) and (2) repairable from the board alone, with the same bytes the
submitter would have written (:func:`repair_unrecorded`).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from fabric.errors import FabricError, InvalidInput
from fabric.layout import PRIORITY_NAMES, State, receipt_reference
from fabric.models import Record, TaskSpec
from fabric.taskboard import TaskBoard, TaskView

SPEC_FENCE = "```json fabric-spec"
_SPEC_BLOCK = re.compile(r"```json fabric-spec\n(.*?)\n```", re.S)


class ActionIdCollision(FabricError):
    """The same (actor, action id) was used before with different content."""

    exit_code = 5
    code = "ACTION_ID_COLLISION"

    def __init__(self, actor: str, action_id: str, task_id: int) -> None:
        super().__init__(
            f"ACTION_ID_COLLISION: action id {action_id!r} of {actor!r} already names task "
            f"#{task_id} with different content",
            where="--key", hint="use a new action id for a different task",
        )
        self.task_id = task_id


class StuckReceipt(FabricError):
    """The receipt for an action id is taken but no task carries it."""

    exit_code = 5

    def __init__(self, action_id: str) -> None:
        super().__init__(
            f"action id {action_id!r} was taken by a submit that never created its task",
            where="--key", hint="submit again with a new action id",
        )


@dataclass(frozen=True)
class Receipt:
    """What submit returns: the task's ref, and whether this call created it."""

    task_id: int
    uid: str
    created: bool
    queue: str

    @property
    def ref(self) -> str:
        return f"task:{self.task_id}"


def new_uid() -> str:
    """A fresh task uid (Kanboard reuses numeric ids, so locks never name those)."""
    return secrets.token_hex(8)


def initial_record(spec: TaskSpec, *, assignee: str | None) -> Record:
    """The epoch-0 record, a pure function of the spec (so a repair writes the same bytes)."""
    return Record(epoch=0, state=State.QUEUED, op="submit", by=spec.actor,
                  at=spec.submitted_at, not_before=spec.not_before, assignee=assignee)


def render_description(spec: TaskSpec, uid: str, *, result_ref: str | None = None,
                       assignee: str | None = None) -> str:
    """The readable description: intent, refs as links, constraints, provenance, spec."""
    lines = [spec.intent, ""]
    if result_ref:
        lines += [f"**Result:** {_link(result_ref)}", ""]
    if spec.refs:
        lines.append("**Context**")
        lines += [f"- {_link(r)}" for r in spec.refs]
        lines.append("")
    facts = [f"target `{spec.target}` (queue `{spec.queue}`)",
             f"priority {PRIORITY_NAMES.get(spec.priority, spec.priority)}"]
    if spec.deadline:
        facts.append(f"deadline {_when(spec.deadline)}")
    if spec.not_before:
        facts.append(f"not before {_when(spec.not_before)}")
    if spec.constraints:
        facts.append("constraints " + ", ".join(f"{k}={v}" for k, v in sorted(spec.constraints.items())))
    lines.append("**Constraints:** " + "; ".join(facts))
    prov = f"submitted by `{spec.actor}` at {_when(spec.submitted_at)}"
    if spec.action_id:
        prov += f", action id `{spec.action_id}`"
    if spec.parent:
        prov += f", child of task uid `{spec.parent}` (depth {len(spec.ancestry)})"
    lines += [f"**Provenance:** {prov}", "",
              "<details><summary>fabric spec (machine-readable)</summary>", "",
              SPEC_FENCE,
              json.dumps({"uid": uid, "assignee": assignee, "spec": json.loads(spec.to_meta())},
                         sort_keys=True),
              "```", "</details>"]
    return "\n".join(lines)


def _link(ref: str) -> str:
    return f"[{ref}]({ref})" if ref.startswith(("http://", "https://")) else f"`{ref}`"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def parse_description(text: str) -> tuple[str, TaskSpec, str | None] | None:
    """The (uid, spec, assignee) embedded in a description, or None."""
    m = _SPEC_BLOCK.search(text or "")
    if not m:
        return None
    try:
        d = json.loads(m.group(1))
        return str(d["uid"]), TaskSpec.model_validate(d["spec"]), d.get("assignee")
    except (ValueError, KeyError, TypeError):
        return None


def repair_unrecorded(board: TaskBoard, view: TaskView) -> TaskView | None:
    """Write the uid, spec and epoch-0 record of a task whose submit died halfway.

    Idempotent and safe to race: every caller writes the same bytes, taken from the
    description the submitter wrote. Returns the repaired view, or None if the
    description carries no spec (not a fabric task).
    """
    parsed = parse_description(str(view.row.get("description", "")))
    if parsed is None:
        return None
    uid, spec, assignee = parsed
    board.write_initial(view.id, uid, spec, initial_record(spec, assignee=assignee))
    return board.read(view.id)


class Submitter:
    """Creates fabric tasks on a :class:`TaskBoard`."""

    def __init__(self, board: TaskBoard, *, clock: object = time.time,
                 settle_seconds: float = 3.0) -> None:
        self.board = board
        self.clock = clock
        self.settle_seconds = settle_seconds

    def submit(self, spec: TaskSpec, *, assignee: str | None = None) -> Receipt:
        """Create the task for a validated, routed ``spec``; idempotent with an action id."""
        uid = new_uid()
        # Every task gets a unique reference so an ambiguous createTask can be settled by
        # looking it up: the action id when there is one, else the task's own uid.
        reference = (receipt_reference(spec.actor, spec.action_id) if spec.action_id
                     else f"uid:{uid}")
        receipt = None
        if spec.action_id:
            from fabric.layout import receipt_lock

            receipt = receipt_lock(spec.actor, spec.action_id)
        owner_id = self.board.layout.users.get(assignee or "", 0)
        description = render_description(spec, uid, assignee=assignee)
        task_id, won = self.board.create_task(spec, description=description,
                                              reference=reference, owner_id=owner_id,
                                              receipt=receipt)
        if not won:
            assert spec.action_id is not None
            self.board.remove_task(task_id)
            return self._existing(spec, reference, exclude=task_id)
        self.board.write_initial(task_id, uid, spec, initial_record(spec, assignee=assignee))
        return Receipt(task_id, uid, True, spec.queue)

    def _existing(self, spec: TaskSpec, reference: str, *, exclude: int) -> Receipt:
        """The task that holds this action id's receipt (waiting briefly if in flight)."""
        assert spec.action_id is not None
        deadline = time.monotonic() + self.settle_seconds
        while True:
            row = self.board.find_by_reference(reference)
            if row is not None and int(row["id"]) != exclude:
                view = self.board.read(int(row["id"]))
                if view.current is None and time.monotonic() >= deadline:
                    view = repair_unrecorded(self.board, view) or view
                if view.spec is not None and view.uid is not None:
                    if view.spec.digest() != spec.digest():
                        raise ActionIdCollision(spec.actor, spec.action_id, view.id)
                    return Receipt(view.id, view.uid, False, view.spec.queue)
            if time.monotonic() >= deadline:
                raise StuckReceipt(spec.action_id)
            time.sleep(0.05)


def build_spec(
    *,
    intent: str,
    target: str,
    queue: str,
    refs: tuple[str, ...] = (),
    constraints: dict[str, object] | None = None,
    priority: int = 1,
    deadline: float | None = None,
    not_before: float | None = None,
    actor: str = "cli",
    action_id: str | None = None,
    parent: TaskView | None = None,
    max_attempts: int = 3,
    now: float,
) -> TaskSpec:
    """Validate the pieces of a task into a :class:`TaskSpec` (raises InvalidInput)."""
    from pydantic import ValidationError

    if action_id is not None and not action_id.strip():
        raise InvalidInput("the action id is empty", where="--key")
    ancestry: tuple[str, ...] = ()
    parent_uid = None
    if parent is not None:
        if parent.uid is None or parent.spec is None:
            raise InvalidInput(f"task #{parent.id} is not a fabric task", where="--parent")
        parent_uid = parent.uid
        ancestry = (*parent.spec.ancestry, parent.uid)
    try:
        return TaskSpec(
            intent=intent, refs=tuple(refs), target=target, queue=queue,
            constraints=dict(constraints or {}), priority=priority, deadline=deadline,
            not_before=not_before, actor=actor, action_id=action_id, parent=parent_uid,
            ancestry=ancestry, max_attempts=max_attempts, submitted_at=round(now, 3),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "task"
        raise InvalidInput(first["msg"].removeprefix("Value error, "), where=field) from None
