"""The part of a card a person reads: what is asked of them, how to answer, and links.

Kanboard renders a description as Markdown with HTML escaped (Parsedown in safe mode), so
a card carries no HTML at all. From the top:

* **what is asked**, on every card that waits on a person (a task for them, a gate, a
  decision, a question, a result to verify, a dead letter), with the exact gestures in
  Kanboard's UI that answer it: drag the card to a column, or **Close this task**;
* the intent as written;
* the result as a link that opens the attachment in Kanboard's file viewer;
* the refs as links (a task's page, a web address; a path as code: browsers do not open
  ``file://`` from a web page);
* the routing facts and provenance.

The machine-readable spec follows as a Markdown reference definition, which Markdown
never shows (:mod:`fabric.kanboard.card` writes and reads it). The gestures a card offers
are the gesture table's (:mod:`fabric.kanboard.gestures`). This module only makes text:
a pure function of the spec, the record and the links.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from fabric.kanboard.gestures import CLOSE, offers
from fabric.kanboard.weblinks import WebLinks
from fabric.task import GATE_ACTOR, KEEPER_ACTOR, PRIORITY_NAMES, PROMOTE_ACTOR, Record, State, TaskSpec

_TASK_REF = re.compile(r"^(?:kanboard://task/|task:)#?(\d+)/?$")
_FILE_REF = re.compile(r"^kanboard://task/(\d+)/file/([^/]+)$")
_RESULT_LINK = re.compile(r"^\*\*Result:\*\* \[[^\]\n]*\]\((\S+)\) \(`([^`\n]+)`\)$", re.M)
# The cards that ask a person to approve something: closing one refuses it.
APPROVALS = frozenset({GATE_ACTOR, PROMOTE_ACTOR})


def _who(name: str | None) -> str:
    return f"@{name}" if name else "you"


def _gestures(spec: TaskSpec, state: State, *, waiting: bool) -> list[str]:
    """The gestures that answer this card, as bullets (from the gesture table)."""
    return [f"- {line}" for line in offers(state, waiting=waiting, approval=spec.actor in APPROVALS)]


def _for_person(spec: TaskSpec, assignee: str | None) -> list[str]:
    who = _who(assignee)
    if spec.actor == KEEPER_ACTOR and spec.refs:
        return [
            f"**Waiting on {who}: a decision.** The options are below: act on the task they "
            f"name, then write what you decided as a comment and {CLOSE}.",
        ]
    if spec.actor == KEEPER_ACTOR:
        return [f"**For {who} to read.** When you have read it, {CLOSE}."]
    head = (
        f"**Waiting on {who}: approve or refuse.**" if spec.actor in APPROVALS else f"**Waiting on {who}.**"
    )
    return [head, "", *_gestures(spec, State.QUEUED, waiting=True)]


def asked(spec: TaskSpec, record: Record | None) -> list[str]:
    """What the card asks of a person now, and the gestures that answer it ([] if nothing)."""
    if record is None:
        return []
    state, assignee = record.state, record.assignee
    if state == State.QUEUED and assignee:
        return _for_person(spec, assignee)
    if state == State.INPUT_REQUIRED:
        return [
            f"**Question for {_who(assignee)}:** {record.reason or ''}",
            "",
            *[line[2:] for line in _gestures(spec, state, waiting=False)],
        ]
    if state == State.DONE and spec.actor == GATE_ACTOR:
        return [
            "**Approved.** The request that asked for this gate passes when it cites this card. "
            f"When you no longer need it, {CLOSE}."
        ]
    if state == State.DONE:
        return [f"**Done: please verify, {_who(assignee)}.**", "", *_gestures(spec, state, waiting=False)]
    if state == State.DEAD:
        return [
            f"**Dead letter:** {record.reason or 'it gave up'}.",
            "",
            *_gestures(spec, state, waiting=False),
        ]
    return []


def ref_markdown(ref: str, links: WebLinks | None) -> str:
    """A ref as Markdown: a link a browser opens, or code for what it cannot."""
    if ref.startswith(("http://", "https://")):
        return f"[{ref}]({ref})"
    m = _TASK_REF.match(ref) or _FILE_REF.match(ref)
    if m and links is not None:
        return f"[{ref}]({links.task(int(m.group(1)))})"
    return f"`{ref}`"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def human_text(
    spec: TaskSpec,
    record: Record | None = None,
    *,
    links: WebLinks | None = None,
    result_url: str | None = None,
    assignee: str | None = None,
    asks: bool = True,
) -> list[str]:
    """The readable lines of a description (everything but the machine-readable block);
    without ``asks``, not what the card asks of a person (a view that acts otherwise)."""
    lines: list[str] = []
    ask = asked(spec, record) if record is not None else (_for_person(spec, assignee) if assignee else [])
    ask = ask if asks else []
    if ask:
        lines += [*ask, "", "---", ""]
    lines += [spec.intent, ""]
    result_ref = record.result_ref if record is not None else None
    if result_ref and result_ref.startswith(("kanboard://", "http://", "https://", "file:", "task:")):
        name = result_ref.rsplit("/", 1)[-1]
        shown = f"[{name}]({result_url}) (`{result_ref}`)" if result_url else ref_markdown(result_ref, links)
        lines += [f"**Result:** {shown}", ""]
    if spec.refs:
        lines += ["**Context**", *(f"- {ref_markdown(r, links)}" for r in spec.refs), ""]
    lines.append("**Constraints:** " + "; ".join(_facts(spec)))
    prov = f"submitted by `{spec.actor}` at {_when(spec.submitted_at)}"
    if spec.action_id:
        prov += f", action id `{spec.action_id}`"
    if spec.parent:
        prov += f", child of task uid `{spec.parent}` (depth {len(spec.ancestry)})"
    lines += [f"**Provenance:** {prov}", ""]
    return lines


def _facts(spec: TaskSpec) -> list[str]:
    facts = [
        f"target `{spec.target}` (queue `{spec.queue}`)",
        f"priority {PRIORITY_NAMES.get(spec.priority, spec.priority)}",
    ]
    if spec.deadline:
        facts.append(f"deadline {_when(spec.deadline)}")
    if spec.not_before:
        facts.append(f"not before {_when(spec.not_before)}")
    if spec.constraints:
        facts.append("constraints " + ", ".join(f"{k}={v}" for k, v in sorted(spec.constraints.items())))
    return facts


def result_link_in(text: str, result_ref: str) -> str | None:
    """The link a description already gives ``result_ref`` (a later rewrite keeps it: the
    attachment's file id is known only to the process that attached it)."""
    for m in _RESULT_LINK.finditer(text or ""):
        if m.group(2) == result_ref:
            return m.group(1)
    return None


def result_file(result_ref: str, task_id: int) -> str | None:
    """The name of the task's own attachment ``result_ref`` names (``kanboard://task/<id>/
    file/<name>``), or None for any other ref."""
    m = _FILE_REF.match(result_ref)
    return m.group(2) if m and int(m.group(1)) == task_id else None


def shows(spec: TaskSpec, record: Record, text: str) -> bool:
    """Whether a description already shows what ``record`` asks of a person (at its top)
    and the result it names. False for a card whose writer could not rewrite it (a
    confined agent's worker has no seal key): the keeper redraws those."""
    ask = asked(spec, record)
    if ask and not (text or "").startswith("\n".join(ask)):
        return False
    ref = record.result_ref
    lines = (text or "").splitlines()
    return not ref or any(line.startswith("**Result:** ") and ref in line for line in lines)


def needs_rewrite(spec: TaskSpec, before: Record | None, after: Record) -> bool:
    """Whether a transition changes what the card asks (so its description is rewritten)."""
    return asked(spec, before) != asked(spec, after) or (
        after.result_ref is not None and (before is None or before.result_ref != after.result_ref)
    )
