"""Kanboard's "Tasks" procedures: create, read, update, open/close, moves and positions, search."""

from __future__ import annotations

import sqlite3
from typing import Any

from fabric.embedded import flavour as fl
from fabric.embedded import php
from fabric.embedded.flavour import SqlError
from fabric.embedded.procedures.activity import (
    TaskEvent,
    caller,
    deliver,
    file_event,
    move_events,
    project_move_event,
    record,
    update_events,
)
from fabric.embedded.procedures.app import COLORS
from fabric.embedded.procedures.base import Board, procedure, project_row, row_dict, task_row
from fabric.embedded.procedures.tags import find_or_create_tag, save_tags, tag_list
from fabric.embedded.procedures.users import assignable
from fabric.embedded.search import build_where
from fabric.embedded.store import as_dict
from fabric.kanboard.dates import BadDate, parse_input_date

_TASK_INTEGERS = (
    "project_id",
    "column_id",
    "owner_id",
    "creator_id",
    "score",
    "category_id",
    "swimlane_id",
    "recurrence_status",
    "recurrence_trigger",
    "recurrence_factor",
    "recurrence_timeframe",
    "recurrence_basedate",
    "priority",
)
# resetFields: a given-but-empty value of these becomes 0.
_RESET_TO_ZERO = (
    "creator_id",
    "owner_id",
    "date_due",
    "date_started",
    "score",
    "category_id",
    "time_estimated",
    "time_spent",
)


def _format_task(api: Board, task: dict[str, Any]) -> dict[str, Any]:
    task = api.shape("tasks", task)
    task["url"] = f"{api.base_url}?controller=TaskViewController&action=show&task_id={task['id']}"
    task["color"] = COLORS.get(str(task["color_id"]), COLORS["yellow"])
    return task


def _fields_valid(values: dict[str, Any]) -> bool:
    """TaskValidator's rules on the integer, numeric and length-limited fields."""
    if not all(php.is_integer(values.get(k)) for k in _TASK_INTEGERS):
        return False
    if php.given(values.get("score")) and abs(php.to_int(values["score"])) > 2147483647:
        return False
    if php.given(values.get("swimlane_id")) and php.to_int(values["swimlane_id"]) <= 0:
        return False
    if len(php.as_text(values.get("title"))) > 65535 or len(php.as_text(values.get("reference"))) > 191:
        return False
    return php.is_numeric(values.get("time_spent")) and php.is_numeric(values.get("time_estimated"))


def _with_dates(values: dict[str, Any], now: int) -> dict[str, Any] | None:
    """The values with the given dates converted, or None for a bad date or a start after the due date."""
    out = dict(values)
    for key in ("date_due", "date_started"):
        v = values.get(key)
        if php.given(v):
            try:
                out[key] = parse_input_date(v, now)
            except BadDate:
                return None
    started, due = out.get("date_started"), out.get("date_due")
    if not php.empty(started) and not php.empty(due) and php.to_int(started) > php.to_int(due):
        return None
    return out


def _validate_task(values: dict[str, Any], now: int) -> dict[str, Any] | None:
    """Kanboard's TaskValidator common rules; the values with dates converted, or None."""
    if not _fields_valid(values):
        return None
    out = _with_dates(values, now)
    if out is None:
        return None
    for key in _RESET_TO_ZERO:
        if key in out and out[key] is not None and php.empty(out[key]):
            out[key] = 0
    return out


def _may_own(db: sqlite3.Connection, project_id: Any, owner_id: Any, creator_id: Any) -> bool:
    """The owner and the creator must be assignable, unless exactly the integer 0."""
    return all(
        (type(who) is int and who == 0) or assignable(db, project_id, who) for who in (owner_id, creator_id)
    )


def _fill_defaults(api: Board, db: sqlite3.Connection, project_id: int, values: dict[str, Any]) -> None:
    """A new task's empty fields as Kanboard fills them: the first column, the first active
    swimlane, yellow, "Untitled"."""
    if php.empty(values["column_id"]):
        values["column_id"] = _first_id(db, "columns", project_id)
        if values["column_id"] is None and api.flavour.sql_errors:
            # An unknown project has no first column: '' is bound for an integer.
            raise SqlError(fl.no_column_error(api.flavour))
    if php.empty(values["color_id"]):
        values["color_id"] = "yellow"
    if php.empty(values["title"]):
        values["title"] = "Untitled"
    if php.empty(values["swimlane_id"]):
        values["swimlane_id"] = _first_id(db, "swimlanes", project_id, active_only=True)


def _next_position(db: sqlite3.Connection, project_id: int, column_id: Any, swimlane_id: Any) -> int:
    """The bottom of a cell: one past its open tasks."""
    (count,) = db.execute(
        "SELECT COUNT(*) FROM tasks WHERE project_id = ? AND column_id = ?"
        " AND swimlane_id = ? AND is_active = 1",
        (project_id, column_id, swimlane_id),
    ).fetchone()
    return int(count) + 1


@procedure
def createTask(
    api: Board,
    title: Any,
    project_id: Any,
    color_id: Any = "",
    column_id: Any = 0,
    owner_id: Any = 0,
    creator_id: Any = 0,
    date_due: Any = "",
    description: Any = "",
    category_id: Any = 0,
    score: Any = 0,
    swimlane_id: Any = None,
    priority: Any = 0,
    recurrence_status: Any = 0,
    recurrence_trigger: Any = 0,
    recurrence_factor: Any = 0,
    recurrence_timeframe: Any = 0,
    recurrence_basedate: Any = 0,
    reference: Any = "",
    tags: Any = php.ABSENT,
    date_started: Any = "",
    time_spent: Any = None,
    time_estimated: Any = None,
) -> int | bool:
    tag_names = [] if tags is php.ABSENT else tag_list(tags)
    given = dict(locals())
    for k in ("api", "tags", "tag_names"):
        given.pop(k)
    if not php.given(project_id) or not php.given(title):
        return False
    if caller() and not php.to_int(creator_id):
        given["creator_id"] = caller()  # TaskProcedure: the signed-in user creates it
    now = api.now()
    values = _validate_task(given, now)
    if values is None:
        return False
    with api.store.write() as db:
        if not _may_own(db, project_id, owner_id, creator_id):
            return False
        pid = php.to_int(project_id)
        _fill_defaults(api, db, pid, values)
        position = _next_position(db, pid, values["column_id"], values["swimlane_id"])
        values.update(position=position, date_creation=now, date_modification=now, date_moved=now)
        stored = {k: php.stored(v) for k, v in values.items()}
        stored["color_id"] = api.fit("tasks", "color_id", stored["color_id"])
        try:
            task_id = api.insert(db, "tasks", stored)
        except sqlite3.IntegrityError:
            return 0  # a foreign key (project, column, swimlane) or NOT NULL failed
        if tag_names:
            save_tags(api, db, pid, task_id, tag_names)
        event = record(api, db, "task.create", task_id)
    deliver(api, [event])
    return task_id


@procedure
def getTask(api: Board, task_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        task = task_row(db, task_id)
        return None if task is None else _format_task(api, task)


@procedure
def getTaskByReference(api: Board, project_id: Any, reference: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(
            db.execute(
                f"SELECT * FROM tasks WHERE project_id = ? AND {api.eq('reference')} ORDER BY id LIMIT 1",
                (php.to_int(project_id), php.as_text(reference)),
            ).fetchone()
        )
        return None if row is None else _format_task(api, row)


@procedure
def getAllTasks(api: Board, project_id: Any, status_id: Any = 1) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM tasks WHERE project_id = ? AND is_active = ? ORDER BY id",
            (php.to_int(project_id), php.to_int(status_id)),
        )
        return [_format_task(api, as_dict(r)) for r in rows]


@procedure
def updateTask(
    api: Board,
    id: Any,
    title: Any = None,
    color_id: Any = None,
    owner_id: Any = None,
    date_due: Any = None,
    description: Any = None,
    category_id: Any = None,
    score: Any = None,
    priority: Any = None,
    recurrence_status: Any = None,
    recurrence_trigger: Any = None,
    recurrence_factor: Any = None,
    recurrence_timeframe: Any = None,
    recurrence_basedate: Any = None,
    reference: Any = None,
    tags: Any = None,
    date_started: Any = None,
    time_spent: Any = None,
    time_estimated: Any = None,
) -> bool:
    given = {k: v for k, v in locals().items() if v is not None and k not in ("api", "id")}
    tag_names = tag_list(given.pop("tags")) if "tags" in given else None
    now = api.now()
    with api.store.write() as db:
        task = task_row(db, id)
        if task is None:
            return False
        if (
            "owner_id" in given
            and not php.same(owner_id, 0)
            and not assignable(db, task["project_id"], owner_id)
        ):
            return False
        values = _validate_task(given, now)
        if values is None or not php.is_integer(id):
            return False
        if tag_names is not None:
            save_tags(api, db, task["project_id"], task["id"], tag_names)
        for key in (
            "priority",
            "recurrence_status",
            "recurrence_trigger",
            "recurrence_factor",
            "recurrence_timeframe",
            "recurrence_basedate",
        ):
            if key in values:
                values[key] = php.to_int(values[key])
        values["date_modification"] = now
        stored = {k: php.stored(v) for k, v in values.items()}
        if "color_id" in stored:
            stored["color_id"] = api.fit("tasks", "color_id", stored["color_id"])
        cols = ", ".join(f"{k} = ?" for k in stored)
        db.execute(f"UPDATE tasks SET {cols} WHERE id = ?", (*stored.values(), task["id"]))
        events = update_events(api, db, task, values)
    deliver(api, list(events))
    return True


@procedure
def openTask(api: Board, task_id: Any) -> bool:
    return _set_status(
        api, task_id, "task.open", "is_active = 1, date_completed = 0, date_modification = ?", (api.now(),)
    )


@procedure
def closeTask(api: Board, task_id: Any) -> bool:
    now = api.now()
    return _set_status(
        api, task_id, "task.close", "is_active = 0, date_completed = ?, date_modification = ?", (now, now)
    )


def _set_status(api: Board, task_id: Any, event: str, assignments: str, values: tuple[int, ...]) -> bool:
    """TaskStatusModel::changeStatus: the update, then the event (with its activity row)."""
    tid = php.to_int(task_id)
    with api.store.write() as db:
        if db.execute(f"UPDATE tasks SET {assignments} WHERE id = ?", (*values, tid)).rowcount == 0:
            return False
        fired = record(api, db, event, tid)
    deliver(api, [fired])
    return True


@procedure
def removeTask(api: Board, task_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM tasks WHERE id = ?", (php.to_int(task_id),)).rowcount > 0


def _renumber(
    db: sqlite3.Connection, project_id: int, task_id: int, position: int, column_id: int, swimlane_id: int
) -> None:
    """Kanboard's saveTaskPositions: open tasks of a cell renumbered 1..n, the task put
    at ``position`` (clamped to the bottom); position 0 only closes the gap it left."""
    siblings = [
        r[0]
        for r in db.execute(
            "SELECT id FROM tasks WHERE is_active = 1 AND swimlane_id = ? AND project_id = ?"
            " AND column_id = ? AND id != ? ORDER BY position, id",
            (swimlane_id, project_id, column_id, task_id),
        )
    ]
    if position >= 1:
        siblings.insert(min(position, len(siblings) + 1) - 1, task_id)
    db.executemany(
        "UPDATE tasks SET position = ?, column_id = ?, swimlane_id = ? WHERE id = ?",
        [(i, column_id, swimlane_id, tid) for i, tid in enumerate(siblings, start=1)],
    )


@procedure
def moveTaskPosition(
    api: Board,
    project_id: Any,
    task_id: Any,
    column_id: Any,
    position: Any,
    swimlane_id: Any,
) -> bool:
    pos, col, lane = php.to_int(position), php.to_int(column_id), php.to_int(swimlane_id)
    now = api.now()
    with api.store.write() as db:
        task = task_row(db, task_id)
        if task is None or task["project_id"] != php.to_int(project_id) or pos < 1:
            return False
        pid = task["project_id"]
        if lane == 0:
            lane = task["swimlane_id"]
        if (task["column_id"], task["swimlane_id"]) == (col, lane):
            if task["position"] == pos:
                return False  # already there: Kanboard reports false
            _renumber(db, pid, task["id"], pos, col, lane)
            ok = True
        else:
            ok = _move_across(db, task, pos, col, lane, now)
        events = move_events(api, db, task, pos) if ok else []
    deliver(api, list(events))
    return ok


def _move_across(
    db: sqlite3.Connection, task: dict[str, Any], pos: int, col: int, lane: int, now: int
) -> bool:
    """Move a task to another column or swimlane; a missing target undoes the renumbering,
    but the timestamps are written anyway, as in Kanboard."""
    db.execute("SAVEPOINT move")
    try:
        _renumber(db, task["project_id"], task["id"], 0, task["column_id"], task["swimlane_id"])
        _renumber(db, task["project_id"], task["id"], pos, col, lane)
        ok = True
    except sqlite3.IntegrityError:
        ok = False
        db.execute("ROLLBACK TO move")
    db.execute("RELEASE move")
    db.execute("UPDATE tasks SET date_moved = ?, date_modification = ? WHERE id = ?", (now, now, task["id"]))
    return ok


def _allowed(db: sqlite3.Connection, project_id: int, user_id: int) -> bool:
    """ProjectPermissionModel::isUserAllowed: a signed-in admin may give anyone anything;
    else an active user with a role in the project."""
    me = db.execute("SELECT role FROM users WHERE id = ?", (caller(),)).fetchone()
    if me is not None and me[0] == "app-admin":
        return True
    user = db.execute("SELECT is_active FROM users WHERE id = ?", (user_id,)).fetchone()
    role = db.execute(
        "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?", (project_id, user_id)
    ).fetchone()
    return user is not None and user[0] == 1 and role is not None and bool(role[0])


def _named_id(api: Board, db: sqlite3.Connection, table: str, column: str, pid: int, ident: Any) -> int:
    """The id of the row of project ``pid`` named as row ``ident`` is (0: none), compared as
    the backend compares names."""
    name = db.execute(f"SELECT {column} FROM {table} WHERE id = ?", (php.to_int(ident),)).fetchone()
    if name is None:
        return 0
    found = db.execute(
        f"SELECT id FROM {table} WHERE project_id = ? AND {api.eq(column)} ORDER BY id LIMIT 1",
        (pid, name[0]),
    ).fetchone()
    return 0 if found is None else int(found[0])


def _destination(api: Board, db: sqlite3.Connection, values: dict[str, Any]) -> None:
    """TaskDuplicationModel::checkDestinationProjectValues: the assignee, category, swimlane,
    column and priority of ``values`` as they exist in its project (by name), in place."""
    pid = php.to_int(values["project_id"])
    if php.to_int(values["owner_id"]) > 0 and not _allowed(db, pid, php.to_int(values["owner_id"])):
        values["owner_id"] = 0
    if php.to_int(values["category_id"]) > 0:
        values["category_id"] = _named_id(api, db, "categories", "name", pid, values["category_id"])
    values["swimlane_id"] = _named_id(api, db, "swimlanes", "name", pid, values["swimlane_id"]) or (
        _first_id(db, "swimlanes", pid, active_only=True) or 0
    )
    if php.to_int(values["column_id"]) > 0:
        values["column_id"] = _named_id(api, db, "columns", "title", pid, values["column_id"]) or (
            _first_id(db, "columns", pid) or 0
        )
    project = db.execute(
        "SELECT priority_default, priority_start, priority_end FROM projects WHERE id = ?", (pid,)
    ).fetchone()
    priority = php.to_int(values["priority"])
    if project is not None and not project[1] <= priority <= project[2]:
        values["priority"] = project[0]


def _copy_tags(
    api: Board, db: sqlite3.Connection, task_id: int, to_task: int, pid: int, *, move: bool
) -> None:
    """TagDuplicationModel: the task's tags, by name, in project ``pid`` (created there with
    their colour if missing): moved (``syncTaskTagsToAnotherProject``: only the tags of
    another project) or copied to ``to_task``."""
    tags = db.execute(
        "SELECT g.id, g.name, g.color_id, g.project_id FROM task_has_tags th JOIN tags g ON g.id = th.tag_id"
        " WHERE th.task_id = ? ORDER BY g.id",
        (task_id,),
    ).fetchall()
    for tag_id, name, color, project in tags:
        if move and project in (0, pid):
            continue
        new = find_or_create_tag(api, db, pid, str(name), color)
        if move:
            db.execute("DELETE FROM task_has_tags WHERE task_id = ? AND tag_id = ?", (task_id, tag_id))
        if new is not None:
            db.execute("INSERT OR IGNORE INTO task_has_tags (task_id, tag_id) VALUES (?, ?)", (to_task, new))


@procedure
def moveTaskToProject(
    api: Board,
    task_id: Any,
    project_id: Any,
    swimlane_id: Any = None,
    column_id: Any = None,
    category_id: Any = None,
    owner_id: Any = None,
) -> bool:
    """TaskProjectMoveModel::moveToProject: one row updated, nothing renumbered.

    The card keeps its id, metadata, comments and files, and goes to the destination's
    column and swimlane *of the same name* (its own when not given), at position "open
    tasks in that column, every lane, plus one", reopened, its tags synced to the project;
    ``date_moved`` and ``date_modification`` are left as they were. Kanboard answers true
    whatever happened (a task that does not exist is an HTTP 500), and fires
    ``task.move.project``, recorded in the project the card lands in.
    """
    with api.store.write() as db:
        task = task_row(db, task_id)
        if task is None:
            # prepare() reads the missing task's fields: a PHP TypeError, an HTTP 500.
            raise php.Fatal("moveTaskToProject: no such task")
        pid = php.to_int(project_id)
        col = task["column_id"] if column_id is None else php.to_int(column_id)
        # prepare(): the position counts the column asked for, before it is mapped by name.
        (count,) = db.execute(
            "SELECT COUNT(*) FROM tasks WHERE project_id = ? AND column_id = ? AND is_active = 1",
            (pid, col),
        ).fetchone()
        values = {
            "is_active": 1,
            "project_id": pid,
            "column_id": col,
            "position": int(count) + 1,
            "swimlane_id": task["swimlane_id"] if swimlane_id is None else php.to_int(swimlane_id),
            "category_id": task["category_id"] if category_id is None else php.to_int(category_id),
            "owner_id": task["owner_id"] if owner_id is None else php.to_int(owner_id),
            "priority": php.to_int(task["priority"]),
        }
        _destination(api, db, values)
        _copy_tags(api, db, task["id"], task["id"], pid, move=True)
        changed = {k: v for k, v in values.items() if v != task[k]}
        if changed:
            names = ", ".join(f"{k} = ?" for k in changed)
            db.execute(f"UPDATE tasks SET {names} WHERE id = ?", (*changed.values(), task["id"]))
        event = project_move_event(api, db, int(task["id"]), values)
    deliver(api, [event])
    return True


# TaskDuplicationModel::$fieldsToDuplicate
_DUPLICATED = (
    "title",
    "description",
    "date_due",
    "color_id",
    "project_id",
    "column_id",
    "owner_id",
    "score",
    "priority",
    "category_id",
    "time_estimated",
    "swimlane_id",
    "recurrence_status",
    "recurrence_trigger",
    "recurrence_factor",
    "recurrence_timeframe",
    "recurrence_basedate",
    "external_provider",
    "external_uri",
    "reference",
)


@procedure
def duplicateTaskToProject(
    api: Board,
    task_id: Any,
    project_id: Any,
    swimlane_id: Any = None,
    column_id: Any = None,
    category_id: Any = None,
    owner_id: Any = None,
) -> int | bool:
    """TaskProjectDuplicationModel::duplicateToProject: a new task (made by the caller)
    with the copied fields (the reference and description included; no metadata, no
    comments), mapped into the project by name, its tags and files copied; events: the
    copy's ``task.create``, then a ``task.file.create`` per file. Kanboard also links the
    two tasks ("is a duplicate of"); the embedded board has no task links.

    A task that does not exist is ``false`` here; Kanboard, given one with the application
    token, makes an "Untitled" task (a user is refused by its permission check)."""
    pid = php.to_int(project_id)
    now = api.now()
    events: list[TaskEvent | None] = []
    with api.store.write() as db:
        task = task_row(db, task_id)
        if task is None or project_row(db, pid) is None:
            return False
        values = {k: task[k] for k in _DUPLICATED}
        overrides = {
            "column_id": column_id,
            "swimlane_id": swimlane_id,
            "category_id": category_id,
            "owner_id": owner_id,
        }
        values.update({k: v for k, v in overrides.items() if v is not None}, project_id=pid)
        _destination(api, db, values)
        # TaskCreationModel::create: the defaults, the signed-in user as creator, the dates.
        values["creator_id"] = caller()
        if php.empty(values["column_id"]):
            values["column_id"] = _first_id(db, "columns", pid)
        if php.empty(values["title"]):
            values["title"] = "Untitled"
        position = _next_position(db, pid, values["column_id"], values["swimlane_id"])
        values.update(position=position, date_creation=now, date_modification=now, date_moved=now)
        try:
            new_id = api.insert(db, "tasks", {k: php.stored(v) for k, v in values.items()})
        except sqlite3.IntegrityError:
            return False
        events.append(record(api, db, "task.create", new_id))
        _copy_tags(api, db, task["id"], new_id, pid, move=False)
        files = db.execute(
            "SELECT name, path, is_image, size, blob FROM task_has_files WHERE task_id = ? ORDER BY id",
            (task["id"],),
        ).fetchall()
        for f in files:
            fid = api.insert(
                db, "task_has_files", {**dict(f), "task_id": new_id, "date": now, "user_id": caller()}
            )
            events.append(file_event(api, db, fid))
    deliver(api, events)
    return new_id


def _first_id(
    db: sqlite3.Connection, table: str, project_id: int, *, active_only: bool = False
) -> int | None:
    extra = " AND is_active = 1" if active_only else ""
    row = db.execute(
        f"SELECT id FROM {table} WHERE project_id = ?{extra} ORDER BY position, id LIMIT 1",
        (project_id,),
    ).fetchone()
    return None if row is None else int(row[0])


_SEARCH_SELECT = """
SELECT
  (SELECT COUNT(*) FROM comments WHERE task_id = t.id) AS nb_comments,
  (SELECT COUNT(*) FROM task_has_files WHERE task_id = t.id) AS nb_files,
  0 AS nb_subtasks, 0 AS nb_completed_subtasks, 0 AS nb_links, 0 AS nb_external_links,
  NULL AS is_milestone,
  t.id, t.reference, t.title, t.description, t.date_creation, t.date_modification,
  t.date_completed, t.date_started, t.date_due, t.color_id, t.project_id, t.column_id,
  t.swimlane_id, t.owner_id, t.creator_id, t.position, t.is_active, t.score, t.category_id,
  t.priority, t.date_moved, t.recurrence_status, t.recurrence_trigger, t.recurrence_factor,
  t.recurrence_timeframe, t.recurrence_basedate, t.recurrence_parent, t.recurrence_child,
  t.time_estimated, t.time_spent,
  u.username AS assignee_username, u.name AS assignee_name, u.email AS assignee_email,
  u.avatar_path AS assignee_avatar_path,
  cat.name AS category_name, cat.description AS category_description,
  cat.color_id AS category_color_id,
  c.title AS column_name, c.position AS column_position,
  s.name AS swimlane_name, p.name AS project_name
FROM tasks t
LEFT JOIN users u ON u.id = t.owner_id
LEFT JOIN users uc ON uc.id = t.creator_id
LEFT JOIN categories cat ON cat.id = t.category_id
LEFT JOIN columns c ON c.id = t.column_id
LEFT JOIN swimlanes s ON s.id = t.swimlane_id
LEFT JOIN projects p ON p.id = t.project_id
WHERE t.project_id = ?
"""


@procedure
def searchTasks(api: Board, project_id: Any, query: Any) -> list[dict[str, Any]]:
    where = build_where(php.as_text(query), api.flavour)
    sql = _SEARCH_SELECT + "".join(f" AND {c}" for c in where.sql)
    # Kanboard has no ORDER BY here; the real backends happen to answer in id order, and
    # so do these flavours, by saying so: the index a search goes through (open cards by
    # column) no longer gives it. Strict answers the other way so nothing comes to depend
    # on it.
    sql += " ORDER BY t.id DESC" if api.flavour.search_reversed else " ORDER BY t.id"
    with api.store.read() as db:
        rows = db.execute(sql, (php.to_int(project_id), *where.params))
        return [fl.shape(api.flavour, "tasks", as_dict(r), reorder=False) for r in rows]
