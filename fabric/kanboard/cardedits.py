"""A fabric card as a person may edit it in Kanboard's UI, and what the keeper writes back.

A card's title, description, reference, priority, due date and assignee are drawn from
its task: the spec (with the priority and deadline a person set, :class:`~fabric.task.Terms`)
and the current record. :func:`expected` says what each should hold, :func:`drawn` tells a
description the fabric drew from one a person wrote (line endings, trailing spaces and
link targets aside: a person's browser sends CRLF, and each fabric process links to the
address it knows the board by), and :func:`added_lines` is what a person wrote into it. The writes below
are one round trip each, with the application token, which Kanboard records in no activity:
an undo never looks like a person's edit.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from fabric.kanboard.cardtext import result_link_in
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.layout import (
    META_EDITED,
    META_ESCALATED,
    META_TERMS,
    Column,
    receipt_reference,
    uid_reference,
)
from fabric.kanboard.port import Call
from fabric.kanboard.resend import send
from fabric.kanboard.taskboard import TaskBoard
from fabric.kanboard.views import TaskView
from fabric.task import Terms

#: The attributes of a card (:class:`~fabric.kanboard.rows.BoardTask`) a person may edit
#: that the fabric draws (colour, category, tags, score and times are the person's own).
EDITABLE = ("title", "description", "reference", "priority", "due_at", "owner_id")
DUE_SLACK = 60  # Kanboard keeps a due date to the minute

_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")


def plain(text: str) -> str:
    """``text`` as compared: LF line ends, no trailing spaces, no link targets."""
    text = _LINK_TARGET.sub("]()", text.replace("\r\n", "\n").replace("\r", "\n"))
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


def expected(board: TaskBoard, view: TaskView) -> dict[str, Any]:
    """What the card's editable attributes hold when nobody edited them (but the
    description, which :func:`drawn` judges)."""
    assert view.spec is not None and view.current is not None
    spec, submitted = view.spec, view.submitted or view.spec
    # The reference a submit gives a task (fabric.submit): its idempotency key, hashed.
    if submitted.action_id:
        reference = receipt_reference(submitted.actor, submitted.action_id)
    else:
        reference = uid_reference(view.uid or "")
    return {
        "title": spec.title(),
        "reference": reference,
        "priority": spec.priority,
        "due_at": int(spec.deadline or 0),
        "owner_id": board.layout.users.get(view.current.assignee or "", 0),
    }


def same(attr: str, value: Any, want: Any) -> bool:
    """Whether a card's ``attr`` holding ``value`` holds ``want``."""
    if attr == "due_at":
        return (not value and not want) or (
            bool(value) and bool(want) and abs(int(value) - int(want)) < DUE_SLACK
        )
    if attr in ("title", "description"):
        return plain(str(value)) == plain(str(want))
    return bool(value == want)


def _renders(board: TaskBoard, view: TaskView) -> list[str]:
    """Every description the fabric may have drawn for this task: as submitted, and as
    each of its records shows it, with the spec as submitted and as a person's terms make it."""
    assert view.spec is not None and view.uid is not None
    first = view.records.get(0)
    assignee = first.assignee if first else None
    specs = {view.spec.digest(): view.spec, **({} if view.submitted is None else {"s": view.submitted})}
    out = []
    for spec in specs.values():
        for rec in (None, *view.records.values()):
            url = result_link_in(view.task.description, rec.result_ref) if rec and rec.result_ref else None
            out.append(board.describe(spec, view.uid, assignee=assignee, record=rec, result_url=url))
    return out


def drawn(board: TaskBoard, view: TaskView) -> bool:
    """Whether the card's description is one the fabric drew for this task: its sealed
    spec intact, and its text a drawing of the task (see the module's docstring)."""
    sealed = board.sealed(view.task.description)
    if sealed is None or sealed.uid != view.uid:
        return False
    text = plain(board.readable(view.task.description))
    return any(plain(board.readable(r)) == text for r in _renders(board, view))


def added_lines(board: TaskBoard, view: TaskView) -> str:
    """The lines of the card's description that no drawing of the task has: what a person
    wrote into it (at most 1500 characters)."""
    known = {plain(line) for r in _renders(board, view) for line in board.readable(r).splitlines()}
    mine = [line.rstrip() for line in board.readable(view.task.description).replace("\r\n", "\n").split("\n")]
    added = "\n".join(line for line in mine if line.strip() and plain(line) not in known)
    return added if len(added) <= 1500 else added[:1499] + "…"


def settle(
    board: TaskBoard,
    view: TaskView,
    *,
    put_back: set[str],
    marker: int,
    terms: Terms | None = None,
    escalated: bool = False,
    comment: str | None = None,
) -> None:
    """Handle a person's edits of a card in one round trip: the activity row ``marker``
    handled (kept first, with ``terms`` when a person's priority or deadline is kept, and
    an earlier escalation forgotten for a new deadline with ``escalated``), the attributes
    ``put_back`` drawn again from the task (the description too when the terms change what
    it says), and the line for the journal."""
    assert view.spec is not None and view.current is not None
    meta = {META_EDITED: str(marker)}
    shown = view
    if terms is not None:
        meta[META_TERMS] = terms.to_meta()
        base = view.submitted or view.spec
        shown = dataclasses.replace(view, spec=terms.apply(base), terms=terms, as_submitted=base)
    if escalated:
        meta[META_ESCALATED] = ""  # a new deadline may be missed again: escalated anew
    want = expected(board, shown)
    update: dict[str, Any] = {}
    for attr in put_back - {"description"}:
        value = want[attr]
        update[_PARAM[attr]] = (format_input_date(value) if value else "") if attr == "due_at" else value
    if "description" in put_back or terms is not None:
        update["description"] = board.drawing(shown, board.result_urls([shown]).get(view.id))
    calls = [Call("saveTaskMetadata", {"task_id": view.id, "values": meta})]
    if update:
        calls.append(Call("updateTask", {"id": view.id, **update}))
    if comment:
        calls.append(board.comment_call(view.id, comment))
    send(board.port, calls)[0].unwrap()


# Kanboard's updateTask parameter for each editable attribute.
_PARAM = {
    "title": "title",
    "reference": "reference",
    "priority": "priority",
    "due_at": "date_due",
    "owner_id": "owner_id",
}


def bring_back(
    board: TaskBoard, view: TaskView, column: Column, *, queue: str, is_open: bool, comment: str
) -> None:
    """Move a card a person moved to another project back into the board's project, in
    ``column`` and ``queue``'s swimlane (Kanboard reopens it: closed again unless
    ``is_open``), with a line for the journal (one round trip)."""
    layout = board.layout
    calls = [
        Call(
            "moveTaskToProject",
            {
                "task_id": view.id,
                "project_id": layout.project_id,
                "swimlane_id": layout.swimlanes.get(queue, view.task.swimlane_id),
                "column_id": layout.columns[column],
            },
        )
    ]
    if not is_open:
        calls.append(Call("closeTask", {"task_id": view.id}))
    calls.append(board.comment_call(view.id, comment))
    send(board.port, calls)[0].unwrap()


def close_copy(board: TaskBoard, view: TaskView, comment: str) -> None:
    """Close a copy of a fabric card a person made (Kanboard's "Duplicate") in the Done
    column, with a line for the journal. It loses the copied reference and sealed spec: a
    copy must never answer for the original (an idempotent submit's lookup, the policy's
    search by uid) nor be rebuilt as a task (one round trip)."""
    done = board.layout.columns[Column.DONE]
    text = f"{comment}\n\n---\n\n{board.readable(view.task.description)}"
    calls = [Call("updateTask", {"id": view.id, "reference": "", "description": text})]
    if view.task.column_id != done:
        calls.append(board.move_call(view.id, done, view.task.swimlane_id))
    calls += [Call("closeTask", {"task_id": view.id}), board.comment_call(view.id, comment)]
    send(board.port, calls)[0].unwrap()


__all__ = [
    "DUE_SLACK",
    "EDITABLE",
    "added_lines",
    "bring_back",
    "close_copy",
    "drawn",
    "expected",
    "plain",
    "same",
    "settle",
]
