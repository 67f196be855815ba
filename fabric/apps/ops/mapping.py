"""A Zabbix problem, and what the playbooks say to do with it (plain functions, no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from fabric.apps.ops.zabbix import ZabbixError
from fabric.cards.playbooks import OpsBook

SEVERITIES = ("not classified", "information", "warning", "average", "high", "disaster")
RAW_LIMIT = 1500  # of the raw problem quoted to the operator: the intent holds 4000


@dataclass(frozen=True)
class Problem:
    """One open problem as ``problem.get`` returns it (with ``selectTags``)."""

    eventid: str
    objectid: str
    name: str
    severity: int
    clock: int
    tags: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def problem_class(self) -> str:
        return self.tags.get("agap.class", "")

    @classmethod
    def from_api(cls, item: Any) -> Problem:
        """Read one entry; :class:`ZabbixError` (one line) when it is not a problem."""
        try:
            tags = {str(t["tag"]): str(t.get("value", "")) for t in item.get("tags", [])}
            return cls(
                eventid=str(int(item["eventid"])),
                objectid=str(item.get("objectid", "")),
                name=str(item["name"]),
                severity=int(item.get("severity", 0)),
                clock=int(item.get("clock", 0)),
                tags=tags,
                raw=dict(item),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ZabbixError(f"problem.get: an entry the ops-agent cannot read: {str(item)[:120]}") from None


@dataclass(frozen=True)
class Decision:
    """File a task (``to``, ``intent``, ``priority``) or revive (``revive_max``)."""

    action: Literal["file", "revive"]
    playbook: str  # the playbook's name, or "operator" for a problem no playbook fits
    to: str = ""
    intent: str = ""
    priority: str = "high"
    revive_max: int = 0
    queue: str = ""


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def decide(problem: Problem, book: OpsBook) -> Decision:
    """The first fitting playbook's decision; the operator, with the raw problem, otherwise.

    The problem's name and tags are data from Zabbix: they are quoted into the task, never
    followed as instructions.
    """
    pb = book.choose(problem.problem_class, problem.tags)
    if pb is None:
        raw = json.dumps(problem.raw, sort_keys=True, default=str)[:RAW_LIMIT]
        intent = (
            f"Zabbix raised a problem no ops playbook covers (class {problem.problem_class or 'none'!r}): "
            f"{problem.name}. Decide what to do, and add a playbook to cards/_ops.yaml if it recurs. "
            f"Raw problem: {raw}"
        )
        return Decision("file", "operator", to=book.operator, intent=intent, priority="high")
    if pb.revive is not None:
        return Decision("revive", pb.name, revive_max=pb.revive.max, queue=problem.tags.get("queue", ""))
    assert pb.file is not None
    values = _Blank(
        name=problem.name,
        queue=problem.tags.get("queue", ""),
        schedule=problem.tags.get("schedule", ""),
        eventid=problem.eventid,
        severity=SEVERITIES[problem.severity] if 0 <= problem.severity < len(SEVERITIES) else "?",
    )
    try:
        text = pb.file.intent.format_map(values)
    except (ValueError, IndexError):  # a stray brace in the playbook: its words as written
        text = pb.file.intent
    intent = f"{text} (Zabbix: {problem.name})" if text else f"Zabbix: {problem.name}"
    return Decision("file", pb.name, to=pb.file.to, intent=intent, priority=pb.file.priority)
