"""The HTTP JSON-RPC client for Kanboard (and the embedded board).

Why not the ``kanboard`` package from the package index: it builds a new SSL context and
connection for every call (about 10x slower than a kept-alive connection), drops
positional arguments and cannot send JSON-RPC batches. The fabric's hot path (claims,
lease renewals, polls) is all round trips, so it speaks JSON-RPC itself, over
:mod:`fabric.httpwire` (sockets: a shell loop's ``agap heartbeat`` would spend longer
importing ``requests``, or ``http.client`` with the email package, than on its round trip).
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Sequence
from typing import Any

from fabric.httpwire import Ambiguous, KeptAlive, NotSent
from fabric.kanboard.port import (
    PROTOCOL_ERRORS,
    BoardAuthError,
    BoardError,
    BoardUnavailable,
    Call,
    MaybeDone,
    Outcome,
    Params,
    RoundTrips,
    RpcError,
)
from fabric.signals import STOPPING, pause

DEFAULT_TIMEOUT = 10.0
READ_ATTEMPTS = 3


class _Ambiguous(Ambiguous):
    """The board answered in a way that may follow a processed request (HTTP 5xx, no JSON)."""


class KanboardClient:
    """A kept-alive JSON-RPC client with Kanboard's app-token auth.

    Reads are retried (bounded) on transport failures; a write that fails ambiguously
    raises :class:`MaybeDone` and is never repeated here.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        user: str = "jsonrpc",
        timeout: float = DEFAULT_TIMEOUT,
        read_attempts: int = READ_ATTEMPTS,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.read_attempts = read_attempts
        self.stats = RoundTrips()
        self._ids = itertools.count(1)
        creds = base64.b64encode(f"{user}:{token}".encode()).decode("ascii")
        self._wire = KeptAlive(url, headers={"Authorization": f"Basic {creds}"}, timeout=timeout)
        # A board user is refused every project it is no member of (HTTP 403).
        self._hint = (
            ""
            if user == "jsonrpc"
            else f"check AGAP_BOARD_USER ({user}) and AGAP_BOARD_PASSWORD; a board user reaches "
            "only the projects `agap init` made it a member of"
        )

    def close(self) -> None:
        """Close pooled connections."""
        self._wire.close()

    # -- the port -------------------------------------------------------------------

    def call(self, method: str, params: Params = None) -> Any:
        """Run one procedure; raise :class:`RpcError` on a JSON-RPC error."""
        outcome = self.batch([Call(method, params)])[0]
        return outcome.unwrap()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        """Send ``calls`` in one round trip and return one :class:`Outcome` per call."""
        if not calls:
            return []
        single = len(calls) == 1
        ids = [next(self._ids) for _ in calls]
        body: Any = [self._request(i, c) for i, c in zip(ids, calls, strict=True)]
        if single:
            body = body[0]
        all_reads = all(c.is_read for c in calls)
        for attempt in range(1, self.read_attempts + 1):
            reply = self._send_with_policy(body, calls, retry=all_reads)
            outcomes = self._outcomes(reply, ids, calls)
            # A read that hit a server-side error (Kanboard's code 0 "database is locked")
            # changed nothing: run it again. Writes are never repeated here.
            busy = any(
                o.error is not None and o.error.code not in PROTOCOL_ERRORS and not o.error.refused
                for o in outcomes
            )
            if not (all_reads and busy) or attempt == self.read_attempts:
                return outcomes
            if pause(0.05 * attempt):  # stopping: the caller gets the busy answer now
                return outcomes
        raise AssertionError("unreachable")  # pragma: no cover

    # -- internals ------------------------------------------------------------------

    @staticmethod
    def _request(rpc_id: int, call: Call) -> dict[str, Any]:
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": call.method, "id": rpc_id}
        if call.params is not None:
            req["params"] = call.params
        return req

    def _send_with_policy(self, body: Any, calls: Sequence[Call], *, retry: bool) -> Any:
        where = f"{self.url} ({', '.join(c.method for c in calls[:3])}{'…' if len(calls) > 3 else ''})"
        attempts = self.read_attempts if retry else 1
        attempt = 1
        while True:
            try:
                return self._post(body, calls)
            except NotSent as exc:
                # A process told to stop does not retry: its stop is bounded (fabric.signals).
                if attempt >= attempts or STOPPING.is_set() or pause(_backoff(attempt)):
                    raise BoardUnavailable(f"cannot reach the board: {exc}", where=where) from None
            except Ambiguous as exc:
                if not retry:
                    raise MaybeDone(f"a write failed ambiguously: {exc}", where=where, calls=calls) from None
                if attempt >= attempts or STOPPING.is_set() or pause(_backoff(attempt)):
                    raise BoardUnavailable(f"the board did not answer: {exc}", where=where) from None
            attempt += 1

    def _post(self, body: Any, calls: Sequence[Call]) -> Any:
        self.stats.record(calls)
        data = json.dumps(body, separators=(",", ":")).encode()
        resp = self._wire.post(data)  # raises NotSent / Ambiguous
        if resp.status in (401, 403):
            raise BoardAuthError(
                f"HTTP {resp.status}: the board rejected the credentials",
                where=self.url,
                hint=self._hint,
            )
        if resp.status >= 500:
            raise _Ambiguous(f"HTTP {resp.status} with {len(resp.body)} bytes of body")
        if 300 <= resp.status < 400:
            # Nothing was done (a redirect answers before the API runs), but following it
            # would turn the POST into a GET: the configured URL is the one to fix.
            raise BoardError(
                f"HTTP {resp.status}: the board's URL redirects to {resp.location or 'elsewhere'}",
                where=self.url,
                hint="set KANBOARD_URL to the .../jsonrpc.php URL the redirect names",
            )
        if not resp.body:
            # Kanboard answers 200 with an empty body to notifications only; we never send
            # those, so an empty body means the server died mid-request.
            raise _Ambiguous(f"HTTP {resp.status} with an empty body")
        try:
            return json.loads(resp.body)
        except ValueError as exc:
            raise _Ambiguous(f"HTTP {resp.status} with a body that is not JSON") from exc

    @staticmethod
    def _outcomes(reply: Any, ids: list[int], calls: Sequence[Call]) -> list[Outcome]:
        items = reply if isinstance(reply, list) else [reply]
        by_id: dict[Any, dict[str, Any]] = {}
        loose: list[dict[str, Any]] = []
        for item in items:
            if isinstance(item, dict) and item.get("id") is not None:
                by_id[item["id"]] = item
            elif isinstance(item, dict):
                loose.append(item)
        out: list[Outcome] = []
        for rpc_id, call in zip(ids, calls, strict=True):
            item = by_id.get(rpc_id)
            if item is None:
                # A request-level error (parse error, bad batch) carries id null.
                item = loose[0] if loose else {"error": {"code": -32603, "message": "no reply"}}
            if "error" in item and item["error"] is not None:
                err = item["error"]
                out.append(
                    Outcome(
                        call,
                        error=RpcError(
                            int(err.get("code", -32603)),
                            str(err.get("message", "")),
                            err.get("data"),
                            method=call.method,
                        ),
                    )
                )
            else:
                out.append(Outcome(call, value=item.get("result")))
        return out


def _backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: 0.05, 0.1, 0.2 … at most 1 s."""
    return float(min(1.0, 0.05 * 2 ** (attempt - 1)))
