"""Project activity: what Kanboard records when a signed-in person acts, and only then.

The same calls are made as a named user (user-auth JSON-RPC, as Kanboard's UI makes them)
on every board; ``getProjectActivity`` (read with the application token) must answer the
same rows with the same shapes. Calls made with the application token record nothing.
The users and projects made here start with ``g_``.
"""

from __future__ import annotations

import uuid
from typing import Any

from fabric.kanboard.client import KanboardClient
from tests.contract.conftest import Board, Project, make_project

PASSWORD = "g-contract-pass"
ROW_KEYS = {
    "id",
    "date_creation",
    "event_name",
    "creator_id",
    "project_id",
    "task_id",
    "author_username",
    "author_name",
    "email",
    "avatar_path",
    "task",
    "author",
    "event_title",
    "event_content",
}
MOVE_KEYS = {
    "changes",
    "position",
    "column_id",
    "swimlane_id",
    "src_column_id",
    "dst_column_id",
    "date_moved",
    "recurrence_status",
    "recurrence_trigger",
}
TASK_KEYS = {
    "id", "title", "description", "date_creation", "color_id", "project_id", "column_id", "owner_id",
    "position", "is_active", "date_completed", "score", "date_due", "category_id", "creator_id",
    "date_modification", "reference", "date_started", "time_spent", "time_estimated", "swimlane_id",
    "date_moved", "recurrence_status", "recurrence_trigger", "recurrence_factor", "recurrence_timeframe",
    "recurrence_basedate", "recurrence_parent", "recurrence_child", "priority", "external_provider",
    "external_uri", "category_name", "category_description", "creator_username", "creator_name",
    "assignee_username", "assignee_name", "project_name", "column_title", "column_position",
    "swimlane_name",
}  # fmt: skip
COMMENT_KEYS = {
    "id", "task_id", "user_id", "date_creation", "date_modification", "comment", "reference",
    "visibility", "username", "name", "email", "avatar_path",
}  # fmt: skip


def person(board: Board, project: Project) -> tuple[int, str, KanboardClient]:
    """A new member of ``project`` and a client signed in as them."""
    name = f"g_{uuid.uuid4().hex[:10]}"
    uid = board.call("createUser", {"username": name, "password": PASSWORD, "name": "G Person"})
    assert isinstance(uid, int) and uid > 0
    assert board.call("addProjectUser", {"project_id": project.id, "user_id": uid, "role": "project-member"})
    return uid, name, KanboardClient(board.url, PASSWORD, user=name, timeout=30)


def activity(board: Board, project: Project) -> list[dict[str, Any]]:
    rows = board.call("getProjectActivity", {"project_id": project.id})
    assert isinstance(rows, list)
    return rows


def move(client: KanboardClient, project: Project, tid: int, column: str, lane: int | None = None) -> None:
    assert client.call(
        "moveTaskPosition",
        {
            "project_id": project.id,
            "task_id": tid,
            "column_id": project.column(column),
            "position": 1,
            "swimlane_id": lane or project.swimlane_id,
        },
    )


def test_a_persons_create_move_comment_close_and_open_are_recorded_as_theirs(board: Board) -> None:
    project = make_project(board, "g_act")
    uid, name, me = person(board, project)
    first = project.columns[next(iter(project.columns))]
    tid = me.call("createTask", {"project_id": project.id, "title": "made by hand", "column_id": first})
    assert isinstance(tid, int) and tid > 0
    assert board.call("getTask", {"task_id": tid})["creator_id"] == uid, "the signed-in user made it"
    second = list(project.columns)[1]
    move(me, project, tid, second)
    assert me.call("createComment", {"task_id": tid, "user_id": uid, "content": "done?"})
    assert me.call("closeTask", {"task_id": tid})
    assert me.call("openTask", {"task_id": tid})
    rows = activity(board, project)
    names = [r["event_name"] for r in rows]
    assert names == ["task.open", "task.close", "comment.create", "task.move.column", "task.create"]
    for r in rows:
        assert (r["creator_id"], r["author_username"], r["task_id"]) == (uid, name, tid)
        assert (r["author"], r["project_id"]) == ("G Person", project.id)
        assert set(r["task"]) == TASK_KEYS
        assert r["task"]["is_active"] == board.flag(1) or r["event_name"] == "task.close"
    by_name = {r["event_name"]: r for r in rows}
    moved = by_name["task.move.column"]
    assert set(moved) == ROW_KEYS | MOVE_KEYS
    assert (moved["src_column_id"], moved["dst_column_id"]) == (first, project.column(second))
    assert (
        {"src_column_id", "dst_column_id"}
        <= set(moved["changes"])
        <= {
            "src_column_id",
            "dst_column_id",
            "date_moved",
            "position",
        }
    )
    assert moved["task"]["column_id"] == project.column(second)
    assert moved["event_title"] == f'G Person moved the task #{tid} to the column "{second}"'
    said = by_name["comment.create"]
    assert set(said) == ROW_KEYS | {"comment"} and set(said["comment"]) == COMMENT_KEYS
    assert (said["comment"]["comment"], said["comment"]["username"]) == ("done?", name)
    assert set(by_name["task.close"]) == ROW_KEYS
    assert by_name["task.close"]["event_title"] == f"G Person closed the task #{tid}"


def test_a_move_to_another_swimlane_records_the_swimlane_then_the_column(board: Board) -> None:
    project = make_project(board, "g_lane")
    uid, _, me = person(board, project)
    lane = board.call("addSwimlane", {"project_id": project.id, "name": "g-other"})
    assert isinstance(lane, int) and lane > 0
    tid = project.task("to move")
    move(me, project, tid, list(project.columns)[1], lane=lane)
    rows = activity(board, project)
    assert [r["event_name"] for r in rows] == ["task.move.column", "task.move.swimlane"]
    assert all(r["creator_id"] == uid and r["swimlane_id"] == lane for r in rows)
    assert rows[1]["task"]["swimlane_name"] == "g-other"


def test_the_application_token_records_no_activity(board: Board, project: Project) -> None:
    tid = project.task("made by the app")
    move(board.client, project, tid, list(project.columns)[1])
    assert board.call("closeTask", {"task_id": tid})
    assert activity(board, project) == []


def test_a_person_comments_only_as_themselves(board: Board) -> None:
    project = make_project(board, "g_who")
    uid, _, me = person(board, project)
    other, _, _ = person(board, project)
    tid = project.task("a card")
    assert me.call("createComment", {"task_id": tid, "user_id": other, "content": "as someone else"}) is False
    assert me.call("createComment", {"task_id": tid, "user_id": uid, "content": "as me"})
