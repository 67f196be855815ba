"""Context refs: the URIs a task points at, resolved to text for the prompt.

Supported (each capped at :data:`MAX_REF_BYTES`, the rest cut with a visible marker):

* ``file:///abs/path`` — only under the allow-listed roots the caller gives (the repo, a
  data dir); symlinks are followed before the check, so a link cannot escape, and the file
  is judged again as opened (its path read back from the descriptor), so a swap between
  the check and the read cannot either.
* ``kanboard://task/<id>`` and ``task:<id>`` — another task (title, description, latest
  result ref) through the ``resolve_task`` callable the caller passes in.
* ``http://`` / ``https://`` — GET, loopback hosts only (127.0.0.0/8, ::1, localhost) unless
  the host is allow-listed; redirects are not followed.
* ``memo:`` / ``drill:`` — markers for other executors; skipped (not in the prompt).
* any scheme in ``schemes`` — a :class:`SchemeReader` registered by the caller (the context
  stores: ``hindsight://`` in :mod:`workers.memory`, ``git+file://`` in :mod:`workers.gitref`;
  :func:`workers.stores.store_readers` builds them). The guard admits the ref before the
  reader runs; a reader whose ref names a local path judges what it opened again.

With a ``guard`` (:class:`fabric.domains.ReadGuard`), every ref is admitted before it is
read and every file again on the opened object (its resolved path, read back from the
descriptor): a ref into a privacy domain the reading card may not see raises
:class:`~fabric.refusals.PrivacyViolation`.

Failures are typed: :class:`UnresolvableRef` (unknown scheme, path outside the roots,
missing or binary file, 4xx, no such task: retrying cannot help → the task fails as poison)
and :class:`RefUnavailable` (the service holding the ref timed out, refused or answered
5xx: a failed attempt that may succeed later).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit

from fabric.domains import ReadGuard
from fabric.errors import FabricError
from fabric.kanboard.port import BoardError
from fabric.plain import Plain
from fabric.refcanon import is_loopback

if TYPE_CHECKING:
    import requests

__all__ = [
    "IGNORED_SCHEMES",
    "MAX_REF_BYTES",
    "ReadScope",
    "RefResolver",
    "RefUnavailable",
    "SchemeReader",
    "UnresolvableRef",
    "cap",
    "opened_path",
    "within_roots",
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


class ReadScope(Plain):
    """What a :class:`SchemeReader` reads under: the directories local refs may name, the
    byte cap, the time limit of one fetch, and the reading card's privacy guard."""

    roots: Sequence[Path]
    max_bytes: int
    timeout: float
    guard: ReadGuard | None


class SchemeReader(Protocol):
    """Turns refs of one scheme into prompt text (``None``: the ref carries no content).

    Raises :class:`UnresolvableRef` or :class:`RefUnavailable`. A reader whose ref names a
    local path must call ``scope.guard.admit_file`` on what it opened."""

    def read(self, ref: str, scope: ReadScope) -> str | None: ...


def within_roots(ref: str, real: Path, roots: Sequence[Path]) -> None:
    """Refuse ``real`` (a resolved path) unless it lies under one of ``roots``."""
    allowed = [Path(r).resolve() for r in roots]
    if not any(real == root or real.is_relative_to(root) for root in allowed):
        shown = ", ".join(str(r) for r in allowed) or "none configured"
        raise UnresolvableRef(ref, "outside the directories workers may read", hint=f"allowed roots: {shown}")


class RefResolver(Plain, frozen=False):
    """Resolves refs to text. ``roots``: directories ``file://`` refs may read from;
    ``resolve_task(id)``: text for a task ref (raise ``LookupError``/``KeyError`` for a
    missing task; a ``BoardError`` propagates, the board being away is not the ref's fault);
    ``http_hosts``: extra host names allowed besides loopback; ``session``: the HTTP session
    to use (a fresh one per fetch when None); ``guard``: the privacy check of the card
    reading (none: the roots are the only limit)."""

    roots: Sequence[Path] = ()
    resolve_task: Callable[[int], str] | None = None
    http_hosts: Sequence[str] = ()
    max_bytes: int = MAX_REF_BYTES
    http_timeout: float = 10.0
    session: requests.Session | None = field(default=None, repr=False)
    guard: ReadGuard | None = field(default=None, repr=False)
    schemes: Mapping[str, SchemeReader] = field(default_factory=dict, repr=False)

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
        if self.guard is not None:
            self.guard.admit(ref)  # before anything is read; files again once opened
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
        reader = self.schemes.get(scheme)
        if reader is not None:
            return reader.read(ref, ReadScope(self.roots, self.max_bytes, self.http_timeout, self.guard))
        if scheme in ("kanboard", "task"):
            raise UnresolvableRef(ref, "not a task ref", hint="write kanboard://task/<id> or task:<id>")
        if not scheme:
            hint = (
                "write file:///absolute/path"
                if ref.startswith("/")
                else "use file://, kanboard://task/<id>, task:<id> or http(s)://"
            )
            raise UnresolvableRef(ref, "a ref must be a URI with a scheme", hint=hint)
        stores = "".join(f", {s}://" for s in sorted(self.schemes))
        raise UnresolvableRef(
            ref,
            f"unknown scheme {scheme!r}",
            hint=f"use file://, kanboard://task/<id>, task:<id>, http(s)://{stores}",
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
        real = self._file_path(ref)
        try:
            # No symlink may be swapped in for the resolved name; a FIFO must not block.
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UnresolvableRef(ref, f"unreadable: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            opened = opened_path(ref, fd, real, st)
            self._within_roots(ref, opened)
            if not stat.S_ISREG(st.st_mode):
                raise UnresolvableRef(ref, "not a regular file")
            data, size = _read_head(ref, fd, self.max_bytes)
        finally:
            os.close(fd)
        if self.guard is not None:
            self.guard.admit_file(ref, opened, st)
        if b"\x00" in data[:8192]:
            raise UnresolvableRef(ref, "a binary file, not text")
        return cap(data, self.max_bytes, total=max(size, len(data)))

    @staticmethod
    def _file_path(ref: str) -> Path:
        """The resolved path a file ref names (every symlink followed)."""
        parts = urlsplit(ref)
        if parts.netloc.lower() not in ("", "localhost"):
            raise UnresolvableRef(ref, f"file refs on another host ({parts.netloc}) are not readable here")
        raw = unquote(parts.path)
        path = Path(raw)
        if not raw or not path.is_absolute() or "\x00" in raw:
            raise UnresolvableRef(
                ref, "a file ref needs an absolute path", hint="write file:///absolute/path"
            )
        try:
            return path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise UnresolvableRef(ref, "no such file") from None

    def _within_roots(self, ref: str, real: Path) -> None:
        within_roots(ref, real, self.roots)

    def _http(self, ref: str) -> str:
        host = (urlsplit(ref).hostname or "").lower()
        if not host:
            raise UnresolvableRef(ref, "an http ref needs a host")
        if not (is_loopback(host) or host in {h.lower() for h in self.http_hosts}):
            raise UnresolvableRef(
                ref,
                f"host {host} is not allowed",
                hint="workers fetch only loopback URLs unless the host is allow-listed",
            )
        import requests  # only a task with an http ref pays for it (a worker's memory)

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


def opened_path(ref: str, fd: int, real: Path, st: os.stat_result) -> Path:
    """Where the open descriptor really points: read back from /proc where there is one,
    else ``real`` once it is checked to be the same file (device and inode)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
    try:
        now = os.stat(real, follow_symlinks=False)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise UnresolvableRef(ref, "the file changed while it was being opened")
    return real


def _read_head(ref: str, fd: int, max_bytes: int) -> tuple[bytes, int]:
    """(the first ``max_bytes + 1`` bytes, the size) of the open file."""
    data = b""
    try:
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
        return data, max(os.fstat(fd).st_size, len(data))
    except OSError as exc:
        raise UnresolvableRef(ref, f"unreadable: {exc.strerror or exc}") from None
