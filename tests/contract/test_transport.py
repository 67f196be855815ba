"""Transport, auth and JSON-RPC framing: what the fabric's client relies on."""

from __future__ import annotations

import pytest

from fabric.kanboard.port import BoardAuthError, Call, MaybeDone, RpcError
from tests.contract.conftest import Board, Project


def test_version_is_a_string(board: Board) -> None:
    assert isinstance(board.call("getVersion"), str)


def test_wrong_token_is_401_with_a_jsonrpc_body(board: Board) -> None:
    resp = board.post({"jsonrpc": "2.0", "method": "getVersion", "id": 1}, token="wrong-token")
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"] == 'Basic realm="JsonRPC"'
    assert resp.json() == {"jsonrpc": "2.0", "error": {"code": 401, "message": "Unauthorized"}, "id": None}


def test_missing_credentials_are_401(board: Board) -> None:
    resp = board.post({"jsonrpc": "2.0", "method": "getVersion", "id": 1}, auth=False)
    assert resp.status_code == 401


def test_client_maps_401_to_board_auth_error(board: Board) -> None:
    from fabric.kanboard.client import KanboardClient

    bad = KanboardClient(board.url, "wrong-token")
    with pytest.raises(BoardAuthError):
        bad.call("getVersion")


def test_unknown_method_is_32601(board: Board) -> None:
    reply = board.rpc("noSuchProcedure")
    assert reply["error"] == {"code": -32601, "message": "Method not found"}


@pytest.mark.parametrize(
    ("params", "data"),
    [
        (None, "Wrong number of arguments"),
        ([], "Wrong number of arguments"),
        ([1, 2], "Too many arguments"),
        ({"task_id": 1, "bogus": 1}, "Too many arguments"),
        ({"taskid": 5}, "Missing argument: task_id"),
        ({"TASK_ID": 5}, "Missing argument: task_id"),  # names are case-sensitive
    ],
)
def test_bad_params_are_32602_with_data(board: Board, params: object, data: str) -> None:
    reply = board.rpc("getTask", params)
    assert reply["error"] == {"code": -32602, "message": "Invalid params", "data": data}


def test_named_params_count_before_names(board: Board, project: Project) -> None:
    task = project.task()
    # Two keys for three required params: a count error, not a missing name.
    reply = board.rpc("createComment", {"task_id": task, "content": "x"})
    assert reply["error"]["data"] == "Wrong number of arguments"
    reply = board.rpc("createComment", {"task_id": task, "content": "x", "user": 0})
    assert reply["error"]["data"] == "Missing argument: user_id"


def test_named_null_is_passed_as_null(board: Board) -> None:
    reply = board.rpc("getTask", {"task_id": None})
    assert "error" not in reply
    assert reply["result"] is None


def test_unknown_named_params_are_ignored(board: Board, project: Project) -> None:
    task = project.task()
    column = board.call("getTask", [task])["column_id"]
    assert board.call("updateTask", {"id": task, "column_id": project.column("Done")}) is True
    assert board.call("getTask", [task])["column_id"] == column


@pytest.mark.parametrize("body", [b"", b"{not json", b'"a string"', b"42"])
def test_malformed_json_is_a_parse_error(board: Board, body: bytes) -> None:
    resp = board.post(body)
    assert resp.status_code == 200
    assert resp.json() == {"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}


def test_get_is_a_parse_error(board: Board) -> None:
    resp = board.post(b"", method="GET")
    assert resp.status_code == 200
    assert resp.json()["error"]["code"] == -32700


@pytest.mark.parametrize(
    "req",
    [
        {"method": "getVersion", "id": 5},
        {"jsonrpc": "1.0", "method": "getVersion", "id": 5},
        {"jsonrpc": "2.0", "method": 1, "id": 5},
        {"jsonrpc": "2.0", "method": "getVersion", "params": "x", "id": 5},
        [],
    ],
)
def test_invalid_request_has_a_null_id(board: Board, req: object) -> None:
    resp = board.post(req)
    assert resp.json() == {
        "jsonrpc": "2.0",
        "error": {"code": -32600, "message": "Invalid Request"},
        "id": None,
    }


@pytest.mark.parametrize("rpc_id", ["absent", None])
def test_notification_gets_an_empty_body(board: Board, rpc_id: object) -> None:
    req: dict[str, object] = {"jsonrpc": "2.0", "method": "getVersion"}
    if rpc_id != "absent":
        req["id"] = rpc_id
    resp = board.post(req)
    assert resp.status_code == 200
    assert resp.content == b""


def test_string_id_is_echoed(board: Board) -> None:
    resp = board.post({"jsonrpc": "2.0", "method": "getTimezone", "id": "abc"})
    assert resp.json()["id"] == "abc"


def test_batch_answers_in_order_with_per_item_errors(board: Board) -> None:
    resp = board.post(
        [
            {"jsonrpc": "2.0", "method": "getTimezone", "id": 1},
            {"jsonrpc": "2.0", "method": "nope", "id": 2},
            {"jsonrpc": "2.0", "id": 3},
            {"jsonrpc": "2.0", "method": "getTask", "id": 4},
            {"jsonrpc": "2.0", "method": "getTimezone"},  # a notification: no entry
            7,
        ]
    )
    assert resp.status_code == 200
    items = resp.json()
    assert [i["id"] for i in items] == [1, 2, None, 4, None]
    assert isinstance(items[0]["result"], str)
    assert items[1]["error"]["code"] == -32601
    assert items[2]["error"]["code"] == -32600
    assert items[3]["error"] == {
        "code": -32602,
        "message": "Invalid params",
        "data": "Wrong number of arguments",
    }
    assert items[4]["error"]["code"] == -32700


def test_client_batch_returns_outcomes_in_order(board: Board, project: Project) -> None:
    task = project.task("batched")
    outcomes = board.client.batch(
        [
            Call("getTask", [task]),
            Call("noSuchProcedure"),
            Call("getTask", {"task_id": task}),
        ]
    )
    assert outcomes[0].unwrap()["id"] == task
    assert isinstance(outcomes[1].error, RpcError) and outcomes[1].error.code == -32601
    assert outcomes[2].unwrap()["title"] == "batched"


def test_batch_is_not_atomic(board: Board, project: Project) -> None:
    ref = board.unique("ref")
    outcomes = board.client.batch(
        [
            Call("createTask", {"title": "first", "project_id": project.id, "reference": ref}),
            Call("getTask"),  # fails with -32602
            Call("createTask", {"title": "third", "project_id": project.id}),
        ]
    )
    assert isinstance(outcomes[0].value, int) and outcomes[0].value > 0
    assert outcomes[1].error is not None and outcomes[1].error.code == -32602
    assert isinstance(outcomes[2].value, int) and outcomes[2].value > 0
    assert board.call("getTaskByReference", [project.id, ref])["id"] == outcomes[0].value


def test_type_error_is_an_empty_http_500(board: Board, project: Project) -> None:
    resp = board.post(
        {
            "jsonrpc": "2.0",
            "method": "createTask",
            "id": 1,
            "params": {"title": "x", "project_id": project.id, "tags": "a"},
        }
    )
    assert resp.status_code == 500
    assert resp.content == b""


def test_http_500_after_a_committed_item_is_maybe_done(board: Board, project: Project) -> None:
    ref = board.unique("ref")
    with pytest.raises(MaybeDone):
        board.client.batch(
            [
                Call("createTask", {"title": "kept", "project_id": project.id, "reference": ref}),
                Call("createTask", {"title": "x", "project_id": project.id, "tags": "a"}),
            ]
        )
    # The first item committed before PHP died: reconcile by reference.
    assert board.call("getTaskByReference", [project.id, ref])["title"] == "kept"


def test_non_array_metadata_is_http_500(board: Board, project: Project) -> None:
    task = project.task()
    resp = board.post({"jsonrpc": "2.0", "method": "saveTaskMetadata", "id": 1, "params": [task, "str"]})
    assert resp.status_code == 500
    assert resp.content == b""
