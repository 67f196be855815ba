"""Notification channels: how the keeper reaches a human at once.

A :class:`Channel` sends one message. :class:`WebhookNotifier` POSTs JSON to a URL with a
bearer token from the environment variable the human's card names; :class:`MatrixNotifier`
(:mod:`keeper.matrix`) sends to a Matrix room. A Matrix channel whose settings are missing
is skipped with a log line.

Webhook targets on loopback, private or link-local addresses are refused unless they are
inside a configured allow-list (``AGAP_KEEPER_NOTIFY_ALLOW``, CIDRs): a card must not be
able to make the keeper probe the LAN.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import requests

from fabric.cards import Card, CardSet
from fabric.cards import WebhookChannel as WebhookSpec
from fabric.errors import ConfigError, FabricError
from fabric.people import find_person
from fabric.settings import registry
from fabric.signals import stop_requested
from keeper.matrix import MatrixNotifier, Notice

log = logging.getLogger("agap.keeper.notify")


class NotifyError(Exception):
    """A notification could not be delivered."""


class Channel(Protocol):
    """Somewhere a human reads urgent messages."""

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
        """Deliver one message; ``url`` opens the card in Kanboard (when the board has a web
        address); ``key`` names the notice (a retry or a repeat of it carries the same key);
        ``about`` is the task as it stands, when a reply may answer it."""
        ...


def _networks(allow: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for text in allow:
        try:
            nets.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ConfigError(f"not an address or CIDR: {text!r}", where="AGAP_KEEPER_NOTIFY_ALLOW") from None
    return nets


def check_target(url: str, allow: Iterable[str], resolve: Callable[[str], list[str]] | None = None) -> None:
    """Refuse a URL whose host resolves to a non-public address outside ``allow``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotifyError(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    addrs = (resolve or _resolve)(host)
    nets = _networks(allow)
    for a in addrs:
        ip = ipaddress.ip_address(a)
        if ip.is_global:
            continue
        if not any(ip in n for n in nets if n.version == ip.version):
            raise NotifyError(
                f"webhook target {host} ({ip}) is a private address; allow it with AGAP_KEEPER_NOTIFY_ALLOW"
            )


def _resolve(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError as exc:
        raise NotifyError(f"cannot resolve {host}: {exc}") from exc


@dataclass
class WebhookNotifier:
    """POST ``{subject, body, urgent, ref, url, sent_at}`` as JSON (``url``: the card in
    Kanboard), retried with bounded backoff."""

    url: str
    token: str = field(default="", repr=False)
    allow: tuple[str, ...] = ()
    attempts: int = 4
    timeout: float = 5.0
    backoff: float = 0.2
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

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
        check_target(self.url, self.allow)
        payload = {
            "subject": subject,
            "body": body,
            "urgent": urgent,
            "ref": ref,
            "url": url,
            "key": key,  # the same for a repeat of the same notice: the receiver's dedup key
            "sent_at": self.clock(),
        }
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        last = ""
        for attempt in range(self.attempts):
            try:
                resp = requests.post(
                    self.url,
                    data=json.dumps(payload),
                    headers=headers,
                    timeout=self.timeout,
                    allow_redirects=False,
                )
                if 200 <= resp.status_code < 300:
                    return
                last = f"HTTP {resp.status_code}"
                if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
                    break  # the receiver refuses: retrying will not help
            except requests.RequestException as exc:
                last = type(exc).__name__
            if attempt + 1 >= self.attempts or stop_requested():
                break  # the last try, or the keeper is stopping: no retry (bounded stop)
            self.sleep(min(5.0, self.backoff * 2**attempt) * random.uniform(0.8, 1.2))
        raise NotifyError(f"webhook {urlsplit(self.url).hostname} failed: {last}")


@dataclass
class Notifier:
    """Sends to every channel on a human's card; failures are counted, never raised."""

    cards: CardSet
    allow: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    sent: int = 0
    failed: int = 0
    outbox: list[tuple[str, str, bool, str | None]] = field(default_factory=list)
    _said: set[str] = field(default_factory=set)

    def _say_once(self, line: str) -> None:
        """A channel that cannot work is said once per keeper, as a warning where someone
        can act on it; under ``agap up`` (the demo household's example channels) as INFO."""
        if line in self._said:
            return
        self._said.add(line)
        log.log(
            logging.INFO if registry.get_bool("AGAP_SUPERVISED", self.env) else logging.WARNING, "%s", line
        )

    def channels(self, card: Card) -> list[Channel]:
        env = registry.environ(self.env)
        out: list[Channel] = []
        for spec in card.human.channels if card.human else []:
            if isinstance(spec, WebhookSpec):
                token = registry.named(spec.token_env, env) if spec.token_env else ""
                out.append(WebhookNotifier(str(spec.url), token, allow=self.allow))
            else:
                try:
                    out.append(MatrixNotifier.from_spec(spec, env))
                except ConfigError as exc:
                    self._say_once(f"{card.id}: matrix channel skipped: {exc.line()}")
        return out

    def notify(
        self,
        human: str,
        subject: str,
        body: str,
        *,
        urgent: bool,
        ref: str | None = None,
        url: str | None = None,
        key: str | None = None,
        about: Notice | None = None,
    ) -> bool:
        """Send to ``human`` (a card id or username); True if any channel took it. ``url``
        is the card's page in Kanboard, so the message opens it in one click; ``key`` names
        the notice (its repeats are deduplicated), ``about`` makes a Matrix reply an answer."""
        card = find_person(self.cards, human)
        if card is None:
            log.warning("no human card for %r: notification %r dropped", human, subject)
            self.failed += 1
            return False
        self.outbox.append((card.id, subject, urgent, ref))
        ok = False
        for ch in self.channels(card):
            try:
                ch.send(subject, body, urgent=urgent, ref=ref, url=url, key=key, about=about)
                ok = True
            except (NotifyError, FabricError) as exc:
                self._say_once(f"notify {card.id}: {exc}")
        if ok:
            self.sent += 1
        else:
            self.failed += 1
        return ok
