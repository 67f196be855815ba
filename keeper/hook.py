"""The receiver for Kanboard's webhook: a person's gesture is acted on at once.

Kanboard POSTs ``{"event_name", "event_data", "event_author"}`` as JSON to its
``webhook_url`` setting, with ``?token=<webhook_token>`` appended, for every task event
(a move, a close, a comment, a new card), synchronously inside the request of the person
who made it. So the receiver answers at once and only *pokes* the keeper's gesture job,
which runs on the keeper's own thread; the job's interval stays as the safety net for a
webhook that was lost or never configured.

A request without the token is refused (401) before its body is read. Events without an
author (the fabric's own calls, made with the application token) and events by an
agent's own Kanboard user are not a person's: they poke nothing.

Kanboard has one webhook URL, and a confined agent's home has a keeper of its own. So the
main keeper's receiver routes (:class:`HomeRoutes`): a person's event on a home's card
is forwarded, with the same token, to the receiver that home's keeper published in its
project's metadata (loopback unless told otherwise), which pokes that keeper's gesture
job. A forward that fails pokes the main keeper instead (harmless: it never looks into a
home) and the home's own sweep stays the safety net. A card moved to another project is
named by the project it landed in: that event pokes the main keeper too (a work card moved
into a home is the main keeper's to bring back).

``POST /openclaw`` is OpenClaw's "run finished" webhook (:mod:`keeper.openclaw`), with
its own token (``AGAP_KEEPER_OPENCLAW_TOKEN``, which OpenClaw sends as ``Authorization:
Bearer`` from its ``cron.webhookToken``); without that setting the route answers 404.
Bad input is 400 with one line; the run is recorded before the answer (OpenClaw posts
from its scheduler, not inside a person's request).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fabric.errors import ConfigError, FabricError, InvalidInput
from keeper.serving import BackgroundServer

log = logging.getLogger("agap.keeper.hook")

MAX_BODY = 1 << 20  # Kanboard's event data is a task and a comment or two
MOVED_TO_PROJECT = "task.move.project"  # Kanboard's event for "Move to another project"


class HookServer(BackgroundServer):
    """Kanboard's webhook receiver on ``host:port`` (127.0.0.1 unless told otherwise).

    ``poke()`` is called, off the request, for each event a person caused; ``ignore`` are
    Kanboard usernames whose events are not a person's (the agents' own users).
    """

    thread_name = "keeper-hook"

    def __init__(
        self,
        poke: Callable[[], None],
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        ignore: Iterable[str] = (),
        route: Callable[[Any], bool] | None = None,
        openclaw: Callable[[Any, dict[str, str]], str] | None = None,
        openclaw_token: str = "",
        moved: Callable[[int], None] | None = None,
    ) -> None:
        if not token:
            raise ConfigError(
                "the webhook receiver needs a token",
                where="AGAP_KEEPER_HOOK_TOKEN",
                hint="set it, and the same value as Kanboard's webhook token (Settings > Webhooks)",
            )
        self.events = 0  # events received from a person
        self.ignored = 0  # authenticated events that were not a person's
        self.forwarded = 0  # a person's events sent on to the keeper of their project
        self._poke = poke
        self._moved = moved  # told the id of a card a person moved to another project
        self._route = route
        self._ignore = frozenset(ignore)
        self.openclaw = openclaw if openclaw_token else None
        self.openclaw_runs = 0  # OpenClaw finished events recorded
        super().__init__(ThreadingHTTPServer((host, port), _handler(self, token, openclaw_token)))

    @property
    def url(self) -> str:
        """The URL to give Kanboard (it appends ``?token=…``)."""
        return super().url + "/"

    def received(self, payload: Any) -> None:
        """Count an event and poke the keeper when a person caused it."""
        author = payload.get("event_author") if isinstance(payload, dict) else None
        if not isinstance(author, str) or not author or author in self._ignore:
            self.ignored += 1
            return
        self.events += 1
        log.debug("webhook: %s by %s", payload.get("event_name"), author)
        moved = task_of(payload) if payload.get("event_name") == MOVED_TO_PROJECT else None
        if moved is not None and self._moved is not None:
            self._moved(moved)  # a closed card is in no search: the keeper reads this one
        if self._route is not None and self._route(payload):
            self.forwarded += 1
            # A card moved to another project is named by where it landed; the keeper of
            # where it came from must notice, and only this one may be it.
            if payload.get("event_name") != MOVED_TO_PROJECT:
                return
        self._poke()


def project_of(payload: Any) -> int | None:
    """The project a webhook event is about (its task's, as Kanboard sends it)."""
    data = payload.get("event_data") if isinstance(payload, dict) else None
    task = data.get("task") if isinstance(data, dict) else None
    for where in (task, data):
        if isinstance(where, dict) and where.get("project_id") is not None:
            try:
                return int(where["project_id"])
            except (TypeError, ValueError):
                return None
    return None


def task_of(payload: Any) -> int | None:
    """The task a webhook event is about."""
    data = payload.get("event_data") if isinstance(payload, dict) else None
    task = data.get("task") if isinstance(data, dict) else None
    found = task.get("id") if isinstance(task, dict) else None
    try:
        return int(found) if found is not None else None
    except (TypeError, ValueError):
        return None


class HomeRoutes:
    """Sends a home project's events on to that home keeper's receiver.

    ``lookup()`` reads the receivers the homes' keepers published (project id -> URL); it
    is called again for a project it did not name, or after a forward failed, at most
    once per ``refresh`` seconds (an event for the work project never calls it).
    """

    def __init__(
        self,
        lookup: Callable[[], dict[int, str]],
        *,
        token: str,
        main_project: Callable[[], int | None],
        timeout: float = 2.0,
        refresh: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._token = token
        self._main = main_project
        self._timeout = timeout
        self._refresh = refresh
        self._clock = clock
        self._hooks: dict[int, str] = {}
        self._looked = -float("inf")
        self._lock = threading.Lock()

    def _url(self, pid: int, *, again: bool = False) -> str | None:
        with self._lock:
            stale = again or pid not in self._hooks
            if stale and self._clock() - self._looked >= self._refresh:
                self._looked = self._clock()
                try:
                    self._hooks = dict(self._lookup())
                except Exception:  # the board is away: the sweeps are the safety net
                    log.warning("webhook: cannot read the homes' receivers", exc_info=True)
            return self._hooks.get(pid)

    def __call__(self, payload: Any) -> bool:
        """True when the event went to a home's keeper (else the caller pokes its own)."""
        pid = project_of(payload)
        if pid is None or pid == self._main():
            return False
        for again in (False, True):
            url = self._url(pid, again=again)
            if url is None:
                return False
            if self._send(url, payload):
                return True
        return False

    def _send(self, url: str, payload: Any) -> bool:
        target = url + ("&" if "?" in url else "?") + "token=" + self._token
        body = json.dumps(payload).encode()
        req = urllib.request.Request(target, body, {"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as reply:
                reply.read()
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError) as exc:
            log.warning("webhook: the home keeper at %s did not take the event (%s)", url, exc)
            return False


def _handler(server: HookServer, token: str, openclaw_token: str) -> type[BaseHTTPRequestHandler]:
    attrs = {"hook": server, "expected": token.encode(), "bearer": f"Bearer {openclaw_token}".encode()}
    return type("Handler", (_Handler,), attrs)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hook: HookServer
    expected: bytes  # Kanboard's ?token=
    bearer: bytes  # OpenClaw's Authorization header

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes | None:
        """The request's body, or None after answering 413."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._reply(413, b"too large\n")
            return None
        return self.rfile.read(length)

    def _openclaw(self) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items() if v}
        auth = self.headers.get("Authorization") or ""
        status, line = _openclaw(self.hook, self.bearer, auth, query, self._body)
        self.close_connection = status == 401
        if status:
            self._reply(status, (line + "\n").encode())

    def do_POST(self) -> None:
        if urlsplit(self.path).path.rstrip("/") == "/openclaw":
            self._openclaw()
            return
        given = parse_qs(urlsplit(self.path).query).get("token", [""])[0].encode()
        if not hmac.compare_digest(given, self.expected):
            self.close_connection = True
            self._reply(401, b"unauthorized\n")
            return
        raw = self._body()
        if raw is None:
            return
        # Kanboard waits for this answer inside a person's request: answer first.
        self._reply(200, b"ok\n")
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return
        self.hook.received(payload)

    def do_GET(self) -> None:
        self._reply(405, b"POST only\n")


def _openclaw(
    server: HookServer,
    bearer: bytes,
    authorization: str,
    query: dict[str, str],
    body: Callable[[], bytes | None],
) -> tuple[int, str]:
    """``POST /openclaw``: (status, line) to answer; (0, "") when ``body`` answered already."""
    handle = server.openclaw
    if handle is None:
        return 404, "no OpenClaw route: set AGAP_KEEPER_OPENCLAW_TOKEN"
    if not hmac.compare_digest(authorization.encode(), bearer):
        return 401, "unauthorized"
    raw = body()
    if raw is None:
        return 0, ""
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return 400, "body: not JSON (an OpenClaw finished event)"
    try:
        line = handle(payload, query)
    except InvalidInput as exc:
        return 400, exc.line()
    except FabricError as exc:  # the board away: OpenClaw logs the failed delivery
        return 503, exc.line()[:300]
    server.openclaw_runs += 1
    return 200, line


__all__ = ["HomeRoutes", "HookServer", "project_of", "task_of"]
