"""Kanboard's "Comments" procedures."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.activity import caller, comment_event, deliver
from fabric.embedded.procedures.base import Board, procedure, row_dict
from fabric.embedded.procedures.users import APP_ROLES

_COMMENT_USER = "u.username AS username, u.name AS name, u.email AS email, u.avatar_path"
_COMMENT_FROM = " FROM comments c LEFT JOIN users u ON u.id = c.user_id"


@procedure
def createComment(
    api: Board,
    task_id: Any,
    user_id: Any,
    content: Any,
    reference: Any = "",
    visibility: Any = "app-user",
) -> int | bool:
    if not php.given(content) or visibility not in APP_ROLES:
        return False
    if not (php.is_integer(task_id) and php.is_integer(user_id)) or len(php.as_text(reference)) > 191:
        return False
    if caller() and php.to_int(user_id) != caller():
        return False  # a signed-in user comments only as themselves
    now = api.now()
    with api.store.write() as db:
        try:
            comment_id = api.insert(
                db,
                "comments",
                {
                    "task_id": php.to_int(task_id),
                    "user_id": php.stored(user_id),
                    "date_creation": now,
                    "date_modification": now,
                    "comment": php.as_text(content),
                    "reference": php.stored(reference),
                    "visibility": visibility,
                },
            )
        except sqlite3.IntegrityError:
            return False  # the task is missing
        event = comment_event(api, db, comment_id)
    deliver(api, [event])
    return comment_id


@procedure
def getComment(api: Board, comment_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        return row_dict(
            db.execute(
                "SELECT c.id, c.task_id, c.user_id, c.date_creation, c.date_modification,"
                " c.comment, c.reference, c.visibility, " + _COMMENT_USER + _COMMENT_FROM + " WHERE c.id = ?",
                (php.to_int(comment_id),),
            ).fetchone()
        )


@procedure
def getAllComments(api: Board, task_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT c.id, c.date_creation, c.date_modification, c.task_id, c.user_id,"
            " c.comment, c.visibility, "
            + _COMMENT_USER
            + _COMMENT_FROM
            + " WHERE c.task_id = ? ORDER BY c.date_creation, c.id",
            (php.to_int(task_id),),
        )
        return [dict(r) for r in rows]


@procedure
def updateComment(api: Board, id: Any, content: Any) -> bool:
    if not php.given(content):
        return False
    with api.store.write() as db:
        return (
            db.execute(
                "UPDATE comments SET comment = ?, date_modification = ? WHERE id = ?",
                (php.as_text(content), api.now(), php.to_int(id)),
            ).rowcount
            > 0
        )


@procedure
def removeComment(api: Board, comment_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM comments WHERE id = ?", (php.to_int(comment_id),)).rowcount > 0
