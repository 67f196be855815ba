"""Kanboard's "Columns" procedures. Titles are unique per project, compared as the backend compares."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure, project_row, row_dict


@procedure
def getColumns(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM columns WHERE project_id = ? ORDER BY position, id",
            (php.to_int(project_id),),
        )
        return api.rows("columns", rows)


@procedure
def getColumn(api: Board, column_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(db.execute("SELECT * FROM columns WHERE id = ?", (php.to_int(column_id),)).fetchone())
        return None if row is None else api.shape("columns", row)


def _title_taken(api: Board, db: sqlite3.Connection, project_id: int, title: str, but: int = 0) -> bool:
    """UNIQUE(title, project_id), compared as the backend compares (MySQL: ignoring case)."""
    return (
        db.execute(
            f"SELECT 1 FROM columns WHERE project_id = ? AND id != ? AND {api.eq('title')}",
            (project_id, but, title),
        ).fetchone()
        is not None
    )


@procedure
def addColumn(
    api: Board, project_id: Any, title: Any, task_limit: Any = 0, description: Any = ""
) -> int | bool:
    with api.store.write() as db:
        pid = php.to_int(project_id)
        if project_row(db, pid) is None:
            return False
        (pos,) = db.execute(
            "SELECT COALESCE(MAX(position), 0) + 1 FROM columns WHERE project_id = ?", (pid,)
        ).fetchone()
        text = api.fit("columns", "title", php.as_text(title))
        if _title_taken(api, db, pid, text):
            return api.refused(db, "columns")  # the unique index: Kanboard answers false
        try:
            return api.insert(
                db,
                "columns",
                {
                    "title": text,
                    "position": pos,
                    "project_id": pid,
                    "task_limit": php.to_int(task_limit),
                    "description": php.as_text(description),
                },
            )
        except sqlite3.IntegrityError:
            return False


@procedure
def updateColumn(api: Board, column_id: Any, title: Any, task_limit: Any = 0, description: Any = "") -> bool:
    with api.store.write() as db:
        text = api.fit("columns", "title", php.as_text(title))
        row = db.execute("SELECT project_id FROM columns WHERE id = ?", (php.to_int(column_id),)).fetchone()
        if row is not None and _title_taken(api, db, row[0], text, but=php.to_int(column_id)):
            return False
        try:
            db.execute(
                "UPDATE columns SET title = ?, task_limit = ?, description = ? WHERE id = ?",
                (text, php.to_int(task_limit), php.as_text(description), php.to_int(column_id)),
            )
        except sqlite3.IntegrityError:
            return False
        return True  # an UPDATE of no row is a success for Kanboard


@procedure
def changeColumnPosition(api: Board, project_id: Any, column_id: Any, position: Any) -> bool:
    pos = php.to_int(position)
    with api.store.write() as db:
        ids = [
            r[0]
            for r in db.execute(
                "SELECT id FROM columns WHERE project_id = ? ORDER BY position, id",
                (php.to_int(project_id),),
            )
        ]
        cid = php.to_int(column_id)
        if cid not in ids or pos < 1 or pos > len(ids):
            return False
        ids.remove(cid)
        ids.insert(pos - 1, cid)
        db.executemany(
            "UPDATE columns SET position = ? WHERE id = ?", [(i, c) for i, c in enumerate(ids, start=1)]
        )
        return True


@procedure
def removeColumn(api: Board, column_id: Any) -> bool:
    with api.store.write() as db:
        cid = php.to_int(column_id)
        if db.execute("SELECT 1 FROM tasks WHERE column_id = ?", (cid,)).fetchone():
            return False
        return db.execute("DELETE FROM columns WHERE id = ?", (cid,)).rowcount > 0
