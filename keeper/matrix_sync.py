"""Reading a Matrix room as the fabric's bot: ``/sync`` from a saved token, and one event.

::

    GET {homeserver}/_matrix/client/v3/sync?since=<token>&timeout=0&filter=<the rooms, messages only>
    GET {homeserver}/_matrix/client/v3/rooms/{room}/messages?dir=b&from=<prev_batch>&to=<token>
    GET {homeserver}/_matrix/client/v3/rooms/{room}/event/{event id}

A sync whose timeline is ``limited`` (more happened since the token than one page holds,
e.g. while the fabric was down) is completed from ``/messages``, back to the token, so no
message is skipped. One call is bounded by ``timeout``; an error raises
:class:`~keeper.matrix.MatrixSendError` and the caller keeps its token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import requests

from keeper.matrix import MatrixSendError


@dataclass(frozen=True)
class Page:
    """What happened in the rooms since a token: (room, event) oldest first, and the next token."""

    events: list[tuple[str, dict[str, Any]]]
    next_batch: str


@dataclass
class MatrixReader:
    """The bot's view of its rooms on one homeserver."""

    homeserver: str
    token: str = field(repr=False)
    timeout: float = 10.0
    limit: int = 50  # timeline events per room and page
    session: requests.Session | None = None

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.homeserver.rstrip('/')}/_matrix/client/v3{path}"
        if params:
            url += "?" + urlencode(params)
        http = self.session or requests
        try:
            resp = http.get(
                url,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.timeout,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise MatrixSendError(f"matrix read failed: {type(exc).__name__}", where=self.homeserver) from exc
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise MatrixSendError(
                f"matrix read failed: HTTP {resp.status_code}",
                where=self.homeserver,
                hint="check the bot's token and its membership of the room",
            )
        try:
            return resp.json()
        except ValueError as exc:
            raise MatrixSendError("matrix read failed: not JSON", where=self.homeserver) from exc

    def whoami(self) -> str:
        """The bot's own user id (its messages are never answers)."""
        out = self._get("/account/whoami")
        return str((out or {}).get("user_id", ""))

    def sync(self, since: str | None, rooms: list[str]) -> Page:
        """Messages in ``rooms`` since ``since`` (None: a first sync, the newest page only)."""
        flt = {
            "presence": {"types": []},
            "account_data": {"types": []},
            "room": {
                "rooms": rooms,
                "timeline": {"limit": self.limit, "types": ["m.room.message"]},
                "state": {"types": [], "lazy_load_members": True},
                "ephemeral": {"types": []},
                "account_data": {"types": []},
            },
        }
        params = {"timeout": "0", "filter": json.dumps(flt, separators=(",", ":"))}
        if since:
            params["since"] = since
        out = self._get("/sync", params) or {}
        events: list[tuple[str, dict[str, Any]]] = []
        joined = out.get("rooms", {}).get("join", {})
        for room in rooms:
            timeline = joined.get(room, {}).get("timeline", {})
            chunk = list(timeline.get("events", []))
            if since and timeline.get("limited") and timeline.get("prev_batch"):
                chunk = self._older(room, str(timeline["prev_batch"]), since) + chunk
            events += [(room, e) for e in chunk if isinstance(e, dict)]
        return Page(events, str(out.get("next_batch") or since or ""))

    def _older(self, room: str, start: str, since: str) -> list[dict[str, Any]]:
        """The messages between ``since`` and ``start`` that a limited sync left out, oldest first."""
        found: list[dict[str, Any]] = []
        cursor = start
        for _ in range(1000):  # bounded: 1000 pages of ``limit`` messages
            params = {"dir": "b", "from": cursor, "to": since, "limit": str(self.limit)}
            params["filter"] = json.dumps({"types": ["m.room.message"]})
            out = self._get(f"/rooms/{quote(room, safe='')}/messages", params) or {}
            chunk = out.get("chunk") or []
            found = [e for e in reversed(chunk) if isinstance(e, dict)] + found
            end = out.get("end")
            if not chunk or not end or end == cursor:
                break
            cursor = str(end)
        return found

    def event(self, room: str, event_id: str) -> dict[str, Any] | None:
        """One event of ``room`` (None: not there, or not visible to the bot)."""
        out = self._get(f"/rooms/{quote(room, safe='')}/event/{quote(event_id, safe='')}")
        return out if isinstance(out, dict) else None


__all__ = ["MatrixReader", "Page"]
