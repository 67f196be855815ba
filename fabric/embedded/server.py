"""The embedded board's HTTP server: Kanboard's ``/jsonrpc.php`` on loopback, token-guarded.

Every request needs ``Authorization: Basic jsonrpc:<token>`` (Kanboard's app token
convention); there is no anonymous endpoint. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.utils
import http.client
import json
import logging
import re
import secrets
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from fabric.embedded.flavour import DEFAULT_FLAVOUR
from fabric.embedded.permissions import Forbidden
from fabric.embedded.php import Fatal
from fabric.embedded.procedures.activity import acting_as, configure_webhook
from fabric.embedded.quiet import QuietServer
from fabric.embedded.rpc import BoardApi, encode
from fabric.embedded.store import Store

log = logging.getLogger("agap.board")

ENDPOINT = "/jsonrpc.php"
MAX_BODY = 64 * 1024 * 1024
UNAUTHORIZED = b'{"jsonrpc":"2.0","error":{"code":401,"message":"Unauthorized"},"id":null}'
FORBIDDEN = b'{"jsonrpc":"2.0","error":{"code":403,"message":"Forbidden"},"id":null}'
PARSE_ERROR = b'{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}'
# http.client's limits on a request's head, which http.server applies (431 beyond them).
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100
# A header line the email parser reads as one "Name: value" and nothing else: a name of
# the characters its header pattern allows, no continuation, one line ending.
_PLAIN_HEADER = re.compile(r"[\x21-\x39\x3b-\x7e]+:[^\r\n]*\r?\n")


def stored_token(store: Store, token: str | None = None) -> str:
    """The board's app token: the one given, else the one saved in the database, else new."""
    with store.write() as db:
        row = db.execute("SELECT value FROM settings WHERE option = 'api_token'").fetchone()
        if token:
            db.execute(
                "INSERT INTO settings (option, value) VALUES ('api_token', ?)"
                " ON CONFLICT(option) DO UPDATE SET value = excluded.value",
                (token,),
            )
            return token
        if row is not None:
            return str(row[0])
        new = secrets.token_hex(24)
        db.execute("INSERT INTO settings (option, value) VALUES ('api_token', ?)", (new,))
        return new


_DATE: tuple[int, str] = (0, "")


def _http_date() -> str:
    """BaseHTTPRequestHandler.date_time_string() (it has a second's resolution), made once a
    second: formatting it was a tenth of a reply's time."""
    global _DATE
    now = int(time.time())
    cached = _DATE
    if cached[0] != now:
        cached = _DATE = (now, email.utils.formatdate(now, usegmt=True))
    return cached[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a requests.Session reuses the connection
    # Headers and body leave in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (~40 ms a call on loopback).
    disable_nagle_algorithm = True
    # Buffered, so headers and body leave in one write (the handler flushes after each
    # request): each write wakes the client, and on a busy machine each wake-up can cost
    # the board its CPU (sendall was a third of the board's time in `make bench`).
    wbufsize = -1
    server: _Server
    raw_requestline: bytes  # set by handle_one_request before parse_request

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def parse_request(self) -> bool:
        """:meth:`BaseHTTPRequestHandler.parse_request` (the same on Python 3.11 to 3.13), its
        headers read without the email parser when every line is a plain ``Name: value``.

        The standard library hands a request's head to :mod:`email`'s feed parser, which
        was an eighth of the board's time per request; plain lines are split the way that
        parser's compat32 policy splits them, into the same message class, and a head with
        anything else (a continuation, a line that is no header, an early end) still
        goes through it. Refusals (400, 431, 505) are the standard library's own.
        """
        self.command = None  # type: ignore[assignment]  # as the standard library does
        self.request_version = self.default_request_version
        self.close_connection = True
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = requestline
        words = requestline.split()
        if not words:
            return False
        if len(words) >= 3 and not self._take_version(words[-1]):
            return False
        if not 2 <= len(words) <= 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        self.command, self.path = command, path
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")  # gh-87389: no open redirects
        try:
            self.headers = self._read_headers()
        except http.client.LineTooLong as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(err))
            return False
        except http.client.HTTPException as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(err))
            return False
        return self._take_connection_headers()

    def _take_version(self, version: str) -> bool:
        """The request line's HTTP version (parse_request's first part); False: refused."""
        try:
            if not version.startswith("HTTP/"):
                raise ValueError
            number = version.split("/", 1)[1].split(".")
            if len(number) != 2:
                raise ValueError
            if any(not part.isdigit() for part in number):
                raise ValueError("non digit in http version")
            if any(len(part) > 10 for part in number):
                raise ValueError("unreasonable length http version")
            version_number = int(number[0]), int(number[1])
        except (ValueError, IndexError):
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
            return False
        if version_number >= (1, 1) and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        if version_number >= (2, 0):
            self.send_error(
                HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version.split('/', 1)[1]})"
            )
            return False
        self.request_version = version
        return True

    def _take_connection_headers(self) -> bool:
        """``Connection`` and ``Expect: 100-continue`` (parse_request's last part)."""
        conntype = self.headers.get("Connection", "")
        if conntype.lower() == "close":
            self.close_connection = True
        elif conntype.lower() == "keep-alive" and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        expect = self.headers.get("Expect", "")
        if (
            expect.lower() == "100-continue"
            and self.protocol_version >= "HTTP/1.1"
            and self.request_version >= "HTTP/1.1"
        ):
            return self.handle_expect_100()
        return True

    def _read_headers(self) -> http.client.HTTPMessage:
        """http.client.parse_headers, the plain lines split here (see parse_request)."""
        lines: list[bytes] = []
        while True:
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                raise http.client.LineTooLong("header line")
            lines.append(line)
            if len(lines) > MAX_HEADERS:
                raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
            if line in (b"\r\n", b"\n", b""):
                break
        text = [line.decode("iso-8859-1") for line in lines[:-1]]
        if lines[-1] == b"" or not all(_PLAIN_HEADER.fullmatch(t) for t in text):
            message: http.client.HTTPMessage = email.parser.Parser(_class=self.MessageClass).parsestr(
                "".join(text) + lines[-1].decode("iso-8859-1")
            )
            return message
        message = self.MessageClass()
        for t in text:
            name, value = t.split(":", 1)
            message[name] = value.lstrip(" \t").rstrip("\r\n")
        return message

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        extra: dict[str, str] | None = None,
    ) -> None:
        """What send_response, send_header and end_headers write, built in one piece.

        The same bytes as theirs (the status line, Server, Date, then ours), made without
        a call per header, the Date text made once a second.
        """
        if log.isEnabledFor(logging.DEBUG):
            self.log_request(status)
        if self.request_version == "HTTP/0.9":  # no status line, no headers
            if body:
                self.wfile.write(body)
            return
        reason = self.responses[status][0] if status in self.responses else ""
        head = (
            f"{self.protocol_version} {status} {reason}\r\n"
            f"Server: {self.version_string()}\r\nDate: {_http_date()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        )
        for k, v in (extra or {}).items():
            head += f"{k}: {v}\r\n"
        self.wfile.write(head.encode("latin-1", "strict") + b"\r\n" + body)

    def _authorized(self) -> bool:
        return self._caller() is not None

    def _caller(self) -> int | None:
        """0 for the application token, a user's id for user auth; None (answered 401) else."""
        who = self.server.api.caller_of(self.headers.get("Authorization"))
        if who is None:
            self._reply(401, UNAUTHORIZED, extra={"WWW-Authenticate": 'Basic realm="JsonRPC"'})
        return who

    def _read_body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._reply(413, b"")
            self.close_connection = True
            return None
        return self.rfile.read(length)

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != ENDPOINT:
            self._reply(404, b"")
            return
        raw = self._read_body()
        if raw is None:
            return
        self._answer(raw)

    def _answer(self, raw: bytes) -> None:
        api = self.server.api
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError):
            payload = None
        if not isinstance(payload, dict | list):
            # Kanboard checks the JSON before the credentials: a parse error needs no auth.
            self._reply(200, PARSE_ERROR)
            return
        who = self._caller()
        if who is None:
            return
        try:
            with acting_as(who):
                reply = api.handle(payload)
        except Forbidden as exc:
            log.debug("HTTP 403 (as Kanboard would): %s", exc)
            self._reply(403, FORBIDDEN)
            return
        except Fatal as exc:
            log.warning("HTTP 500 (as PHP would): %s", exc)
            self._reply(500, b"", content_type="text/html; charset=UTF-8")
            return
        except Exception:
            log.exception("embedded board: unexpected error")
            self._reply(500, b"", content_type="text/html; charset=UTF-8")
            return
        self._reply(200, b"" if reply is None else encode(reply))

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == ENDPOINT:
            self._answer(b"")  # a GET has no JSON body: Kanboard answers a parse error
            return
        view = self.server.view
        if view is None:
            self._reply(404, b"")
            return
        if not self._authorized():
            return
        status, content_type, body = view(self.path)
        self._reply(status, body, content_type=content_type)


class _Server(QuietServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    api: BoardApi
    view: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.api.store.release()  # the thread ends: its database connection is reused

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut every open (kept-alive) connection, as a dying board process would."""
        with self._open_lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()


class EmbeddedBoard:
    """A running embedded board: ``start()`` serves in a thread, ``stop()`` shuts it down.

    ``flavour`` is the Kanboard database backend it imitates (``strict``: the strictest
    of all; see :mod:`fabric.embedded.flavour`).
    """

    def __init__(
        self,
        db_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        flavour: str = DEFAULT_FLAVOUR,
    ) -> None:
        self.store = Store(db_path, flavour=flavour)
        self.token = stored_token(self.store, token)
        self.api = BoardApi(self.store, self.token)
        self.flavour = self.api.flavour.name
        self._server = _Server((host, port), _Handler)
        self._server.api = self.api
        address: Any = self._server.server_address
        self.host: str = address[0].decode() if isinstance(address[0], bytes) else address[0]
        self.port: int = int(address[1])
        self.api.base_url = f"http://{self.host}:{self.port}/"
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The JSON-RPC endpoint, in the form KANBOARD_URL takes."""
        return f"http://{self.host}:{self.port}{ENDPOINT}"

    def set_webhook(self, url: str, token: str) -> None:
        """Call ``url?token=<token>`` on every task event, as Kanboard's webhook setting does."""
        configure_webhook(self.api, url, token)

    def set_view(self, view: Any) -> None:
        """Serve ``view(path) -> (status, content_type, body)`` for GET requests."""
        self._server.view = view

    def start(self) -> EmbeddedBoard:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="agap-board", daemon=True
        )  # a 0.1 s poll: stop() returns that fast
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` or :meth:`request_stop`."""
        self._server.serve_forever(0.1)

    def request_stop(self) -> None:
        """Make :meth:`serve_forever` return (from another thread; returns at once)."""
        threading.Thread(target=self._server.shutdown, name="agap-board-stop", daemon=True).start()

    def stop(self) -> None:
        """Stop serving, drop open connections and close the database."""
        self._server.shutdown()
        self._server.server_close()
        self._server.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()

    def __enter__(self) -> EmbeddedBoard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
