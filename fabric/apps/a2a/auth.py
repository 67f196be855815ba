"""Who is calling: bearer tokens per client, checked in front of every A2A JSON-RPC call.

Tokens come from the environment, never from the repository:

* ``AGAP_A2A_TOKENS="alice-bot:<token>,cron:<token>"``, or
* ``AGAP_A2A_TOKENS_FILE=/path`` — one ``caller:token`` (or ``caller token``) a line,
  ``#`` comments and blank lines ignored.

The server refuses to start without at least one token. Tokens are compared in constant
time against every configured token (no early exit, so timing says nothing about which
prefix matched). The agent card stays public: it is what declares the bearer scheme.
Everything else answers 401 with ``WWW-Authenticate: Bearer realm="agap"`` unless a
valid token comes with it; the caller's name becomes ``request.user``, which the A2A SDK
copies into the call context (and the fabric scopes every task to it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.authentication import AuthCredentials, SimpleUser

from fabric.errors import ConfigError
from fabric.settings import registry

REALM = "agap"
MIN_TOKEN_CHARS = 16
_CALLER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class TokenTable:
    """Callers and the SHA-256 digests of their tokens (the tokens themselves are not kept)."""

    digests: tuple[tuple[str, bytes], ...] = field(repr=False)

    @property
    def callers(self) -> list[str]:
        return sorted({c for c, _ in self.digests})

    def __len__(self) -> int:
        return len(self.digests)

    def caller_for(self, token: str) -> str | None:
        """The caller owning ``token``, or None. Constant time in the matched position."""
        probe = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: str | None = None
        for caller, digest in self.digests:
            if hmac.compare_digest(probe, digest) and found is None:
                found = caller
        return found

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]], *, where: str) -> TokenTable:
        out: list[tuple[str, bytes]] = []
        seen: set[bytes] = set()
        for caller, token in pairs:
            caller, token = caller.strip(), token.strip()
            if not _CALLER.match(caller):
                raise ConfigError(
                    f"bad caller name {caller!r}",
                    where=where,
                    hint="letters, digits, '_', '.', '@', '-' (max 64)",
                )
            if len(token) < MIN_TOKEN_CHARS:
                raise ConfigError(
                    f"the token of {caller!r} is shorter than {MIN_TOKEN_CHARS} characters",
                    where=where,
                    hint="generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`",
                )
            digest = hashlib.sha256(token.encode()).digest()
            if digest in seen:
                raise ConfigError(
                    f"the token of {caller!r} is also another caller's token",
                    where=where,
                    hint="give every client its own token",
                )
            seen.add(digest)
            out.append((caller, digest))
        return cls(tuple(out))


def _split_pairs(text: str, *, where: str, sep: str) -> list[tuple[str, str]]:
    pairs = []
    for raw in re.split(sep, text):
        item = raw.strip()
        if not item or item.startswith("#"):
            continue
        caller, sep_, token = item.partition(":")
        if not sep_:
            caller, _, token = item.partition(" ")
        caller, token = caller.strip(), token.strip()
        if not caller or not token or any(c.isspace() for c in caller + token):
            raise ConfigError(
                "expected caller:token",
                where=where,
                hint="e.g. AGAP_A2A_TOKENS='alice-bot:<token>,cron:<token>'",
            )
        pairs.append((caller, token))
    return pairs


def load_tokens(env: Mapping[str, str]) -> TokenTable:
    """The token table from ``AGAP_A2A_TOKENS`` and/or ``AGAP_A2A_TOKENS_FILE``.

    Raises :class:`ConfigError` (exit code 2) when no token is configured at all: the A2A
    surface never runs unauthenticated.
    """
    pairs: list[tuple[str, str]] = []
    inline = registry.get_str("AGAP_A2A_TOKENS", env).strip()
    if inline:
        pairs += _split_pairs(inline, where="AGAP_A2A_TOKENS", sep=r"[,\n]")
    path = registry.get_str("AGAP_A2A_TOKENS_FILE", env).strip()
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read the token file: {exc.strerror}", where=f"AGAP_A2A_TOKENS_FILE={path}"
            ) from None
        pairs += _split_pairs(text, where=path, sep=r"\n")
    if not pairs:
        raise ConfigError(
            "no A2A client tokens are configured: the A2A server does not run without authentication",
            where="AGAP_A2A_TOKENS",
            hint="set AGAP_A2A_TOKENS='<caller>:<token>,...' or AGAP_A2A_TOKENS_FILE",
        )
    return TokenTable.from_pairs(pairs, where="AGAP_A2A_TOKENS")


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class BearerGate:
    """ASGI middleware: public paths pass; every other request needs a valid bearer token.

    On success the scope gets ``user`` (a Starlette ``SimpleUser`` named after the caller)
    and ``auth``; on failure the request never reaches the SDK: 401 and a challenge.
    """

    def __init__(self, app: ASGIApp, *, tokens: TokenTable, public_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.tokens = tokens
        self.public = frozenset(public_paths)
        self._user = SimpleUser
        self._creds = AuthCredentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if scope.get("method") in ("GET", "HEAD") and path in self.public:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope.get("headers") or [])
        caller = self.tokens.caller_for(token) if token else None
        if caller is None:
            await _unauthorized(send, "invalid_token" if token else None)
            return
        scope["user"] = self._user(caller)
        scope["auth"] = self._creds(["authenticated"])
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, error: str | None) -> None:
    challenge = f'Bearer realm="{REALM}"' + (f', error="{error}"' if error else "")
    body = json.dumps({"error": "unauthorized", "detail": "a valid bearer token is required"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
