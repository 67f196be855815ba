"""One canonical form per ref, so a privacy domain is decided by what a ref resolves to.

A ref is written by whoever submits, and the same object can be written many ways:
``%61lvis``, ``%2F``, ``..``, ``//``, ``file://localhost/``, ``FILE:``, a symlink. Every
check works on :class:`Canon`, never on the text as written:

* the scheme and host are lower-cased (a store's host, a Hindsight bank id, keeps its
  case: bank ids are case-sensitive); the path is percent-decoded once (an encoded
  slash is a slash, exactly as the worker reads it), and ``.``, ``..`` and repeated
  slashes are folded;
* a ``file:`` ref (or ``git+file:``) names a host-local path (no host, or
  ``localhost``); its path is resolved through every symlink (file and directory) with
  :func:`os.path.realpath`;
* ``task:N``, ``task:#N`` and ``kanboard://task/N[/…]`` name task N;
* a fragment that sets ``domain`` (``#domain=…``, ``#x=1&domain=…``, encoded or not) is
  refused: a domain is never a label on a ref.

This module decides nothing and raises :class:`BadRef` (a plain ``ValueError``); the
policy turns it into its refusal.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from fabric.kanboard.layout import is_uid
from fabric.plain import Plain

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
_TASK = re.compile(r"^(?:kanboard://task/|task:)(\d+)(?:/.*)?$", re.IGNORECASE)
_LABEL = re.compile(r"(?:^|[&;?,/\s])\s*domain\s*[=:]", re.IGNORECASE)
_TASK_HASH = re.compile(r"^(kanboard://task/|task:)#", re.IGNORECASE)  # task:#N means task:N


class BadRef(ValueError):
    """A ref with no canonical form (a domain label, another host's file, no path)."""

    def __init__(self, what: str, *, label: bool = False) -> None:
        self.label = label
        super().__init__(what)


class Canon(Plain):
    """A ref in canonical form: ``key`` is what prefixes are matched against."""

    ref: str  # as written
    scheme: str  # lower case; "" when the ref has none
    key: str  # canonical text: file:///real/path, task:N, scheme://host/folded/path
    path: Path | None = None  # a file ref's resolved path
    task_id: int | None = None  # a task ref's id

    @property
    def uid(self) -> str | None:
        """The task uid among a file path's folders (a result stored under its task)."""
        if self.path is None:
            return None
        return next((p for p in reversed(self.path.parts) if is_uid(p)), None)


def _fold(path: str) -> str:
    """``path`` percent-decoded once, with ``.``, ``..`` and repeated slashes folded."""
    raw = unquote(path)
    if not raw:
        return "/"
    folded = posixpath.normpath("/" + raw.lstrip("/"))
    return "/" if folded == "//" else folded


def _refuse_label(ref: str, fragment: str) -> None:
    # Decoded twice: a label hidden as %2564omain is still a label. A git branch that
    # merely mentions "domain" (#feature/domain-model) is not one.
    if _LABEL.search(unquote(unquote(fragment))):
        raise BadRef(
            "a ref carries no privacy domain: the '#domain=' label is refused, the domain is "
            "decided by what the ref resolves to",
            label=True,
        )


def canonical(ref: str) -> Canon:
    """``ref`` in canonical form (see the module docstring); :class:`BadRef` if it has none."""
    text = _TASK_HASH.sub(r"\1", ref.strip(), count=1)
    head, sep, fragment = text.partition("#")
    if sep:
        _refuse_label(text, fragment)
    m = _SCHEME.match(head)
    scheme = m.group(1).lower() if m else ""
    task = _TASK.match(unquote(head))
    if task:
        n = int(task.group(1))
        return Canon(ref, scheme, f"task:{n}", task_id=n)
    if scheme == "file" or scheme.endswith("+file"):  # git+file:// is a local path too
        return _file(ref, head[len(scheme) - 4 :] if scheme != "file" else head)
    if not scheme:
        return Canon(ref, "", head)
    parts = urlsplit(head)
    host = unquote(parts.netloc or "")
    # A store's host is an id it compares case-sensitively (a Hindsight bank: Adolf-Upper
    # is not adolf-upper); a network host's case means nothing.
    host = host if scheme in STORE_SCHEMES else host.lower()
    if "/" in host or "\\" in host:
        # An encoded slash would move part of the host into the path the rules match.
        raise BadRef(f"a ref's host may not contain a slash ({parts.netloc})")
    return Canon(ref, scheme, f"{scheme}://{host}{_fold(parts.path)}")


def _file(ref: str, head: str) -> Canon:
    parts = urlsplit(head)
    if parts.netloc.lower() not in ("", "localhost"):
        raise BadRef(f"file refs on another host ({parts.netloc}) are not readable here")
    raw = unquote(parts.path)
    if not raw.startswith("/"):
        raise BadRef("a file ref needs an absolute path (file:///absolute/path)")
    if "\x00" in raw:
        raise BadRef("a file ref may not contain a NUL byte")
    real = Path(os.path.realpath(raw))
    return Canon(ref, "file", "file://" + real.as_posix(), path=real)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ::1)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Schemes of the household's own context stores (a Hindsight bank): like a loopback
#: URL, what they hold belongs to whoever a rule names, and to nobody visible without one.
STORE_SCHEMES = frozenset({"hindsight"})


def local_service(key: str) -> bool:
    """Whether canonical ``key`` is an http(s) URL on this machine or a ref into one of the
    :data:`STORE_SCHEMES`: a service of the household's own (a memory bank, the board),
    whose owner only a rule can name."""
    parts = urlsplit(key)
    if parts.scheme in STORE_SCHEMES:
        return True
    return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "")


def canonical_prefix(prefix: str) -> str:
    """A configured prefix in the same form as :attr:`Canon.key` (a file prefix resolved
    through its symlinks; a trailing slash kept, so ``/a/b/`` never matches ``/a/bc``)."""
    c = canonical(prefix)
    if c.task_id is not None:
        return c.key
    slash = "/" if prefix.rstrip().endswith("/") or c.path is not None else ""
    return c.key.rstrip("/") + slash


def under(key: str, prefix: str) -> bool:
    """Whether canonical ``key`` lies under canonical ``prefix`` (whole path segments)."""
    if prefix.endswith("/"):
        return key == prefix.rstrip("/") or key.startswith(prefix)
    return key.startswith(prefix)


__all__ = [
    "STORE_SCHEMES",
    "BadRef",
    "Canon",
    "canonical",
    "canonical_prefix",
    "is_loopback",
    "local_service",
    "under",
]
