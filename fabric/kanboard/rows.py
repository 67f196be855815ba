"""Kanboard's rows, typed: parsed once, where they come off the board.

Kanboard answers with whatever its database driver hands it: ids, numbers and dates as
ints or as strings (PDO on older PHP), booleans as ``1``/``0``, ``"1"``/``"0"`` or
``true``/``false`` (PostgreSQL's BOOLEAN columns), an unset date as ``0`` or ``null``.
The rest of the fabric reads these attributes, never Kanboard's field names.

Each row keeps what the board sent (``raw``): a backup stores it as it is. A row is not
indexable, so nothing above this package can read a Kanboard field by name by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from fabric.plain import Plain


def as_int(value: Any) -> int:
    """A Kanboard number as an int: 0 for unset (``None``, ``""``, ``false``) or unreadable."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return int(float(value))
            except ValueError:
                return 0
    return 0


def as_flag(value: Any, default: bool) -> bool:
    """A Kanboard boolean: ``1``/``0``, ``"1"``/``"0"``, ``true``/``false``, ``"t"``/``"f"``."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "t", "true", "yes", "on")
    return bool(value)


def as_text(value: Any) -> str:
    """A Kanboard string: ``""`` for ``null``."""
    return "" if value is None else str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


class BoardTask(Plain):
    """A Kanboard task row. Dates are unix seconds, 0 when unset."""

    id: int
    title: str = ""
    description: str = ""
    reference: str = ""  # the idempotency key (fabric.kanboard.layout)
    project_id: int = 0  # 0 where the row does not say (a search's rows are its project's)
    priority: int = 0
    color: str = ""
    column_id: int = 0
    swimlane_id: int = 0
    owner_id: int = 0
    creator_id: int = 0  # who made the card: 0 for the application token
    is_open: bool = True
    created_at: int = 0
    modified_at: int = 0
    moved_at: int = 0  # last moved to another column or swimlane
    completed_at: int = 0  # closed at (0 while open)
    due_at: int = 0
    start_at: int = 0  # Kanboard's start date: the fabric's start hint
    column_name: str | None = None
    swimlane_name: str | None = None
    assignee: str | None = None  # the owner's username, where the board joins it in
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> BoardTask:
        g = row.get
        return cls(
            id=as_int(g("id")),
            title=as_text(g("title")),
            description=as_text(g("description")),
            reference=as_text(g("reference")),
            project_id=as_int(g("project_id")),
            priority=as_int(g("priority")),
            color=as_text(g("color_id")),
            column_id=as_int(g("column_id")),
            swimlane_id=as_int(g("swimlane_id")),
            owner_id=as_int(g("owner_id")),
            creator_id=as_int(g("creator_id")),
            is_open=as_flag(g("is_active"), True),
            created_at=as_int(g("date_creation")),
            modified_at=as_int(g("date_modification")),
            moved_at=as_int(g("date_moved")),
            completed_at=as_int(g("date_completed")),
            due_at=as_int(g("date_due")),
            start_at=as_int(g("date_started")),
            column_name=_optional_text(g("column_name")),
            swimlane_name=_optional_text(g("swimlane_name")),
            assignee=_optional_text(g("assignee_username")),
            raw=dict(row),
        )


class BoardComment(Plain):
    """A comment: one line of a task's journal. ``user_id`` 0 is the application token."""

    id: int
    task_id: int = 0
    user_id: int = 0
    username: str | None = None
    text: str = ""
    visibility: str | None = None
    created_at: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> BoardComment:
        g = row.get
        return cls(
            id=as_int(g("id")),
            task_id=as_int(g("task_id")),
            user_id=as_int(g("user_id")),
            username=_optional_text(g("username")),
            text=as_text(g("comment")),
            visibility=_optional_text(g("visibility")),
            created_at=as_int(g("date_creation")),
            raw=dict(row),
        )


class BoardFile(Plain):
    """A file attached to a task (its content is downloaded separately, base64)."""

    id: int
    name: str = ""
    size: int = 0
    task_id: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> BoardFile:
        g = row.get
        return cls(
            id=as_int(g("id")),
            name=as_text(g("name")),
            size=as_int(g("size")),
            task_id=as_int(g("task_id")),
            raw=dict(row),
        )


class BoardTag(Plain):
    """A project tag. In the locks project a tag is a lock; its colour names its creator."""

    id: int
    name: str = ""
    color: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> BoardTag:
        g = row.get
        return cls(id=as_int(g("id")), name=as_text(g("name")), color=as_text(g("color_id")), raw=dict(row))


# Kanboard's activity events, by what a person did (event names are Kanboard's).
ACTIVITY_KINDS = {
    "task.move.column": "move",
    "task.move.swimlane": "move",
    "task.move.position": "move",
    "task.close": "close",
    "task.open": "open",
    "task.create": "create",
    "comment.create": "comment",
    "task.update": "edit",
    "task.assignee_change": "edit",
    "task.move.project": "arrive",  # recorded in the project the card was moved to
}

# What a person may edit on a card, by Kanboard's field name in an edit's ``changes``: the
# typed row's attribute that holds it, and how its value reads.
EDIT_FIELDS: dict[str, tuple[str, Any]] = {
    "title": ("title", as_text),
    "description": ("description", as_text),
    "priority": ("priority", as_int),
    "date_due": ("due_at", as_int),
    "owner_id": ("owner_id", as_int),
    "reference": ("reference", as_text),
}


class BoardActivity(Plain):
    """One row of a project's activity: what a signed-in user did to a task, and when.

    Kanboard writes one only for a signed-in user (its web UI, user-auth JSON-RPC), never
    for the application token. ``kind`` is move, close, open, create, comment, edit (a
    title, description, priority, due date or assignee changed: ``edited`` holds the new
    values, by :class:`BoardTask` attribute), arrive (moved here from another project) or
    other.
    """

    id: int
    kind: str
    task_id: int = 0
    user_id: int = 0
    username: str = ""
    at: int = 0
    column_id: int = 0  # where the card was after the event
    swimlane_id: int = 0
    edited: Mapping[str, Any] = field(default_factory=dict)  # row attribute -> its new value
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> BoardActivity:
        g = row.get
        found = g("task")
        task: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        # An empty PHP array is a JSON list: no changes.
        found_changes = g("changes")
        changes: Mapping[str, Any] = found_changes if isinstance(found_changes, Mapping) else {}
        edited = {attr: read(changes[name]) for name, (attr, read) in EDIT_FIELDS.items() if name in changes}
        return cls(
            id=as_int(g("id")),
            kind=ACTIVITY_KINDS.get(as_text(g("event_name")), "other"),
            task_id=as_int(g("task_id")),
            user_id=as_int(g("creator_id")),
            username=as_text(g("author_username")),
            at=as_int(g("date_creation")),
            column_id=as_int(task.get("column_id")),
            swimlane_id=as_int(task.get("swimlane_id")),
            edited=edited,
            raw=dict(row),
        )


def activity_rows(value: Any) -> list[BoardActivity]:
    """``getProjectActivity``'s answer (newest first), typed; anything but a list is none."""
    return [BoardActivity.parse(r) for r in value or [] if isinstance(r, Mapping)]


def task_rows(value: Any) -> list[BoardTask]:
    """Task rows from a list answer (``searchTasks``, ``getAllTasks``); ``null`` is none."""
    return [BoardTask.parse(r) for r in value or [] if isinstance(r, Mapping)]


def comment_rows(value: Any) -> list[BoardComment]:
    return [BoardComment.parse(r) for r in value or [] if isinstance(r, Mapping)]


def file_rows(value: Any) -> list[BoardFile]:
    return [BoardFile.parse(r) for r in value or [] if isinstance(r, Mapping)]


def tag_rows(value: Any) -> list[BoardTag]:
    return [BoardTag.parse(r) for r in value or [] if isinstance(r, Mapping)]


def meta_map(value: Any) -> dict[str, str]:
    """Metadata as strings (``null`` values as ``""``); anything but an object is empty."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): as_text(v) for k, v in value.items()}


__all__ = [
    "ACTIVITY_KINDS",
    "BoardActivity",
    "BoardComment",
    "BoardFile",
    "BoardTag",
    "BoardTask",
    "activity_rows",
    "as_flag",
    "as_int",
    "as_text",
    "comment_rows",
    "file_rows",
    "meta_map",
    "tag_rows",
    "task_rows",
]
