"""The HTTP client's failure vocabulary: auth, server errors, timeouts, batches."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import requests
import responses

from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import (
    BoardAuthError,
    BoardError,
    BoardRefused,
    BoardUnavailable,
    Call,
    MaybeDone,
    RpcError,
    refuse_falsy,
)

URL = "http://127.0.0.1:9/jsonrpc.php"


def _ok(result: Any, rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "result": result, "id": rid}


@responses.activate
def test_basic_auth_and_named_params_are_sent() -> None:
    responses.post(URL, json=_ok("1.2.53"))
    c = KanboardClient(URL, "secret-token")
    assert c.call("getVersion") == "1.2.53"
    req = responses.calls[0].request
    assert req.headers["Authorization"] == "Basic anNvbnJwYzpzZWNyZXQtdG9rZW4="
    assert json.loads(req.body or b"{}") == {"jsonrpc": "2.0", "method": "getVersion", "id": 1}
    assert c.stats.trips == 1


@responses.activate
def test_401_is_an_auth_error_with_a_hint() -> None:
    responses.post(
        URL,
        status=401,
        json={"jsonrpc": "2.0", "error": {"code": 401, "message": "Unauthorized"}, "id": None},
    )
    with pytest.raises(BoardAuthError) as err:
        KanboardClient(URL, "wrong").call("getVersion")
    assert "KANBOARD_API_TOKEN" in err.value.line() and err.value.exit_code == 3


@responses.activate
def test_a_read_answered_500_empty_is_retried_then_unavailable() -> None:
    responses.post(URL, status=500, body=b"")
    c = KanboardClient(URL, "t", read_attempts=3)
    with pytest.raises(BoardUnavailable):
        c.call("getTask", {"task_id": 1})
    assert len(responses.calls) == 3 and c.stats.trips == 3


@responses.activate
def test_a_read_recovers_after_a_transient_500() -> None:
    responses.post(URL, status=500, body=b"")
    responses.post(URL, json=_ok({"id": 1}, rid=1))
    assert KanboardClient(URL, "t").call("getTask", {"task_id": 1}) == {"id": 1}


@responses.activate
def test_a_write_answered_500_empty_is_maybe_done_and_never_repeated() -> None:
    responses.post(URL, status=500, body=b"")
    with pytest.raises(MaybeDone) as err:
        KanboardClient(URL, "t").call("createTask", {"title": "x", "project_id": 1})
    assert len(responses.calls) == 1
    assert "may have happened" in err.value.line()


@responses.activate
def test_a_write_timing_out_is_maybe_done() -> None:
    responses.post(URL, body=requests.exceptions.ReadTimeout("slow"))
    with pytest.raises(MaybeDone):
        KanboardClient(URL, "t").call("saveTaskMetadata", {"task_id": 1, "values": {}})
    assert len(responses.calls) == 1


@responses.activate
def test_an_answer_broken_off_mid_body_is_a_board_failure_not_a_crash() -> None:
    # The board killed while it answers: requests raises ChunkedEncodingError, which is
    # neither a ConnectionError nor a Timeout.
    responses.post(URL, body=requests.exceptions.ChunkedEncodingError("IncompleteRead"))
    with pytest.raises(MaybeDone):
        KanboardClient(URL, "t").call("saveTaskMetadata", {"task_id": 1, "values": {}})
    assert len(responses.calls) == 1
    responses.post(URL, body=requests.exceptions.ChunkedEncodingError("IncompleteRead"))
    with pytest.raises(BoardError):
        KanboardClient(URL, "t").call("getTask", {"task_id": 1})


def test_a_refused_connection_is_unavailable_even_for_writes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        c = KanboardClient(f"http://127.0.0.1:{port}/jsonrpc.php", "t", read_attempts=2)
        with pytest.raises(BoardUnavailable) as err:
            c.call("createTask", {"title": "x", "project_id": 1})
        assert not isinstance(err.value, MaybeDone), "nothing was sent: safe to retry"
        assert "agap board serve" in err.value.line()


@responses.activate
def test_batch_outcomes_follow_request_order_even_if_replies_do_not() -> None:
    responses.post(
        URL,
        json=[
            {"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": 2},
            _ok(7, rid=1),
            _ok(False, rid=3),
        ],
    )
    out = KanboardClient(URL, "t").batch(
        [Call("createTag", [1, "a"]), Call("nope"), Call("createTag", [1, "a"])]
    )
    assert out[0].value == 7 and out[2].value is False
    assert out[1].error is not None and out[1].error.code == -32601
    assert not out[1].error.maybe_done


@responses.activate
def test_sql_errors_on_writes_are_flagged_maybe_done() -> None:
    responses.post(
        URL,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": 0, "message": "SQL Error[HY000]: database is locked"},
        },
    )
    with pytest.raises(RpcError) as err:
        KanboardClient(URL, "t").call("createTask", {"title": "x", "project_id": 1})
    assert err.value.maybe_done and "read back" in err.value.line()


def test_the_failure_channel_is_named() -> None:
    for value in (False, 0, None):
        with pytest.raises(BoardRefused, match="create the task"):
            refuse_falsy("createTask", value, "create the task")
    assert refuse_falsy("createTask", 12, "create the task") == 12


@responses.activate
def test_a_read_hitting_a_locked_database_is_retried_a_write_is_not() -> None:
    locked = {"jsonrpc": "2.0", "id": 1, "error": {"code": 0, "message": "database is locked"}}
    responses.post(URL, json=locked)
    responses.post(URL, json=_ok({"id": 5}))
    assert KanboardClient(URL, "t").call("getTask", {"task_id": 5}) == {"id": 5}
    responses.calls.reset()
    responses.replace(responses.POST, URL, json=locked | {"id": 2})
    c = KanboardClient(URL, "t")
    next(c._ids)
    with pytest.raises(RpcError):
        c.call("createTag", {"project_id": 1, "tag": "x"})
    assert len(responses.calls) == 1
