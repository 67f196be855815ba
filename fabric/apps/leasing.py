"""Working a claimed task from outside the fabric: what ``agap claim``/``complete``/``fail``
/``ask`` and the MCP lease tools share.

A runtime that drains a queue from a shell or over MCP (a Claude Code loop, OpenClaw)
holds a lease named by (task, epoch, owner) and acts under it. Both surfaces rebuild the
lease from the board the same way (:func:`held_lease`), keep what a fenced owner gave as
evidence, never as the result (:func:`keeping_evidence`), read a result the same way
(:func:`result_input`, :func:`read_result_file`), store and complete it the same way
(:func:`complete`), and pick the person to ask by one rule (:func:`person_to_ask`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.errors import FabricError, InvalidInput
from fabric.kanboard.views import TaskView
from fabric.ledger import Fenced, Lease
from fabric.people import find_person
from fabric.results import ResultStore, result_url
from fabric.task import Record, TaskSpec

T = TypeVar("T")

#: A result given as a file is stored as the task's result; bigger outputs belong in a
#: store of their own, passed by reference.
RESULT_FILE_BYTES = 2 * 1024 * 1024
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")


def held_lease(fab: Fabric, task_id: int, epoch: int, owner: str) -> tuple[Lease, TaskView]:
    """The lease ``owner`` holds on ``task_id`` at ``epoch``, rebuilt from the board (raises
    :class:`~fabric.ledger.NotHolder` when it names another owner), and the task as read."""
    view = fab.show(task_id)
    return fab.ledger.held(view, epoch, owner), view


def under_lease(
    fab: Fabric, task_id: int, epoch: int, owner: str, evidence: str, act: Callable[[Lease], T]
) -> T:
    """``act`` under the named lease. Fenced (the read already shows a later epoch, or the
    act's own lock finds one), ``evidence`` is kept on the task and :class:`Fenced` raised:
    nothing (no result file) is stored for an ended epoch."""
    lease, view = held_lease(fab, task_id, epoch, owner)
    with keeping_evidence(fab, lease, evidence):
        if view.epoch != epoch:
            raise Fenced(task_id, epoch, view.epoch)
        return act(lease)


@contextmanager
def keeping_evidence(fab: Fabric, lease: Lease, evidence: str) -> Iterator[None]:
    """On a fence inside the block, keep ``evidence`` on the task (best effort) and re-raise:
    a fenced owner's output is evidence, never the result."""
    try:
        yield
    except Fenced:
        with contextlib.suppress(FabricError):  # the caller says fenced whatever happens here
            fab.ledger.keep_evidence(lease, evidence)
        raise


def result_uri(text: str, where: str) -> str:
    """A result given by reference: a URI, or refused before anything is written."""
    if not _URI.match(text.strip()):
        raise InvalidInput(f"{text!r} is not a URI", where=where, hint="e.g. https://git.example/pr/7")
    return text.strip()


def read_result_file(path: Path, where: str, *, check: Callable[[Path], None] | None = None) -> str:
    """The UTF-8 text of a result file, refused (one line) when it cannot be the result:
    missing, too large to store, not text, or empty. ``check(path)`` may refuse it first
    (the MCP tools' privacy check)."""
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file", where=where, hint="give a readable file")
    if check is not None:
        check(path)
    if path.stat().st_size > RESULT_FILE_BYTES:
        raise InvalidInput(
            f"{path} is larger than {RESULT_FILE_BYTES // 1024 // 1024} MiB",
            where=where,
            hint="store it elsewhere and pass its URI as the result ref",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(
            f"{path} is not UTF-8 text", where=where, hint="pass its URI as the result ref"
        ) from None
    if not text.strip():
        raise InvalidInput("the result file is empty", where=where, hint=f"{path} holds no text")
    return text


def complete(
    fab: Fabric, lease: Lease, results: ResultStore, *, ref: str | None, text: str | None, note: str | None
) -> tuple[Record, str]:
    """Store ``text`` as the result (unless given by ``ref``) and report the task done, as
    the built-in workers do; a fence keeps what was given as evidence. (record, result ref)."""
    with keeping_evidence(fab, lease, text if text is not None else f"result: {ref}"):
        stored = ref if ref is not None else results.put(lease, text or "")
        rec = fab.ledger.complete(lease, stored, note=note or None, result_url=result_url(fab.board, stored))
    return rec, stored


def person_to_ask(cards: CardSet, name: str | None, spec: TaskSpec, *, where: str) -> str:
    """The Kanboard username a question goes to: the person named, else the submitter
    when that is a person, else the first human card (the built-in workers' rule)."""
    if name:
        card = find_person(cards, name.strip())
        if card is None or card.human is None:
            known = ", ".join(c.id for c in cards.humans())
            raise InvalidInput(f"unknown human {name!r}", where=where, hint=f"known: {known}")
        return card.human.username
    card = find_person(cards, spec.actor)
    if card is None:
        humans = cards.humans()
        card = humans[0] if humans else None
    if card is None or card.human is None:
        raise InvalidInput("no human card to ask", where=where)
    return card.human.username


__all__ = [
    "RESULT_FILE_BYTES",
    "complete",
    "held_lease",
    "keeping_evidence",
    "person_to_ask",
    "read_result_file",
    "result_uri",
    "under_lease",
]
