"""Live-event settings, read from the environment.

``AGAP_EVENTS_URL`` turns events on; without it every hook is a no-op and the fabric
polls the board as before. The URL picks the transport::

    mqtt://127.0.0.1:1883          mqtts://broker:8883 (TLS)
    nats://127.0.0.1:4222          tls://broker:4222   (NATS over TLS)

Other variables: ``AGAP_EVENTS_SECRET`` (required: the HMAC fabric secret, 16+
characters), ``AGAP_EVENTS_PREFIX`` (topic prefix, default ``agap``),
``AGAP_EVENTS_USERNAME``/``AGAP_EVENTS_PASSWORD``, ``AGAP_EVENTS_TLS=1``,
``AGAP_EVENTS_CA``/``AGAP_EVENTS_CERT``/``AGAP_EVENTS_KEY`` (TLS files),
``AGAP_EVENTS_JETSTREAM=0`` (NATS: plain core NATS even when JetStream is there),
``AGAP_EVENTS_WEBHOOK=127.0.0.1:8099`` and ``AGAP_EVENTS_WEBHOOK_TOKEN`` (a worker's
Kanboard webhook listener, hints only). Credentials in the URL work too but the
environment variables keep them out of process listings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import field
from typing import Literal
from urllib.parse import unquote, urlsplit

from fabric.errors import ConfigError
from fabric.plain import Plain
from fabric.settings import registry

MIN_SECRET = 16
# One to four levels, so a seed-003 subscriber's topics (python/mqtt/jobs/<id>/events) fit.
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_-]{1,64}){0,3}$")

Scheme = Literal["mqtt", "nats"]
_SCHEMES: dict[str, tuple[Scheme, bool, int]] = {
    "mqtt": ("mqtt", False, 1883),
    "tcp": ("mqtt", False, 1883),
    "mqtts": ("mqtt", True, 8883),
    "ssl": ("mqtt", True, 8883),
    "nats": ("nats", False, 4222),
    "tls": ("nats", True, 4222),
}


class EventsConfig(Plain):
    """Where events go and how they are signed."""

    scheme: Scheme
    host: str
    port: int
    secret: bytes = field(repr=False)
    prefix: str = "agap"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    jetstream: bool = True
    webhook: tuple[str, int] | None = None
    webhook_token: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The broker URL without credentials (for logs)."""
        scheme = {
            ("mqtt", False): "mqtt",
            ("mqtt", True): "mqtts",
            ("nats", False): "nats",
            ("nats", True): "tls",
        }[(self.scheme, self.tls)]
        return f"{scheme}://{self.host}:{self.port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EventsConfig | None:
        """The settings, or None when ``AGAP_EVENTS_URL`` is unset (events off)."""
        raw = registry.get_str("AGAP_EVENTS_URL", env).strip()
        if not raw:
            return None
        secret = registry.get_str("AGAP_EVENTS_SECRET", env)
        if not secret:
            raise ConfigError(
                "AGAP_EVENTS_URL is set but AGAP_EVENTS_SECRET is not: events are never "
                "published or accepted unsigned",
                where="AGAP_EVENTS_SECRET",
                hint="set AGAP_EVENTS_SECRET to the same random value (16+ characters) for "
                "workers and watchers, e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`; or unset AGAP_EVENTS_URL",
            )
        if len(secret) < MIN_SECRET:
            raise ConfigError(
                f"AGAP_EVENTS_SECRET is too short ({len(secret)} characters)",
                where="AGAP_EVENTS_SECRET",
                hint=f"use at least {MIN_SECRET} random characters",
            )
        parts = urlsplit(raw)
        if parts.scheme.lower() not in _SCHEMES:
            raise ConfigError(
                f"unsupported event broker URL scheme {parts.scheme!r}",
                where="AGAP_EVENTS_URL",
                hint="use mqtt://, mqtts://, nats:// or tls://",
            )
        scheme, tls_default, port_default = _SCHEMES[parts.scheme.lower()]
        try:
            port = parts.port or port_default
        except ValueError:
            raise ConfigError("the event broker URL has a bad port", where="AGAP_EVENTS_URL") from None
        if not parts.hostname:
            raise ConfigError("the event broker URL has no host", where="AGAP_EVENTS_URL")
        prefix = registry.get_str("AGAP_EVENTS_PREFIX", env).strip()
        if not _PREFIX.match(prefix):
            raise ConfigError(
                f"bad topic prefix {prefix!r}",
                where="AGAP_EVENTS_PREFIX",
                hint="1 to 4 levels of letters, digits, '_' and '-' (1-64 each), separated by '/'",
            )
        webhook = None
        if hook := registry.get_str("AGAP_EVENTS_WEBHOOK", env).strip():
            host, _, hport = hook.rpartition(":")
            if not host or not hport.isdigit():
                raise ConfigError(
                    f"bad webhook address {hook!r}",
                    where="AGAP_EVENTS_WEBHOOK",
                    hint="HOST:PORT, e.g. 127.0.0.1:8099",
                )
            webhook = (host, int(hport))
        return cls(
            scheme=scheme,
            host=parts.hostname,
            port=port,
            secret=secret.encode(),
            prefix=prefix,
            username=registry.get_str("AGAP_EVENTS_USERNAME", env)
            or (unquote(parts.username) if parts.username else None),
            password=registry.get_str("AGAP_EVENTS_PASSWORD", env)
            or (unquote(parts.password) if parts.password else None),
            tls=tls_default or registry.get_bool("AGAP_EVENTS_TLS", env),
            ca_file=registry.get_str("AGAP_EVENTS_CA", env) or None,
            cert_file=registry.get_str("AGAP_EVENTS_CERT", env) or None,
            key_file=registry.get_str("AGAP_EVENTS_KEY", env) or None,
            jetstream=registry.get_bool("AGAP_EVENTS_JETSTREAM", env),
            webhook=webhook,
            webhook_token=registry.get_str("AGAP_EVENTS_WEBHOOK_TOKEN", env) or None,
        )


__all__ = ["EventsConfig"]
