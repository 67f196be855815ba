"""Context refs: the URIs a task points at, resolved to text for the prompt.

Supported (each capped at :data:`MAX_REF_BYTES`, the rest cut with a visible marker):

* ``file:///abs/path`` — only under the allow-listed roots the caller gives (the repo, a
  data dir); symlinks are followed before the check, so a link cannot escape.
* ``kanboard://task/<id>`` and ``task:<id>`` — another task (title, description, latest
  result ref) through the ``resolve_task`` callable the caller passes in.
* ``http://`` / ``https://`` — GET, loopback hosts only (127.0.0.0/8, ::1, localhost) unless
  the host is allow-listed; redirects are not followed.
* ``memo:`` / ``drill:`` — markers for other executors; skipped (not in the prompt).

Failures are typed: :class:`UnresolvableRef` (unknown scheme, path outside the roots,
missing or binary file, 4xx, no such task: retrying cannot help → the task fails as poison)
and :class:`RefUnavailable` (the service holding the ref timed out, refused or answered
5xx: a failed attempt that may succeed later).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from fabric.errors import FabricError
from fabric.kanboard.port import BoardError

__all__ = [
    "IGNORED_SCHEMES",
    "MAX_REF_BYTES",
    "RefResolver",
    "RefUnavailable",
    "UnresolvableRef",
    "cap",
]

MAX_REF_BYTES = 64 * 1024
IGNORED_SCHEMES = ("memo", "drill")
_TASK_REF = re.compile(r"^(?:kanboard://task/|task:)#?(\d+)/?$")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")


class UnresolvableRef(FabricError):
    """A ref that cannot be turned into text, and will not become resolvable by retrying."""

    def __init__(self, ref: str, reason: str, *, hint: str = "") -> None:
        self.ref = ref
        self.reason = reason
        super().__init__(f"cannot resolve context ref: {reason}", where=ref, hint=hint)


class RefUnavailable(FabricError):
    """The service holding a ref did not answer (timeout, refused, 5xx): try again later."""

    def __init__(self, ref: str, reason: str) -> None:
        self.ref = ref
        self.reason = reason
        super().__init__(f"context ref unavailable: {reason}", where=ref, hint="a later attempt may succeed")


def cap(data: bytes, max_bytes: int = MAX_REF_BYTES, *, total: int | None = None, more: bool = False) -> str:
    """``data`` as text, cut to ``max_bytes`` with a marker saying how much was left out."""
    size = len(data) if total is None else total
    if len(data) <= max_bytes and not more:
        return data.decode("utf-8", errors="replace")
    head = data[:max_bytes].decode("utf-8", errors="ignore")  # never split a character
    left = f"{size - max_bytes} more bytes" if not more else "more bytes"
    return f"{head}\n[... truncated by agap: {left} not shown (cap {max_bytes} bytes) ...]"


@dataclass
class RefResolver:
    """Resolves refs to text. ``roots``: directories ``file://`` refs may read from;
    ``resolve_task(id)``: text for a task ref (raise ``LookupError``/``KeyError`` for a
    missing task; a ``BoardError`` propagates, the board being away is not the ref's fault);
    ``http_hosts``: extra host names allowed besides loopback; ``session``: the HTTP session
    to use (a fresh one per fetch when None)."""

    roots: Sequence[Path] = ()
    resolve_task: Callable[[int], str] | None = None
    http_hosts: Sequence[str] = ()
    max_bytes: int = MAX_REF_BYTES
    http_timeout: float = 10.0
    session: requests.Session | None = field(default=None, repr=False)

    def resolve_all(self, refs: Iterable[str]) -> dict[str, str]:
        """``{ref: text}`` in the given order, skipping ignored schemes and duplicates.
        The first failure raises (a prompt with a missing ref would be a wrong prompt)."""
        out: dict[str, str] = {}
        for ref in refs:
            if ref in out:
                continue
            text = self.resolve(ref)
            if text is not None:
                out[ref] = text
        return out

    def resolve(self, ref: str) -> str | None:
        """The text behind ``ref``; ``None`` for a ref of an ignored scheme."""
        ref = ref.strip()
        if not ref:
            raise UnresolvableRef(ref, "empty ref")
        task = _TASK_REF.match(ref)
        if task:
            return self._task(ref, int(task.group(1)))
        m = _SCHEME.match(ref)
        scheme = m.group(1).lower() if m else ""
        if scheme in IGNORED_SCHEMES:
            return None
        if scheme == "file":
            return self._file(ref)
        if scheme in ("http", "https"):
            return self._http(ref)
        if scheme in ("kanboard", "task"):
            raise UnresolvableRef(ref, "not a task ref", hint="write kanboard://task/<id> or task:<id>")
        if not scheme:
            hint = (
                "write file:///absolute/path"
                if ref.startswith("/")
                else "use file://, kanboard://task/<id>, task:<id> or http(s)://"
            )
            raise UnresolvableRef(ref, "a ref must be a URI with a scheme", hint=hint)
        raise UnresolvableRef(
            ref,
            f"unknown scheme {scheme!r}",
            hint="use file://, kanboard://task/<id>, task:<id> or http(s)://",
        )

    # -- schemes -------------------------------------------------------------------

    def _task(self, ref: str, task_id: int) -> str:
        if self.resolve_task is None:
            raise UnresolvableRef(ref, "this worker cannot read other tasks (no task resolver)")
        try:
            text = self.resolve_task(task_id)
        except BoardError:
            raise
        except (LookupError, ValueError, FabricError) as exc:
            raise UnresolvableRef(ref, f"task #{task_id}: {exc}") from None
        return cap(text.encode("utf-8"), self.max_bytes)

    def _file(self, ref: str) -> str:
        parts = urlsplit(ref)
        if parts.netloc not in ("", "localhost"):
            raise UnresolvableRef(ref, f"file refs on another host ({parts.netloc}) are not readable here")
        raw = unquote(parts.path)
        path = Path(raw)
        if not raw or not path.is_absolute():
            raise UnresolvableRef(
                ref, "a file ref needs an absolute path", hint="write file:///absolute/path"
            )
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise UnresolvableRef(ref, "no such file") from None
        allowed = [Path(r).resolve() for r in self.roots]
        if not any(real == root or real.is_relative_to(root) for root in allowed):
            shown = ", ".join(str(r) for r in allowed) or "none configured"
            raise UnresolvableRef(
                ref, "outside the directories workers may read", hint=f"allowed roots: {shown}"
            )
        if not real.is_file():
            raise UnresolvableRef(ref, "not a regular file")
        try:
            size = real.stat().st_size
            with real.open("rb") as fh:
                data = fh.read(self.max_bytes + 1)
        except OSError as exc:
            raise UnresolvableRef(ref, f"unreadable: {exc.strerror or exc}") from None
        if b"\x00" in data[:8192]:
            raise UnresolvableRef(ref, "a binary file, not text")
        return cap(data, self.max_bytes, total=max(size, len(data)))

    def _http(self, ref: str) -> str:
        host = (urlsplit(ref).hostname or "").lower()
        if not host:
            raise UnresolvableRef(ref, "an http ref needs a host")
        if not (_is_loopback(host) or host in {h.lower() for h in self.http_hosts}):
            raise UnresolvableRef(
                ref,
                f"host {host} is not allowed",
                hint="workers fetch only loopback URLs unless the host is allow-listed",
            )
        session = self.session or requests.Session()
        try:
            with session.get(ref, timeout=self.http_timeout, stream=True, allow_redirects=False) as resp:
                if resp.status_code >= 500:
                    raise RefUnavailable(ref, f"HTTP {resp.status_code}")
                if resp.status_code >= 300:
                    raise UnresolvableRef(ref, f"HTTP {resp.status_code}")
                data = b""
                for chunk in resp.iter_content(16384):
                    data += chunk
                    if len(data) > self.max_bytes:
                        break
        except requests.RequestException as exc:
            raise RefUnavailable(ref, f"{type(exc).__name__}") from None
        finally:
            if self.session is None:
                session.close()
        return cap(data, self.max_bytes, more=len(data) > self.max_bytes)


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
