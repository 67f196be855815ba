"""``submit(task, target)``: validate, route, create the Kanboard task, return its ref.

A submit costs two round trips: (1) create the task, in the same batch as the
receipt's lock tag when an action id is given; (2) write its uid, spec and epoch-0
record. Until (2) lands the task has no records, so nothing can claim it.

The description ends with the spec as one line of JSON, sealed with a key only the fabric
holds, in a Markdown reference definition (which renders as nothing). That makes a task
whose submitter died between (1) and (2) repairable from the board alone, with the same
bytes the submitter would have written (:func:`repair_unrecorded`); the policy's lineage
and taint checks find a task's spec by its uid in one search the same way. Anyone who can
edit a description can write a block, so a repair trusts only the *last* block, only if
its seal verifies, and only on the one task its uid is bound to (the ``<uid>/e0`` lock
tag, whose colour names the task id).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from fabric.errors import EXIT_COLLISION, FabricError, InvalidInput
from fabric.kanboard.layout import receipt_lock, receipt_reference, uid_reference
from fabric.kanboard.taskboard import TaskBoard, TaskView
from fabric.plain import Plain
from fabric.task import Record, SpecError, State, TaskSpec


class SubmitOption(Plain):
    """One option of a submit, said once: ``Fabric.submit``'s keyword, ``agap submit``'s
    flag and the MCP ``submit_task`` argument are all made from it (a new spec field is
    one line here, plus the spec and its use)."""

    name: str  # Fabric.submit's keyword and the MCP tool's argument
    help: str  # the CLI's help and the MCP argument's description
    kind: type = str  # str, int, or list (of str: repeatable)
    default: str | None = None
    flag: str = ""  # the CLI flag (default: --name with dashes)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


INTENT_HELP = "What to do, in words; the first line becomes the title (at most 4000 characters)."
SUBMIT_OPTIONS = (
    SubmitOption("target", "An agent or person id (direct), or 'auto' for the fabric's routing rules."),
    SubmitOption(
        "constraints", "Instead of a target, a constraint set: e.g. 'tier>=large,cap=code,trust>=trusted'."
    ),
    SubmitOption(
        "refs",
        "Context by reference, never pasted: a URI such as file:///notes.md, task:12 or https://…"
        " (repeatable).",
        kind=list,
        flag="--ref",
    ),
    SubmitOption("priority", "low, normal, high or urgent.", default="normal"),
    SubmitOption("deadline", "'YYYY-MM-DD HH:MM' (UTC), ISO-8601 with an offset, or a delay like +2h."),
    SubmitOption("not_before", "Do not start before this time (the same formats)."),
    SubmitOption("key", "Idempotency key (action id): a retry with the same key and content makes one task."),
    SubmitOption("parent", "The task (its id) this one is part of.", kind=int),
    SubmitOption(
        "slot",
        "For a scheduler's firing: the job's cron expression (e.g. '0 7 * * *'). The key then names "
        "the job and gets the planned time added, so one slot is one task; a firing more than 60 s "
        "late is refused as missed.",
    ),
    SubmitOption("timezone", "The slot's IANA time zone (e.g. Europe/Berlin); required with slot."),
)


class ActionIdCollision(FabricError):
    """The same (actor, action id) was used before with different content."""

    exit_code = EXIT_COLLISION
    code = "ACTION_ID_COLLISION"

    def __init__(self, actor: str, action_id: str, task_id: int) -> None:
        super().__init__(
            f"ACTION_ID_COLLISION: action id {action_id!r} of {actor!r} already names task "
            f"#{task_id} with different content",
            where="--key",
            hint="use a new action id for a different task",
        )
        self.task_id = task_id


class StuckReceipt(FabricError):
    """The receipt for an action id is taken but no task carries it."""

    exit_code = EXIT_COLLISION

    def __init__(self, action_id: str) -> None:
        super().__init__(
            f"action id {action_id!r} was taken by a submit that never created its task",
            where="--key",
            hint="submit again with a new action id",
        )


class Receipt(Plain):
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
    return Record(
        epoch=0,
        state=State.QUEUED,
        op="submit",
        by=spec.actor,
        at=spec.submitted_at,
        not_before=spec.not_before,
        assignee=assignee,
    )


# A check a repair must pass before adopting a task (routing and policy, re-applied):
# raises a FabricError to refuse.
Vet = Callable[[TaskView, TaskSpec], None]


def repair_unrecorded(board: TaskBoard, view: TaskView, *, vet: Vet | None = None) -> TaskView | None:
    """Write the uid, spec and epoch-0 record of a task whose submit died halfway.

    Idempotent and safe to race: every caller writes the same bytes, taken from the
    sealed block the submitter wrote. Returns the repaired view, or None when the task
    is not one the fabric created: no sealed block, or a block copied from another task
    (its uid is bound to another task id). ``vet`` re-applies routing and policy.
    """
    if view.current is not None or view.uid is not None:
        return None  # it has records: nothing to repair, and nothing to overwrite
    parsed = board.sealed(view.task.description)
    if parsed is None:
        return None
    uid, spec, assignee = parsed
    if not board.bind_uid(uid, view.id):
        return None
    if vet is not None:
        vet(view, spec)
    board.write_initial(view.id, uid, spec, initial_record(spec, assignee=assignee))
    return board.read(view.id)


class Submitter:
    """Creates fabric tasks on a :class:`TaskBoard`."""

    def __init__(self, board: TaskBoard, *, clock: object = time.time, settle_seconds: float = 3.0) -> None:
        self.board = board
        self.clock = clock
        self.settle_seconds = settle_seconds

    def submit(self, spec: TaskSpec, *, assignee: str | None = None) -> Receipt:
        """Create the task for a validated, routed ``spec``; idempotent with an action id."""
        uid = new_uid()
        # Every task gets a unique reference so an ambiguous createTask can be settled by
        # looking it up: the action id when there is one, else the task's own uid.
        reference = receipt_reference(spec.actor, spec.action_id) if spec.action_id else uid_reference(uid)
        receipt = None
        if spec.action_id:
            receipt = receipt_lock(spec.actor, spec.action_id)
        owner_id = self.board.layout.users.get(assignee or "", 0)
        task_id, won = self.board.create_task(
            spec, uid=uid, assignee=assignee, reference=reference, owner_id=owner_id, receipt=receipt
        )
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
            if row is not None and row.id != exclude:
                view = self.board.read(row.id)
                if view.current is None and time.monotonic() >= deadline:
                    view = repair_unrecorded(self.board, view) or view
                if view.submitted is not None and view.uid is not None:
                    # As submitted: a priority a person set on the card since is no collision.
                    if view.submitted.digest() != spec.digest():
                        raise ActionIdCollision(spec.actor, spec.action_id, view.id)
                    return Receipt(view.id, view.uid, False, view.submitted.queue)
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
    if action_id is not None and not action_id.strip():
        raise InvalidInput("the action id is empty", where="--key")
    if not actor.strip():
        raise InvalidInput("the actor is empty", where="--actor", hint="name who submits, or leave it out")
    if not_before is not None and deadline is not None and not_before > deadline:
        raise InvalidInput(
            "the task may not start after its deadline",
            where="--not-before",
            hint="give a --not-before before the --deadline, or a later --deadline",
        )
    ancestry: tuple[str, ...] = ()
    parent_uid = None
    if parent is not None:
        if parent.uid is None or parent.spec is None:
            raise InvalidInput(f"task #{parent.id} is not a fabric task", where="--parent")
        parent_uid = parent.uid
        ancestry = (*parent.spec.ancestry, parent.uid)
    try:
        return TaskSpec(
            intent=intent,
            refs=tuple(refs),
            target=target,
            queue=queue,
            constraints=dict(constraints or {}),
            priority=priority,
            deadline=deadline,
            not_before=not_before,
            actor=actor,
            action_id=action_id,
            parent=parent_uid,
            ancestry=ancestry,
            max_attempts=max_attempts,
            submitted_at=round(now, 3),
        )
    except SpecError as exc:
        field, message = exc.problems[0]
        raise InvalidInput(message, where=field or "task") from None
