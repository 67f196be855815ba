"""Kanboard's project activity and its webhook, as the embedded board writes them.

Kanboard turns each task event (create, update, assignee change, close, open, a move, a
move to another project, a comment, a file) into two things, both inside the request that
caused it:

* a ``project_activities`` row, only when a *user* is signed in (user-auth JSON-RPC or
  the web UI; never for the application token), with that user as ``creator_id`` and the
  event's data as JSON; ``getProjectActivity`` answers the newest 50, joined with the
  author, the event data merged in;
* a POST of ``{event_name, event_data, event_author}`` to the ``webhook_url`` setting,
  with ``?token=<webhook_token>`` appended, for every event (``event_author`` is ``None``
  for the application token), sent synchronously: the caller waits for the receiver.

Who the caller is comes from the request's credentials (:func:`acting_as`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure, project_row
from fabric.embedded.store import as_dict

log = logging.getLogger("agap.board.activity")

# The signed-in user of the request being answered (0: the application token).
_CALLER: ContextVar[int] = ContextVar("embedded_board_caller", default=0)
ACTIVITY_LIMIT = 50  # ProjectActivityHelper::getProjectEvents
WEBHOOK_TIMEOUT = 10.0  # Kanboard's HTTP_TIMEOUT
_MOVE_VALUES = ("project_id", "position", "column_id", "swimlane_id", "src_column_id", "dst_column_id")

_TITLES = {
    "task.create": "{author} created the task #{id}",
    "task.close": "{author} closed the task #{id}",
    "task.open": "{author} opened the task #{id}",
    "task.move.column": '{author} moved the task #{id} to the column "{column_title}"',
    "task.move.position": (
        '{author} moved the task #{id} to the position {position} in the column "{column_title}"'
    ),
    "task.move.swimlane": '{author} moved the task #{id} to the swimlane "{swimlane_name}"',
    "comment.create": "{author} commented on the task #{id}",
    "task.update": "{author} updated the task #{id}",
    "task.move.project": '{author} moved the task #{id} "{title}" to the project "{project_name}"',
    "task.file.create": "{author} attached a file to the task #{id}",
}


@contextmanager
def acting_as(user_id: int) -> Iterator[None]:
    """Answer the calls inside as ``user_id`` (0: the application token)."""
    token = _CALLER.set(user_id)
    try:
        yield
    finally:
        _CALLER.reset(token)


def caller() -> int:
    return _CALLER.get()


@dataclass(frozen=True)
class TaskEvent:
    """One event, built inside the write that caused it, delivered after it."""

    name: str
    data: dict[str, Any]
    author: str | None


def task_details(api: Board, db: sqlite3.Connection, task_id: int) -> dict[str, Any] | None:
    """TaskFinderModel::getDetails: the task row with its names joined in."""
    row = db.execute(
        "SELECT t.*, c.name AS category_name, c.description AS category_description,"
        " cr.username AS creator_username, cr.name AS creator_name,"
        " a.username AS assignee_username, a.name AS assignee_name, p.name AS project_name,"
        " col.title AS column_title, col.position AS column_position, s.name AS swimlane_name"
        " FROM tasks t LEFT JOIN categories c ON c.id = t.category_id"
        " LEFT JOIN users cr ON cr.id = t.creator_id LEFT JOIN users a ON a.id = t.owner_id"
        " LEFT JOIN projects p ON p.id = t.project_id LEFT JOIN columns col ON col.id = t.column_id"
        " LEFT JOIN swimlanes s ON s.id = t.swimlane_id WHERE t.id = ?",
        (task_id,),
    ).fetchone()
    return None if row is None else api.shape("tasks", as_dict(row))


def _author(db: sqlite3.Connection) -> str | None:
    uid = caller()
    if not uid:
        return None
    row = db.execute("SELECT username FROM users WHERE id = ?", (uid,)).fetchone()
    return None if row is None else str(row[0])


def record(
    api: Board,
    db: sqlite3.Connection,
    name: str,
    task_id: int,
    extra: dict[str, Any] | None = None,
    *,
    task: dict[str, Any] | None = None,
) -> TaskEvent | None:
    """Build event ``name`` for a task and write its activity row (a signed-in caller only).

    ``task``: the task's :func:`task_details`, when the caller has just read them in this
    transaction (the join is the costliest read of a move); else they are read here."""
    if task is None:
        task = task_details(api, db, task_id)
    if task is None:
        return None
    data: dict[str, Any] = {"task_id": task_id, "task": task, **(extra or {})}
    if caller():
        db.execute(
            "INSERT INTO project_activities (date_creation, event_name, creator_id, project_id,"
            " task_id, data) VALUES (?,?,?,?,?,?)",
            (api.now(), name, caller(), task["project_id"], task_id, json.dumps(data)),
        )
    return TaskEvent(name, data, _author(db))


def move_events(api: Board, db: sqlite3.Connection, before: dict[str, Any], position: int) -> list[TaskEvent]:
    """TaskPositionModel::fireEvents: a swimlane move, then a column move, or a position move."""
    details = task_details(api, db, int(before["id"]))
    after = details or {}
    values = {
        "project_id": before["project_id"],
        "position": position,
        "column_id": after.get("column_id"),
        "swimlane_id": after.get("swimlane_id"),
        "src_column_id": before["column_id"],
        "dst_column_id": after.get("column_id"),
        "date_moved": before["date_moved"],
        "recurrence_status": before["recurrence_status"],
        "recurrence_trigger": before["recurrence_trigger"],
    }
    # TaskEventBuilder: the changes are the values that differ from the task after the move.
    changes = {k: v for k, v in values.items() if k not in after or str(after[k]) != str(v)}
    extra = {"changes": changes, **values}
    names: list[str] = []
    if before["swimlane_id"] != values["swimlane_id"]:
        names.append("task.move.swimlane")
        if before["column_id"] != values["column_id"]:
            names.append("task.move.column")
    elif before["column_id"] != values["column_id"]:
        names.append("task.move.column")
    else:
        names.append("task.move.position")
    # Each event gets its own copy of the details, as when each read them (what is
    # written between, an activity row, is not part of them).
    events = (
        record(api, db, n, int(before["id"]), extra, task=None if details is None else dict(details))
        for n in names
    )
    return [e for e in events if e is not None]


def update_events(
    api: Board, db: sqlite3.Connection, before: dict[str, Any], values: dict[str, Any]
) -> list[TaskEvent]:
    """TaskModificationModel::fireEvents, after ``before`` was updated with ``values``.

    The changes are the values that differ from the task before (PHP's
    ``array_diff_assoc``: compared as strings), less ``date_modification``. Only the
    assignee changed: ``task.assignee_change``; anything else changed: ``task.update``
    (Kanboard's ``task.create_update`` reaches no webhook and no activity); nothing
    changed: no event.
    """
    changes = {
        k: v
        for k, v in values.items()
        if k != "date_modification" and php.as_text(v) != php.as_text(before.get(k))
    }
    if not changes:
        return []
    assignee_only = "owner_id" in changes and len(changes) == 1
    name = "task.assignee_change" if assignee_only else "task.update"
    event = record(api, db, name, int(before["id"]), {"changes": changes})
    return [] if event is None else [event]


def project_move_event(
    api: Board, db: sqlite3.Connection, task_id: int, values: dict[str, Any]
) -> TaskEvent | None:
    """TaskProjectMoveModel's ``task.move.project``: its changes are the values that differ
    from the task as it is *after* the move (TaskEventBuilder compares with the task it
    reads then), so usually none: Kanboard's empty PHP array, a JSON ``[]``. The row and
    the event belong to the project the task is in now."""
    details = task_details(api, db, task_id)
    after = details or {}
    changes = {k: v for k, v in values.items() if php.as_text(v) != php.as_text(after.get(k))}
    return record(api, db, "task.move.project", task_id, {"changes": changes or []}, task=details)


def file_event(api: Board, db: sqlite3.Connection, file_id: int) -> TaskEvent | None:
    """TaskFileEventBuilder: the file row and its task (no ``task_id`` of its own)."""
    row = db.execute(
        "SELECT id, name, path, is_image, task_id, date, user_id, size FROM task_has_files WHERE id = ?",
        (file_id,),
    ).fetchone()
    if row is None:
        return None
    event = record(api, db, "task.file.create", int(row["task_id"]), {"file": dict(row)})
    if event is not None:
        event.data.pop("task_id")
    return event


def comment_event(api: Board, db: sqlite3.Connection, comment_id: int) -> TaskEvent | None:
    """CommentEventBuilder: the comment joined with its author (none without one), and its task."""
    row = db.execute(
        "SELECT c.id, c.task_id, c.user_id, c.date_creation, c.date_modification, c.comment,"
        " c.reference, c.visibility, u.username, u.name, u.email, u.avatar_path"
        " FROM comments c JOIN users u ON u.id = c.user_id WHERE c.id = ?",
        (comment_id,),
    ).fetchone()
    if row is None:
        return None
    event = record(api, db, "comment.create", int(row["task_id"]), {"comment": as_dict(row)})
    if event is not None:
        event.data.pop("task_id")  # a comment event carries the comment and the task only
    return event


def deliver(api: Board, events: list[TaskEvent | None]) -> None:
    """POST each event to the configured webhook, as Kanboard does, waiting for each."""
    with api.store.read() as db:
        rows = dict(db.execute("SELECT option, value FROM settings WHERE option LIKE 'webhook_%'").fetchall())
    url = rows.get("webhook_url", "")
    if not url:
        return
    url += ("&" if "?" in url else "?") + "token=" + rows.get("webhook_token", "")
    for event in events:
        if event is None:
            continue
        body = json.dumps(
            {"event_name": event.name, "event_data": event.data, "event_author": event.author}
        ).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT) as reply:
                reply.read()
        except (urllib.error.URLError, OSError) as exc:  # Kanboard logs and carries on
            log.warning("webhook %s: %s", url.split("?", 1)[0], exc)


def configure_webhook(api: Board, url: str, token: str) -> None:
    """Set Kanboard's ``webhook_url`` and ``webhook_token`` (its settings page; no API)."""
    with api.store.write() as db:
        for option, value in (("webhook_url", url), ("webhook_token", token)):
            db.execute("INSERT OR REPLACE INTO settings (option, value) VALUES (?, ?)", (option, value))


def _title(event: dict[str, Any]) -> str:
    task = event.get("task") or {}
    if event["event_name"] == "task.assignee_change":
        # TaskEventBuilder::buildTitleWithAuthor: the assignee's name, else their username.
        assignee = task.get("assignee_name") or task.get("assignee_username")
        if assignee:
            return f"{event['author']} changed the assignee of the task #{event['task_id']} to {assignee}"
        return f"{event['author']} removed the assignee of the task #{event['task_id']}"
    fmt = _TITLES.get(str(event["event_name"]), "")
    return fmt.format(author=event["author"], **{**task, "id": event["task_id"]}) if fmt else ""


@procedure
def getProjectActivity(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        if project_row(db, project_id) is None:
            return []
        rows = db.execute(
            "SELECT a.*, u.username AS author_username, u.name AS author_name, u.email,"
            " u.avatar_path FROM project_activities a JOIN tasks t ON t.id = a.task_id"
            " LEFT JOIN users u ON u.id = a.creator_id WHERE a.project_id = ?"
            " ORDER BY a.id DESC LIMIT ?",
            (php.to_int(project_id), ACTIVITY_LIMIT),
        ).fetchall()
    out = []
    for r in rows:
        event = dict(r)
        data = json.loads(event.pop("data") or "{}")
        event.update((k, v) for k, v in data.items() if k not in event)
        event["author"] = event["author_name"] or event["author_username"]
        event["event_title"] = _title(event)
        event["event_content"] = f'<p class="activity-title">{event["event_title"]}</p>'
        out.append(event)
    return out
