"""A Matrix notification channel: one ``m.room.message`` through the client-server API.

Same call shape as the keeper's channels (``send(subject, body, *, urgent, ref)``)::

    PUT {homeserver}/_matrix/client/v3/rooms/{room id, URL-encoded}/send/m.room.message/{txn}
    Authorization: Bearer <token from the env var the card's channel names in token_env>
    {"msgtype": "m.text", "body": ..., "format": "org.matrix.custom.html", "formatted_body": ...}

A notification's transaction id is derived from what it is about (its ``key``: the task,
its epoch, the duty), and kept across retries: the homeserver deduplicates by (device,
txn id), so neither a retry after a lost response nor the same notice after a restart
posts twice (Synapse keeps a device's txn ids for a day). A message about a task carries
``org.agap.notice`` (``{"task": id, "epoch": n, "state": s}``): a reply to it is an answer
(:mod:`keeper.replies`). Connection errors, timeouts, 5xx and 429 (honouring
``retry_after_ms``) are retried with bounded, jittered backoff; any other 4xx is final.
"""

from __future__ import annotations

import hashlib
import html
import json
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from fabric.cards import MatrixChannel as MatrixSpec
from fabric.errors import EXIT_UNREACHABLE, ConfigError, FabricError
from fabric.settings import registry
from fabric.signals import stop_requested


class MatrixSendError(FabricError):
    """A Matrix message could not be delivered (after the retries it deserved)."""

    exit_code = EXIT_UNREACHABLE


NOTICE = "org.agap.notice"  # the content key naming the task (and epoch) a message is about


@dataclass(frozen=True)
class Notice:
    """What a notification is about: a task as it stood (its epoch and state). A reply
    answers it only while the task still stands so; anything since makes it old."""

    task: int
    epoch: int
    state: str


def new_txn_id(key: str | None = None, room: str = "") -> str:
    """A transaction id: derived from ``key`` (the same notice, the same id), else unique
    to one message (time-ordered, with a random tail)."""
    if key:
        return "agap." + hashlib.sha256(f"{room}\n{key}".encode()).hexdigest()[:40]
    return f"agap.{time.time_ns()}.{secrets.token_hex(6)}"


@dataclass
class MatrixNotifier:
    """Posts to one Matrix room as the bot whose access token is given."""

    homeserver: str
    room: str
    token: str = field(default="", repr=False)
    attempts: int = 4
    timeout: float = 5.0
    backoff: float = 0.2  # seconds; doubled per attempt, capped at max_backoff
    max_backoff: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    session: requests.Session | None = None
    last_event_id: str | None = None  # the event id of the last message delivered

    @classmethod
    def from_spec(
        cls, spec: MatrixSpec, env: Mapping[str, str] | None = None, **kw: object
    ) -> MatrixNotifier:
        """The channel a human card describes; the token comes from ``spec.token_env``."""
        token = registry.named(spec.token_env, env)
        if not token:
            raise ConfigError(
                f"{spec.token_env} is not set",
                where=f"matrix channel {spec.room}",
                hint="export the bot's access token under that name",
            )
        return cls(str(spec.homeserver), spec.room, token, **kw)  # type: ignore[arg-type]

    def url(self, txn_id: str) -> str:
        base = self.homeserver.rstrip("/")
        return (
            f"{base}/_matrix/client/v3/rooms/{quote(self.room, safe='')}"
            f"/send/m.room.message/{quote(txn_id, safe='')}"
        )

    @staticmethod
    def content(
        subject: str,
        body: str,
        *,
        urgent: bool,
        ref: str | None,
        url: str | None = None,
        about: Notice | None = None,
    ) -> dict[str, Any]:
        """The event content: plain text, and the same as simple HTML (``url``, the card in
        Kanboard, as a link on the ref)."""
        head = ("[urgent] " if urgent else "") + subject
        tail = " ".join(x for x in (ref, url) if x)
        text = head + (f"\n\n{body}" if body else "") + (f"\n\n{tail}" if tail else "")
        parts = [f"<b>{html.escape(head)}</b>"]
        if body:
            parts.append(html.escape(body).replace("\n", "<br>"))
        if url:
            label = html.escape(ref or "open the card")
            parts.append(f'<a href="{html.escape(url, quote=True)}">{label}</a>')
        elif ref:
            parts.append(f"<code>{html.escape(ref)}</code>")
        out: dict[str, Any] = {
            "msgtype": "m.text",
            "body": text,
            "format": "org.matrix.custom.html",
            "formatted_body": "<br><br>".join(parts),
        }
        if about is not None:
            out[NOTICE] = {"task": about.task, "epoch": about.epoch, "state": about.state}
        return out

    def send(
        self,
        subject: str,
        body: str,
        *,
        urgent: bool,
        ref: str | None,
        url: str | None = None,
        key: str | None = None,
        about: Notice | None = None,
    ) -> None:
        """Post one message (its event id goes to ``last_event_id``); raises
        :class:`MatrixSendError` when it cannot be delivered. ``key`` names the notice
        (the same key, the same message: see the module doc); ``about`` (the task as it stands)
        makes a reply to it an answer."""
        content = self.content(subject, body, urgent=urgent, ref=ref, url=url, about=about)
        self.post(content, new_txn_id(key, self.room))

    def post(self, content: Mapping[str, Any], txn: str) -> None:
        """PUT one event's ``content`` with transaction id ``txn``, retried (bounded)."""
        payload = json.dumps(content)
        target = self.url(txn)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        http = self.session or requests
        last = ""
        for attempt in range(self.attempts):
            wait = min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.8, 1.2)
            try:
                resp = http.put(
                    target, data=payload, headers=headers, timeout=self.timeout, allow_redirects=False
                )
            except requests.RequestException as exc:
                last = type(exc).__name__
            else:
                if 200 <= resp.status_code < 300:
                    try:
                        self.last_event_id = str(resp.json().get("event_id", ""))
                    except ValueError:
                        self.last_event_id = ""
                    return
                last = f"HTTP {resp.status_code}" + _errcode(resp)
                if resp.status_code == 429:
                    wait = max(wait, min(self.max_backoff, _retry_after(resp)))
                elif 400 <= resp.status_code < 500 and resp.status_code != 408:
                    break  # refused (bad token, not in the room): retrying will not help
            if attempt + 1 >= self.attempts or stop_requested():
                break  # the last try, or the keeper is stopping: no retry (bounded stop)
            self.sleep(wait)
        raise MatrixSendError(
            f"matrix message to {self.room} failed: {last}",
            where=self.homeserver,
            hint="check the token and the bot's membership of the room",
        )


def _errcode(resp: requests.Response) -> str:
    try:
        code = resp.json().get("errcode")
    except (ValueError, AttributeError):
        return ""
    return f" {code}" if code else ""


def _retry_after(resp: requests.Response) -> float:
    try:
        return float(resp.json().get("retry_after_ms", 0)) / 1000.0
    except (ValueError, AttributeError, TypeError):
        return 0.0


__all__ = ["NOTICE", "MatrixNotifier", "MatrixSendError", "Notice", "new_txn_id"]
