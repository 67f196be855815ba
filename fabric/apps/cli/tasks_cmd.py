"""Task commands: init, submit, show, ls, and the ledger's transitions.

Every command prints a short human form by default and one JSON document with
``--json``. Transitions by workers (claim, heartbeat, complete, fail, ask) name the
lease they act under with ``--epoch`` and ``--owner`` so that external runtimes (a
Claude Code loop, OpenClaw) follow the same fencing rules as the built-in workers.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from typing import Any

import click

from fabric.apps.cli import main
from fabric.apps.workspace import Workspace, find_repo_ref
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.errors import EXIT_LOST, InvalidInput
from fabric.events.wiring import attach_submitter
from fabric.kanboard.bootstrap import init_board, load_layout, save_layout_cache
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import LAYOUT_VERSION, PRIORITY_NAMES, State
from fabric.kanboard.migrate import migrate
from fabric.kanboard.taskboard import TaskView
from fabric.ledger import Lease
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.submit import seal_key
from workers.queue import QueueReader


def _emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str) if as_json else text)


def _age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _ts(value: float | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


@main.command("init")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def init_cmd(as_json: bool) -> None:
    """Create or adopt the fabric's projects, columns, swimlanes and members (idempotent)."""
    settings = Settings.from_env()
    cards = load_cards(settings.cards_dir)
    url, token = settings.require_board()
    report = init_board(KanboardClient(url, token), settings, cards)
    assert report.layout is not None
    save_layout_cache(settings, report.layout)
    data = {
        "changed": report.created,
        "project_id": report.layout.project_id,
        "locks_project_id": report.layout.locks_project_id,
        "queues": sorted(report.layout.swimlanes),
        "new_users": report.new_users,
    }
    text = (
        "board already in shape: nothing changed"
        if not report.created
        else "created: " + ", ".join(report.created)
    )
    if report.new_users:
        text += (
            "\nnew Kanboard users have random passwords: set them in Kanboard "
            "(Users > Edit) before they log in"
        )
    _emit(data, as_json, text)


@main.command("migrate")
@click.option("--force", is_flag=True, help="Check every task even if the board says it is current.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def migrate_cmd(force: bool, as_json: bool) -> None:
    """Bring a board written by an older storage layout up to date (idempotent).

    `agap init` runs this too; run it alone after an upgrade, or with --force to re-check.
    """
    settings = Settings.from_env()
    url, token = settings.require_board()
    port = KanboardClient(url, token)
    layout = load_layout(port, settings)
    m = migrate(port, layout, seal_key=seal_key(token), force=force)
    data = {
        "from_version": m.from_version,
        "to_version": LAYOUT_VERSION,
        "tasks_seen": m.tasks_seen,
        "values_chunked": m.values_chunked,
        "references": m.references,
        "blocks_sealed": m.blocks_sealed,
        "unrecorded": m.unrecorded,
    }
    if m.from_version == LAYOUT_VERSION and not force:
        text = f"the board is at storage layout {LAYOUT_VERSION}: nothing to do"
    else:
        text = (
            f"storage layout {m.from_version} -> {LAYOUT_VERSION}: {m.tasks_seen} tasks "
            f"checked, {m.values_chunked} values chunked, {m.references} references "
            f"hashed, {m.blocks_sealed} spec blocks sealed"
        )
        if m.unrecorded:
            text += (
                f"; {len(m.unrecorded)} cards without fabric records left as they are "
                f"(#{', #'.join(map(str, m.unrecorded[:10]))})"
            )
    _emit(data, as_json, text)


@main.command("submit")
@click.option("--target", help="Agent id (direct target).")
@click.option("--constraints", help="Constraint set, e.g. tier>=large,cap=tools.")
@click.option("--intent", required=True, help="What to do (the first line becomes the title).")
@click.option("--ref", "refs", multiple=True, help="Context reference (URI); repeatable.")
@click.option("--priority", default="normal", show_default=True, help="low, normal, high or urgent.")
@click.option("--deadline", help="'YYYY-MM-DD HH:MM' (UTC), ISO-8601, or +2h.")
@click.option("--not-before", help="Do not start before this time (same formats).")
@click.option("--key", help="Idempotency key (action id): the same key and content make one task.")
@click.option("--parent", type=int, help="Task id of the task submitting this one.")
@click.option("--actor", help="Who is submitting (default: AGAP_ACTOR or 'cli').")
@click.option("--json", "as_json", is_flag=True)
def submit_cmd(
    target: str | None,
    constraints: str | None,
    intent: str,
    refs: tuple[str, ...],
    priority: str,
    deadline: str | None,
    not_before: str | None,
    key: str | None,
    parent: int | None,
    actor: str | None,
    as_json: bool,
) -> None:
    """Submit a task and print its ref at once."""
    if not intent.strip():
        raise InvalidInput("the intent is empty", where="--intent")
    fab = Fabric.connect()
    attach_submitter(fab)  # publishes "submitted" (and wakes the queue) when events are on
    receipt = fab.submit(
        intent,
        target=target,
        constraints=constraints,
        refs=refs,
        priority=priority,
        deadline=deadline,
        not_before=not_before,
        key=key,
        actor=actor,
        parent=parent,
    )
    data = {
        "ref": receipt.ref,
        "task_id": receipt.task_id,
        "uid": receipt.uid,
        "queue": receipt.queue,
        "created": receipt.created,
        "round_trips": fab.port.stats.trips,
    }
    text = receipt.ref if receipt.created else f"{receipt.ref} (existing task for this key)"
    _emit(data, as_json, text)


def view_json(view: TaskView) -> dict[str, Any]:
    """A task view as plain data."""
    cur = view.current
    return {
        "id": view.id,
        "uid": view.uid,
        "title": view.task.title,
        "open": view.is_open,
        "state": cur.state.value if cur else None,
        "epoch": view.epoch,
        "owner": cur.owner if cur else None,
        "lease_until": cur.lease_until if cur else None,
        "attempt": cur.attempt if cur else None,
        "result_ref": cur.result_ref if cur else None,
        "spec": json.loads(view.spec.to_meta()) if view.spec else None,
        "records": [json.loads(r.to_meta()) for _, r in sorted(view.records.items())],
        "problems": view.problems,
        "gap": vars(view.gap) if view.gap else None,
    }


@main.command("show")
@click.argument("task_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show_cmd(task_id: int, as_json: bool) -> None:
    """Show one task: state, epoch, owner, spec and its record history."""
    fab = Fabric.connect()
    view = fab.show(task_id)
    data = view_json(view)
    lines = [f"#{view.id} {view.task.title}"]
    cur = view.current
    if cur is None:
        lines.append("  no fabric records (not a fabric task, or its submit is in flight)")
    else:
        lines.append(
            f"  state {cur.state.value}, epoch {view.epoch}, attempt {cur.attempt}"
            + (f", owner {cur.owner} until {_ts(cur.lease_until)}" if cur.state == State.WORKING else "")
        )
        if cur.result_ref:
            lines.append(f"  result {cur.result_ref}")
    if view.spec:
        s = view.spec
        lines.append(
            f"  target {s.target} (queue {s.queue}), priority "
            f"{PRIORITY_NAMES.get(s.priority)}, deadline {_ts(s.deadline)}"
        )
        for ref in s.refs:
            lines.append(f"  ref {ref}")
    for epoch, rec in sorted(view.records.items()):
        lines.append(
            f"  e{epoch} {_ts(rec.at)} {rec.op:<11} -> {rec.state.value:<14} by {rec.by}"
            + (f" ({rec.reason})" if rec.reason else "")
        )
    for p in view.problems:
        lines.append(f"  problem: {p}")
    _emit(data, as_json, "\n".join(lines))


@main.command("ls")
@click.option("--all", "include_closed", is_flag=True, help="Include closed tasks.")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(include_closed: bool, as_json: bool) -> None:
    """List tasks per queue and column, with ages."""
    fab = Fabric.connect()
    rows = fab.listing(include_closed=include_closed)
    parked = {q: p for q, p in fab.parks.items() if p.get("parked")}
    if as_json:
        _emit({"tasks": rows, "parked": parked}, True, "")
        return
    for q, p in sorted(parked.items()):
        until = f" until {_ts(p.get('until'))}" if p.get("until") else ""
        click.echo(f"PARKED {q}: {p.get('reason', '?')}{until}")
    if not rows:
        click.echo("no open tasks")
        return
    queue = None
    for r in rows:
        if r["queue"] != queue:
            queue = r["queue"]
            note = " (parked)" if queue in parked else ""
            click.echo(f"{queue}:{note}")
        who = f" @{r['assignee']}" if r["assignee"] else ""
        click.echo(
            f"  #{r['id']:<5} {r['column']:<14} {PRIORITY_NAMES.get(r['priority'], '?'):<7}"
            f" age {_age(r['age_seconds']):>4}{who}  {r['title']}"
        )


# -- transitions -------------------------------------------------------------------


def default_owner(agent: str) -> str:
    """A worker identity that is unique per process: agent@host:pid."""
    return registry.get_str("AGAP_WORKER_ID") or f"{agent}@{socket.gethostname()}:{os.getpid()}"


def _lease(fab: Fabric, task_id: int, epoch: int, owner: str) -> Lease:
    return fab.ledger.held(fab.show(task_id), epoch, owner)


def _card_lease(fab: Fabric, target: str) -> float:
    return float(fab.cards.get(target).runtime.lease_seconds)


def _record_out(rec: Any, as_json: bool, task_id: int) -> None:
    _emit(
        {"task_id": task_id, **json.loads(rec.to_meta())},
        as_json,
        f"#{task_id} {rec.state.value} (epoch {rec.epoch})",
    )


@main.command("claim")
@click.option("--agent", required=True, help="The agent whose queue to claim from.")
@click.option("--owner", help="Worker identity (default agent@host:pid or AGAP_WORKER_ID).")
@click.option("--lease", "lease_seconds", type=float, help="Lease length (default: the card's).")
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
    """Claim the next due task of an agent's queue (exit 4 when there is none)."""

    fab = Fabric.connect()
    card = fab.cards.get(agent)
    owner = owner or default_owner(agent)
    lease = QueueReader(fab.board, fab.ledger, card.queue_name).claim_next(
        owner, lease_seconds=lease_seconds or card.runtime.lease_seconds
    )
    if lease is None:
        _emit({"task_id": None}, as_json, "nothing to claim")
        raise SystemExit(EXIT_LOST)
    data = {
        "task_id": lease.task_id,
        "epoch": lease.epoch,
        "owner": lease.owner,
        "lease_until": lease.lease_until,
        "attempt": lease.attempt,
        "checkpoint": lease.checkpoint,
        "spec": json.loads(lease.spec.to_meta()),
    }
    text = (
        f"#{lease.task_id} epoch {lease.epoch} owner {lease.owner} "
        f"until {_ts(lease.lease_until)}: {lease.spec.intent}"
    )
    if with_workspace and find_repo_ref(lease.spec.refs) is not None:
        root = registry.get_str("AGAP_WORKSPACE_ROOT") or str(fab.settings.state_dir)
        ws = Workspace.prepare(root, lease)
        data["workspace"] = {
            "path": str(ws.path),
            "branch": ws.state.branch,
            "resumed": bool(ws.state.remote_head),
        }
        text += f"\nworkspace {ws.path} (branch {ws.state.branch})"
    _emit(data, as_json, text)


def _lease_options(fn: Any) -> Any:
    fn = click.option("--json", "as_json", is_flag=True)(fn)
    fn = click.option("--owner", required=True, help="The owner `agap claim` printed.")(fn)
    fn = click.option("--epoch", type=int, required=True, help="The epoch `agap claim` printed.")(fn)
    return click.argument("task_id", type=int)(fn)


@main.command("heartbeat")
@_lease_options
@click.option(
    "--lease",
    "lease_seconds",
    type=float,
    help="Lease length (default: the length the task was claimed for, else the card's).",
)
def heartbeat_cmd(task_id: int, epoch: int, owner: str, as_json: bool, lease_seconds: float | None) -> None:
    """Renew a lease (exit 4 when fenced: stop working on the task)."""
    fab = Fabric.connect()
    held = _lease(fab, task_id, epoch, owner)
    if lease_seconds is None and held.lease_seconds is None:
        # A lease claimed before claims recorded their length: the card's is what claim used.
        lease_seconds = _card_lease(fab, held.spec.target)
    lease = fab.ledger.renew(held, lease_seconds=lease_seconds)
    _emit(
        {"task_id": task_id, "epoch": epoch, "lease_until": lease.lease_until},
        as_json,
        f"#{task_id} lease renewed until {_ts(lease.lease_until)}",
    )


@main.command("complete")
@_lease_options
@click.option("--result-ref", required=True, help="Where the result is (a URI).")
@click.option("--note", help="A short note for the journal.")
def complete_cmd(
    task_id: int, epoch: int, owner: str, as_json: bool, result_ref: str, note: str | None
) -> None:
    """Report a task done (unverified) with its result reference."""
    fab = Fabric.connect()
    _record_out(
        fab.ledger.complete(_lease(fab, task_id, epoch, owner), result_ref, note=note), as_json, task_id
    )


@main.command("fail")
@_lease_options
@click.option("--reason", required=True)
@click.option("--poison", is_flag=True, help="Never retry: straight to dead letter.")
def fail_cmd(task_id: int, epoch: int, owner: str, as_json: bool, reason: str, poison: bool) -> None:
    """Report a failed attempt (retried with backoff, or dead-lettered)."""
    fab = Fabric.connect()
    lease = _lease(fab, task_id, epoch, owner)
    card = fab.cards.get(lease.spec.target)
    _record_out(
        fab.ledger.fail(lease, reason, poison=poison, backoff_base=card.runtime.backoff_seconds),
        as_json,
        task_id,
    )


@main.command("ask")
@_lease_options
@click.option("--question", required=True)
@click.option("--human", help="Kanboard username to ask (default: the first human card).")
def ask_cmd(task_id: int, epoch: int, owner: str, as_json: bool, question: str, human: str | None) -> None:
    """Ask a human: the task waits in their inbox (input required)."""
    fab = Fabric.connect()
    if human is None:
        humans = fab.cards.humans()
        if not humans or humans[0].human is None:
            raise InvalidInput("no human card to ask", where="--human")
        human = humans[0].human.username
    _record_out(fab.ledger.ask(_lease(fab, task_id, epoch, owner), question, human), as_json, task_id)


def _by() -> str:
    return registry.get_str("AGAP_ACTOR")


@main.command("resume")
@click.argument("task_id", type=int)
@click.option("--answer", help="The answer, kept in the journal.")
@click.option("--json", "as_json", is_flag=True)
def resume_cmd(task_id: int, answer: str | None, as_json: bool) -> None:
    """Answer an input-required task: it returns to its queue."""
    fab = Fabric.connect()
    _record_out(fab.ledger.resume(task_id, _by(), answer), as_json, task_id)


@main.command("cancel")
@click.argument("task_id", type=int)
@click.option("--reason", default="")
@click.option("--json", "as_json", is_flag=True)
def cancel_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Cancel a task (a working owner is fenced)."""
    fab = Fabric.connect()
    attach_submitter(fab)  # publishes "canceled" after the cancel is recorded
    _record_out(fab.ledger.cancel(task_id, _by(), reason), as_json, task_id)


@main.command("verify")
@click.argument("task_id", type=int)
@click.option("--note", default="")
@click.option("--json", "as_json", is_flag=True)
def verify_cmd(task_id: int, note: str, as_json: bool) -> None:
    """Verify a done task: it is closed (the producer may not verify its own work)."""
    fab = Fabric.connect()
    _record_out(fab.ledger.verify(task_id, _by(), note), as_json, task_id)


@main.command("reopen")
@click.argument("task_id", type=int)
@click.option("--reason", required=True)
@click.option("--json", "as_json", is_flag=True)
def reopen_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Reject a done task's result: it returns to its queue."""
    fab = Fabric.connect()
    _record_out(fab.ledger.reopen(task_id, _by(), reason), as_json, task_id)


@main.command("revive")
@click.argument("task_id", type=int)
@click.option("--reason", default="")
@click.option("--json", "as_json", is_flag=True)
def revive_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Give a dead-lettered task a fresh set of attempts."""
    fab = Fabric.connect()
    _record_out(fab.ledger.revive(task_id, _by(), reason), as_json, task_id)


__all__ = ["default_owner", "view_json"]
