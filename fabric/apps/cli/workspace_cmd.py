"""``agap workspace``: per-task workspaces for coding runtimes that drain a queue from the shell.

An external runtime (a Claude Code loop) claims a task with ``agap claim``, then::

    agap workspace prepare 12 --epoch 1 --owner loop-1         # prints the directory
    … edit, test …
    agap workspace checkpoint 12 --epoch 1 --owner loop-1 -m "parser done"
    agap workspace finish 12 --epoch 1 --owner loop-1 --title "Fix the parser" --complete

Every command acts under the lease it names, like ``agap heartbeat``: a fenced owner gets
exit 4 before anything is pushed. Workspaces live under ``--root`` (``AGAP_WORKSPACE_ROOT``,
default ``AGAP_STATE_DIR``). The forge is ``AGAP_FORGE_URL`` (a Gitea base URL; for an
``https`` repository its host is the default) with the token in ``GITEA_TOKEN``.
See docs/WORKSPACES.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from fabric.apps.cli import main
from fabric.apps.cli.params import TASK
from fabric.apps.forge import GiteaForge
from fabric.apps.workspace import RepoRef, Workspace
from fabric.core import Fabric
from fabric.errors import ConfigError, InvalidInput
from fabric.ledger import Lease
from fabric.settings import registry

PR_EFFECT = "pull_request"


def _emit(data: dict[str, Any], as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def _root(root: Path | None, fab: Fabric) -> Path:
    if root is not None:
        return root
    return registry.get_path("AGAP_WORKSPACE_ROOT", fallback=fab.settings.state_dir)


def _held(fab: Fabric, task_id: int, epoch: int, owner: str) -> Lease:
    """The lease (epoch, owner) on the task, checked against its record and against fencing."""
    lease = fab.ledger.held(fab.show(task_id), epoch, owner)
    fab.ledger.check(lease)  # exit 4 when a later epoch exists
    return lease


def _options(fn: Any) -> Any:
    fn = click.option("--json", "as_json", is_flag=True)(fn)
    fn = click.option(
        "--root",
        type=click.Path(file_okay=False, path_type=Path),
        help="Where workspaces/ lives (AGAP_WORKSPACE_ROOT, else AGAP_STATE_DIR).",
    )(fn)
    fn = click.option("--owner", required=True, help="The owner `agap claim` printed.")(fn)
    fn = click.option("--epoch", type=int, required=True, help="The epoch `agap claim` printed.")(fn)
    return click.argument("task_id", type=TASK)(fn)


@main.group("workspace")
def workspace() -> None:
    """Per-task workspaces: a fresh clone and branch per claimed coding task."""


@workspace.command("prepare")
@_options
@click.option("--repo", "repo_ref", help="git+<url>#<base> (default: the task's first git+ ref).")
def prepare_cmd(
    task_id: int, epoch: int, owner: str, root: Path | None, as_json: bool, repo_ref: str | None
) -> None:
    """Clone the task's repository onto its branch (resuming from its last pushed checkpoint)."""
    fab = Fabric.connect()
    lease = _held(fab, task_id, epoch, owner)
    ws = Workspace.prepare(_root(root, fab), lease, repo_ref)
    s = ws.state
    _emit(
        {
            "task_id": task_id,
            "path": str(ws.path),
            "branch": s.branch,
            "base": s.base,
            "resumed": bool(s.remote_head),
            "head": s.resumed_from,
        },
        as_json,
        f"{ws.path}\n# branch {s.branch} from "
        f"{'its last pushed checkpoint' if s.remote_head else s.base} ({s.resumed_from[:12]})",
    )


@workspace.command("checkpoint")
@_options
@click.option("-m", "--message", required=True, help="Commit message of the checkpoint.")
def checkpoint_cmd(
    task_id: int, epoch: int, owner: str, root: Path | None, as_json: bool, message: str
) -> None:
    """Commit and push the task branch, and record the checkpoint on the task."""
    fab = Fabric.connect()
    lease = _held(fab, task_id, epoch, owner)
    ws = Workspace.open(_root(root, fab), lease.spec.target, lease.uid)
    ref = ws.checkpoint(message)
    fab.ledger.checkpoint(lease, ref)
    _emit({"task_id": task_id, "checkpoint": ref}, as_json, ref)


def _forge(url: str | None, token_env: str, repo: RepoRef) -> GiteaForge:
    base = url or registry.get_str("AGAP_FORGE_URL")
    if not base:
        parts = urlsplit(repo.url)
        if parts.scheme not in ("http", "https"):
            raise ConfigError(
                "no forge to open the pull request on",
                where="--forge-url",
                hint="set AGAP_FORGE_URL to the Gitea base URL",
            )
        base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return GiteaForge(base, token_env)


@workspace.command("finish")
@_options
@click.option("--title", required=True, help="Pull request title.")
@click.option("--body", default="", help="Pull request description.")
@click.option("--forge-url", help="Gitea base URL (AGAP_FORGE_URL; default: the repo's host).")
@click.option(
    "--token-env",
    default="GITEA_TOKEN",
    show_default=True,
    help="Environment variable holding the forge token.",
)
@click.option(
    "--complete",
    "complete",
    is_flag=True,
    help="Also report the task done with the pull request as its result.",
)
@click.option("--keep", is_flag=True, help="Keep the workspace directory.")
def finish_cmd(
    task_id: int,
    epoch: int,
    owner: str,
    root: Path | None,
    as_json: bool,
    title: str,
    body: str,
    forge_url: str | None,
    token_env: str,
    complete: bool,
    keep: bool,
) -> None:
    """Push the branch and open its pull request (once per task), then release the workspace."""
    fab = Fabric.connect()
    lease = _held(fab, task_id, epoch, owner)
    ws = Workspace.open(_root(root, fab), lease.spec.target, lease.uid)
    effect = fab.ledger.effect(lease, PR_EFFECT)
    if effect.done and effect.receipt:
        ws.checkpoint(title)  # later work still reaches the open pull request
        url = effect.receipt
    else:
        body = body or f"Task #{task_id} ({lease.uid}), epoch {epoch}, by {owner}.\n\n{lease.spec.intent}"
        url = ws.finish(_forge(forge_url, token_env, ws.repo), title, body)
        lease = fab.ledger.effect_done(lease, effect, url)
    state = None
    if complete:
        state = fab.ledger.complete(lease, url, note=f"pull request {url}").state.value
    if not keep:
        ws.release()
    _emit({"task_id": task_id, "pull_request": url, "state": state, "released": not keep}, as_json, url)


@workspace.command("release")
@click.argument("task_id", type=TASK)
@click.option("--root", type=click.Path(file_okay=False, path_type=Path))
def release_cmd(task_id: int, root: Path | None) -> None:
    """Remove a task's workspace (pushed work stays on its branch)."""
    fab = Fabric.connect()
    view = fab.show(task_id)
    if view.uid is None or view.spec is None:
        raise InvalidInput("not a fabric task", where=f"task #{task_id}")
    Workspace.open(_root(root, fab), view.spec.target, view.uid).release()
    click.echo(f"#{task_id} workspace removed")
