"""Workspace leases for coding tasks: one fresh clone and branch per task, merged only by PR.

A coding task names its repository among its refs, as a *git ref*::

    git+<clone URL>#<base branch>             git+https://gitea.example/alvis/agap.git#main
                                              git+file:///srv/git/alvis/agap.git#main
    git+<clone URL>#<branch>@<commit>         a checkpoint (what ``checkpoint`` returns)

The owner/name the forge knows the repository by is the URL path's last two segments
(``alvis/agap``). Without a fragment the base branch is ``main``.

When a worker (or an external runtime, through ``agap workspace``) claims such a task:

* :meth:`Workspace.prepare` clones the repository into
  ``<root>/workspaces/<agent>/<task uid>/`` and checks out the task's own branch
  ``agap/<task uid>-<slug of the intent>``. The branch already on the remote (the last
  pushed checkpoint, from an earlier epoch) is where a requeued task resumes; a new task
  starts from the base branch.
* :meth:`Workspace.checkpoint` commits everything and pushes the task branch.
* :meth:`Workspace.finish` pushes and opens a pull request through a :class:`Forge`
  (:class:`GiteaForge` speaks Gitea's REST API). Opening is idempotent: an open pull
  request for the same head and base is returned instead of a second one.
* :meth:`Workspace.release` removes the directory when the lease ends.

An autonomous agent never pushes anywhere but its task branch. Two independent checks
enforce it: :meth:`Workspace.push` refuses any other target before git runs, and the
workspace's own ``pre-push`` hook refuses it again inside git (belt and braces; a forge's
branch protection on ``main`` is the third, server-side, line — see docs/WORKSPACES.md).
Pushes use ``--force-with-lease`` against the remote head the workspace last saw, so two
owners of the same task can never silently overwrite each other's pushes.

The forge is :mod:`fabric.apps.forge`; container sandboxing (image, network allow-list,
resource caps, no vault) is :mod:`fabric.apps.sandbox`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fabric.apps.forge import Forge
from fabric.errors import EXIT_FAILED, EXIT_INVALID, FabricError, InvalidInput
from fabric.gitrefs import PREFIX, is_git_ref, split_git_ref
from fabric.ledger import Lease

REF_PREFIX = PREFIX
DEFAULT_BASE = "main"
BRANCH_PREFIX = "agap/"
# Never pushed to by an agent, whatever the task's base branch is.
PROTECTED = frozenset({"main", "master", "trunk", "develop", "production"})
STATE_FILE = "agap-workspace.json"  # inside .git: never committed
GIT_TIMEOUT = 300.0
_SHA = re.compile(r"^[0-9a-f]{7,64}$")
_TRANSPORTS = ("file", "https", "http", "ssh")


class WorkspaceError(FabricError):
    """A git or forge step of a workspace failed."""

    exit_code = EXIT_FAILED


class PushRefused(WorkspaceError):
    """A push to anything but the task's own branch (above all ``main``): never allowed."""

    exit_code = EXIT_INVALID


# ---------------------------------------------------------------------------------------
# Git refs


@dataclass(frozen=True)
class RepoRef:
    """A repository and a branch (and optionally a commit): a task's ``git+…`` ref."""

    url: str  # what git clones: file:///…, https://…, ssh://…
    branch: str = DEFAULT_BASE
    commit: str | None = None

    @classmethod
    def parse(cls, text: str) -> RepoRef:
        """Parse ``git+<url>#<branch>[@<commit>]``; :class:`InvalidInput` says what is wrong."""
        try:
            ref = split_git_ref(text)
        except ValueError:
            raise InvalidInput(
                f"{text!r} is not a git ref",
                where="refs",
                hint="write it as git+https://host/owner/repo.git#main",
            ) from None
        url, fragment = ref.url, ref.fragment
        if ref.scheme not in _TRANSPORTS or not ref.path.strip("/"):
            raise InvalidInput(
                f"{text!r}: cannot clone {url!r}",
                where="refs",
                hint="use git+file:///path/repo.git, git+https://… or git+ssh://…",
            )
        branch, commit = fragment or DEFAULT_BASE, None
        head, at, tail = branch.rpartition("@")
        if at and _SHA.match(tail):
            branch, commit = head, tail
        if not _valid_branch(branch):
            raise InvalidInput(f"{text!r}: {branch!r} is not a branch name", where="refs")
        return cls(url, branch, commit)

    @property
    def repo(self) -> str:
        """``owner/name`` as the forge knows it: the URL path's last two segments."""
        segments = [s for s in urlsplit(self.url).path.split("/") if s]
        name = segments[-1].removesuffix(".git")
        owner = segments[-2] if len(segments) > 1 else ""
        return f"{owner}/{name}" if owner else name

    def text(self) -> str:
        fragment = self.branch + (f"@{self.commit}" if self.commit else "")
        return f"{REF_PREFIX}{self.url}#{fragment}"


def _valid_branch(name: str) -> bool:
    return bool(name) and not (
        name.startswith(("-", "/"))
        or name.endswith(("/", ".", ".lock"))
        or ".." in name
        or "@{" in name
        or "//" in name
        or any(c in name for c in " ~^:?*[\\\x7f")
        or any(ord(c) < 32 for c in name)
    )


def find_repo_ref(refs: Iterable[str]) -> RepoRef | None:
    """The first ``git+…`` ref of a task (its repository), or None for a task without one.
    A ref to a file in a repository (``#<rev>:<path>``, context for the prompt: no branch
    has a ``:``) names no workspace."""
    for ref in refs:
        if is_git_ref(ref) and split_git_ref(ref).blob is None:
            return RepoRef.parse(ref)
    return None


def slug(text: str, limit: int = 40) -> str:
    """Lowercase ASCII words joined by ``-``, at most ``limit`` characters."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    out = ""
    for w in words:
        nxt = f"{out}-{w}" if out else w
        if len(nxt) > limit:
            break
        out = nxt
    return out or "task"


def branch_name(uid: str, intent: str) -> str:
    """The task's branch: ``agap/<uid>-<slug>`` (stable across epochs: uid and intent are)."""
    return f"{BRANCH_PREFIX}{uid}-{slug(intent.splitlines()[0] if intent else '')}"


# ---------------------------------------------------------------------------------------
# Forges


# ---------------------------------------------------------------------------------------
# The workspace


HOOK = """#!/bin/sh
# Installed by agap (fabric/workspace.py). This workspace belongs to one task: it may push
# its task branch and nothing else. Changes reach {base} only through a pull request.
allowed="refs/heads/{branch}"
while read -r local_ref local_sha remote_ref remote_sha; do
  if [ "$remote_ref" != "$allowed" ]; then
    echo "agap pre-push: refusing to push to $remote_ref; this workspace pushes only $allowed" \\
         "(merge through a pull request)" >&2
    exit 1
  fi
done
exit 0
"""


@dataclass
class WorkspaceState:
    """What a workspace remembers between commands (kept in ``.git/agap-workspace.json``)."""

    agent: str
    uid: str
    task_id: int
    epoch: int
    owner: str
    url: str
    base: str
    branch: str
    remote_head: str  # the task branch on the remote as last seen ("" = not pushed yet)
    resumed_from: str  # the commit this epoch started from
    pull_request: str = ""


Runner = Callable[..., subprocess.CompletedProcess[str]]


def workspace_path(root: str | Path, agent: str, uid: str) -> Path:
    """``<root>/workspaces/<agent>/<task uid>``."""
    for part, name in ((agent, "agent"), (uid, "task uid")):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", part):
            raise InvalidInput(f"{part!r} cannot name a workspace directory", where=name)
    # Absolute: git runs in other directories (a relative root, such as make run's default
    # state dir `var`, would clone into the wrong place).
    return Path(root).absolute() / "workspaces" / agent / uid


class Workspace:
    """One task's clone and branch. Create with :meth:`prepare`, reopen with :meth:`open`."""

    def __init__(
        self, path: Path, state: WorkspaceState, *, env: Mapping[str, str] | None = None, git: str = "git"
    ) -> None:
        self.path = path
        self.state = state
        self.env = dict(os.environ if env is None else env)
        self.git_bin = git

    # -- life cycle -----------------------------------------------------------------------

    @classmethod
    def prepare(
        cls,
        root: str | Path,
        lease: Lease,
        repo_ref: str | RepoRef | None = None,
        *,
        agent: str | None = None,
        env: Mapping[str, str] | None = None,
        git: str = "git",
    ) -> Workspace:
        """A fresh clone for ``lease`` on the task's branch, resuming from its last push.

        ``repo_ref`` defaults to the task's first ``git+…`` ref. A directory left by an
        earlier owner (a killed worker) is removed first: every lease starts clean.
        """
        ref = RepoRef.parse(repo_ref) if isinstance(repo_ref, str) else repo_ref
        if ref is None:
            ref = find_repo_ref(lease.spec.refs)
        if ref is None:
            raise InvalidInput(
                "the task names no repository",
                where=f"task #{lease.task_id}",
                hint="add a ref like git+https://gitea.example/owner/repo.git#main",
            )
        agent = agent or lease.spec.target
        path = workspace_path(root, agent, lease.uid)
        branch = branch_name(lease.uid, lease.spec.intent)
        if ref.branch == branch:
            raise InvalidInput("the base branch is the task branch", where="refs")
        if path.exists():
            _remove_tree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = WorkspaceState(
            agent=agent,
            uid=lease.uid,
            task_id=lease.task_id,
            epoch=lease.epoch,
            owner=lease.owner,
            url=ref.url,
            base=ref.branch,
            branch=branch,
            remote_head="",
            resumed_from="",
        )
        ws = cls(path, state, env=env, git=git)
        try:
            ws._clone_and_branch()
        except BaseException:
            _remove_tree(path)
            raise
        return ws

    def _clone_and_branch(self) -> None:
        s = self.state
        self._git(
            "clone",
            "--quiet",
            "--no-checkout",
            "--origin",
            "origin",
            s.url,
            str(self.path),
            cwd=self.path.parent,
        )
        remote = self._rev(f"refs/remotes/origin/{s.branch}")
        if remote:  # an earlier epoch pushed a checkpoint: resume from it
            start = remote
        else:
            start = self._rev(f"refs/remotes/origin/{s.base}")
            if not start:
                raise WorkspaceError(
                    f"branch {s.base!r} is not in {s.url}",
                    where="refs",
                    hint="name an existing base branch after '#'",
                )
        self._git("checkout", "--quiet", "-B", s.branch, start)
        s.remote_head, s.resumed_from = remote, start
        hooks = self.path / ".git" / "hooks"
        hooks.mkdir(exist_ok=True)
        hook = hooks / "pre-push"
        hook.write_text(HOOK.format(branch=s.branch, base=s.base))
        hook.chmod(0o755)
        self._git("config", "core.hooksPath", str(hooks))  # a global hooksPath must not hide it
        self._git("config", "push.default", "nothing")  # a bare `git push` pushes nothing
        if not self._git("config", "--get", "user.email", check=False).stdout.strip():
            self._git("config", "user.name", s.agent)
            self._git("config", "user.email", f"{s.agent}@agap.invalid")
        self._save()

    @classmethod
    def open(
        cls, root: str | Path, agent: str, uid: str, *, env: Mapping[str, str] | None = None, git: str = "git"
    ) -> Workspace:
        """The workspace :meth:`prepare` made for (agent, task uid)."""
        path = workspace_path(root, agent, uid)
        try:
            data = json.loads((path / ".git" / STATE_FILE).read_text())
            state = WorkspaceState(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise WorkspaceError(
                f"no workspace at {path} ({exc.__class__.__name__})",
                hint="run `agap workspace prepare` after claiming the task",
            ) from None
        return cls(path, state, env=env, git=git)

    def release(self) -> None:
        """Remove the workspace (the lease ended). Pushed work stays on the remote branch."""
        if self.path.exists():
            _remove_tree(self.path)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # the agent's directory, when it was the last one

    # -- work -----------------------------------------------------------------------------

    @property
    def branch(self) -> str:
        return self.state.branch

    @property
    def base(self) -> str:
        return self.state.base

    @property
    def repo(self) -> RepoRef:
        return RepoRef(self.state.url, self.state.base)

    def head(self) -> str:
        return self._git("rev-parse", "HEAD").stdout.strip()

    def commit(self, message: str) -> bool:
        """Commit every change in the work tree; False when there was nothing to commit."""
        self._git("add", "--all")
        if not self._git("status", "--porcelain").stdout.strip():
            return False
        self._git("commit", "--quiet", "--no-verify", "-m", message)
        return True

    def checkpoint(self, message: str) -> str:
        """Commit and push the task branch; returns the checkpoint's ref (``…#branch@sha``)."""
        self.commit(message)
        self.push()
        return RepoRef(self.state.url, self.state.branch, self.head()).text()

    def push(self, target: str | None = None) -> None:
        """Push HEAD to the task branch (``target`` must be it: anything else is refused)."""
        dest = (target or self.state.branch).removeprefix("refs/heads/")
        self.guard(dest)
        s = self.state
        head = self.head()
        if head == s.remote_head:
            return
        lease = f"--force-with-lease=refs/heads/{dest}:{s.remote_head}"
        done = self._git(
            "push", "--quiet", "--porcelain", lease, "origin", f"HEAD:refs/heads/{dest}", check=False
        )
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise WorkspaceError(
                f"push of {dest} failed: {' / '.join(why[-3:])}",
                where=str(self.path),
                hint="the branch moved on the remote (another owner?) or the "
                "remote refused it; stop if your lease is fenced",
            )
        s.remote_head = head
        self._save()

    def guard(self, dest: str) -> None:
        """Raise :class:`PushRefused` unless ``dest`` is this task's own branch."""
        dest = dest.removeprefix("refs/heads/")
        if dest in PROTECTED or dest == self.state.base:
            raise PushRefused(
                f"refusing to push to {dest!r}: an autonomous agent never pushes "
                f"to {self.state.base!r} or another protected branch",
                where=str(self.path),
                hint=f"push {self.state.branch!r} and open a pull request",
            )
        if dest != self.state.branch:
            raise PushRefused(
                f"refusing to push to {dest!r}: this workspace pushes only {self.state.branch!r}",
                where=str(self.path),
            )

    def finish(self, forge: Forge, title: str, body: str = "") -> str:
        """Commit, push, and open (or find) the pull request into the base; returns its URL."""
        self.commit(title)
        ahead = self._git("rev-list", "--count", f"refs/remotes/origin/{self.state.base}..HEAD")
        if int(ahead.stdout.strip() or 0) == 0:
            raise WorkspaceError(
                f"nothing to propose: {self.branch} has no commits beyond {self.state.base}",
                where=str(self.path),
            )
        self.push()
        url = forge.open_pull_request(self.repo.repo, self.state.branch, self.state.base, title, body)
        self.state.pull_request = url
        self._save()
        return url

    # -- helpers ----------------------------------------------------------------------------

    def _save(self) -> None:
        (self.path / ".git" / STATE_FILE).write_text(json.dumps(asdict(self.state), indent=1))

    def _rev(self, name: str) -> str:
        out = self._git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    def _git(
        self, *args: str, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
        try:
            out = subprocess.run(
                [self.git_bin, *args],
                cwd=cwd or self.path,
                env=env,
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkspaceError(f"git {args[0]} failed to run: {exc}", where=str(self.path)) from None
        if check and out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            raise WorkspaceError(f"git {args[0]} failed: {' / '.join(lines[-3:])}", where=str(self.path))
        return out


def _remove_tree(path: Path) -> None:
    def _retry(func: Callable[..., Any], p: str, _exc: Any) -> None:
        os.chmod(p, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
        func(p)

    shutil.rmtree(path, onerror=_retry)
