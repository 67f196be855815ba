"""Kanboard's "Users" and "Project permissions" procedures, and who may be assigned a task."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import EMAIL, Board, procedure, project_row, row_dict, user_exists
from fabric.embedded.store import hash_password

APP_ROLES = ("app-user", "app-manager", "app-admin")
PROJECT_ROLES = ("project-manager", "project-member", "project-viewer")


@procedure
def createUser(
    api: Board,
    username: Any,
    password: Any,
    name: Any = "",
    email: Any = "",
    role: Any = "app-user",
) -> int | bool:
    if not php.given(username) or len(php.as_text(username)) > 191:
        return False
    if len(php.as_text(password)) < 6:
        return False
    if php.given(email) and not EMAIL.match(php.as_text(email)):
        return False
    if php.given(role) and role not in APP_ROLES:
        return False
    with api.store.write() as db:
        if db.execute(f"SELECT 1 FROM users WHERE {api.eq('username')}", (php.as_text(username),)).fetchone():
            return False  # the validator's unique check: MySQL compares ignoring case
        values: dict[str, Any] = {
            "username": php.as_text(username),
            "password": hash_password(php.as_text(password)),
            "name": api.fit("users", "name", php.as_text(name)),
            "email": api.fit("users", "email", php.as_text(email)),
            "role": php.as_text(role) or "app-user",
        }
        if api.flavour.null_lock_expiration:
            values["lock_expiration_date"] = None  # MySQL's column has no default
        try:
            return api.insert(db, "users", values)
        except sqlite3.IntegrityError:
            return False


@procedure
def getUser(api: Board, user_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(db.execute("SELECT * FROM users WHERE id = ?", (php.to_int(user_id),)).fetchone())
        return None if row is None else api.shape("users", row)


@procedure
def getUserByName(api: Board, username: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(
            db.execute(f"SELECT * FROM users WHERE {api.eq('username')}", (php.as_text(username),)).fetchone()
        )
        return None if row is None else api.shape("users", row)


@procedure
def getAllUsers(api: Board) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return api.rows("users", db.execute(f"SELECT * FROM users ORDER BY {api.order('username')}, id"))


@procedure
def addProjectUser(api: Board, project_id: Any, user_id: Any, role: Any = "project-member") -> bool:
    if role not in PROJECT_ROLES:
        return False
    with api.store.write() as db:
        pid, uid = php.to_int(project_id), php.to_int(user_id)
        if project_row(db, pid) is None or not user_exists(db, uid):
            return False
        try:
            db.execute(
                "INSERT INTO project_has_users (project_id, user_id, role) VALUES (?,?,?)",
                (pid, uid, role),
            )
        except sqlite3.IntegrityError:
            return False
        return True


@procedure
def removeProjectUser(api: Board, project_id: Any, user_id: Any) -> bool:
    with api.store.write() as db:
        return (
            db.execute(
                "DELETE FROM project_has_users WHERE project_id = ? AND user_id = ?",
                (php.to_int(project_id), php.to_int(user_id)),
            ).rowcount
            > 0
        )


@procedure
def getProjectUserRole(api: Board, project_id: Any, user_id: Any) -> str:
    with api.store.read() as db:
        row = db.execute(
            "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?",
            (php.to_int(project_id), php.to_int(user_id)),
        ).fetchone()
        return "" if row is None else str(row[0])


def _user_list(rows: Any) -> dict[str, str]:
    """Kanboard's ``prepareList``: id -> name (username when empty), sorted by value."""
    users = {str(r["id"]): (r["name"] or r["username"]) for r in rows}
    return dict(sorted(users.items(), key=lambda kv: kv[1]))


@procedure
def getProjectUsers(api: Board, project_id: Any) -> dict[str, str]:
    with api.store.read() as db:
        return _user_list(
            db.execute(
                "SELECT u.id, u.username, u.name FROM project_has_users p JOIN users u"
                " ON u.id = p.user_id WHERE p.project_id = ?",
                (php.to_int(project_id),),
            )
        )


@procedure
def getAssignableUsers(api: Board, project_id: Any, prepend_unassigned: Any = False) -> dict[str, str]:
    with api.store.read() as db:
        users = _user_list(
            db.execute(
                "SELECT u.id, u.username, u.name FROM project_has_users p JOIN users u"
                " ON u.id = p.user_id WHERE p.project_id = ? AND u.is_active = 1"
                " AND p.role != 'project-viewer'",
                (php.to_int(project_id),),
            )
        )
    if prepend_unassigned:
        users = {"0": "Unassigned", **users}
    return users


def assignable(db: sqlite3.Connection, project_id: Any, user_id: Any) -> bool:
    """Kanboard's ``isAssignable``: an active project member or manager (not a viewer)."""
    if not php.is_integer(user_id) or not php.given(user_id):
        return False
    user = db.execute("SELECT is_active FROM users WHERE id = ?", (php.to_int(user_id),)).fetchone()
    if user is None or user[0] != 1:
        return False
    project = db.execute(
        "SELECT is_everybody_allowed FROM projects WHERE id = ?", (php.to_int(project_id),)
    ).fetchone()
    if project is not None and project[0] == 1:
        return True
    row = db.execute(
        "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?",
        (php.to_int(project_id), php.to_int(user_id)),
    ).fetchone()
    return row is not None and row[0] != "project-viewer"


@procedure
def getMe(api: Board) -> dict[str, Any] | None:
    """The logged-in user: answered by :mod:`fabric.embedded.permissions`, refused to the app."""
    return None


@procedure
def updateUser(
    api: Board, id: Any, username: Any = None, name: Any = None, email: Any = None, role: Any = None
) -> bool:
    """Change a user's username, name, e-mail or role (``agap init`` keeps name and
    e-mail as the person's card says). As Kanboard: only given fields change; a taken
    username, a bad e-mail or role is false; a missing user is true (nothing matched)."""
    uid = php.to_int(id)
    if not uid:
        return False
    values = {
        k: php.as_text(v)
        for k, v in (("username", username), ("name", name), ("email", email), ("role", role))
        if v is not None
    }
    if "username" in values and len(values["username"]) > 191:
        return False
    if values.get("email") and not EMAIL.match(values["email"]):
        return False
    if "role" in values and values["role"] not in APP_ROLES:
        return False
    with api.store.write() as db:
        if (
            "username" in values
            and db.execute(
                f"SELECT 1 FROM users WHERE {api.eq('username')} AND id != ?", (values["username"], uid)
            ).fetchone()
        ):
            return False
        for key in ("name", "email"):
            if key in values:
                values[key] = api.fit("users", key, values[key])
        if values:
            sets = ", ".join(f"{k} = ?" for k in values)
            db.execute(f"UPDATE users SET {sets} WHERE id = ?", (*values.values(), uid))
        return True


@procedure
def removeUser(api: Board, user_id: Any) -> bool:
    """UserModel::remove: the user's tasks and comments are unassigned, its memberships go.

    Kanboard answers true even for an id that names no user (its updates succeed).
    """
    uid = php.to_int(user_id)
    with api.store.write() as db:
        db.execute("UPDATE tasks SET owner_id = 0 WHERE owner_id = ?", (uid,))
        db.execute("UPDATE comments SET user_id = 0 WHERE user_id = ?", (uid,))
        db.execute("DELETE FROM users WHERE id = ?", (uid,))
    return True
