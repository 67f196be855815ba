"""Kept-alive HTTP POSTs on the standard library, for the fabric's hot round trips.

A short-lived ``agap claim`` or ``heartbeat`` and a small worker spend most of their start
on imports; ``requests`` (with urllib3, charset detection and idna) costs more to import
than the round trip it makes, and several MB of a worker's memory. What the board client
and the LiteLLM gateway client need is small: one URL, a JSON body, keep-alive, and to
know whether a failed request can have reached the server. That is this module.

What it does not do, on purpose: follow redirects (a redirected JSON-RPC POST is a wrong
URL, said so), use proxy variables (the board is the household's own; its token is not
sent through a proxy), decompress. TLS verifies against the system's CAs (and a file named
by ``SSL_CERT_FILE``, which OpenSSL reads itself) plus certifi's bundle, which is what
``requests`` trusted.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from fabric.plain import Plain

POOL = 10  # idle connections kept per client, as urllib3's default pool


class NotSent(Exception):
    """The request never reached the server (refused, unresolvable, connect timeout)."""


class Ambiguous(Exception):
    """The request was sent and may have been processed (timeout, broken or cut-off reply)."""

    def __init__(self, what: str, *, timed_out: bool = False) -> None:
        super().__init__(what)
        self.timed_out = timed_out


class HttpReply(Plain):
    status: int
    body: bytes
    headers: dict[str, str]  # names lower-cased

    @property
    def location(self) -> str | None:
        return self.headers.get("location")


class _Joined(http.client.HTTPConnection):
    """A connection whose POST leaves in one write, head and body together.

    ``http.client`` writes a request's head and its body apart: the server wakes twice per
    call, and on a busy machine each wake-up can cost a scheduling round (the embedded
    board's throughput run spent a quarter of its worker's samples in that second send).
    """

    _held: bytes | None = None

    def send(self, data: Any) -> None:
        if self._held is not None and isinstance(data, bytes):
            self._held += data  # the head, kept for the body (post)
            return
        super().send(data)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        """Send a POST of ``body`` with ``headers`` (as ``request`` would, in one write)."""
        self.putrequest("POST", path, skip_host="Host" in headers)
        for name, value in headers.items():
            self.putheader(name, value)
        self.putheader("Content-Length", str(len(body)))
        self._held = b""
        try:
            self.endheaders()
            head = self._held
        finally:
            self._held = None
        self.send(head + body)


class _JoinedTls(_Joined, http.client.HTTPSConnection):
    """:class:`_Joined` over TLS."""


class KeptAlive:
    """POSTs to one URL over a small pool of kept-alive connections (thread-safe)."""

    def __init__(self, url: str, *, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.timeout = timeout
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {
            "Host": parts.netloc.rpartition("@")[2],
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "agap-fabric",
            **headers,
        }
        self._idle: list[_Joined] = []
        self._lock = threading.Lock()
        self._context: Any = None

    def post(
        self, body: bytes, *, headers: dict[str, str] | None = None, timeout: float | None = None
    ) -> HttpReply:
        """POST ``body`` (with ``headers`` added, within ``timeout`` seconds, else the
        client's); raise :class:`NotSent` or :class:`Ambiguous` on transport failure."""
        wait = self.timeout if timeout is None else timeout
        conn = self._take()
        try:
            conn.timeout = wait
            if conn.sock is None:
                self._connect(conn, wait)
            else:
                conn.sock.settimeout(wait)
            try:
                conn.post(self._path, body, {**self._headers, **(headers or {})})
                resp = conn.getresponse()
                data = resp.read()
            except TimeoutError as exc:
                raise Ambiguous(f"no answer within {wait:g}s", timed_out=True) from exc
            except http.client.IncompleteRead as exc:
                raise Ambiguous("answer broken off: IncompleteRead") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise Ambiguous(f"connection broken: {exc.__class__.__name__}") from exc
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return HttpReply(resp.status, data, {k.lower(): v for k, v in resp.getheaders()})

    def close(self) -> None:
        """Close the idle connections (a later post opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- internals ------------------------------------------------------------------

    def _connect(self, conn: _Joined, wait: float) -> None:
        try:
            conn.connect()
        except TimeoutError as exc:
            raise NotSent(f"connect timeout after {wait:g}s") from exc
        except OSError as exc:  # refused, unreachable, unresolvable, TLS handshake refused
            raise NotSent(f"{exc.__class__.__name__}: {_reason(exc)}") from exc

    def _take(self) -> _Joined:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not _dropped(conn):
                    return conn
                conn.close()  # the server closed it while idle: nothing was sent on it
        if self._https:
            tls = self._tls()
            return _JoinedTls(self._host, self._port, timeout=self.timeout, context=tls)
        return _Joined(self._host, self._port, timeout=self.timeout)

    def _give_back(self, conn: _Joined) -> None:
        with self._lock:
            if len(self._idle) < POOL:
                self._idle.append(conn)
                return
        conn.close()

    def _tls(self) -> Any:
        if self._context is None:
            import ssl  # only https boards pay for it

            import certifi  # only https boards pay for it

            context = ssl.create_default_context()  # the system's CAs, SSL_CERT_FILE
            context.load_verify_locations(cafile=certifi.where())
            self._context = context
        return self._context


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """True when a kept-alive connection was closed by the server (readable while idle)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    return exc.strerror or str(exc) or exc.__class__.__name__
