"""User-auth JSON-RPC: what a Kanboard user may call, on every board.

A sandboxed agent's worker signs in as its own user, a member of its own projects only
(README, "Least privilege on the board"). These tests pin the rules it relies on: a
project role is needed for every project the call touches, a refusal is HTTP 403 for the
whole request (a batch's earlier calls stay done, its later ones never run), members
write tasks, tags, comments, files and metadata, only managers shape the project.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardAuthError
from tests.contract.conftest import Board, Project, make_project

PASSWORD = "lp-contract-" + uuid.uuid4().hex[:12]


@dataclass
class User:
    """A user signed in with a password, and the raw requests it sends."""

    board: Board
    id: int
    username: str

    def post(self, body: Any, password: str = PASSWORD) -> requests.Response:
        return requests.post(
            self.board.url, data=json.dumps(body), auth=(self.username, password), timeout=30
        )

    def rpc(self, method: str, params: Any = None) -> tuple[int, Any]:
        """(HTTP status, the reply's result, or its error object)."""
        resp = self.post({"jsonrpc": "2.0", "method": method, "id": 1, "params": params or {}})
        reply = resp.json()
        return resp.status_code, reply.get("result", reply.get("error"))

    def result(self, method: str, params: Any = None) -> Any:
        status, value = self.rpc(method, params)
        assert status == 200, (method, status, value)
        return value


FORBIDDEN = (403, {"code": 403, "message": "Forbidden"})


def make_user(board: Board, project: Project | None = None, role: str = "project-member") -> User:
    name = board.unique("lp-user")
    uid = board.call("createUser", {"username": name, "password": PASSWORD})
    assert isinstance(uid, int) and uid > 0, uid
    if project is not None:
        assert board.call("addProjectUser", [project.id, uid, role]) is True
    return User(board, uid, name)


@pytest.fixture
def home(board: Board) -> Project:
    return make_project(board, "lp-home")


@pytest.fixture
def other(board: Board) -> Project:
    return make_project(board, "lp-other")


def test_credentials(board: Board, home: Project) -> None:
    user = make_user(board, home)
    assert user.rpc("getVersion")[0] == 200
    bad = user.post({"jsonrpc": "2.0", "method": "getVersion", "id": 1}, password="wrong")
    assert bad.status_code == 401
    assert bad.json() == {"jsonrpc": "2.0", "error": {"code": 401, "message": "Unauthorized"}, "id": None}
    me = user.result("getMe")
    assert int(me["id"]) == user.id and me["username"] == user.username
    # getMe is a user's procedure: the application token has no "me".
    resp = board.post({"jsonrpc": "2.0", "method": "getMe", "id": 1})
    assert (resp.status_code, resp.json()["error"]) == FORBIDDEN


def test_a_member_works_its_own_project(board: Board, home: Project) -> None:
    user = make_user(board, home)
    task = user.result("createTask", {"project_id": home.id, "title": "mine"})
    assert isinstance(task, int) and task > 0
    assert user.result("searchTasks", {"project_id": home.id, "query": "status:open"})[0]["id"] == task
    assert user.result("saveTaskMetadata", {"task_id": task, "values": {"fabric.x": "1"}}) is True
    assert user.result("getTaskMetadata", {"task_id": task}) == {"fabric.x": "1"}
    tag = user.result("createTag", {"project_id": home.id, "tag": "t/e1", "color_id": "n1"})
    assert isinstance(tag, int) and tag > 0
    assert [t["name"] for t in user.result("getTagsByProject", {"project_id": home.id})] == ["t/e1"]
    move = {"project_id": home.id, "task_id": task, "position": 1, "swimlane_id": home.swimlane_id}
    assert user.result("moveTaskPosition", {**move, "column_id": home.column("Ready")}) is True
    assert user.result("updateTask", {"id": task, "owner_id": user.id}) is True
    assert user.result("saveProjectMetadata", {"project_id": home.id, "values": {"fabric.p": "1"}}) is True
    blob = {"project_id": home.id, "task_id": task, "filename": "r.md", "blob": "aGk="}
    file_id = user.result("createTaskFile", blob)
    assert user.result("downloadTaskFile", {"file_id": file_id}) == "aGk="
    assert user.result("closeTask", {"task_id": task}) is True
    assert user.result("openTask", {"task_id": task}) is True
    assert user.result("removeTag", {"tag_id": tag}) is True


def test_a_member_comments_only_as_itself(board: Board, home: Project) -> None:
    user = make_user(board, home)
    task = home.task()
    assert user.result("createComment", {"task_id": task, "user_id": 0, "content": "as the app"}) is False
    cid = user.result("createComment", {"task_id": task, "user_id": user.id, "content": "as me"})
    assert isinstance(cid, int) and cid > 0
    assert [int(c["user_id"]) for c in user.result("getAllComments", {"task_id": task})] == [user.id]


def test_another_project_is_refused(board: Board, home: Project, other: Project) -> None:
    user = make_user(board, home)
    secret = other.task("someone else's")
    for method, params in [
        ("searchTasks", {"project_id": other.id, "query": ""}),
        ("getTask", {"task_id": secret}),
        ("getTaskMetadata", {"task_id": secret}),
        ("getAllComments", {"task_id": secret}),
        ("getProjectById", {"project_id": other.id}),
        ("getProjectByName", {"name": other.name}),
        ("getProjectMetadata", {"project_id": other.id}),
        ("getColumns", {"project_id": other.id}),
        ("createTask", {"project_id": other.id, "title": "x"}),
        ("createTag", {"project_id": other.id, "tag": "x"}),
        ("saveTaskMetadata", {"task_id": secret, "values": {"fabric.x": "1"}}),
        ("getTask", {"task_id": 2_000_000_000}),  # a missing task has no project: refused too
        ("getProjectById", {"project_id": 2_000_000_000}),
    ]:
        assert user.rpc(method, params) == FORBIDDEN, method
    # A name that names no project is false before any check.
    assert user.result("getProjectByName", {"name": board.unique("lp-none")}) is False
    # Moving a foreign task into its own project: refused on the task's project.
    move = {"project_id": home.id, "task_id": secret, "column_id": home.column("Ready"), "position": 1}
    assert user.rpc("moveTaskPosition", {**move, "swimlane_id": home.swimlane_id}) == FORBIDDEN
    assert board.call("getTask", [secret])["project_id"] in (other.id, str(other.id))


def test_the_application_s_procedures_are_refused(board: Board, home: Project) -> None:
    user = make_user(board, home)
    for method, params in [
        ("getAllUsers", None),
        ("getUserByName", {"username": user.username}),
        ("createUser", {"username": board.unique("lp-x"), "password": PASSWORD}),
        ("getAllProjects", None),
        ("createProject", {"name": board.unique("lp-x")}),
        ("updateUser", {"id": user.id, "name": "renamed"}),
        ("removeUser", {"user_id": user.id}),
    ]:
        assert user.rpc(method, params) == FORBIDDEN, method
    # getAllTags answers only the tags of the user's own projects.
    board.call("createTag", [make_project(board).id, board.unique("lp-tag")])
    mine = board.unique("lp-tag")
    board.call("createTag", [home.id, mine])
    assert [t["name"] for t in user.result("getAllTags")] == [mine]


def test_only_a_manager_shapes_the_project(board: Board, home: Project) -> None:
    member = make_user(board, home)
    for method, params in [
        ("addColumn", {"project_id": home.id, "title": "new"}),
        ("addSwimlane", {"project_id": home.id, "name": "new"}),
        ("addProjectUser", {"project_id": home.id, "user_id": member.id}),
        ("removeProject", {"project_id": home.id}),
    ]:
        assert member.rpc(method, params) == FORBIDDEN, method
    manager = make_user(board, home, "project-manager")
    assert isinstance(manager.result("addSwimlane", {"project_id": home.id, "name": "new"}), int)


def test_a_viewer_only_reads(board: Board, home: Project) -> None:
    viewer = make_user(board, home, "project-viewer")
    task = home.task()
    assert viewer.result("searchTasks", {"project_id": home.id, "query": ""})[0]["id"] == task
    assert viewer.rpc("saveTaskMetadata", {"task_id": task, "values": {"fabric.x": "1"}}) == FORBIDDEN
    assert viewer.rpc("createTag", {"project_id": home.id, "tag": "x"}) == FORBIDDEN


def test_a_refusal_ends_the_whole_batch(board: Board, home: Project, other: Project) -> None:
    user = make_user(board, home)

    def tag(i: int, name: str, pid: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "createTag", "id": i, "params": {"project_id": pid, "tag": name}}

    resp = user.post([tag(1, "before", home.id), tag(2, "denied", other.id), tag(3, "after", home.id)])
    assert resp.status_code == 403
    assert resp.json() == {"jsonrpc": "2.0", "error": {"code": 403, "message": "Forbidden"}, "id": None}
    assert [t["name"] for t in board.call("getTagsByProject", [home.id])] == ["before"]
    # The fabric's client reports it as the board refusing the credentials (exit 3).
    client = KanboardClient(board.url, PASSWORD, user=user.username)
    try:
        with pytest.raises(BoardAuthError, match="HTTP 403"):
            client.call("searchTasks", {"project_id": other.id, "query": ""})
    finally:
        client.close()


def test_a_removed_user_cannot_sign_in_and_a_new_one_starts_bare(board: Board, home: Project) -> None:
    """`agap init` recreates an agent's user whose password was rotated (the API cannot set
    a password): the old one's memberships go with it."""
    user = make_user(board, home)
    assert board.call("removeUser", [user.id]) is True
    resp = user.post({"jsonrpc": "2.0", "method": "getMe", "id": 1})
    assert resp.status_code == 401
    uid = board.call("createUser", {"username": user.username, "password": PASSWORD})
    again = User(board, uid, user.username)
    assert board.call("getProjectUserRole", [home.id, uid]) == ""
    assert again.rpc("searchTasks", {"project_id": home.id, "query": ""}) == FORBIDDEN
