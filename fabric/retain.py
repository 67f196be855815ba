"""A task's result, back into a Hindsight bank (``agap memory retain``).

``retain_result`` reads a done task's result as the fabric stored it and sends it to
Hindsight's retain endpoint (``POST …/banks/{bank}/memories``, one item: the result as
``content``, the task's intent as ``context``, the time it was done as ``timestamp``,
``agap-task-<uid>`` as ``document_id``, so a second retain of the same result replaces the
first instead of adding a copy). With ``consolidate`` it then asks Hindsight's own
consolidation to run on the bank (``POST …/consolidate``).

The keeper does the same for the cards that ask for it (``memory: {retain: …}``,
:mod:`keeper.memory`), through :func:`plan_retain`: the checks and the item are one code.

Before anything is sent, the policy decides (:func:`fabric.domains.check_retain`): only
into a bank of the task's own privacy domain, never across people, and never the output
of untrusted work (it would come back as memory without its taint). ``agap memory retain``
retries nothing: a retain runs Hindsight's LLM, so a failed one is reported (one line,
the exit code of :mod:`fabric.errors`) and left to the person.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fabric.core import Fabric
from fabric.domains import Domains, check_retain, rules_domain
from fabric.errors import FabricError
from fabric.hindsight import HindsightClient, bank_of
from fabric.kanboard.taskboard import TaskView
from fabric.policy_file import policy_config
from fabric.refusals import PolicyRefused
from fabric.results import read_result
from fabric.settings import registry
from fabric.taint import is_tainted
from fabric.task import State

__all__ = ["RetainPlan", "Retained", "bank_of", "client_from_settings", "plan_retain", "retain_result"]

#: A result is retained once the task is done, or verified after that.
RETAINABLE = frozenset({State.DONE, State.CLOSED})


@dataclass(frozen=True)
class Retained:
    """What a retain did."""

    task_id: int
    bank: str
    domain: str
    document_id: str
    consolidation: str | None  # Hindsight's operation id, when one was asked for

    def as_json(self) -> dict[str, Any]:
        return vars(self)


@dataclass(frozen=True)
class RetainPlan:
    """A retain every check has passed: the one item to send into ``bank``."""

    task_id: int
    bank: str
    domain: str
    document_id: str
    item: dict[str, Any]

    def send(self, client: HindsightClient, *, consolidate: bool = False) -> Retained:
        """Hindsight's retain (one document: a second send replaces the first), then its
        consolidation when asked."""
        client.retain(self.bank, [self.item])
        operation = None
        if consolidate:
            operation = str(client.consolidate(self.bank).get("operation_id") or "") or None
        return Retained(self.task_id, self.bank, self.domain, self.document_id, operation)


def client_from_settings() -> HindsightClient:
    """The Hindsight API of ``AGAP_HINDSIGHT_URL``, with ``AGAP_HINDSIGHT_KEY``."""
    return HindsightClient(
        registry.get_str("AGAP_HINDSIGHT_URL"), registry.get_str("AGAP_HINDSIGHT_KEY", fallback="")
    )


def plan_retain(fab: Fabric, view: TaskView, ref: str, found: Iterable[str] | None = None) -> RetainPlan:
    """Every check before a retain of ``view``'s result into the bank ``ref`` (see the
    module); ``found``: the task's privacy domains when the caller has them already."""
    bank, key = bank_of(ref)
    task_id = view.id
    cur = view.current
    if cur is None or view.spec is None or cur.state not in RETAINABLE or not cur.result_ref:
        state = cur.state.value if cur is not None else "not a fabric task"
        raise FabricError(
            f"task #{task_id} has no result to retain ({state})",
            where=f"task #{task_id}",
            hint=f"agap watch {task_id} waits for it to be done",
        )
    cfg = policy_config(fab.settings.cards_dir)
    domain = rules_domain(cfg, key)
    if found is None:
        found = Domains(fab.cards, cfg, fab.reader()).task(task_id)
    check_retain(task_id, found, bank, domain)
    if is_tainted(fab.cards, view.spec):
        raise PolicyRefused(
            "taint.retain",
            f"task #{task_id} ran on untrusted {view.spec.target}: its output does not become memory",
            limit="results of trusted work",
            where=f"task #{task_id} -> {ref}",
        )
    text = read_result(fab.board, task_id, cur.result_ref, registry.get_str("AGAP_RESULT_DIR") or None)
    if text is None or not text.strip():
        raise FabricError(
            f"task #{task_id}'s result is not stored by the fabric ({cur.result_ref})",
            where=f"task #{task_id}",
            hint="only a result the fabric stored (an attachment or a result file) can be retained",
        )
    document = f"agap-task-{view.uid or task_id}"
    item = {
        "content": text,
        "context": f"agap task #{task_id}: {view.spec.intent[:300]}",
        "timestamp": datetime.fromtimestamp(cur.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "document_id": document,
        "tags": ["agap"],
    }
    return RetainPlan(task_id, bank, domain, document, item)


def retain_result(
    fab: Fabric, task_id: int, ref: str, client: HindsightClient | None = None, *, consolidate: bool = False
) -> Retained:
    """Retain task ``task_id``'s result into the bank ``ref`` names (see the module)."""
    bank_of(ref)  # a bad ref is said before the board is read
    plan = plan_retain(fab, fab.show(task_id), ref)
    return plan.send(client or client_from_settings(), consolidate=consolidate)
