"""Who may call what: Kanboard's API authorization, for a caller logged in as a user.

The application token (user ``jsonrpc``) may call everything. A user (HTTP Basic with a
username and that user's password) is held to Kanboard 1.2.53's rules
(``AuthenticationProvider::getApiAccessMap`` and ``getApiProjectAccessMap``, and the
``*Authorization`` classes of its API):

* user administration, ``getAllProjects`` and ``getOverdueTasks`` need the app role
  ``app-admin``; ``createProject`` needs ``app-manager``;
* everything else that touches a project needs a role in *that* project (the project
  named by the call, or the one the task, tag, comment, file, column, swimlane or category
  belongs to): viewers read, members write tasks, tags, comments, files and metadata,
  managers change columns, swimlanes, categories, members and the project itself. A
  project the user has no role in, or one that does not exist, is refused;
* a refusal answers the whole request, a batch too, with HTTP 403 and
  ``{"code": 403, "message": "Forbidden"}``; the batch's earlier calls stay done and its
  later ones never run, as in Kanboard;
* a procedure this table does not know is refused to users: the embedded board refuses
  wherever Kanboard might.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board

VIEWER, MEMBER, MANAGER = "project-viewer", "project-member", "project-manager"
_RANK = {VIEWER: 1, MEMBER: 2, MANAGER: 3}
_APP_RANK = {"app-user": 1, "app-manager": 2, "app-admin": 3}

_MANAGER_ONLY = frozenset(
    [
        "createCategory",
        "updateCategory",
        "removeCategory",
        "addColumn",
        "updateColumn",
        "removeColumn",
        "changeColumnPosition",
        "addProjectUser",
        "removeProjectUser",
        "changeProjectUserRole",
        "updateProject",
        "removeProject",
        "enableProject",
        "disableProject",
        "addSwimlane",
        "updateSwimlane",
        "removeSwimlane",
        "disableSwimlane",
        "enableSwimlane",
        "changeSwimlanePosition",
    ]
)
_MEMBER_WRITES = frozenset(
    [
        "createComment",
        "updateComment",
        "removeComment",
        "createTaskFile",
        "removeTaskFile",
        "removeAllTaskFiles",
        "openTask",
        "closeTask",
        "removeTask",
        "moveTaskPosition",
        "moveTaskToProject",
        "duplicateTaskToProject",
        "createTask",
        "updateTask",
        "setTaskTags",
        "createTag",
        "updateTag",
        "removeTag",
        "saveProjectMetadata",
        "removeProjectMetadata",
        "saveTaskMetadata",
        "removeTaskMetadata",
    ]
)
_APP_ROLE = {
    **dict.fromkeys(
        (
            "createUser",
            "updateUser",
            "removeUser",
            "getUser",
            "getUserByName",
            "getAllUsers",
            "getAllProjects",
        ),
        "app-admin",
    ),
    "createProject": "app-manager",
}
_OPEN = frozenset(
    ("getVersion", "getTimezone", "getDefaultTaskColors", "getDefaultTaskColor", "getColorList", "getMe")
)

# How a procedure names its project: the parameter, and what it is the id of.
_BY_PROJECT = [
    "searchTasks",
    "getTaskByReference",
    "getAllTasks",
    "createTask",
    "getProjectMetadata",
    "getProjectMetadataByName",
    "saveProjectMetadata",
    "removeProjectMetadata",
    "getTagsByProject",
    "createTag",
    "getProjectById",
    "removeProject",
    "enableProject",
    "disableProject",
    "getProjectActivity",
    "getColumns",
    "addColumn",
    "changeColumnPosition",
    "getActiveSwimlanes",
    "getAllSwimlanes",
    "getSwimlaneByName",
    "addSwimlane",
    "disableSwimlane",
    "enableSwimlane",
    "getProjectUsers",
    "getAssignableUsers",
    "addProjectUser",
    "removeProjectUser",
    "getProjectUserRole",
    "getAllCategories",
    "createCategory",
]
_BY_TASK = [
    "getTask",
    "openTask",
    "closeTask",
    "removeTask",
    "getTaskMetadata",
    "getTaskMetadataByName",
    "saveTaskMetadata",
    "removeTaskMetadata",
    "getTaskTags",
    "getAllComments",
    "createComment",
    "getAllTaskFiles",
    "removeAllTaskFiles",
]
_SCOPE: dict[str, tuple[str, str]] = {
    **{m: ("project", "project_id") for m in _BY_PROJECT},
    **{m: ("task", "task_id") for m in _BY_TASK},
    "updateTask": ("task", "id"),
    "updateTag": ("tag", "tag_id"),
    "removeTag": ("tag", "tag_id"),
    "getComment": ("comment", "comment_id"),
    "removeComment": ("comment", "comment_id"),
    "updateComment": ("comment", "id"),
    "getTaskFile": ("file", "file_id"),
    "downloadTaskFile": ("file", "file_id"),
    "removeTaskFile": ("file", "file_id"),
    "getColumn": ("column", "column_id"),
    "updateColumn": ("column", "column_id"),
    "removeColumn": ("column", "column_id"),
    "getSwimlaneById": ("swimlane", "swimlane_id"),
    "getSwimlane": ("swimlane", "swimlane_id"),
    "getCategory": ("category", "category_id"),
    "updateCategory": ("category", "id"),
    "removeCategory": ("category", "category_id"),
}
_OWNER_SQL = {
    "task": "SELECT project_id FROM tasks WHERE id = ?",
    "tag": "SELECT project_id FROM tags WHERE id = ?",
    "comment": "SELECT t.project_id FROM comments c JOIN tasks t ON t.id = c.task_id WHERE c.id = ?",
    "file": "SELECT t.project_id FROM task_has_files f JOIN tasks t ON t.id = f.task_id WHERE f.id = ?",
    "column": "SELECT project_id FROM columns WHERE id = ?",
    "swimlane": "SELECT project_id FROM swimlanes WHERE id = ?",
    "category": "SELECT project_id FROM categories WHERE id = ?",
}


class Forbidden(Exception):
    """Kanboard's AccessDeniedException: the whole request is answered with HTTP 403."""


@dataclass(frozen=True)
class SignedIn:
    """A signed-in user: id, username and application role."""

    user_id: int
    username: str
    role: str


@dataclass(frozen=True)
class Permit:
    """Run the procedure (``run``), or answer ``result`` without running it."""

    run: bool = True
    result: Any = None


RUN = Permit()


def check(api: Board, user_id: int, method: str, args: Mapping[str, Any]) -> Permit:
    """What Kanboard does with ``method(args)`` from ``user_id`` (0: the application
    token); raises :class:`Forbidden`."""
    if not user_id:
        if method == "getMe":
            raise Forbidden("getMe is not available with the API credentials")
        return RUN
    with api.store.read() as db:
        row = db.execute("SELECT username, role FROM users WHERE id = ?", (user_id,)).fetchone()
        if row is None:
            raise Forbidden("the signed-in user is gone")
        return _check_user(api, db, SignedIn(user_id, str(row[0]), str(row[1])), method, args)


def _check_user(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    if method == "getMe":
        row = db.execute("SELECT * FROM users WHERE id = ?", (caller.user_id,)).fetchone()
        return Permit(run=False, result=api.shape("users", dict(row)))
    if method in _OPEN:
        return RUN
    needed = _APP_ROLE.get(method)
    if needed is not None:
        if _APP_RANK.get(caller.role, 0) < _APP_RANK[needed]:
            raise Forbidden(f"{method} needs the application role {needed}")
        return RUN
    special = _SPECIAL.get(method)
    if special is not None:
        return special(api, db, caller, method, args)
    scope = _SCOPE.get(method)
    if scope is None:
        raise Forbidden(f"{method}: not in the embedded board's permission table")
    _require(db, caller, method, _project_of(db, scope[0], args.get(scope[1])))
    return RUN


def has_rule(method: str) -> bool:
    """Whether this table says what a user needs for ``method`` (else it is refused)."""
    return method in _OPEN or method in _APP_ROLE or method in _SPECIAL or method in _SCOPE


def required_role(method: str) -> str:
    """The least project role ``method`` needs."""
    if method in _MANAGER_ONLY:
        return MANAGER
    return MEMBER if method in _MEMBER_WRITES else VIEWER


def _project_of(db: sqlite3.Connection, kind: str, ident: Any) -> int | None:
    if kind == "project":
        return php.to_int(ident) or None
    row = db.execute(_OWNER_SQL[kind], (php.to_int(ident),)).fetchone()
    return None if row is None else int(row[0])


def _require(db: sqlite3.Connection, caller: SignedIn, method: str, project_id: int | None) -> None:
    if not project_id:
        raise Forbidden(f"{method}: Project Not Found")
    row = db.execute(
        "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?",
        (project_id, caller.user_id),
    ).fetchone()
    role = "" if row is None else str(row[0])
    if _RANK.get(role, 0) < _RANK[required_role(method)]:
        raise Forbidden(f"{method}: Project Access Denied (project #{project_id}, role {role or 'none'})")


def _member_projects(db: sqlite3.Connection, caller: SignedIn) -> list[int]:
    rows = db.execute("SELECT project_id FROM project_has_users WHERE user_id = ?", (caller.user_id,))
    return [int(r[0]) for r in rows]


# -- the procedures whose check is more than "a role in the project" ------------------


def _by_name(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    """getProjectByName/ByIdentifier: a missing project is ``false`` before any check."""
    if method == "getProjectByName":
        column, value = "name", php.as_text(args.get("name"))
    else:
        column, value = "identifier", php.as_text(args.get("identifier")).upper()
    sql = f"SELECT id FROM projects WHERE {api.eq(column)} ORDER BY id LIMIT 1"
    row = db.execute(sql, (value,)).fetchone()
    if row is None:
        return RUN  # the procedure answers false
    _require(db, caller, method, int(row[0]))
    return RUN


def _move(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    """moveTaskPosition: the task's project (Kanboard checks the named one too, once it
    is known to be the same), ``false`` when it is not the one named."""
    task_project = _project_of(db, "task", args.get("task_id"))
    _require(db, caller, method, task_project)
    return RUN if task_project == php.to_int(args.get("project_id")) else Permit(run=False, result=False)


def _task_file(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    """createTaskFile: the named project, then ``false`` for a missing or foreign task."""
    _require(db, caller, method, php.to_int(args.get("project_id")) or None)
    task_project = _project_of(db, "task", args.get("task_id"))
    if task_project is None or task_project != php.to_int(args.get("project_id")):
        return Permit(run=False, result=False)
    _require(db, caller, method, task_project)
    return RUN


def _comment(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    """createComment: a user's comment is visible to every user (the procedure itself
    refuses a comment in someone else's name)."""
    _require(db, caller, method, _project_of(db, "task", args.get("task_id")))
    if caller.role == "app-user" and args.get("visibility", "app-user") != "app-user":
        return Permit(run=False, result=False)
    return RUN


def _all_tags(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    """getAllTags: a user who is not an admin sees the tags of their projects only."""
    if caller.role == "app-admin":
        return RUN
    ids = _member_projects(db, caller)
    marks = ",".join("?" * len(ids)) or "NULL"
    sql = f"SELECT * FROM tags WHERE project_id IN ({marks}) ORDER BY {api.order('name')}, id"
    return Permit(run=False, result=[dict(r) for r in db.execute(sql, ids)])


def _set_tags(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    _require(db, caller, method, php.to_int(args.get("project_id")) or None)
    _require(db, caller, method, _project_of(db, "task", args.get("task_id")))
    return RUN


def _to_project(
    api: Board, db: sqlite3.Connection, caller: SignedIn, method: str, args: Mapping[str, Any]
) -> Permit:
    _require(db, caller, method, _project_of(db, "task", args.get("task_id")))
    _require(db, caller, method, php.to_int(args.get("project_id")) or None)
    return RUN


_Special = Callable[[Board, sqlite3.Connection, SignedIn, str, Mapping[str, Any]], Permit]
_SPECIAL: dict[str, _Special] = {
    "getProjectByName": _by_name,
    "getProjectByIdentifier": _by_name,
    "moveTaskPosition": _move,
    "createTaskFile": _task_file,
    "createComment": _comment,
    "getAllTags": _all_tags,
    "setTaskTags": _set_tags,
    "moveTaskToProject": _to_project,
    "duplicateTaskToProject": _to_project,
}

__all__ = ["Forbidden", "Permit", "SignedIn", "check", "has_rule", "required_role"]
