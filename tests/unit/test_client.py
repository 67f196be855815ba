"""The HTTP client's failure vocabulary: auth, server errors, timeouts, batches.

A loopback HTTP server plays the board, one scripted answer per request, so each failure
is the real thing on a real socket (a reply cut off mid-body, a board that never answers).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

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
from tests.integration.test_a2a_mtls import make_pki


def _ok(result: Any, rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "result": result, "id": rid}


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # JSON-encoded unless bytes
    cut: bool = False  # announce the whole body, send a tenth of it, close
    hang: bool = False  # never answer (until the test ends)
    drop: bool = False  # answer as if keeping the connection, then close it
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes
    client_port: int


class Board:
    """The scripted board: ``answers`` are used in order, the last one repeats."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.answers: list[Answer] = []
        self.seen: list[Seen] = []
        self.release = threading.Event()
        self.dropped = threading.Event()
        board = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                board.seen.append(Seen(dict(self.headers.items()), body, self.client_address[1]))
                answer = board.answers[min(len(board.seen), len(board.answers)) - 1]
                if answer.hang:
                    board.release.wait(30)
                    self.close_connection = True
                    return
                data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
                if answer.body is None:
                    data = b""
                self.send_response(answer.status)
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) * (10 if answer.cut else 1)))
                self.end_headers()
                self.wfile.write(data)
                if answer.cut:
                    self.close_connection = True
                if answer.drop:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    board.dropped.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/jsonrpc.php"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.seen.clear()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def board() -> Iterator[Board]:
    b = Board()
    yield b
    b.close()


def test_basic_auth_and_named_params_are_sent(board: Board) -> None:
    board.answer(Answer(body=_ok("1.2.53")))
    c = KanboardClient(board.url, "secret-token")
    assert c.call("getVersion") == "1.2.53"
    req = board.seen[0]
    assert req.headers["Authorization"] == "Basic anNvbnJwYzpzZWNyZXQtdG9rZW4="
    assert json.loads(req.body) == {"jsonrpc": "2.0", "method": "getVersion", "id": 1}
    assert c.stats.trips == 1


def test_the_connection_is_kept_alive_between_calls(board: Board) -> None:
    board.answer(Answer(body=_ok(1)), Answer(body=_ok(2, rid=2)))
    c = KanboardClient(board.url, "t")
    assert c.call("getVersion") == 1
    assert c.call("getVersion") == 2
    c.close()
    assert len(board.seen) == 2 and board.seen[0].client_port == board.seen[1].client_port


def test_401_is_an_auth_error_with_a_hint(board: Board) -> None:
    board.answer(
        Answer(401, {"jsonrpc": "2.0", "error": {"code": 401, "message": "Unauthorized"}, "id": None})
    )
    with pytest.raises(BoardAuthError) as err:
        KanboardClient(board.url, "wrong").call("getVersion")
    assert "KANBOARD_API_TOKEN" in err.value.line() and err.value.exit_code == 3


def test_a_read_answered_500_empty_is_retried_then_unavailable(board: Board) -> None:
    board.answer(Answer(500))
    c = KanboardClient(board.url, "t", read_attempts=3)
    with pytest.raises(BoardUnavailable):
        c.call("getTask", {"task_id": 1})
    assert len(board.seen) == 3 and c.stats.trips == 3


def test_a_read_recovers_after_a_transient_500(board: Board) -> None:
    board.answer(Answer(500), Answer(body=_ok({"id": 1}, rid=1)))
    assert KanboardClient(board.url, "t").call("getTask", {"task_id": 1}) == {"id": 1}


def test_a_write_answered_500_empty_is_maybe_done_and_never_repeated(board: Board) -> None:
    board.answer(Answer(500))
    with pytest.raises(MaybeDone) as err:
        KanboardClient(board.url, "t").call("createTask", {"title": "x", "project_id": 1})
    assert len(board.seen) == 1
    assert "may have happened" in err.value.line()


def test_a_write_timing_out_is_maybe_done(board: Board) -> None:
    board.answer(Answer(hang=True))
    with pytest.raises(MaybeDone) as err:
        KanboardClient(board.url, "t", timeout=0.3).call("saveTaskMetadata", {"task_id": 1, "values": {}})
    assert len(board.seen) == 1 and "no answer within 0.3s" in err.value.line()


def test_an_answer_broken_off_mid_body_is_a_board_failure_not_a_crash(board: Board) -> None:
    board.answer(Answer(body=_ok(True), cut=True))
    with pytest.raises(MaybeDone) as err:
        KanboardClient(board.url, "t").call("saveTaskMetadata", {"task_id": 1, "values": {}})
    assert len(board.seen) == 1 and "broken off" in err.value.line()
    board.answer(Answer(body=_ok(True), cut=True))
    with pytest.raises(BoardError):
        KanboardClient(board.url, "t").call("getTask", {"task_id": 1})
    assert len(board.seen) == 3  # a read is retried, bounded


def test_a_body_that_is_not_json_is_ambiguous(board: Board) -> None:
    board.answer(Answer(body=b"<html>PHP Fatal error</html>"))
    with pytest.raises(MaybeDone, match="not JSON"):
        KanboardClient(board.url, "t").call("createTask", {"title": "x", "project_id": 1})


def test_a_redirect_is_not_followed_and_names_the_url(board: Board) -> None:
    board.answer(Answer(301, b"moved", headers={"Location": "https://kb.home/jsonrpc.php"}))
    with pytest.raises(BoardError) as err:
        KanboardClient(board.url, "t").call("createTask", {"title": "x", "project_id": 1})
    assert not isinstance(err.value, MaybeDone)
    assert "https://kb.home/jsonrpc.php" in err.value.line() and "KANBOARD_URL" in err.value.line()
    assert len(board.seen) == 1


def test_a_refused_connection_is_unavailable_even_for_writes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        c = KanboardClient(f"http://127.0.0.1:{port}/jsonrpc.php", "t", read_attempts=2)
        with pytest.raises(BoardUnavailable) as err:
            c.call("createTask", {"title": "x", "project_id": 1})
        assert not isinstance(err.value, MaybeDone), "nothing was sent: safe to retry"
        assert "connection refused" in err.value.line() and "agap board serve" in err.value.line()


def test_a_board_that_closed_an_idle_connection_is_reached_again(board: Board) -> None:
    board.answer(Answer(body=_ok(1), drop=True), Answer(body=_ok(2, rid=2)))
    c = KanboardClient(board.url, "t")
    assert c.call("getVersion") == 1
    assert board.dropped.wait(10), "the board closed the kept-alive connection"
    assert c.call("createTag", [1, "a"]) == 2, "a dropped idle connection is not a failed write"
    assert len(board.seen) == 2 and board.seen[0].client_port != board.seen[1].client_port


def test_batch_outcomes_follow_request_order_even_if_replies_do_not(board: Board) -> None:
    board.answer(
        Answer(
            body=[
                {"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": 2},
                _ok(7, rid=1),
                _ok(False, rid=3),
            ]
        )
    )
    out = KanboardClient(board.url, "t").batch(
        [Call("createTag", [1, "a"]), Call("nope"), Call("createTag", [1, "a"])]
    )
    assert out[0].value == 7 and out[2].value is False
    assert out[1].error is not None and out[1].error.code == -32601
    assert not out[1].error.maybe_done


def test_sql_errors_on_writes_are_flagged_maybe_done(board: Board) -> None:
    board.answer(
        Answer(
            body={
                "jsonrpc": "2.0",
                "id": 1,
                "error": {"code": 0, "message": "SQL Error[HY000]: database is locked"},
            }
        )
    )
    with pytest.raises(RpcError) as err:
        KanboardClient(board.url, "t").call("createTask", {"title": "x", "project_id": 1})
    assert err.value.maybe_done and "read back" in err.value.line()


def test_the_failure_channel_is_named() -> None:
    for value in (False, 0, None):
        with pytest.raises(BoardRefused, match="create the task"):
            refuse_falsy("createTask", value, "create the task")
    assert refuse_falsy("createTask", 12, "create the task") == 12


def test_a_read_hitting_a_locked_database_is_retried_a_write_is_not(board: Board) -> None:
    locked = {"jsonrpc": "2.0", "id": 1, "error": {"code": 0, "message": "database is locked"}}
    board.answer(Answer(body=locked), Answer(body=_ok({"id": 5})))
    assert KanboardClient(board.url, "t").call("getTask", {"task_id": 5}) == {"id": 5}
    board.answer(Answer(body=locked | {"id": 2}))
    c = KanboardClient(board.url, "t")
    next(c._ids)
    with pytest.raises(RpcError):
        c.call("createTag", {"project_id": 1, "tag": "x"})
    assert len(board.seen) == 1


def test_an_https_board_is_verified_against_the_cas_the_system_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    b = Board(tls)
    try:
        b.answer(Answer(body=_ok("1.2.53")))
        with pytest.raises(BoardUnavailable) as err:  # a CA nobody told the client about
            KanboardClient(b.url, "t", read_attempts=1).call("getVersion")
        assert "CERTIFICATE_VERIFY_FAILED" in err.value.line() and not b.seen
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # OpenSSL's own variable
        assert KanboardClient(b.url, "t").call("getVersion") == "1.2.53"
    finally:
        b.close()
