"""The ops-agent's playbooks: ``cards/_ops.yaml`` maps a Zabbix problem class to what to do.

A problem's class is the ``agap.class`` tag the template sets on every trigger (and its
``queue`` or ``schedule`` tag, where it has one). The playbooks are tried top to bottom;
the first whose ``class`` and ``match`` fit decides: a **mitigation** (a bounded, declared
action: ``revive``, at most ``max`` dead letters of the problem's queue) or a **task** filed
to the agent or person it names, the Zabbix event as a ref. A problem no playbook fits goes
to the household's ``operator`` (a person) with the raw problem. Problems name the file and
the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from fabric.cards.cardset import CardSet
from fabric.cards.files import read_yaml, shown_path
from fabric.cards.models import Slug, StrictModel
from fabric.cards.problems import CardErrors, CardProblem, validation_problems

__all__ = ["OPS_PLAYBOOKS", "OpsBook", "Playbook", "load_playbooks", "playbook_problems"]

OPS_PLAYBOOKS = "_ops.yaml"
#: The classes the template's triggers carry (compose/zabbix/, tag agap.class).
KNOWN_CLASSES = frozenset(
    {
        "board_down",
        "keeper_silent",
        "dead_letter",
        "backlog",
        "oldest_task",
        "parked_past_reset",
        "schedule_missed",
    }
)


class FileTask(StrictModel):
    """File a task to ``to`` (an agent or a person); ``intent`` may use {name}, {queue},
    {schedule}, {eventid} and {severity}."""

    to: Slug
    intent: str = Field(default="", max_length=500)
    priority: str = Field(default="high", pattern=r"^(low|normal|high|urgent)$")


class Revive(StrictModel):
    """Revive at most ``max`` dead letters of the problem's queue (all queues without one)."""

    max: int = Field(ge=1, le=20)


class Playbook(StrictModel):
    """One problem class (optionally narrowed by its queue or schedule) and what to do."""

    name: Slug
    # The class names are checked against the template's (KNOWN_CLASSES) by the cross-check:
    # a pydantic Literal would say only "input should be ...", without the file's words.
    problem_class: str = Field(alias="class")
    match: dict[str, str] = Field(default_factory=dict)
    file: FileTask | None = None
    revive: Revive | None = None

    @model_validator(mode="after")
    def _one_action(self) -> Playbook:
        if (self.file is None) == (self.revive is None):
            raise ValueError("a playbook does exactly one thing: file (a task) or revive (a mitigation)")
        unknown = set(self.match) - {"queue", "schedule"}
        if unknown:
            raise ValueError(f"match takes queue and schedule, not {', '.join(sorted(unknown))}")
        return self

    def fits(self, cls: str, tags: dict[str, str]) -> bool:
        return cls == self.problem_class and all(tags.get(k) == v for k, v in self.match.items())


class OpsBook(StrictModel):
    """``cards/_ops.yaml``: the household's operator and the playbooks, first fit wins."""

    operator: Slug
    playbooks: list[Playbook] = Field(default_factory=list)

    def choose(self, cls: str, tags: dict[str, str]) -> Playbook | None:
        return next((p for p in self.playbooks if p.fits(cls, tags)), None)


def _line(text: str, path: Sequence[str]) -> int | None:
    """The 1-based line of the node at the dotted ``path`` in ``text`` (the deepest found)."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    line = int(node.start_mark.line) + 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if nxt is None or key is None:
                break
            line, node = int(key.start_mark.line) + 1, nxt
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = int(node.start_mark.line) + 1
        else:
            break
    return line


def _with_lines(problems: list[CardProblem], text: str) -> list[CardProblem]:
    return [
        p
        if p.line
        else CardProblem(p.file, p.field, p.message, _line(text, p.field.split(".") if p.field else []))
        for p in problems
    ]


def load_playbooks(path: Path, base: Path, cards: CardSet | None = None) -> OpsBook:
    """The playbooks in ``path``; :class:`CardErrors` (file:line: field: what) if they are wrong."""
    book, problems = _read(path, base, cards)
    if problems or book is None:
        raise CardErrors(problems, hint=f"fix {path.name} and run `agap cards validate`")
    return book


def playbook_problems(directory: Path, base: Path, cards: CardSet) -> list[CardProblem]:
    """What is wrong with ``cards/_ops.yaml`` (nothing when the file is absent)."""
    path = directory / OPS_PLAYBOOKS
    return _read(path, base, cards)[1] if path.is_file() else []


def _read(path: Path, base: Path, cards: CardSet | None) -> tuple[OpsBook | None, list[CardProblem]]:
    shown = shown_path(path, base)
    data, found = read_yaml(path, shown)
    if found:
        return None, found
    text = path.read_text(encoding="utf-8")
    if not isinstance(data, dict):
        return None, [CardProblem(shown, "", "must be a mapping with operator and playbooks", line=1)]
    try:
        book = OpsBook.model_validate(data)
    except ValidationError as exc:
        return None, _with_lines(validation_problems(shown, exc), text)
    problems = _cross(book, shown, cards)
    return (None if problems else book), _with_lines(problems, text)


def _cross(book: OpsBook, shown: str, cards: CardSet | None) -> list[CardProblem]:
    out: list[CardProblem] = []
    for i, p in enumerate(book.playbooks):
        if p.problem_class not in KNOWN_CLASSES:
            known = ", ".join(sorted(KNOWN_CLASSES))
            out.append(
                CardProblem(shown, f"playbooks.{i}.class", f"unknown class {p.problem_class!r} ({known})")
            )
        if cards is not None and p.file is not None and p.file.to not in cards:
            out.append(CardProblem(shown, f"playbooks.{i}.file.to", f"no card {p.file.to!r}"))
    if cards is not None:
        if book.operator not in cards:
            out.append(CardProblem(shown, "operator", f"no card {book.operator!r}"))
        elif cards.get(book.operator).kind != "human":
            out.append(CardProblem(shown, "operator", f"{book.operator!r} is not a person (kind: human)"))
    return out
