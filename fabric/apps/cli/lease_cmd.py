"""Worker commands: the CLI contract for runtimes that drain a queue from a shell.

``claim`` → ``heartbeat`` → ``complete`` / ``fail`` / ``ask``, each naming the lease it
acts under (``--epoch``, ``--owner``), so a Claude Code loop or OpenClaw follows the same
fencing rules as the built-in workers:

- the owner defaults to ``AGAP_WORKER_ID``, else ``<agent>@<host>``: the same on every call
  from one shell, and printed by ``claim`` (two loops for one agent on one host each set
  their own ``AGAP_WORKER_ID``);
- a heartbeat keeps the length the task was claimed for;
- ``complete --result-file PATH|-`` stores the result as the built-in workers do
  (``AGAP_RESULT_STORE``: an attachment ``result-e<epoch>.md``, or a file);
- a call whose epoch has ended exits 4 and keeps what it was given on the task as
  evidence (``fabric.evidence.e<epoch>``, with a comment saying so), never as the result.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any

import click

from fabric.apps import leasing
from fabric.apps.cli import main
from fabric.apps.cli.params import TASK
from fabric.apps.cli.tasks_cmd import _emit, _record_out, _ts, read_text_arg
from fabric.apps.leasing import held_lease, person_to_ask, result_uri, under_lease
from fabric.core import Fabric
from fabric.errors import EXIT_LOST, InvalidInput
from fabric.ledger import Lease
from fabric.results import store_for
from fabric.settings import registry
from fabric.task import Record
from workers.queue import QueueReader


def default_owner(agent: str) -> str:
    """A worker identity unique per process (``agap mcp serve``): AGAP_WORKER_ID, else agent@host:pid."""
    return registry.get_str("AGAP_WORKER_ID") or f"{agent}@{socket.gethostname()}:{os.getpid()}"


def shell_owner(agent: str) -> str:
    """The owner a shell's CLI calls share: AGAP_WORKER_ID, else agent@host (stable across calls)."""
    return registry.get_str("AGAP_WORKER_ID") or f"{agent}@{socket.gethostname()}"


def positive_lease(value: float | None, where: str = "--lease") -> float | None:
    """A lease length, refused unless positive (a zero lease is fenced at once)."""
    if value is not None and not value > 0:
        raise InvalidInput(
            f"a lease of {value:g} seconds", where=where, hint="give a positive number of seconds"
        )
    return value


def _nonblank(value: str, where: str) -> str:
    if not value.strip():
        raise InvalidInput("the value is empty", where=where, hint="say what happened, in a few words")
    return value


def _conversation(lease: Lease) -> list[dict[str, str]]:
    return [{"kind": kind, "text": text} for kind, text in lease.conversation]


@main.command("claim")
@click.option("--agent", required=True, help="The agent whose queue to claim from.")
@click.option("--owner", help="Worker identity (default AGAP_WORKER_ID, else agent@host).")
@click.option("--lease", "lease_seconds", type=float, help="Lease length in seconds (default: the card's).")
@click.option(
    "--workspace",
    "with_workspace",
    is_flag=True,
    help="For a task with a git+ ref: also prepare its workspace (a fresh clone on "
    "the task's branch, resumed from its last pushed checkpoint).",
)
@click.option("--json", "as_json", is_flag=True)
def claim_cmd(
    agent: str, owner: str | None, lease_seconds: float | None, with_workspace: bool, as_json: bool
) -> None:
    """Claim the next due task of an agent's queue (exit 4 when there is none).

    It prints the owner and epoch the other commands name, and the conversation so far:
    questions asked, people's answers, and why an earlier result was sent back.
    """
    positive_lease(lease_seconds)
    fab = Fabric.connect()
    card = fab.cards.get(agent)
    owner = owner or shell_owner(agent)
    # The claim policy every claimer passes (privacy domains, the parent chain, taint).
    lease = QueueReader.for_agent(fab, card).claim_next(
        owner, lease_seconds=lease_seconds or card.runtime.lease_seconds
    )
    if lease is None:
        _emit({"task_id": None}, as_json, "nothing to claim")
        raise SystemExit(EXIT_LOST)
    data: dict[str, Any] = {
        "task_id": lease.task_id,
        "epoch": lease.epoch,
        "owner": lease.owner,
        "lease_until": lease.lease_until,
        "lease_seconds": lease.lease_seconds,
        "attempt": lease.attempt,
        "checkpoint": lease.checkpoint,
        "conversation": _conversation(lease),
        "spec": json.loads(lease.spec.to_meta()),
    }
    text = (
        f"#{lease.task_id} epoch {lease.epoch} owner {lease.owner} "
        f"until {_ts(lease.lease_until)}: {lease.spec.intent}"
    )
    text += "".join(f"\n  {kind}: {said}" for kind, said in lease.conversation)
    if with_workspace:
        text += _workspace(fab, lease, data)
    _emit(data, as_json, text)


def _workspace(fab: Fabric, lease: Lease, data: dict[str, Any]) -> str:
    """Prepare the workspace of a task with a git+ ref (``claim --workspace``)."""
    from fabric.apps.workspace import Workspace, find_repo_ref  # only claims that ask pay for git

    if find_repo_ref(lease.spec.refs) is None:
        return ""
    root = registry.get_str("AGAP_WORKSPACE_ROOT") or str(fab.settings.state_dir)
    ws = Workspace.prepare(root, lease)
    data["workspace"] = {
        "path": str(ws.path),
        "branch": ws.state.branch,
        "resumed": bool(ws.state.remote_head),
    }
    return f"\nworkspace {ws.path} (branch {ws.state.branch})"


def _lease_options(fn: Any) -> Any:
    fn = click.option("--json", "as_json", is_flag=True)(fn)
    fn = click.option("--owner", help="The owner `agap claim` printed (default: as claim's).")(fn)
    fn = click.option("--epoch", type=int, required=True, help="The epoch `agap claim` printed.")(fn)
    return click.argument("task_id", type=TASK)(fn)


def _owner(fab: Fabric, task_id: int, owner: str | None) -> str:
    """The owner a call names: --owner, else what claim printed for the task's agent."""
    if owner:
        return owner
    spec = fab.show(task_id).spec
    return shell_owner(spec.target if spec is not None else "?")


def _as_holder(
    fab: Fabric, task_id: int, epoch: int, owner: str | None, evidence: str, act: Callable[[Lease], Record]
) -> Record:
    """``act`` under the named lease; fenced, keep ``evidence`` on the task (exit 4)."""
    return under_lease(fab, task_id, epoch, _owner(fab, task_id, owner), evidence, act)


@main.command("heartbeat")
@_lease_options
@click.option(
    "--lease",
    "lease_seconds",
    type=float,
    help="Lease length in seconds (default: the length the task was claimed for, else the card's).",
)
def heartbeat_cmd(
    task_id: int, epoch: int, owner: str | None, as_json: bool, lease_seconds: float | None
) -> None:
    """Renew a lease (exit 4 when fenced: stop working on the task)."""
    positive_lease(lease_seconds)
    fab = Fabric.connect()
    held, _ = held_lease(fab, task_id, epoch, _owner(fab, task_id, owner))
    if lease_seconds is None and held.lease_seconds is None:
        # A lease claimed before claims recorded their length: the card's is what claim used.
        lease_seconds = float(fab.cards.get(held.spec.target).runtime.lease_seconds)
    lease = fab.ledger.renew(held, lease_seconds=lease_seconds)
    _emit(
        {"task_id": task_id, "epoch": epoch, "lease_until": lease.lease_until},
        as_json,
        f"#{task_id} lease renewed until {_ts(lease.lease_until)}",
    )


def _result_input(result_ref: str | None, result_file: str | None) -> tuple[str | None, str | None]:
    """(ref, text): exactly one of --result-ref and --result-file, checked before any write."""
    if (result_ref is None) == (result_file is None):
        raise InvalidInput(
            "give exactly one of --result-ref (a URI) or --result-file (a path, or - for stdin)",
            where="agap complete",
        )
    if result_ref is not None:
        return result_uri(result_ref, "--result-ref"), None
    assert result_file is not None
    return None, read_text_arg(result_file, "--result-file")


@main.command("complete")
@_lease_options
@click.option("--result-ref", help="Where the result is (a URI).")
@click.option(
    "--result-file",
    help="The result itself, from a file or - (stdin): stored as the built-in workers store theirs.",
)
@click.option("--note", help="A short note for the journal.")
def complete_cmd(
    task_id: int,
    epoch: int,
    owner: str | None,
    as_json: bool,
    result_ref: str | None,
    result_file: str | None,
    note: str | None,
) -> None:
    """Report a task done (unverified) with its result (exit 4 when fenced: kept as evidence)."""
    ref, text = _result_input(result_ref, result_file)
    fab = Fabric.connect()

    def done(lease: Lease) -> Record:
        store = store_for(
            registry.get_str("AGAP_RESULT_STORE"), fab.board, registry.get_str("AGAP_RESULT_DIR") or None
        )
        # Stored as the built-in workers store theirs; the ledger writes the done card.
        return leasing.complete(fab, lease, store, ref=ref, text=text, note=note)[0]

    evidence = f"agap complete: {ref}" if text is None else text
    evidence += f"\n\nNote: {note}" if note else ""
    _record_out(_as_holder(fab, task_id, epoch, owner, evidence, done), as_json, task_id)


@main.command("fail")
@_lease_options
@click.option("--reason", required=True)
@click.option("--poison", is_flag=True, help="Never retry: straight to dead letter.")
def fail_cmd(task_id: int, epoch: int, owner: str | None, as_json: bool, reason: str, poison: bool) -> None:
    """Report a failed attempt (retried with backoff, or dead-lettered)."""
    _nonblank(reason, "--reason")
    fab = Fabric.connect()

    def failed(lease: Lease) -> Record:
        card = fab.cards.get(lease.spec.target)
        return fab.ledger.fail(lease, reason, poison=poison, backoff_base=card.runtime.backoff_seconds)

    evidence = f"agap fail{' --poison' if poison else ''}: {reason}"
    _record_out(_as_holder(fab, task_id, epoch, owner, evidence, failed), as_json, task_id)


@main.command("ask")
@_lease_options
@click.option("--question", required=True)
@click.option(
    "--human",
    help="Kanboard username to ask (default: the submitter if a person, else the first human card).",
)
def ask_cmd(
    task_id: int, epoch: int, owner: str | None, as_json: bool, question: str, human: str | None
) -> None:
    """Ask a human: the task waits in their inbox (input required)."""
    _nonblank(question, "--question")
    fab = Fabric.connect()
    spec = fab.show(task_id).spec
    assert spec is not None  # a task without a spec holds no lease: held_lease refuses it first
    who = person_to_ask(fab.cards, human, spec, where="--human")
    evidence = f"agap ask @{who}: {question}"
    _record_out(
        _as_holder(fab, task_id, epoch, owner, evidence, lambda lease: fab.ledger.ask(lease, question, who)),
        as_json,
        task_id,
    )


__all__ = ["default_owner", "positive_lease", "shell_owner"]
