"""The embedded board's own request-head parsing and reply writing, against the standard
library's: the board reads plain ``Name: value`` heads without the email parser and writes
a reply's head in one piece, and must come to the same result as http.server on every
head (the odd ones go through the standard library's parser still)."""

from __future__ import annotations

import io
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from fabric.embedded.hindsight import HindsightStandIn
from fabric.embedded.quiet import QuietServer
from fabric.embedded.server import _Handler, _Server

AUTH = "Basic anNvbnJwYzp0b2s="
PLAIN = f"Host: 127.0.0.1:8080\r\nAuthorization: {AUTH}\r\nContent-Length: 2\r\n\r\n"
HEADS = [
    ("POST /jsonrpc.php HTTP/1.1", PLAIN),
    ("POST /jsonrpc.php HTTP/1.1", PLAIN.replace("\r\n", "\n")),
    ("POST /jsonrpc.php HTTP/1.1", "host: x\r\nAUTHORIZATION:\t  v  \r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "X-Folded: a\r\n b\r\nAuthorization: v\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "Host: x\r\nnot a header\r\nAuthorization: v\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", ": no name\r\nAuthorization: v\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "From x: y\r\nAuthorization: v\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "Authorization: a\r\nAuthorization: b\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "X-Latin: caf\xe9\r\nX-CR: a\rb\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "Authorization: v\r\n"),  # the head ends early
    ("POST /jsonrpc.php HTTP/1.1", "".join(f"X-{i}: {i}\r\n" for i in range(101)) + "\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", f"X-Long: {'a' * 70_000}\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "Connection: close\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.0", "Connection: keep-alive\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.1", "Expect: 100-continue\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/1.0", "Expect: 100-continue\r\n\r\n"),
    ("POST /jsonrpc.php HTTP/2.0", PLAIN),
    ("POST /jsonrpc.php HTTP/1.x", PLAIN),
    ("POST /jsonrpc.php HTTP/01.01", PLAIN),
    ("POST /jsonrpc.php FTP/1.1", PLAIN),
    ("POST /jsonrpc.php", PLAIN),
    ("GET /jsonrpc.php", ""),
    ("GET //x//y HTTP/1.1", "\r\n"),
    ("POST  /a  HTTP/1.1 extra", PLAIN),
    ("", ""),
]


def _handler(cls: type[BaseHTTPRequestHandler], line: str, head: str) -> Any:
    handler: Any = cls.__new__(cls)  # no socket: the streams are set below
    handler.rfile = io.BytesIO(head.encode("iso-8859-1") + b"{}")
    handler.wfile = io.BytesIO()
    handler.client_address = ("127.0.0.1", 1)
    handler.raw_requestline = (line + "\r\n").encode("iso-8859-1")
    handler.requestline = line
    handler.request_version = handler.default_request_version
    handler.command = None
    handler.close_connection = False
    return handler


def _outcome(handler: Any, ok: bool) -> tuple[Any, ...]:
    headers = getattr(handler, "headers", None)
    parsed = None
    if headers is not None:
        parsed = (type(headers), list(headers.items()), [type(d) for d in headers.defects])
    written = [
        line
        for line in handler.wfile.getvalue().split(b"\r\n")
        if not line.startswith(b"Date: ")  # the clock may tick between the two
    ]
    return (
        ok,
        handler.command,
        getattr(handler, "path", None),
        handler.request_version,
        handler.close_connection,
        parsed,
        handler.rfile.read(),  # the head is read to its end, the body left
        written,
    )


class _Stdlib(_Handler):
    """The board's handler with the standard library's parse_request."""

    parse_request = BaseHTTPRequestHandler.parse_request


@pytest.mark.parametrize(("line", "head"), HEADS)
def test_request_head_parses_as_the_standard_library_does(line: str, head: str) -> None:
    ours, stdlib = _handler(_Handler, line, head), _handler(_Stdlib, line, head)
    assert _outcome(ours, ours.parse_request()) == _outcome(stdlib, stdlib.parse_request())


@pytest.mark.parametrize(
    ("status", "body", "extra"),
    [
        (200, b'{"jsonrpc":"2.0","result":true,"id":1}', None),
        (401, b"{}", {"WWW-Authenticate": 'Basic realm="JsonRPC"'}),
        (404, b"", None),
        (500, b"", None),
    ],
)
@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0", "HTTP/0.9"])
def test_reply_bytes_are_the_standard_library_s(
    status: int, body: bytes, extra: dict[str, str] | None, version: str
) -> None:
    ours, stdlib = _handler(_Handler, "", ""), _handler(_Handler, "", "")
    ours.request_version = stdlib.request_version = version
    ours._reply(status, body, extra=extra)
    # What _reply replaced: send_response, a send_header per header, end_headers, the body.
    stdlib.send_response(status)
    stdlib.send_header("Content-Type", "application/json")
    stdlib.send_header("Content-Length", str(len(body)))
    for k, v in (extra or {}).items():
        stdlib.send_header(k, v)
    stdlib.end_headers()
    if body:
        stdlib.wfile.write(body)
    assert _outcome(ours, True)[-1] == _outcome(stdlib, True)[-1]
    assert ours.close_connection == stdlib.close_connection


def test_a_client_that_left_before_its_reply_is_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A timed-out or ended client's broken pipe is the board's debug note; any other error
    still prints as the standard library prints it. The Hindsight stand-in serves the same."""
    stand_in = HindsightStandIn().start()
    try:
        assert isinstance(stand_in._server, QuietServer)
    finally:
        stand_in.stop()
    server = _Server(("127.0.0.1", 0), _Handler)
    try:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise gone
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a fault of the board's")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a fault of the board's" in capsys.readouterr().err
    finally:
        server.server_close()
