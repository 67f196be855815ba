"""fabric.httpwire: a POST leaves in one write and reads as the same request; a reply is
read as ``http.client`` reads it (which the module stands in for, so a heartbeat does not
import it): the same status, headers, body and keep-alive decision, or the same refusal."""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fabric import httpwire
from fabric.errors import EXIT_INVALID, ConfigError
from fabric.httpwire import Ambiguous, KeptAlive


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        seen = {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
        reply = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _Counting:
    """A socket that notes each ``sendall``."""

    def __init__(self, real: Any, writes: list[bytes]) -> None:
        self.real, self.writes = real, writes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.real.sendall(data)


def test_a_post_is_one_write_and_the_same_request() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    writes: list[bytes] = []
    try:
        client = KeptAlive(
            f"http://127.0.0.1:{server.server_address[1]}/jsonrpc.php?x=1",
            headers={"Authorization": "Basic abc"},
            timeout=10,
        )
        for n in range(2):  # a fresh connection, then the kept-alive one
            conn = client._take()
            if conn.sock is None:
                client._connect(conn, 10)
            real = conn.sock
            assert real is not None
            conn.sock = _Counting(real, writes)  # type: ignore[assignment]  # a socket to every caller
            client._give_back(conn)
            sent = f'{{"n": {n}}}'
            reply = client.post(sent.encode(), headers={"X-Extra": "1"})
            conn.sock = real
            seen = json.loads(reply.body)
            assert reply.status == 200
            assert seen["path"] == "/jsonrpc.php?x=1" and seen["body"] == sent
            assert seen["headers"]["Authorization"] == "Basic abc" and seen["headers"]["X-Extra"] == "1"
            assert seen["headers"]["Content-Length"] == str(len(seen["body"]))
            assert seen["headers"]["Host"] == f"127.0.0.1:{server.server_address[1]}"
        # One write per request: the server wakes once per call.
        assert len(writes) == 2 and all(w.endswith(b"}") and w.startswith(b"POST ") for w in writes)
        client.close()
    finally:
        server.shutdown()
        server.server_close()


class _Canned:
    """What http.client.HTTPResponse reads a reply from."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.raw)


def _theirs(raw: bytes) -> Any:
    resp = http.client.HTTPResponse(_Canned(raw), method="POST")  # type: ignore[arg-type]
    try:
        resp.begin()
        body = resp.read()
    except (http.client.HTTPException, OSError) as exc:
        return type(exc).__name__
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body, bool(resp.will_close)


def _ours(raw: bytes) -> Any:
    try:
        return httpwire._reply(io.BytesIO(raw))
    except httpwire._Broken as exc:
        return exc.what


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
REPLIES = [
    OK + b"Content-Length: 2\r\n\r\n{}",
    OK + b"Content-Length: 2\r\n\r\n{}trailing bytes of nothing",
    OK + b"Content-Length: 5\r\n\r\n{}",  # cut short
    OK + b"Content-Length: -4\r\n\r\n{}",
    OK + b"Content-Length: x\r\n\r\n{}",
    OK + b"\r\n{} to the end",  # no length: read to the end, which closes
    OK + b"Connection: close\r\nContent-Length: 2\r\n\r\n{}",
    OK + b"Connection: Keep-Alive, Close\r\nContent-Length: 2\r\n\r\n{}",
    OK + b'Transfer-Encoding: chunked\r\n\r\n2;ext=1\r\n{"\r\nA\r\nok": true}\r\n0\r\nX-Trailer: 1\r\n\r\n',
    OK + b"Transfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    OK + b"Transfer-Encoding: chunked\r\n\r\n9\r\n{}\r\n",  # a chunk cut short
    OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}",  # no CRLF after the chunk
    OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n",  # no end of trailers
    b"HTTP/1.1 100 Continue\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\n\r\n",
    b"HTTP/1.1 500\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere/\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/0.9 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 099 OK\r\n\r\n",
    b"HTTP/1.1\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"",
    b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK" + b" " * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
    OK
    + b"X-Same: one\r\nX-Same: two\r\nX-Pad:   padded  \r\nX-Folded: a\r\n  b\r\nContent-Length: 0\r\n\r\n",
    OK + b"Content-Length: 2\r\nContent-Length: 9\r\n\r\n{}",
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}",  # bare newlines
]


@pytest.mark.parametrize("raw", REPLIES, ids=lambda r: repr(r[:60]))
def test_a_reply_reads_as_http_client_reads_it(raw: bytes) -> None:
    assert _ours(raw) == _theirs(raw)


@pytest.fixture
def scripted() -> Iterator[tuple[str, list[bytes], list[int]]]:
    """A server that answers each request on a connection with the next canned reply, and
    closes the connection after the one it is told to (its index in ``closes``)."""
    replies: list[bytes] = []
    closes: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))
    served = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while True:
                    if not conn.recv(65536):
                        break
                    n = served[0]
                    served[0] += 1
                    conn.sendall(replies[min(n, len(replies) - 1)])
                    if n in closes:
                        break

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/rpc", replies, closes
    listener.close()


def test_the_connection_is_kept_or_closed_as_the_reply_says(
    scripted: tuple[str, list[bytes], list[int]],
) -> None:
    url, replies, closes = scripted
    replies += [
        OK + b"Content-Length: 2\r\n\r\n{}",
        OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
        OK + b"Connection: close\r\nContent-Length: 4\r\n\r\nnull",
        OK + b'\r\n"to the end"',
    ]
    closes += [2, 3]
    client = KeptAlive(url, headers={}, timeout=10)
    bodies = [client.post(b"{}").body for _ in range(4)]
    assert bodies == [b"{}", b"[]", b"null", b'"to the end"']
    assert not client._idle  # the last reply closed its connection: none is kept
    client.close()


def test_a_reply_that_is_not_http_is_ambiguous_and_names_what_broke(
    scripted: tuple[str, list[bytes], list[int]],
) -> None:
    url, replies, closes = scripted
    replies += [b"SSH-2.0-OpenSSH\r\n", OK + b"Content-Length: 9\r\n\r\n{}"]
    closes += [0, 1]
    client = KeptAlive(url, headers={}, timeout=10)
    with pytest.raises(Ambiguous, match="connection broken: BadStatusLine"):
        client.post(b"{}")
    with pytest.raises(Ambiguous, match="answer broken off: IncompleteRead"):
        client.post(b"{}")


def test_a_header_that_is_not_one_line_is_refused_before_anything_is_sent() -> None:
    client = KeptAlive("http://127.0.0.1:9/rpc", headers={}, timeout=1)
    with pytest.raises(ValueError, match="one line"):
        client.post(b"{}", headers={"X-Evil": "1\r\nX-Injected: 2"})
    with pytest.raises(ValueError, match="path"):
        KeptAlive("http://127.0.0.1:9/a b", headers={}, timeout=1)


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("http://127.0.0.1:1/a b/jsonrpc.php", "a control character or a space"),
        ("ftp://127.0.0.1/jsonrpc.php", "not an http(s) URL"),
        ("http://127.0.0.1:99999/jsonrpc.php", "port is not a number"),
    ],
)
def test_a_url_the_client_cannot_post_to_is_one_line_for_who_set_it(url: str, what: str) -> None:
    from click.testing import CliRunner

    from fabric.apps.cli import main

    with pytest.raises(ConfigError, match=re.escape(what)):
        KeptAlive(url, headers={}, timeout=1.0)
    result = CliRunner().invoke(main, ["ls"], env={"KANBOARD_URL": url, "KANBOARD_API_TOKEN": "x"})
    assert result.exit_code == EXIT_INVALID, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert what in result.output and "Traceback" not in result.output
