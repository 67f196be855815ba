"""The ops-agent's loop: poll Zabbix's open problems, act on each event once, acknowledge.

**Polling, not a webhook.** ``problem.get`` every ``AGAP_OPS_POLL_EVERY`` (30 s) needs only an
API token and an outbound call: no listener to secure, nothing for Zabbix to deliver to a
host that was asleep, and a restart reads the problems still open instead of the pushes it
missed. A problem that waits 30 s is no worse: the template's own triggers take minutes.

**Exactly once per event.** The event id is the idempotency key twice over: the task is
submitted with the action id ``zabbix-event-<id>`` (a second submit returns the same task,
so a crash between submit and the state file files nothing twice), and the state file
(``AGAP_STATE_DIR/ops/events.json``, replaced atomically) records what was done and which
acknowledgements went out, so a restart neither files nor acknowledges anything again.

**Zabbix unreachable** parks the ``ops`` queue (a(t) = 0, published like any worker's park)
and retries with a backoff; nothing is lost, the problems are still open when it is back.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fabric.apps.ops.mapping import Decision, Problem, decide
from fabric.apps.ops.zabbix import ZabbixClient, ZabbixError
from fabric.availability import ParkState
from fabric.cards.playbooks import OpsBook
from fabric.core import Fabric
from fabric.errors import FabricError
from fabric.kanboard.layout import Column
from fabric.task import TERMINAL

log = logging.getLogger("agap.ops")

OPS_QUEUE = "ops"
ACTOR = "ops"


def action_id(eventid: str) -> str:
    return f"zabbix-event-{eventid}"


class EventLog:
    """What the agent did per Zabbix event, on disk: ``{eventid: {task, acked, final, ...}}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: dict[str, dict[str, Any]] = {}
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise FabricError(f"cannot read the ops event log ({exc})", where=str(path)) from None
            if isinstance(data, dict):
                self.events = {str(k): v for k, v in data.items() if isinstance(v, dict)}

    def get(self, eventid: str) -> dict[str, Any]:
        return self.events.setdefault(eventid, {"acked": []})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".events.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.events, f, sort_keys=True, indent=1)
        os.replace(tmp, self.path)  # whole or not at all


@dataclass
class OpsAgent:
    """One ops-agent over a fabric, a Zabbix API and the playbooks."""

    fab: Fabric
    zabbix: ZabbixClient
    book: OpsBook
    events: EventLog
    frontend: str = ""  # Zabbix's web root, for the event's link
    clock: Callable[[], float] = time.time
    parked: bool | None = field(default=None)

    # -- one round ---------------------------------------------------------------------------

    def poll_once(self) -> list[str]:
        """Handle the open problems and follow up on filed tasks; the event ids acted on.

        :class:`ZabbixError` (unreachable, or an answer it cannot read) propagates after
        the ops queue is parked: the caller backs off and calls again.
        """
        try:
            raw = self.zabbix.call(
                "problem.get",
                {
                    "output": ["eventid", "objectid", "name", "severity", "clock", "r_eventid"],
                    "selectTags": "extend",
                    "tags": [{"tag": "agap.class", "operator": 4}],  # exists: the template's own
                    "recent": False,
                    "sortfield": ["eventid"],
                },
            )
            if not isinstance(raw, list):
                raise ZabbixError(f"problem.get answered {type(raw).__name__}, not a list")
            problems = [Problem.from_api(p) for p in raw]
        except ZabbixError as exc:
            self._park(True, f"zabbix unreachable: {exc.what}"[:200])
            raise
        self._park(False, "")
        acted = [p.eventid for p in problems if self._handle(p)]
        self._follow_up()
        return acted

    # -- one event ---------------------------------------------------------------------------

    def _handle(self, problem: Problem) -> bool:
        entry = self.events.get(problem.eventid)
        if "filed" in entry["acked"] or entry.get("final"):
            return False
        decision = decide(problem, self.book)
        if decision.action == "revive":
            message = self._revive(problem, decision, entry)
        else:
            message = self._file(problem, decision, entry)
        self._ack(problem.eventid, message, entry, "filed")
        return True

    def _file(self, problem: Problem, d: Decision, entry: dict[str, Any]) -> str:
        if entry.get("task") is None:
            receipt = self.fab.submit(
                f"{d.intent} Event: {self._event_link(problem)}",
                target=d.to,
                refs=[self._event_ref(problem)],
                priority=d.priority,
                key=action_id(problem.eventid),  # the same task again after a crash, never a second
                actor=ACTOR,
            )
            entry.update(task=receipt.task_id, to=d.to, playbook=d.playbook)
            self.events.save()
            log.info("event %s (%s): filed task %s to %s", problem.eventid, d.playbook, receipt.task_id, d.to)
        link = self._task_link(entry["task"])
        return f"agap ops ({d.playbook}): filed task #{entry['task']} to {d.to}: {link}"

    def _revive(self, problem: Problem, d: Decision, entry: dict[str, Any]) -> str:
        if "revived" not in entry:
            dead = self.fab.board.open_in([Column.DEAD], d.queue or None)[: d.revive_max]
            revived = []
            for row in dead:
                try:
                    self.fab.ledger.revive(row.id, ACTOR, f"Zabbix event {problem.eventid} ({d.playbook})")
                    revived.append(row.id)
                except FabricError as exc:  # moved meanwhile: not ours to force
                    log.warning("event %s: task %s not revived: %s", problem.eventid, row.id, exc.line())
            entry.update(revived=revived, playbook=d.playbook, final=True)
            self.events.save()
        shown = ", ".join(f"#{t}" for t in entry["revived"]) or "none (no dead letter left)"
        return f"agap ops ({d.playbook}): revived at most {d.revive_max} dead letters: {shown}"

    def _follow_up(self) -> None:
        """Acknowledge again when a filed task is verified, dropped or canceled."""
        for eventid, entry in self.events.events.items():
            task = entry.get("task")
            if task is None or entry.get("final"):
                continue
            try:
                view = self.fab.board.read(int(task))
            except FabricError as exc:
                log.warning("event %s: cannot read task %s: %s", eventid, task, exc.line())
                continue
            state = view.current.state if view.current is not None else None
            if state in TERMINAL:
                word = {"closed": "verified"}.get(str(state), str(state))
                self._ack(eventid, f"agap ops: task #{task} {word}: {self._task_link(task)}", entry, word)
                entry["final"] = True
                self.events.save()

    # -- Zabbix and the board ----------------------------------------------------------------

    def _ack(self, eventid: str, message: str, entry: dict[str, Any], step: str) -> None:
        if step in entry["acked"]:
            return
        # action 6 = acknowledge (2) + add a message (4); both exist in 6.0 and 7.0.
        self.zabbix.call("event.acknowledge", {"eventids": [eventid], "action": 6, "message": message[:2048]})
        entry["acked"].append(step)
        self.events.save()

    def _park(self, parked: bool, reason: str) -> None:
        if self.parked == parked:
            return
        state = ParkState(OPS_QUEUE, parked, reason, None, self.clock() if parked else 0.0)
        try:
            self.fab.board.publish_park(OPS_QUEUE, state.to_dict())
            self.parked = parked
        except FabricError as exc:
            log.warning("cannot publish the ops queue's park state: %s", exc.line())

    def _task_link(self, task: int) -> str:
        links = self.fab.board.links
        return links.task(int(task)) if links is not None else f"task:{task}"

    def _event_link(self, problem: Problem) -> str:
        """The event's page in Zabbix's frontend (for people)."""
        base = self.frontend.rstrip("/")
        return f"{base}/tr_events.php?triggerid={problem.objectid}&eventid={problem.eventid}"

    def _event_ref(self, problem: Problem) -> str:
        """The event as a ref: ``zabbix://<frontend host>/event/<id>``. Its own scheme, not the
        http page: an http URL on this machine has no owner the privacy rules can decide."""
        host = urlsplit(self.frontend).netloc or "zabbix"
        return f"zabbix://{host}/event/{problem.eventid}"


def frontend_of(api_url: str) -> str:
    """Zabbix's web root from its API URL (``.../api_jsonrpc.php``)."""
    return api_url.rsplit("/", 1)[0] if api_url.endswith(".php") else api_url.rstrip("/")
