"""Kept-alive HTTP POSTs on sockets, for the fabric's hot round trips.

A short-lived ``agap claim`` or ``heartbeat`` and a small worker spend most of their start
on imports; ``requests`` (with urllib3, charset detection and idna) costs more to import
than the round trip it makes, and several MB of a worker's memory, and ``http.client``
still imports the email package (to parse headers) and ``ssl`` (for any URL): about 65 M
instructions of a heartbeat's 460 M. What the board client and the LiteLLM gateway client
need is small: one URL, a JSON body, keep-alive, and to know whether a failed request can
have reached the server. That is this module: an HTTP/1.1 POST written in one piece and its
reply read as ``http.client`` reads one (a status line, headers, a body by
``Content-Length``, chunks, or to the end; ``100 Continue`` skipped; the same limits on
line length and header count; kept alive unless the server says it closes).

What it does not do, on purpose: follow redirects (a redirected JSON-RPC POST is a wrong
URL, said so), use proxy variables (the board is the household's own; its token is not
sent through a proxy), decompress (it asks for ``identity``, as ``http.client`` does). TLS,
imported only for an https URL, verifies against the system's CAs (and a file named by
``SSL_CERT_FILE``, which OpenSSL reads itself) plus certifi's bundle, which is what
``requests`` trusted.
"""

from __future__ import annotations

import re
import select
import socket
import threading
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from fabric.errors import ConfigError
from fabric.plain import Plain

POOL = 10  # idle connections kept per client, as urllib3's default pool
_MAXLINE = 65536  # http.client's limits on a line and on the number of headers
_MAXHEADERS = 100
# What http.client refuses in a request line's path and in a header (no request smuggling).
_BAD_PATH = re.compile("[\x00-\x20\x7f]")
_NAME = re.compile(r"[^:\s][^:\r\n]*")
_BAD_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")


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


class _Broken(Exception):
    """A reply that is not HTTP, or that stops short (``what`` names which, as
    ``http.client``'s exception names did)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Conn:
    """One connection: its socket, TLS-wrapped for https."""

    def __init__(self, host: str, port: int, tls: Any) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.sock: socket.socket | None = None

    def connect(self, timeout: float) -> None:
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as http.client
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


class BadUrl(ConfigError, ValueError):
    """A configured URL this client cannot post to: one line for the person who set it
    (a ValueError still, for callers that check a URL by building a client)."""


def _bad_url(url: str, what: str) -> BadUrl:
    return BadUrl(what, where=repr(url), hint="set it to an http:// or https:// URL (spaces as %20)")


class KeptAlive:
    """POSTs to one URL over a small pool of kept-alive connections (thread-safe)."""

    def __init__(self, url: str, *, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise _bad_url(url, "its port is not a number from 0 to 65535") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _bad_url(url, "not an http(s) URL")
        self.url = url
        self.timeout = timeout
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if _BAD_PATH.search(self._path):
            raise _bad_url(url, "its path holds a control character or a space")
        self._headers = {
            "Host": parts.netloc.rpartition("@")[2],
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "agap-fabric",
            **headers,
        }
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._context: Any = None

    def post(
        self, body: bytes, *, headers: dict[str, str] | None = None, timeout: float | None = None
    ) -> HttpReply:
        """POST ``body`` (with ``headers`` added, within ``timeout`` seconds, else the
        client's); raise :class:`NotSent` or :class:`Ambiguous` on transport failure."""
        wait = self.timeout if timeout is None else timeout
        request = _request(self._path, {**self._headers, **(headers or {})}, body)
        conn = self._take()
        try:
            if conn.sock is None:
                self._connect(conn, wait)
            assert conn.sock is not None
            conn.sock.settimeout(wait)
            try:
                conn.sock.sendall(request)  # head and body in one write: one wake-up of the server
                # A reader per reply, as http.client's: bytes past it are not the next one's.
                with conn.sock.makefile("rb") as reader:
                    status, replied, data, closes = _reply(reader)
            except TimeoutError as exc:
                raise Ambiguous(f"no answer within {wait:g}s", timed_out=True) from exc
            except _Broken as exc:
                cut = exc.what == "IncompleteRead"
                raise Ambiguous(f"{'answer broken off' if cut else 'connection broken'}: {exc.what}") from exc
            except OSError as exc:
                raise Ambiguous(f"connection broken: {exc.__class__.__name__}") from exc
        except BaseException:
            conn.close()
            raise
        if closes:
            conn.close()
        else:
            self._give_back(conn)
        return HttpReply(status, data, replied)

    def close(self) -> None:
        """Close the idle connections (a later post opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- internals ------------------------------------------------------------------

    def _connect(self, conn: _Conn, wait: float) -> None:
        try:
            conn.connect(wait)
        except TimeoutError as exc:
            raise NotSent(f"connect timeout after {wait:g}s") from exc
        except OSError as exc:  # refused, unreachable, unresolvable, TLS handshake refused
            raise NotSent(f"{exc.__class__.__name__}: {_reason(exc)}") from exc

    def _take(self) -> _Conn:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not _dropped(conn):
                    return conn
                conn.close()  # the server closed it while idle: nothing was sent on it
        return _Conn(self._host, self._port, self._tls() if self._https else None)

    def _give_back(self, conn: _Conn) -> None:
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


def _request(path: str, headers: dict[str, str], body: bytes) -> bytes:
    """The request's bytes: its head (as ``http.client`` writes it) and ``body``."""
    lines = [f"POST {path} HTTP/1.1", "Accept-Encoding: identity"]
    for name, value in {**headers, "Content-Length": str(len(body))}.items():
        if not _NAME.fullmatch(name) or _BAD_VALUE.search(value):
            raise ValueError(f"invalid HTTP header {name!r}: a header must be one line")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(_MAXLINE + 1)
    if len(line) > _MAXLINE:
        raise _Broken("LineTooLong")
    return line


def _reply(reader: BinaryIO) -> tuple[int, dict[str, str], bytes, bool]:
    """``(status, headers, body, closes)`` of one reply; :class:`_Broken` if it is none."""
    while True:
        status, version = _status(reader)
        headers, first = _headers(reader)
        if status != 100:  # a 100 Continue comes before the reply
            break
    chunked = first.get("transfer-encoding", "").lower() == "chunked"
    closes = _closes(version, first)
    length = None if chunked else _length(first.get("content-length"))
    if status in (204, 304) or 100 <= status < 200:
        length = 0
    if chunked:
        return status, headers, _chunks(reader), closes
    if length is None:
        return status, headers, reader.read(), True  # to the end, which closes it
    data = reader.read(length)
    if len(data) < length:
        raise _Broken("IncompleteRead")
    return status, headers, data, closes


def _status(reader: BinaryIO) -> tuple[int, str]:
    line = str(_line(reader), "iso-8859-1")
    if not line:
        raise _Broken("RemoteDisconnected")  # closed before a reply
    parts = line.split(None, 2)
    version, code = [*parts, "", ""][:2]
    try:
        status = int(code)
    except ValueError:
        status = 0
    if not version.startswith("HTTP/") or not 100 <= status <= 999:
        raise _Broken("BadStatusLine")
    if version not in ("HTTP/1.0", "HTTP/0.9") and not version.startswith("HTTP/1."):
        raise _Broken("UnknownProtocol")
    return status, version


def _headers(reader: BinaryIO) -> tuple[dict[str, str], dict[str, str]]:
    """The header lines, names lower-cased: the last of a repeated name (what a reply
    shows, as ``getheaders()`` gave it) and the first (what frames the body, as
    ``http.client`` read it). A folded line continues the header above it."""
    last: dict[str, str] = {}
    first: dict[str, str] = {}
    name = ""
    for count in range(_MAXHEADERS + 1):
        line = _line(reader)
        if line in (b"\r\n", b"\n", b""):
            return last, first
        if count == _MAXHEADERS:
            break
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and name:
            last[name] += "\r\n" + text
            continue
        raw, sep, value = text.partition(":")
        if sep:
            name = raw.lower()
            last[name] = value.lstrip(" \t")
            first.setdefault(name, last[name])
    raise _Broken("HTTPException")  # more than _MAXHEADERS headers: http.client's word for it


def _closes(version: str, headers: dict[str, str]) -> bool:
    """Whether the server closes the connection after this reply (``http.client``'s rule)."""
    conn = headers.get("connection", "").lower()
    if version.startswith("HTTP/1.") and version != "HTTP/1.0":
        return "close" in conn
    kept = "keep-alive" in headers or "keep-alive" in conn
    return not (kept or "keep-alive" in headers.get("proxy-connection", "").lower())


def _length(value: str | None) -> int | None:
    try:
        length = int(value) if value else None
    except ValueError:
        return None
    return length if length is not None and length >= 0 else None


def _chunks(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        size = _line(reader).split(b";", 1)[0]
        try:
            n = int(size, 16)
        except ValueError:
            raise _Broken("IncompleteRead") from None
        if n == 0:
            break
        data = reader.read(n)
        if len(data) < n or len(reader.read(2)) < 2:  # the chunk, and the CRLF after it
            raise _Broken("IncompleteRead")
        parts.append(data)
    while _line(reader) not in (b"\r\n", b"\n", b""):
        pass  # trailers, dropped
    return b"".join(parts)


def _dropped(conn: _Conn) -> bool:
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
