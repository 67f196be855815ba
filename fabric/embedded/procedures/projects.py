"""Kanboard's "Projects" procedures. A new project gets Kanboard's default columns and swimlane."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import EMAIL, Board, procedure, project_row, row_dict, user_exists

DEFAULT_COLUMNS = ("Backlog", "Ready", "Work in progress", "Done")
DEFAULT_SWIMLANE = "Default swimlane"
_IDENTIFIER = re.compile(r"^[A-Za-z0-9]+$")


def _format_project(api: Board, project: dict[str, Any]) -> dict[str, Any]:
    project = api.shape("projects", project)
    pid = project["id"]
    project["url"] = {
        "board": f"{api.base_url}?controller=BoardViewController&action=show&project_id={pid}",
        "list": f"{api.base_url}?controller=TaskListController&action=show&project_id={pid}",
    }
    return project


def _fields_valid(
    name: Any, ident: str | None, priorities: tuple[Any, ...], dates: tuple[Any, ...], email: Any
) -> bool:
    """ProjectValidator's rules that need no database."""
    if not php.given(name) or len(php.as_text(name)) > 65535:  # the validator's MaxLength
        return False
    if ident is not None and (not _IDENTIFIER.match(ident) or len(ident) > 50):
        return False
    if not all(php.is_integer(v) for v in priorities):
        return False
    if any(php.given(date) and len(php.as_text(date)) > 10 for date in dates):
        return False
    return not (php.given(email) and not EMAIL.match(php.as_text(email)))


def _refused_by_database(
    api: Board, db: sqlite3.Connection, ident: str | None, email: Any, owner_id: Any
) -> bool:
    """The validator's unique checks, and an unknown owner.

    The unique checks are plain SELECTs: they compare as the backend does.
    """
    if ident and db.execute(f"SELECT 1 FROM projects WHERE {api.eq('identifier')}", (ident,)).fetchone():
        return True
    if (
        php.given(email)
        and db.execute(f"SELECT 1 FROM projects WHERE {api.eq('email')}", (email,)).fetchone()
    ):
        return True
    return not php.empty(owner_id) and not user_exists(db, owner_id)


def _add_default_lanes(api: Board, db: sqlite3.Connection, project_id: int) -> None:
    for pos, title in enumerate(DEFAULT_COLUMNS, start=1):
        api.insert(
            db, "columns", {"title": title, "position": pos, "project_id": project_id, "description": ""}
        )
    api.insert(
        db,
        "swimlanes",
        {"name": DEFAULT_SWIMLANE, "position": 1, "project_id": project_id, "description": ""},
    )


@procedure
def createProject(
    api: Board,
    name: Any,
    description: Any = None,
    owner_id: Any = 0,
    identifier: Any = None,
    start_date: Any = None,
    end_date: Any = None,
    priority_default: Any = None,
    priority_start: Any = None,
    priority_end: Any = None,
    email: Any = None,
) -> int | bool:
    ident = php.as_text(identifier).upper() if php.given(identifier) else None
    priorities = (priority_default, priority_start, priority_end)
    if not _fields_valid(name, ident, priorities, (start_date, end_date), email):
        return False
    values: dict[str, Any] = {
        "name": name,
        "description": description,
        "identifier": ident,
        "start_date": start_date,
        "end_date": end_date,
        "email": email,
        "priority_default": None if priority_default is None else php.to_int(priority_default),
        "priority_start": None if priority_start is None else php.to_int(priority_start),
        "priority_end": None if priority_end is None else php.to_int(priority_end),
    }
    values = {k: php.stored(v) for k, v in values.items() if v is not None}
    with api.store.write() as db:
        if _refused_by_database(api, db, ident, values.get("email"), owner_id):
            return False
        values.update(token="", last_modified=api.now(), is_private=0, owner_id=php.stored(owner_id))
        pid = api.insert(db, "projects", values)
        _add_default_lanes(api, db, pid)
        # With the app token Kanboard adds no member, not even owner_id.
        return pid


@procedure
def getProjectById(api: Board, project_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        project = project_row(db, project_id)
        return None if project is None else _format_project(api, project)


@procedure
def getProjectByName(api: Board, name: Any) -> dict[str, Any] | bool:
    with api.store.read() as db:
        row = row_dict(
            db.execute(
                f"SELECT * FROM projects WHERE {api.eq('name')} ORDER BY id LIMIT 1",
                (php.as_text(name),),
            ).fetchone()
        )
        return False if row is None else _format_project(api, row)


@procedure
def getProjectByIdentifier(api: Board, identifier: Any) -> dict[str, Any] | bool:
    ident = php.as_text(identifier).upper()
    if not ident:
        return False
    with api.store.read() as db:
        row = row_dict(
            db.execute(
                f"SELECT * FROM projects WHERE {api.eq('identifier')} ORDER BY id LIMIT 1", (ident,)
            ).fetchone()
        )
        return False if row is None else _format_project(api, row)


@procedure
def getAllProjects(api: Board) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [
            _format_project(api, dict(r))
            for r in db.execute(f"SELECT * FROM projects ORDER BY {api.order('name')}, id")
        ]


@procedure
def removeProject(api: Board, project_id: Any) -> bool:
    with api.store.write() as db:
        pid = php.to_int(project_id)
        if project_row(db, pid) is None:
            return False
        db.execute("DELETE FROM tags WHERE project_id = ?", (pid,))
        db.execute("DELETE FROM projects WHERE id = ?", (pid,))
        return True


@procedure
def enableProject(api: Board, project_id: Any) -> bool:
    return _set_project_active(api, project_id, 1)


@procedure
def disableProject(api: Board, project_id: Any) -> bool:
    return _set_project_active(api, project_id, 0)


def _set_project_active(api: Board, project_id: Any, active: int) -> bool:
    with api.store.write() as db:
        return (
            db.execute(
                "UPDATE projects SET is_active = ? WHERE id = ?", (active, php.to_int(project_id))
            ).rowcount
            > 0
        )
