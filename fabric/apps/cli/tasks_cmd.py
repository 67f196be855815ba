"""Task commands: init, submit, show, ls, and the ledger's transitions.

Every command prints a short human form by default and one JSON document with
``--json``. Transitions by workers (claim, heartbeat, complete, fail, ask) name the
lease they act under with ``--epoch`` and ``--owner`` so that external runtimes (a
Claude Code loop, OpenClaw) follow the same fencing rules as the built-in workers.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click

from fabric.apps.cli import main
from fabric.apps.cli.params import TASK
from fabric.apps.leasing import RESULT_FILE_BYTES
from fabric.apps.signin import check_may_answer, gesture_actor
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.errors import FabricError, InvalidInput
from fabric.events.attach import attach_submitter
from fabric.kanboard.bootstrap import InitReport, init_board, load_layout, save_layout_cache
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import LAYOUT_VERSION
from fabric.kanboard.migrate import migrate
from fabric.kanboard.taskboard import TaskView
from fabric.kanboard.weblinks import WebLinks, links_for
from fabric.ledger import APPROVAL_REF
from fabric.results import read_result
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.submit import INTENT_HELP, SUBMIT_OPTIONS
from fabric.task import PRIORITY_NAMES, State
from keeper.acts import waits_on


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
    """Create or adopt the fabric's projects, columns, swimlanes and members (idempotent).

    A new person's Kanboard user gets the password in AGAP_PASSWORD_<USER>, or a one-time
    one printed here once; lanes nobody uses are hidden.
    """
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
        "sign_in": _sign_in(report),
    }
    text = (
        "board already in shape: nothing changed"
        if not report.created
        else "created: " + ", ".join(report.created)
    )
    _emit(data, as_json, text + _sign_in_text(report, links_for(url, settings.web_url)))


# Kanboard 1.2.53's own words: the avatar menu's "Users management", then the user, then
# "Change password" (an administrator's page; there is no API for it).
CHANGE_PASSWORD = "Users management > {user} > Change password"


def _sign_in(report: InitReport) -> dict[str, dict[str, str]]:
    """How each new person signs in (a one-time password is in here once, and nowhere else)."""
    out: dict[str, dict[str, str]] = {
        u: {"password": p, "kind": "one-time"} for u, p in report.one_time.items()
    }
    out.update({u: {"password_from": v} for u, v in report.password_from.items()})
    out.update({u: {"password_not_set": CHANGE_PASSWORD.format(user=u)} for u in report.password_not_set})
    return out


def _sign_in_text(report: InitReport, links: WebLinks | None) -> str:
    where = f" at {links.base}" if links else ""
    lines = []
    if report.one_time:
        lines.append(f"New people sign in to Kanboard{where} with these one-time passwords, shown once")
        lines.append(
            "and kept nowhere (an admin changes them in Kanboard: "
            + CHANGE_PASSWORD.format(user="the person")
            + "):"
        )
        lines += [f"  {user}  {password}" for user, password in sorted(report.one_time.items())]
    for user, var in sorted(report.password_from.items()):
        lines.append(f"{user} signs in to Kanboard{where} with the password in {var}.")
    for user in report.password_not_set:
        lines.append(
            f"{user} already had a Kanboard user, whose password Kanboard's API cannot change: an "
            f"admin sets it in Kanboard ({CHANGE_PASSWORD.format(user=user)})."
        )
    if lines:
        lines.append(
            "At a shell or an MCP client a person signs in as the same user: AGAP_USER=<username> "
            "and AGAP_USER_PASSWORD=<password or personal API token> (docs/HOUSEHOLD.md)."
        )
    return "".join(f"\n{line}" for line in lines)


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
    m = migrate(port, layout, secret=token, force=force)
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


def submit_options(fn: Any) -> Any:
    """``agap submit``'s options, made from the one declaration (fabric.submit.SUBMIT_OPTIONS)."""
    for opt in reversed(SUBMIT_OPTIONS):
        if opt.kind is list:
            fn = click.option(opt.cli_flag, opt.name, multiple=True, help=opt.help)(fn)
        elif opt.name == "parent":  # a task, named as every command names one
            fn = click.option(opt.cli_flag, opt.name, type=TASK, help=opt.help)(fn)
        else:
            show = opt.default is not None
            fn = click.option(
                opt.cli_flag, opt.name, type=opt.kind, default=opt.default, show_default=show, help=opt.help
            )(fn)
    return fn


@main.command("submit")
@click.option("--intent", help=INTENT_HELP)
@click.option("--intent-file", help="The intent from a file, or - for stdin (long intents).")
@submit_options
@click.option(
    "--actor",
    help="Who is submitting: an agent's card id (default: the person AGAP_USER signs in, "
    "else AGAP_ACTOR, else 'cli'); a person submits signed in as themselves.",
)
@click.option("--json", "as_json", is_flag=True)
def submit_cmd(
    intent: str | None, intent_file: str | None, actor: str | None, as_json: bool, **options: Any
) -> None:
    """Submit a task and print its ref at once."""
    intent = _intent_input(intent, intent_file)
    if actor is not None and not actor.strip():
        raise InvalidInput("the actor is empty", where="--actor", hint="name who submits, or leave it out")
    check_file_refs(options["refs"])
    fab = Fabric.connect()
    # A person's submit reaches their private domain: it is theirs only signed in as them.
    actor = gesture_actor(fab.settings, fab.cards, actor)
    attach_submitter(fab)  # publishes "submitted" (and wakes the queue) when events are on
    receipt = fab.submit(intent, actor=actor, **options)
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


def read_text_arg(name: str, where: str, *, limit: int = RESULT_FILE_BYTES) -> str:
    """The UTF-8 text of file ``name``, or of stdin for ``-``; refused when unreadable or empty."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            path = Path(name)
            if not path.is_file():
                raise InvalidInput(
                    f"{name} is not a file", where=where, hint="give a readable file, or - for stdin"
                )
            with path.open("rb") as f:
                data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {name}: {exc.strerror}", where=where) from None
    if len(data) > limit:
        raise InvalidInput(
            f"{name} is larger than {limit // 1024 // 1024} MiB",
            where=where,
            hint="store it elsewhere and pass its URI as --result-ref",
        )
    try:
        text: str = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{name} is not UTF-8 text", where=where) from None
    if not text.strip():
        raise InvalidInput(f"{name} is empty", where=where)
    return text


def _intent_input(intent: str | None, intent_file: str | None) -> str:
    if (intent is None) == (intent_file is None):
        raise InvalidInput("give exactly one of --intent or --intent-file", where="agap submit")
    if intent_file is not None:
        return read_text_arg(intent_file, "--intent-file", limit=64 * 1024)
    assert intent is not None
    if not intent.strip():
        raise InvalidInput("the intent is empty", where="--intent")
    return intent


def check_file_refs(refs: tuple[str, ...]) -> None:
    """With AGAP_REF_ROOTS set, refuse a ``file://`` ref outside those directories now.

    Workers read ``file://`` refs only under their AGAP_REF_ROOTS (and check again at
    claim); a submitter that shares their setting learns at once, before anything is
    written, instead of from a dead letter. Unset, the submitter cannot know the workers'.
    """
    if "AGAP_REF_ROOTS" not in registry.environ():
        return
    roots = [Path(r).resolve() for r in registry.get_list("AGAP_REF_ROOTS")]
    for ref in refs:
        if not ref.startswith("file://"):
            continue
        path = Path(unquote(urlsplit(ref).path)).resolve()
        if not any(path == root or path.is_relative_to(root) for root in roots):
            raise InvalidInput(
                f"{ref} is outside the directories workers may read",
                where="--ref",
                hint=f"allowed roots (AGAP_REF_ROOTS): {', '.join(map(str, roots)) or 'none'}",
            )


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


def _result_text(fab: Fabric, view: TaskView) -> str | None:
    """The task's result as the fabric stored it (None: no result, or one it did not store)."""
    cur = view.current
    if cur is None or not cur.result_ref:
        return None
    return read_result(fab.board, view.id, cur.result_ref, registry.get_str("AGAP_RESULT_DIR") or None)


@main.command("show")
@click.argument("task_id", type=TASK)
@click.option("--json", "as_json", is_flag=True)
def show_cmd(task_id: int, as_json: bool) -> None:
    """Show one task: state, epoch, owner, spec, its record history and its result."""
    fab = Fabric.connect()
    view = fab.show(task_id)
    data = view_json(view)
    result = _result_text(fab, view)
    data["result"] = result
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
    if result is not None:
        lines += ["", "Result:", *(f"  {line}" for line in result.rstrip().splitlines())]
    _emit(data, as_json, "\n".join(lines))


@main.command("result")
@click.argument("task_id", type=TASK)
@click.option("--no-pager", is_flag=True, help="Print it whole, even to a terminal.")
def result_cmd(task_id: int, no_pager: bool) -> None:
    """Print a task's result (paged on a terminal); exit 1 when it has none yet."""
    fab = Fabric.connect()
    view = fab.show(task_id)
    cur = view.current
    if cur is None or not cur.result_ref:
        state = cur.state.value if cur is not None else "not a fabric task"
        raise FabricError(
            f"task #{task_id} has no result yet ({state})",
            where=f"task #{task_id}",
            hint=f"agap watch {task_id} waits for it",
        )
    text = _result_text(fab, view)
    if text is None:
        click.echo(cur.result_ref)  # stored elsewhere (a pull request, a page): its ref
    elif no_pager or not sys.stdout.isatty():
        click.echo(text.rstrip())
    else:
        click.echo_via_pager(text)


def _parked_models(parked: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """model -> the parked queues whose worker parked for it (the state's ``models``)."""
    out: dict[str, list[str]] = {}
    for q, p in sorted(parked.items()):
        names = p.get("models")
        for m in names if isinstance(names, list) else []:
            out.setdefault(str(m), []).append(q)
    return out


@main.command("ls")
@click.option("--all", "include_closed", is_flag=True, help="Include closed tasks.")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(include_closed: bool, as_json: bool) -> None:
    """List tasks per queue and column, with ages."""
    fab = Fabric.connect()
    rows = fab.listing(include_closed=include_closed)
    parked = {q: p for q, p in fab.parks.items() if p.get("parked")}
    models = _parked_models(parked)
    if as_json:
        _emit({"tasks": rows, "parked": parked, "parked_models": models}, True, "")
        return
    for m, queues in sorted(models.items()):
        click.echo(f"PARKED model {m}: queues {', '.join(queues)}")
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
# The worker-facing ones (claim, heartbeat, complete, fail, ask) are in lease_cmd.


def _record_out(rec: Any, as_json: bool, task_id: int) -> None:
    _emit(
        {"task_id": task_id, **json.loads(rec.to_meta())},
        as_json,
        f"#{task_id} {rec.state.value} (epoch {rec.epoch})",
    )


def _by(fab: Fabric) -> str:
    """Who this command's gesture is by: the person signed in, else a name that is no
    person's (fabric.apps.signin)."""
    return gesture_actor(fab.settings, fab.cards)


def _waits_on(fab: Fabric, view: TaskView) -> str | None:
    """The Kanboard username ``view`` waits on (a question or a card in a person's column)."""
    cur = view.current
    if cur is None or view.spec is None or cur.state not in (State.INPUT_REQUIRED, State.QUEUED):
        return None
    if cur.state == State.QUEUED and not cur.assignee:
        return None  # queued for an agent: nobody's to answer
    return waits_on(fab.cards, cur, view.spec)


@main.command("resume")
@click.argument("task_id", type=TASK)
@click.option("--answer", help="The answer, kept in the journal.")
@click.option("--json", "as_json", is_flag=True)
def resume_cmd(task_id: int, answer: str | None, as_json: bool) -> None:
    """Answer an input-required task: it returns to its queue."""
    fab = Fabric.connect()
    by = _by(fab)
    view = fab.ledger.read(task_id)
    # The operator (`cli`) or an agent answers under its own name; a person only what waits
    # on them (or on whom they deputise for).
    check_may_answer(fab.cards, _waits_on(fab, view), by, "answer", task_id, people_only=True)
    _record_out(fab.ledger.resume(task_id, by, answer, view=view), as_json, task_id)


@main.command("cancel")
@click.argument("task_id", type=TASK)
@click.option("--reason", default="")
@click.option("--json", "as_json", is_flag=True)
def cancel_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Cancel a task (a working owner is fenced); a dead letter is dropped."""
    fab = Fabric.connect()
    by = _by(fab)
    view = fab.ledger.read(task_id)
    if view.current is not None and view.current.state == State.DEAD:
        _record_out(fab.ledger.drop(task_id, by, reason, view=view), as_json, task_id)
        return
    # Canceling what waits on a person refuses it: a person refuses only what is theirs.
    check_may_answer(fab.cards, _waits_on(fab, view), by, "refuse", task_id, people_only=True)
    attach_submitter(fab)  # publishes "canceled" after the cancel is recorded
    _record_out(fab.ledger.cancel(task_id, by, reason, view=view), as_json, task_id)


@main.command("drop")
@click.argument("task_id", type=TASK)
@click.option("--reason", default="")
@click.option("--json", "as_json", is_flag=True)
def drop_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Give up on a dead letter for good (closed, state dropped)."""
    fab = Fabric.connect()
    _record_out(fab.ledger.drop(task_id, _by(fab), reason), as_json, task_id)


@main.command("approve")
@click.argument("task_id", type=TASK)
@click.option("--note", default="", help="Your answer or reason, kept on the card.")
@click.option("--json", "as_json", is_flag=True)
def approve_cmd(task_id: int, note: str, as_json: bool) -> None:
    """Approve a task waiting on you (a gate, a promotion, a decision, a task for you): done
    by you, as moving its card to Done in Kanboard is. You sign in as yourself (AGAP_USER,
    AGAP_USER_PASSWORD); only the person it waits on, or their deputy, approves it."""
    fab = Fabric.connect()
    by = _by(fab)
    view = fab.show(task_id)
    cur = view.current
    if cur is None or cur.state != State.QUEUED or not cur.assignee:
        state = cur.state.value if cur is not None else "not a fabric task"
        raise InvalidInput(
            f"task #{task_id} is not waiting on a person ({state})",
            where=f"task #{task_id}",
            hint="approve what waits in a person's column: agap ls shows it",
        )
    check_may_answer(fab.cards, cur.assignee, by, "approve", task_id)
    lease = fab.ledger.claim(view, by, lease_seconds=600)
    text = note.strip() or f"Approved by {by} from the command line."
    _record_out(fab.ledger.complete(lease, APPROVAL_REF, note=text), as_json, task_id)


@main.command("verify")
@click.argument("task_id", type=TASK)
@click.option("--note", default="")
@click.option("--json", "as_json", is_flag=True)
def verify_cmd(task_id: int, note: str, as_json: bool) -> None:
    """Verify a done task: it is closed (the producer may not verify its own work)."""
    fab = Fabric.connect()
    _record_out(fab.ledger.verify(task_id, _by(fab), note), as_json, task_id)


@main.command("reopen")
@click.argument("task_id", type=TASK)
@click.option("--reason", required=True)
@click.option("--json", "as_json", is_flag=True)
def reopen_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Reject a done task's result: it goes back to its queue, and the rework sees the reason."""
    if not reason.strip():
        raise InvalidInput("the reason is empty", where="--reason", hint="say what is wrong with the result")
    fab = Fabric.connect()
    _record_out(fab.ledger.reopen(task_id, _by(fab), reason), as_json, task_id)


@main.command("revive")
@click.argument("task_id", type=TASK)
@click.option("--reason", default="")
@click.option("--json", "as_json", is_flag=True)
def revive_cmd(task_id: int, reason: str, as_json: bool) -> None:
    """Give a dead-lettered task a fresh set of attempts."""
    fab = Fabric.connect()
    _record_out(fab.ledger.revive(task_id, _by(fab), reason), as_json, task_id)


__all__ = ["read_text_arg", "view_json"]
