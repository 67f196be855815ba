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


def test_a_persons_edit_records_task_update_with_what_changed(board: Board) -> None:
    project = make_project(board, "g_edit")
    uid, name, me = person(board, project)
    tid = project.task("as made", priority=1)
    edit = {"id": tid, "title": "as edited", "priority": 3, "date_due": "2031-02-03 10:20"}
    assert me.call("updateTask", edit)
    [row] = activity(board, project)
    assert (row["event_name"], row["creator_id"], row["author_username"]) == ("task.update", uid, name)
    assert set(row) == ROW_KEYS | {"changes"} and set(row["task"]) == TASK_KEYS
    due = board.call("getTask", {"task_id": tid})["date_due"]
    assert row["changes"] == {"title": "as edited", "priority": 3, "date_due": int(due)}
    assert row["task"]["title"] == "as edited"
    assert row["event_title"] == f"G Person updated the task #{tid}"
    assert me.call("updateTask", {"id": tid, "title": "as edited", "priority": 3}), "nothing changes"
    assert len(activity(board, project)) == 1, "an update that changes nothing records nothing"


def test_a_persons_reassign_records_task_assignee_change(board: Board) -> None:
    project = make_project(board, "g_assign")
    uid, _, me = person(board, project)
    tid = project.task("to assign")
    assert me.call("updateTask", {"id": tid, "owner_id": uid})
    assert me.call("updateTask", {"id": tid, "owner_id": 0})
    unassigned, assigned = activity(board, project)
    assert [assigned["event_name"], unassigned["event_name"]] == ["task.assignee_change"] * 2
    assert assigned["changes"] == {"owner_id": uid} and unassigned["changes"] == {"owner_id": 0}
    assert assigned["event_title"] == f"G Person changed the assignee of the task #{tid} to G Person"
    assert unassigned["event_title"] == f"G Person removed the assignee of the task #{tid}"
    # The assignee and anything else at once is an update, not an assignee change.
    assert me.call("updateTask", {"id": tid, "owner_id": uid, "title": "and renamed"})
    assert activity(board, project)[0]["event_name"] == "task.update"
    # Someone who is not a member cannot be given the card: nothing happens.
    stranger = board.call("createUser", {"username": board.unique("g_x"), "password": PASSWORD})
    assert me.call("updateTask", {"id": tid, "owner_id": stranger}) is False
    assert len(activity(board, project)) == 3
    assert int(board.call("getTask", {"task_id": tid})["owner_id"]) == uid


def test_a_move_to_another_project_keeps_the_task_and_records_it_there(board: Board) -> None:
    home, away = make_project(board, "g_from"), make_project(board, "g_to")
    uid, _, me = person(board, home)
    assert board.call("addProjectUser", {"project_id": away.id, "user_id": uid, "role": "project-member"})
    second = list(home.columns)[1]
    tid = home.task("to move away", column_id=home.column(second), priority=2)
    assert board.call("saveTaskMetadata", {"task_id": tid, "values": {"k": "v"}})
    assert board.call("createComment", {"task_id": tid, "user_id": 0, "content": "a note"})
    assert board.call("closeTask", {"task_id": tid})
    assert me.call("moveTaskToProject", {"task_id": tid, "project_id": away.id}) is True
    task = board.call("getTask", {"task_id": tid})
    assert int(task["project_id"]) == away.id and task["is_active"] == board.flag(1), "moved and reopened"
    assert int(task["column_id"]) == away.column(second), "the column of the same title"
    assert int(task["swimlane_id"]) == away.swimlane_id and int(task["priority"]) == 2
    assert board.call("getTaskMetadata", {"task_id": tid}) == {"k": "v"}, "its metadata goes with it"
    assert [c["comment"] for c in board.call("getAllComments", {"task_id": tid})] == ["a note"]
    [row] = activity(board, away)
    assert (row["event_name"], row["creator_id"], row["task_id"]) == ("task.move.project", uid, tid)
    assert row["changes"] in ([], {})
    assert row["event_title"] == f'G Person moved the task #{tid} "to move away" to the project "{away.name}"'
    assert activity(board, home) == [], "nothing is recorded where it came from"
    # Back, with the application token: true, and no row anywhere.
    first = next(iter(home.columns))
    assert board.call(
        "moveTaskToProject",
        {
            "task_id": tid,
            "project_id": home.id,
            "column_id": home.column(first),
            "swimlane_id": home.swimlane_id,
        },
    )
    task = board.call("getTask", {"task_id": tid})
    assert (int(task["project_id"]), int(task["column_id"])) == (home.id, home.column(first))
    assert len(activity(board, away)) == 1 and activity(board, home) == []


def test_a_duplicate_copies_the_card_but_not_its_metadata_and_records_its_creation(board: Board) -> None:
    project = make_project(board, "g_dup")
    uid, name, me = person(board, project)
    second = list(project.columns)[1]
    tid = project.task(
        "the original",
        description="what to do",
        reference="rcpt:0123",
        priority=2,
        date_due="2031-02-03 10:20",
        column_id=project.column(second),
        owner_id=uid,
    )
    assert board.call("saveTaskMetadata", {"task_id": tid, "values": {"k": "v"}})
    assert board.call("createComment", {"task_id": tid, "user_id": 0, "content": "a note"})
    copy = me.call("duplicateTaskToProject", {"task_id": tid, "project_id": project.id})
    assert isinstance(copy, int) and copy > tid
    old, new = (board.call("getTask", {"task_id": t}) for t in (tid, copy))
    copied = (
        "title",
        "description",
        "reference",
        "priority",
        "date_due",
        "column_id",
        "swimlane_id",
        "owner_id",
    )
    for key in copied:
        assert new[key] == old[key], key
    assert int(new["creator_id"]) == uid and int(old["creator_id"]) == 0
    assert board.call("getTaskMetadata", {"task_id": copy}) == {}
    assert board.call("getAllComments", {"task_id": copy}) == []
    rows = [r for r in activity(board, project) if r["event_name"] == "task.create"]
    assert [(r["task_id"], r["creator_id"], r["author_username"]) for r in rows] == [(copy, uid, name)]
