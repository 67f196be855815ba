"""The embedded board's HTTP server: Kanboard's ``/jsonrpc.php`` on loopback, token-guarded.

Every request needs ``Authorization: Basic jsonrpc:<token>`` (Kanboard's app token
convention); there is no anonymous endpoint. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fabric.embedded.flavour import DEFAULT_FLAVOUR
from fabric.embedded.permissions import Forbidden
from fabric.embedded.php import Fatal
from fabric.embedded.procedures.activity import acting_as, configure_webhook
from fabric.embedded.rpc import BoardApi, encode
from fabric.embedded.store import Store

log = logging.getLogger("agap.board")

ENDPOINT = "/jsonrpc.php"
MAX_BODY = 64 * 1024 * 1024
UNAUTHORIZED = b'{"jsonrpc":"2.0","error":{"code":401,"message":"Unauthorized"},"id":null}'
FORBIDDEN = b'{"jsonrpc":"2.0","error":{"code":403,"message":"Forbidden"},"id":null}'
PARSE_ERROR = b'{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}'


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

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(body)

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


class _Server(ThreadingHTTPServer):
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
