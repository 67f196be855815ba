"""An in-process port onto the embedded board's API: the fake for unit tests.

It is not a hand-written imitation: calls run through the same procedures the HTTP
server runs, and values make a JSON round trip, so unit tests see Kanboard's semantics
(``false``/``0``/``null``, strings in metadata, ``{}`` for empty maps) without a socket.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fabric.embedded.flavour import DEFAULT_FLAVOUR
from fabric.embedded.permissions import Forbidden
from fabric.embedded.php import Fatal
from fabric.embedded.procedures.activity import acting_as
from fabric.embedded.rpc import BoardApi
from fabric.embedded.store import Store
from fabric.kanboard.port import BoardAuthError, Call, MaybeDone, Outcome, Params, RoundTrips, RpcError


class LocalPort:
    """An :class:`~fabric.kanboard.port.RpcPort` that calls a :class:`BoardApi` directly.

    Without ``api`` it makes an in-memory board of the given ``flavour`` (``strict``
    unless told otherwise; ignored when ``api`` is given). With ``user_id`` its calls are
    made as that signed-in user (user-auth JSON-RPC), as a person's in Kanboard's UI.
    """

    def __init__(
        self,
        api: BoardApi | None = None,
        *,
        clock: Callable[[], float] | None = None,
        flavour: str = DEFAULT_FLAVOUR,
        user_id: int = 0,
    ):
        if api is None:
            api = BoardApi(Store(":memory:", flavour=flavour), token="local")
        if clock is not None:
            api.clock = clock
        self.api = api
        self.user_id = user_id  # 0: the application token; else user-auth JSON-RPC as this user
        self.stats = RoundTrips()
        self._next = 0

    def call(self, method: str, params: Params = None) -> Any:
        """Run one procedure and return its result."""
        return self.batch([Call(method, params)])[0].unwrap()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        """Run calls in order; one round trip in the counters."""
        if not calls:
            return []
        self.stats.record(calls)
        payload = []
        for c in calls:
            self._next += 1
            req: dict[str, Any] = {"jsonrpc": "2.0", "method": c.method, "id": self._next}
            if c.params is not None:
                req["params"] = c.params
            payload.append(json.loads(json.dumps(req)))
        try:
            with acting_as(self.user_id):
                replies = json.loads(json.dumps(self.api.handle(payload)))
        except Fatal as exc:
            raise MaybeDone(f"the board failed mid-batch: {exc}", calls=calls) from exc
        except Forbidden as exc:
            # Over HTTP this is a 403 for the whole request, which the client reports so.
            raise BoardAuthError(f"HTTP 403: the board refused the call ({exc})", where="local") from None
        out = []
        for c, r in zip(calls, replies, strict=True):
            if "error" in r:
                e = r["error"]
                out.append(
                    Outcome(c, error=RpcError(e["code"], e["message"], e.get("data"), method=c.method))
                )
            else:
                out.append(Outcome(c, value=r["result"]))
        return out
