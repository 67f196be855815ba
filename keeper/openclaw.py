"""OpenClaw's "run finished" webhook: the outcome of a cron run, on the task it submitted.

OpenClaw 2026.9.6 POSTs a job's finished event to the job's webhook (``openclaw cron add
… --webhook <url>``, delivery mode ``webhook``) with ``Authorization: Bearer
<cron.webhookToken>``, when the run has a summary or failed. The event, as OpenClaw's
scheduler emits it (``action: "finished"``)::

    {"jobId": "…", "action": "finished", "status": "ok" | "error" | "skipped",
     "completionStatus": "succeeded" | "failed" | "unknown", "error": "…", "summary": "…",
     "runId": "…", "runAtMs": 1764745200000, "durationMs": 8123, "nextRunAtMs": …,
     "job": {"id": "…", "name": "morning-digest",
             "schedule": {"kind": "cron", "expr": "0 7 * * *", "tz": "Europe/Berlin"}, …}}

The webhook URL names what the fabric cannot read from the event: the slot's ``key``
(``openclaw/<job name>`` unless given) and the submitting ``actor`` (``openclaw``, what
``agap-slot`` submits as; an agent turn's MCP server submits as its ``--agent``). From
the job's cron expression and zone and ``runAtMs`` the slot's planned time follows
(:func:`fabric.slots.plan_slot`, the same arithmetic as the submit), hence the action id
and the task:

* the slot has its task: the run's outcome goes into the task's metadata
  (``fabric.openclaw.run``) with one journal line, once per run;
* it has none (the run failed before it submitted, or came late and was refused): the
  slot is recorded as missed on the board, where ``agap cron``'s schedules are
  (``fabric.cron.openclaw-<job>``: the keeper's metrics and Zabbix read it), and logged.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from fabric.core import Fabric
from fabric.errors import InvalidInput
from fabric.kanboard.layout import META_OPENCLAW_RUN, cron_key, receipt_reference
from fabric.slots import plan_slot

log = logging.getLogger("agap.keeper.openclaw")

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]{0,150}$")


@dataclass(frozen=True)
class OpenClawRun:
    """One finished OpenClaw cron run, as the fabric reads it."""

    job: str
    expr: str
    tz: str
    key: str
    actor: str
    status: str
    completion: str
    run_id: str
    run_at: float
    next_at: float | None
    error: str
    summary: str

    @property
    def failed(self) -> bool:
        return self.status != "ok" or self.completion == "failed"

    def outcome(self) -> dict[str, Any]:
        out = {
            "job": self.job,
            "run_id": self.run_id,
            "status": self.status,
            "completion": self.completion,
            "run_at": self.run_at,
        }
        if self.error:
            out["error"] = self.error[:500]
        if self.summary:
            out["summary"] = self.summary[:500]
        return out


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def parse_run(payload: Any, query: dict[str, str]) -> OpenClawRun:
    """The run an OpenClaw finished event describes; InvalidInput (one line) else."""
    if not isinstance(payload, dict) or payload.get("action") != "finished":
        raise InvalidInput("not an OpenClaw finished event (action: finished)", where="body")
    job = payload.get("job")
    job = job if isinstance(job, dict) else {}
    schedule = job.get("schedule")
    schedule = schedule if isinstance(schedule, dict) else {}
    name = _text(job.get("name")) or _text(payload.get("jobId"))
    expr = query.get("slot") or (_text(schedule.get("expr")) if schedule.get("kind") == "cron" else "")
    tz = query.get("timezone") or _text(schedule.get("tz"))
    if not expr or not tz:
        raise InvalidInput(
            "the run's job has no cron slot with a time zone",
            where=f"job {name or '?'}",
            hint="add the job with --cron and --tz (or give ?slot=…&timezone=… in the webhook URL)",
        )
    key = query.get("key") or f"openclaw/{name}"
    if not _KEY.match(key):
        raise InvalidInput(f"{key!r} is not a slot key", where="?key=", hint="e.g. openclaw/morning-digest")
    run_at = payload.get("runAtMs")
    if isinstance(run_at, bool) or not isinstance(run_at, int | float) or run_at <= 0:
        raise InvalidInput("the event has no runAtMs", where="body.runAtMs")
    nxt = payload.get("nextRunAtMs")
    return OpenClawRun(
        job=name,
        expr=expr,
        tz=tz,
        key=key,
        actor=query.get("actor") or "openclaw",
        status=_text(payload.get("status")) or "unknown",
        completion=_text(payload.get("completionStatus")) or "unknown",
        run_id=_text(payload.get("runId")),
        run_at=float(run_at) / 1000,
        next_at=float(nxt) / 1000 if isinstance(nxt, int | float) and not isinstance(nxt, bool) else None,
        error=_text(payload.get("error")),
        summary=_text(payload.get("summary")),
    )


def record_run(fab: Fabric, payload: Any, query: dict[str, str]) -> str:
    """Record a finished run (see the module); the line to answer with. InvalidInput for
    a payload the fabric cannot read (the receiver answers 400 with its line)."""
    run = parse_run(payload, query)
    firing = plan_slot(
        run.expr, run.tz, run.key, run.run_at, where="job.schedule", zone_where="job.schedule.tz"
    )
    slot = firing.planned.strftime("%Y-%m-%dT%H:%M:%SZ")
    row = fab.board.find_by_reference(receipt_reference(run.actor, firing.key))
    if row is not None:
        view = fab.board.read(row.id)
        outcome = json.dumps({**run.outcome(), "slot": slot}, sort_keys=True)
        if view.meta.get(META_OPENCLAW_RUN) != outcome:  # the same run posted again: said once
            how = f"failed: {run.error[:300] or run.completion}" if run.failed else "succeeded"
            line = f"OpenClaw run {run.run_id or '?'} of job {run.job} (slot {slot}) {how}."
            fab.board.save_meta(view.id, {META_OPENCLAW_RUN: outcome}, comment=line)
        return f"task #{view.id}: OpenClaw run of {run.job} (slot {slot}) recorded"
    _record_missed(fab, run, firing.planned.timestamp())
    log.warning(
        "OpenClaw job %s: slot %s has no task (run %s, %s%s): recorded as missed",
        run.job,
        slot,
        run.run_id or "?",
        run.status,
        f": {run.error[:200]}" if run.error else "",
    )
    return f"slot {slot} of {run.job} has no task: recorded as missed"


def _record_missed(fab: Fabric, run: OpenClawRun, planned: float) -> None:
    """The slot as a missed run of the schedule ``openclaw-<job>`` (``agap cron``'s record
    shape), counted once per planned time."""
    key = cron_key(f"openclaw-{run.job}")
    raw = fab.board.project_meta().get(key, "")
    try:
        record = json.loads(raw) if raw else {}
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    runs = [r for r in record.get("missed_runs") or [] if isinstance(r, list) and len(r) >= 3]
    if any(r[0] == planned for r in runs):
        return
    runs = [*runs, [planned, planned, 1]][-10:]
    record.update(
        schedule=f"openclaw-{run.job}",
        must_not_miss=bool(record.get("must_not_miss")),
        last_planned=planned,
        last_actual=run.run_at,
        missed=int(record.get("missed") or 0) + 1,
        last_missed=planned,
        missed_runs=runs,
        last_error=(run.error or run.completion)[:300],
    )
    if run.next_at:
        record["next_planned"] = run.next_at
    fab.board.save_project_meta({key: json.dumps(record, sort_keys=True)})


__all__ = ["OpenClawRun", "parse_run", "record_run"]
