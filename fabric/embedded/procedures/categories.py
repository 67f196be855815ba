"""Kanboard's "Categories" procedures. Names are unique per project, ignoring case."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure, row_dict


@procedure
def createCategory(api: Board, project_id: Any, name: Any, color_id: Any = None) -> int | bool:
    if not php.given(name) or not php.is_integer(project_id):
        return False
    with api.store.write() as db:
        text = api.fit("categories", "name", php.as_text(name))
        # SQLite's schema declares the name NOCASE, MySQL's collation ignores case too.
        if db.execute(
            f"SELECT 1 FROM categories WHERE project_id = ? AND {api.eq('name', nocase=True)}",
            (php.to_int(project_id), text),
        ).fetchone():
            return api.refused(db, "categories")
        try:
            return api.insert(
                db,
                "categories",
                {
                    "name": text,
                    "project_id": php.to_int(project_id),
                    "color_id": None
                    if color_id is None
                    else api.fit("categories", "color_id", php.as_text(color_id)),
                },
            )
        except sqlite3.IntegrityError:
            return False


@procedure
def getCategory(api: Board, category_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        return row_dict(
            db.execute("SELECT * FROM categories WHERE id = ?", (php.to_int(category_id),)).fetchone()
        )


@procedure
def getAllCategories(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [
            dict(r)
            for r in db.execute(
                f"SELECT * FROM categories WHERE project_id = ? ORDER BY {api.order('name', nocase=True)}",
                (php.to_int(project_id),),
            )
        ]


@procedure
def removeCategory(api: Board, category_id: Any) -> bool:
    with api.store.write() as db:
        cid = php.to_int(category_id)
        db.execute("UPDATE tasks SET category_id = 0 WHERE category_id = ?", (cid,))
        return db.execute("DELETE FROM categories WHERE id = ?", (cid,)).rowcount > 0
