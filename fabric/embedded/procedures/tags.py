"""Kanboard's "Tags" procedures, and TaskTagModel::save for the task procedures."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import flavour as fl
from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure, task_row


def tag_list(tags: Any) -> list[str]:
    """The names of a ``tags`` param; PHP types it ``array``, so anything else is fatal."""
    if not isinstance(tags, list | dict):
        raise php.Fatal("tags must be an array")
    values = tags.values() if isinstance(tags, dict) else tags
    return [php.as_text(t) for t in values if not php.empty(t)]


def _tag_taken(api: Board, db: sqlite3.Connection, project_id: int, name: str, but: int = 0) -> bool:
    """UNIQUE(project_id, name) as the backend compares (MySQL: ignoring case, accents)."""
    return (
        db.execute(
            f"SELECT 1 FROM tags WHERE project_id = ? AND id != ? AND {api.eq('name')}",
            (project_id, but, name),
        ).fetchone()
        is not None
    )


def tag_by_name(api: Board, db: sqlite3.Connection, project_id: int, name: str) -> int | None:
    """TagModel::getIdByName: ILIKE (wildcards live; SQLite folds ASCII only, PostgreSQL all
    of Unicode, MySQL accents too), a global tag (project 0) first."""
    row = db.execute(
        f"SELECT id FROM tags WHERE project_id IN (0, ?) AND {fl.like_sql(api.flavour, 'name')}"
        " ORDER BY project_id, id LIMIT 1",
        (project_id, name),
    ).fetchone()
    return None if row is None else int(row[0])


def find_or_create_tag(
    api: Board, db: sqlite3.Connection, project_id: int, name: str, color_id: Any = None
) -> int | None:
    """The tag ``name`` of a project (:func:`tag_by_name`), created when not found."""
    found = tag_by_name(api, db, project_id, name)
    if found is not None:
        return found
    name = api.fit("tags", "name", name)
    if _tag_taken(api, db, project_id, name):
        api.refused(db, "tags")
        return None
    try:
        return api.insert(db, "tags", {"name": name, "project_id": project_id, "color_id": color_id})
    except sqlite3.IntegrityError:
        return None


def save_tags(api: Board, db: sqlite3.Connection, project_id: int, task_id: int, names: list[str]) -> None:
    """Kanboard's TaskTagModel::save, quirks included.

    Tags are attached by case-insensitive lookup, but the removal step compares the
    stored names case-sensitively: calling it again with ``["BACKEND"]`` drops
    ``backend``. Keep tag names lowercase.
    """
    current = {
        int(r[0]): str(r[1])
        for r in db.execute(
            "SELECT g.id, g.name FROM task_has_tags th JOIN tags g ON g.id = th.tag_id WHERE th.task_id = ?",
            (task_id,),
        )
    }
    for name in names:
        tag_id = find_or_create_tag(api, db, project_id, name)
        if tag_id is not None and tag_id not in current:
            db.execute(
                "INSERT OR IGNORE INTO task_has_tags (task_id, tag_id) VALUES (?, ?)", (task_id, tag_id)
            )
    for tag_id, name in current.items():
        if name not in names:
            db.execute("DELETE FROM task_has_tags WHERE task_id = ? AND tag_id = ?", (task_id, tag_id))


@procedure
def getAllTags(api: Board) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [dict(r) for r in db.execute(f"SELECT * FROM tags ORDER BY {api.order('name')}, id")]


@procedure
def getTagsByProject(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT * FROM tags WHERE project_id = ? ORDER BY {api.order('name')}, id",
            (php.to_int(project_id),),
        )
        return [dict(r) for r in rows]


@procedure
def createTag(api: Board, project_id: Any, tag: Any, color_id: Any = None) -> int | bool:
    """A plain INSERT under UNIQUE(project_id, name): exactly one concurrent caller wins.

    Any project id is accepted (no foreign key); project 0 makes a global tag. The
    unique check and the name's length follow the flavour: ``ABC`` is a duplicate of
    ``abc`` on MySQL, and a name over 191 (MySQL) or 255 (PostgreSQL) characters, or a
    color_id over 50, is an SQL error there.
    """
    pid = php.to_int(project_id)
    with api.store.write() as db:
        name = api.fit("tags", "name", php.as_text(tag))
        color = None if php.empty(color_id) else api.fit("tags", "color_id", php.as_text(color_id))
        if _tag_taken(api, db, pid, name):
            return api.refused(db, "tags")
        try:
            return api.insert(db, "tags", {"name": name, "project_id": pid, "color_id": color})
        except sqlite3.IntegrityError:
            return False


@procedure
def updateTag(api: Board, tag_id: Any, tag: Any, color_id: Any = None) -> bool:
    with api.store.write() as db:
        name = api.fit("tags", "name", php.as_text(tag))
        color = None if php.empty(color_id) else api.fit("tags", "color_id", php.as_text(color_id))
        row = db.execute("SELECT project_id FROM tags WHERE id = ?", (php.to_int(tag_id),)).fetchone()
        if row is not None and _tag_taken(api, db, row[0], name, but=php.to_int(tag_id)):
            return False
        try:
            db.execute(
                "UPDATE tags SET name = ?, color_id = ? WHERE id = ?", (name, color, php.to_int(tag_id))
            )
        except sqlite3.IntegrityError:
            return False
        return True  # a missing tag_id updates no row, which is a success


@procedure
def removeTag(api: Board, tag_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM tags WHERE id = ?", (php.to_int(tag_id),)).rowcount > 0


@procedure
def setTaskTags(api: Board, project_id: Any, task_id: Any, tags: Any) -> bool:
    names = tag_list(tags)
    with api.store.write() as db:
        task = task_row(db, task_id)
        if task is None:
            return False
        # The project is not checked against the task's: new tags land in project_id.
        save_tags(api, db, php.to_int(project_id), task["id"], names)
        return True


@procedure
def getTaskTags(api: Board, task_id: Any) -> dict[str, str]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT g.id, g.name FROM task_has_tags th JOIN tags g ON g.id = th.tag_id"
            " WHERE th.task_id = ? ORDER BY g.id",
            (php.to_int(task_id),),
        )
        return {str(r["id"]): r["name"] for r in rows}
