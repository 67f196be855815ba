"""``git+file:///abs/repo#<rev>:<path>`` refs: one file of a local repository at a revision.

The form extends the repository refs coding tasks already carry (``git+file:///repo.git#main``,
:mod:`fabric.apps.workspace`): the URL is the repository and the fragment says what to read
from it, ``<rev>:<path>`` as ``git show`` writes it (``#main:docs/DESIGN.md``,
``#v1.2~3:README.md``, ``#3f2a9c1:notes.md``). The repository stays the URL's path, so its
privacy domain is decided like a file ref's, by the repository's resolved path
(:mod:`fabric.refcanon` folds the fragment away), and no path has to be split on ``@``.
A ref without ``:<path>`` names a repository, which is a workspace's business: it puts
nothing into the prompt.

What is read, and how:

* only repositories under the roots ``file://`` refs may read (``AGAP_REF_ROOTS``), a bare
  repository or a working tree whose ``.git`` is a directory; a ``.git`` file or link
  (another repository's objects), ``objects/info/alternates`` and ``commondir`` are
  refused, so every object read lies under the path that was judged;
* the repository directory is opened once and judged again as opened (its path read back
  from the descriptor; ``scope.guard.admit_file``), and git reads through that descriptor,
  so a repository swapped after the submit is refused, not read;
* the revision is a plain name (letters, digits, ``_ . / ~ ^ -``, not starting with ``-``,
  no ``..``, no ``@{``); the path is relative, percent-decoded once, without ``..``. The
  object name goes to ``git cat-file --batch-check`` on stdin, and the blob is read by its
  hex id: no argument git could take for an option, no shell, no user or system config;
* at most ``scope.max_bytes`` bytes are read (the rest is cut with the usual marker); a
  directory, a missing path or a binary blob is an :class:`~workers.refs.UnresolvableRef`,
  a git that does not answer in time a :class:`~workers.refs.RefUnavailable`.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fabric.gitrefs import split_git_ref
from fabric.plain import Plain
from workers.refs import ReadScope, RefUnavailable, UnresolvableRef, cap, opened_path, within_roots

if TYPE_CHECKING:
    import subprocess

__all__ = ["GitBlob", "GitFileReader", "parse_git_ref"]

_REV = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./~^-]{0,199}$")
_SHA = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_HINT = "write git+file:///absolute/repo#<rev>:<path>, e.g. git+file:///srv/git/notes.git#main:week.md"
_ENV_KEEP = ("PATH", "LANG", "TMPDIR")


class GitBlob(Plain):
    """What a git ref names: a repository path (as written, decoded), a revision, a path."""

    repo: str
    rev: str
    path: str


def parse_git_ref(ref: str) -> GitBlob | None:
    """The blob ``ref`` names, or ``None`` for a repository ref (no ``:<path>``)."""
    parts = split_git_ref(ref)
    if parts.host.lower() not in ("", "localhost"):
        raise UnresolvableRef(
            ref, f"git refs on another host ({parts.host}) are not readable here", hint=_HINT
        )
    repo = parts.path
    if not repo.startswith("/") or "\x00" in repo:
        raise UnresolvableRef(ref, "a git ref needs an absolute repository path", hint=_HINT)
    if parts.blob is None:
        return None
    rev, path = parts.blob
    if not _REV.match(rev) or ".." in rev:
        raise UnresolvableRef(ref, f"{rev!r} is not a revision this reader takes", hint=_HINT)
    segments = path.split("/")
    if (
        not path
        or path.startswith("/")
        or any(ord(c) < 32 for c in path)
        or ".." in segments
        or "" in segments
    ):
        raise UnresolvableRef(ref, f"{path!r} is not a path inside the repository", hint=_HINT)
    return GitBlob(repo, rev, path)


class GitFileReader(Plain):
    """The :class:`~workers.refs.SchemeReader` of ``git+file://`` refs."""

    git: str = "git"

    def read(self, ref: str, scope: ReadScope) -> str | None:
        blob = parse_git_ref(ref)
        if blob is None:
            return None  # a repository (a coding task's workspace), not content
        try:
            real = Path(blob.repo).resolve(strict=True)
        except (OSError, RuntimeError):
            raise UnresolvableRef(ref, "no such repository") from None
        with _opened_dir(ref, real) as (fd, opened, st):
            within_roots(ref, opened, scope.roots)
            git_dir = _git_dir(ref, fd)
            if scope.guard is not None:
                scope.guard.admit_file(ref, opened, st)
            base = f"/proc/self/fd/{fd}" if Path(f"/proc/self/fd/{fd}").exists() else str(opened)
            return self._blob(ref, blob, base if git_dir == "." else f"{base}/.git", fd, scope)

    def _blob(self, ref: str, blob: GitBlob, git_dir: str, fd: int, scope: ReadScope) -> str:
        # The object name goes on stdin: nothing the ref says reaches git's argument list.
        line = self._git(ref, git_dir, fd, ["cat-file", "--batch-check"], f"{blob.rev}:{blob.path}\n", scope)
        fields = line.decode("utf-8", "replace").split()
        if len(fields) != 3 or not _SHA.match(fields[0]):
            raise UnresolvableRef(ref, f"no {blob.path} at {blob.rev} in the repository")
        sha, kind, size = fields[0], fields[1], int(fields[2])
        if kind != "blob":
            raise UnresolvableRef(ref, f"{blob.path} at {blob.rev} is a {kind}, not a file")
        data = self._git(ref, git_dir, fd, ["cat-file", "blob", sha], "", scope, limit=scope.max_bytes + 1)
        if b"\x00" in data[:8192]:
            raise UnresolvableRef(ref, "a binary file, not text")
        return cap(data, scope.max_bytes, total=max(size, len(data)))

    def _git(
        self,
        ref: str,
        git_dir: str,
        fd: int,
        args: list[str],
        stdin: str,
        scope: ReadScope,
        *,
        limit: int = 4096,
    ) -> bytes:
        """At most ``limit`` bytes of what ``git <args>`` writes, under the scope's time limit."""
        env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
        env.update(
            GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_NO_REPLACE_OBJECTS="1", LC_ALL="C"
        )
        argv = [self.git, "--git-dir", git_dir, "-c", "core.fsmonitor=false", *args]
        import subprocess  # here: a worker that reads no git ref starts without it

        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                pass_fds=(fd,),
            )
        except OSError as exc:
            raise RefUnavailable(ref, f"cannot run git: {exc.strerror or exc}") from None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(scope.timeout, expire)
        timer.start()
        try:
            out, err = _head(proc, limit, stdin)
        finally:
            timer.cancel()
        if expired.is_set():
            raise RefUnavailable(ref, "git did not answer in time")
        if proc.returncode != 0 and not out:
            why = err.decode("utf-8", "replace").strip()[:200]
            raise UnresolvableRef(ref, f"git could not read the repository: {why}")
        return out


def _head(proc: subprocess.Popen[bytes], limit: int, stdin: str) -> tuple[bytes, bytes]:
    """The first ``limit`` bytes git writes, and its stderr; git is stopped past them."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # git exited before reading: its stderr says why
    data = b""
    while len(data) < limit and (chunk := proc.stdout.read(min(65536, limit - len(data)))):
        data += chunk
    if proc.poll() is None and len(data) >= limit:
        proc.kill()
    proc.stdout.close()
    err = b""
    if proc.stderr is not None:
        err = proc.stderr.read(4096)
        proc.stderr.close()
    proc.wait()
    return data, err


@contextmanager
def _opened_dir(ref: str, real: Path) -> Iterator[tuple[int, Path, os.stat_result]]:
    """The repository directory, opened without following a last symlink, with the path
    read back from its descriptor."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnresolvableRef(ref, f"not a readable repository: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        yield fd, opened_path(ref, fd, real, st), st
    finally:
        os.close(fd)


def _git_dir(ref: str, fd: int) -> str:
    """The git directory inside the opened repository: ``.`` (bare) or ``.git``; refused
    when its objects could come from anywhere else."""

    def lstat(name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None

    dot_git = lstat(".git")
    if dot_git is not None and not stat.S_ISDIR(dot_git.st_mode):
        raise UnresolvableRef(
            ref, "its .git is a file or a link to another repository, which is not followed"
        )
    git_dir = ".git" if dot_git is not None else "."
    head, objects = lstat(f"{git_dir}/HEAD"), lstat(f"{git_dir}/objects")
    if head is None or objects is None or not stat.S_ISDIR(objects.st_mode):
        raise UnresolvableRef(ref, "not a git repository", hint=_HINT)
    for borrowed in ("objects/info/alternates", "commondir"):
        if lstat(f"{git_dir}/{borrowed}") is not None:
            raise UnresolvableRef(ref, f"the repository borrows objects from elsewhere ({borrowed})")
    for folder in ("objects", "objects/pack"):
        if _has_link(fd, f"{git_dir}/{folder}"):
            raise UnresolvableRef(ref, f"its {folder} folder links elsewhere, which is not followed")
    return git_dir


def _has_link(fd: int, name: str) -> bool:
    """Whether folder ``name`` (relative to ``fd``, not followed) holds a symlink."""
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return False  # no such folder (an empty pack directory may be missing)
    try:
        with os.scandir(sub) as entries:
            return any(e.is_symlink() for e in entries)
    finally:
        os.close(sub)
