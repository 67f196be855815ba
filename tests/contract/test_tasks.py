"""Tasks: creation, reads, updates, moves, status, removal and owners."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from fabric.kanboard.port import MaybeDone, RpcError
from tests.contract.conftest import Board, Project, make_project, same

INT_FIELDS = (
    "id",
    "project_id",
    "column_id",
    "swimlane_id",
    "owner_id",
    "creator_id",
    "position",
    "score",
    "category_id",
    "priority",
    "date_creation",
    "date_modification",
    "date_moved",
    "date_due",
    "date_started",
)


def _ts(board: Board, text: str) -> int:
    tz = ZoneInfo(board.call("getTimezone") or "UTC")
    return int(datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=tz).timestamp())


def test_create_and_get_task_field_types(board: Board, project: Project) -> None:
    ref = board.unique("ref")
    task_id = project.task(
        "Typed",
        reference=ref,
        priority=2,
        score=3,
        color_id="red",
        description="desc",
        date_due="2026-12-01 10:00",
    )
    task = board.call("getTask", [task_id])
    for key in INT_FIELDS:
        assert type(task[key]) is int, (key, task[key])
    assert task["title"] == "Typed" and task["description"] == "desc"
    assert task["reference"] == ref and task["color_id"] == "red"
    assert task["priority"] == 2 and task["score"] == 3
    assert task["project_id"] == project.id
    assert task["column_id"] == project.column("Backlog")
    assert task["swimlane_id"] == project.swimlane_id
    assert same(task["is_active"], board.flag(1)) and task["position"] == 1
    assert task["date_due"] == _ts(board, "2026-12-01 10:00")
    assert task["date_started"] == 0
    assert task["date_completed"] is None
    assert task["time_spent"] is None and task["time_estimated"] is None
    assert task["creator_id"] == 0 and task["owner_id"] == 0
    assert isinstance(task["url"], str) and task["color"]["name"] == "Red"


def test_task_defaults(board: Board, project: Project) -> None:
    task = board.call("getTask", [project.task()])
    assert task["color_id"] == "yellow"
    assert task["priority"] == 0 and task["score"] == 0 and task["reference"] == ""
    assert task["date_due"] == 0


def test_get_missing_task_is_null(board: Board) -> None:
    assert board.call("getTask", [2_000_000_000]) is None


def test_date_only_keeps_the_time_of_day(board: Board, project: Project) -> None:
    tz = ZoneInfo(board.call("getTimezone") or "UTC")
    now = datetime.now(tz)
    due = board.call("getTask", [project.task(date_due="2026-12-01")])["date_due"]
    midnight = _ts(board, "2026-12-01 00:00")
    assert midnight <= due < midnight + 86400
    seconds_of_day = now.hour * 3600 + now.minute * 60 + now.second
    assert abs((due - midnight) - seconds_of_day) < 120 or seconds_of_day > 86280


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12/01/2026 10:00", "2026-12-01 10:00"),
        ("01/12/2026 10:00", "2026-01-12 10:00"),  # m/d/Y
        ("2026_12_01 10:00", "2026-12-01 10:00"),
    ],
)
def test_other_date_formats(board: Board, project: Project, text: str, expected: str) -> None:
    assert board.call("getTask", [project.task(date_due=text)])["date_due"] == _ts(board, expected)


@pytest.mark.parametrize(
    "value",
    [
        "2026-12-01T10:00:00",
        "2026-12-01 10:00:00",
        "1764583200",
        1764583200,
        "garbage",
        "2026-13-01",
        "2026-02-30",
        0,
    ],
)
def test_bad_dates_are_refused(board: Board, project: Project, value: object) -> None:
    assert board.call("createTask", {"title": "x", "project_id": project.id, "date_due": value}) is False


def test_start_after_due_is_refused(board: Board, project: Project) -> None:
    assert (
        board.call(
            "createTask",
            {
                "title": "x",
                "project_id": project.id,
                "date_started": "2026-12-02 10:00",
                "date_due": "2026-12-01 10:00",
            },
        )
        is False
    )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"project_id": 2_000_000_000}, "sql-error"),  # 0 on SQLite (test_flavours has more)
        ({"column_id": 2_000_000_000}, 0),
        ({"swimlane_id": 2_000_000_000}, 0),
        ({"swimlane_id": 0}, False),
        ({"priority": "high"}, False),
        ({"title": ""}, False),
    ],
)
def test_create_task_failures(
    board: Board, project: Project, params: dict[str, Any], expected: object
) -> None:
    if expected == "sql-error":
        if board.sql_errors:
            with pytest.raises(RpcError) as err:
                board.call("createTask", {"title": "x", "project_id": project.id, **params})
            assert err.value.code == 0
            return
        expected = 0
    result = board.call("createTask", {"title": "x", "project_id": project.id, **params})
    assert result is expected or (result == expected and type(result) is type(expected))


def test_new_task_goes_to_the_bottom_of_open_tasks(board: Board, project: Project) -> None:
    a, b = project.task("a"), project.task("b")
    assert board.call("closeTask", [a]) is True
    c = project.task("c")
    assert [board.call("getTask", [t])["position"] for t in (b, c)] == [2, 2]


def test_get_task_by_reference_returns_the_first_match(board: Board, project: Project) -> None:
    ref = board.unique("dup")
    first = project.task("one", reference=ref)
    project.task("two", reference=ref)  # references are not unique
    assert board.call("getTaskByReference", [project.id, ref])["id"] == first
    upper = board.call("getTaskByReference", [project.id, ref.upper()])
    assert (upper["id"] == first) if board.ci else (upper is None)  # MySQL ignores case
    assert board.call("getTaskByReference", [project.id, board.unique("none")]) is None


def test_get_all_tasks_by_status(board: Board, project: Project) -> None:
    a, b, c = project.task("a"), project.task("b"), project.task("c")
    board.call("closeTask", [b])
    assert [t["id"] for t in board.call("getAllTasks", [project.id, 1])] == [a, c]
    assert [t["id"] for t in board.call("getAllTasks", [project.id, 0])] == [b]


def test_update_task(board: Board, project: Project) -> None:
    task = project.task("before", priority=1)
    assert (
        board.call(
            "updateTask",
            {"id": task, "title": "after", "priority": 3, "reference": "r-1", "no_such_param": 1},
        )
        is True
    )
    got = board.call("getTask", [task])
    assert (got["title"], got["priority"], got["reference"]) == ("after", 3, "r-1")
    assert board.call("updateTask", {"id": task}) is True
    assert board.call("updateTask", {"id": task, "date_due": 1764583200}) is False
    assert board.call("updateTask", {"id": 2_000_000_000, "title": "x"}) is False


def test_update_task_first_param_is_id(board: Board, project: Project) -> None:
    task = project.task()
    reply = board.rpc("updateTask", {"task_id": task, "title": "x"})
    assert reply["error"]["data"] == "Missing argument: id"
    assert board.call("updateTask", [task, "positional"]) is True
    assert board.call("getTask", [task])["title"] == "positional"


def test_move_task_position(board: Board, project: Project) -> None:
    ready = project.column("Ready")
    a, b = project.task("a", column_id=ready), project.task("b", column_id=ready)
    task = project.task("moving")
    assert board.call("moveTaskPosition", [project.id, task, ready, 1, project.swimlane_id]) is True
    got = board.call("getTask", [task])
    assert (got["column_id"], got["position"]) == (ready, 1)
    assert [board.call("getTask", [t])["position"] for t in (a, b)] == [2, 3]
    # Already there: false, not an error.
    assert board.call("moveTaskPosition", [project.id, task, ready, 1, project.swimlane_id]) is False
    # Clamped to the bottom; swimlane 0 keeps the current lane.
    assert board.call("moveTaskPosition", [project.id, task, ready, 99, 0]) is True
    assert board.call("getTask", [task])["position"] == 3
    assert board.call("moveTaskPosition", [project.id, task, ready, 0, 0]) is False


def test_move_task_position_refusals(board: Board, project: Project) -> None:
    other = make_project(board)
    task = project.task()
    done = project.column("Done")
    assert board.call("moveTaskPosition", [other.id, task, done, 1, project.swimlane_id]) is False
    assert board.call("moveTaskPosition", [project.id, 2_000_000_000, done, 1, project.swimlane_id]) is False
    assert board.call("moveTaskPosition", [project.id, task, 2_000_000_000, 1, project.swimlane_id]) is False
    reply = board.rpc(
        "moveTaskPosition", {"project_id": project.id, "task_id": task, "column_id": done, "position": 1}
    )
    assert reply["error"]["data"] == "Wrong number of arguments"


def test_move_task_to_its_own_project_updates_one_row(board: Board, project: Project) -> None:
    """The fabric's move (fabric.kanboard.moves.MOVE): the card goes to the column asked,
    at "open tasks in that column + 1", and no other card's position changes; date_moved
    and date_modification are left alone; true whatever happened."""
    ready, done = project.column("Ready"), project.column("Done")
    others = [project.task(f"ready {i}", column_id=ready) for i in range(3)]
    before = {t: board.call("getTask", [t])["position"] for t in others}
    task = project.task("moving")
    row = board.call("getTask", [task])
    move = {"task_id": task, "project_id": project.id}
    assert (
        board.call("moveTaskToProject", {**move, "column_id": ready, "swimlane_id": project.swimlane_id})
        is True
    )
    got = board.call("getTask", [task])
    assert (got["column_id"], got["swimlane_id"], got["position"]) == (ready, project.swimlane_id, 4)
    assert (got["date_moved"], got["date_modification"]) == (row["date_moved"], row["date_modification"])
    assert {t: board.call("getTask", [t])["position"] for t in others} == before
    # To where it already is: still true, and the count includes the card itself.
    assert board.call("moveTaskToProject", {**move, "column_id": ready}) is True
    assert board.call("getTask", [task])["position"] == 5
    # No column or swimlane: it stays in its own.
    assert board.call("moveTaskToProject", move) is True
    got = board.call("getTask", [task])
    assert (got["column_id"], got["swimlane_id"]) == (ready, project.swimlane_id)
    # A closed card is reopened by the move (the fabric closes it again in the same batch).
    assert board.call("closeTask", [task]) is True
    assert board.call("moveTaskToProject", {**move, "column_id": done}) is True
    got = board.call("getTask", [task])
    assert got["column_id"] == done and same(got["is_active"], board.flag(1))
    # A task that does not exist: PHP dies reading its fields (HTTP 500, no body).
    with pytest.raises(MaybeDone, match="HTTP 500"):
        board.call("moveTaskToProject", {**move, "task_id": 2_000_000_000, "column_id": done})


def test_closed_task_can_be_moved(board: Board, project: Project) -> None:
    task = project.task()
    board.call("closeTask", [task])
    assert (
        board.call("moveTaskPosition", [project.id, task, project.column("Done"), 1, project.swimlane_id])
        is True
    )
    assert board.call("getTask", [task])["column_id"] == project.column("Done")


def test_close_and_open_are_idempotent(board: Board, project: Project) -> None:
    task = project.task()
    assert board.call("closeTask", [task]) is True
    assert board.call("closeTask", [task]) is True
    closed = board.call("getTask", [task])
    assert same(closed["is_active"], board.flag(0)) and isinstance(closed["date_completed"], int)
    assert closed["date_completed"] > 0
    assert board.call("openTask", [task]) is True
    assert board.call("openTask", [task]) is True
    opened = board.call("getTask", [task])
    assert same(opened["is_active"], board.flag(1)) and opened["date_completed"] == 0
    assert board.call("closeTask", [2_000_000_000]) is False
    assert board.call("openTask", [2_000_000_000]) is False


def test_remove_task(board: Board, project: Project) -> None:
    task = project.task()
    board.call("saveTaskMetadata", [task, {"k": "v"}])
    board.call("createComment", [task, 0, "c"])
    assert board.call("removeTask", [task]) is True
    assert board.call("getTask", [task]) is None
    assert board.call("removeTask", [task]) is False
    assert board.call("getTaskMetadata", [task]) == {}
    assert board.call("getAllComments", [task]) == []


def test_users_and_assignable_owners(board: Board, project: Project) -> None:
    name = board.unique("u").replace("-", "")
    member = board.call(
        "createUser",
        {"username": name, "password": "secret12", "name": "Member", "email": f"{name}@example.com"},
    )
    viewer = board.call("createUser", [name + "v", "secret12"])
    assert isinstance(member, int) and isinstance(viewer, int)
    assert board.call("createUser", [name, "secret12"]) is False  # duplicate
    assert board.call("createUser", [name + "s", "12345"]) is False  # short password
    assert board.call("getUserByName", [name])["id"] == member
    # A new project has no member (app token): no owner is assignable yet.
    assert board.call("getProjectUsers", [project.id]) == {}
    assert board.call("getAssignableUsers", [project.id]) == {}
    assert board.call("createTask", {"title": "x", "project_id": project.id, "owner_id": member}) is False
    assert board.call("addProjectUser", [project.id, member]) is True
    assert board.call("addProjectUser", [project.id, member]) is False
    assert board.call("addProjectUser", [project.id, viewer, "project-viewer"]) is True
    assert board.call("getProjectUsers", [project.id]) == {str(member): "Member", str(viewer): name + "v"}
    assert board.call("getAssignableUsers", [project.id]) == {str(member): "Member"}
    assert board.call("getAssignableUsers", [project.id, True]) == {"0": "Unassigned", str(member): "Member"}
    task = project.task(owner_id=member)
    assert board.call("getTask", [task])["owner_id"] == member
    assert board.call("createTask", {"title": "x", "project_id": project.id, "owner_id": viewer}) is False
    assert board.call("createTask", {"title": "x", "project_id": project.id, "creator_id": viewer}) is False
    assert board.call("updateTask", {"id": task, "owner_id": viewer}) is False
    assert board.call("updateTask", {"id": task, "owner_id": 0}) is True
    assert board.call("getTask", [task])["owner_id"] == 0


def test_project_owner_is_not_a_member(board: Board) -> None:
    name = board.unique("o").replace("-", "")
    user = board.call("createUser", [name, "secret12"])
    pid = board.call("createProject", {"name": board.unique(), "owner_id": user})
    assert isinstance(pid, int) and pid > 0
    assert board.call("getProjectById", [pid])["owner_id"] == user
    assert board.call("getProjectUsers", [pid]) == {}
    assert board.call("createTask", {"title": "x", "project_id": pid, "owner_id": user}) is False
    assert board.call("createProject", {"name": "x", "owner_id": 2_000_000_000}) is False


def test_update_user_name_and_email(board: Board) -> None:
    """`agap init` gives an existing person's user the name and e-mail of their card."""
    name = board.unique("up").replace("-", "")
    uid = board.call("createUser", [name, "secret12", "Old name"])
    other = board.call("createUser", [name + "o", "secret12"])
    assert board.call("updateUser", {"id": uid, "name": "New name", "email": f"{name}@example.com"}) is True
    got = board.call("getUserByName", [name])
    assert (got["name"], got["email"], got["username"]) == ("New name", f"{name}@example.com", name)
    assert board.call("updateUser", {"id": uid, "email": "not an address"}) is False
    assert board.call("updateUser", {"id": uid, "username": name + "o"}) is False  # taken
    assert board.call("updateUser", {"id": uid, "role": "app-nobody"}) is False
    assert board.call("updateUser", {"id": uid, "name": "Only the name"}) is True
    got = board.call("getUser", [uid])
    assert (got["name"], got["email"]) == ("Only the name", f"{name}@example.com")
    assert board.call("updateUser", {"id": 2_000_000, "name": "nobody"}) is True  # nothing matched
    assert board.call("getUser", [other])["name"] == ""
