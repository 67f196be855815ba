"""A task's result, back into a Hindsight bank (``agap memory retain``).

``retain_result`` reads a done task's result as the fabric stored it and sends it to
Hindsight's retain endpoint (``POST …/banks/{bank}/memories``, one item: the result as
``content``, the task's intent as ``context``, the time it was done as ``timestamp``,
``agap-task-<uid>`` as ``document_id``, so a second retain of the same result replaces the
first instead of adding a copy). With ``consolidate`` it then asks Hindsight's own
consolidation to run on the bank (``POST …/consolidate``).

Before anything is sent, the policy decides (:func:`fabric.domains.check_retain`): only
into a bank of the task's own privacy domain, never across people, and never the output
of untrusted work (it would come back as memory without its taint). Nothing is retried:
a retain runs Hindsight's LLM, so a failed one is reported (one line, the exit code of
:mod:`fabric.errors`) and left to the person.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from fabric.core import Fabric
from fabric.domains import Domains, check_retain, rules_domain
from fabric.errors import FabricError, InvalidInput
from fabric.hindsight import HindsightClient, valid_bank_id
from fabric.policy_file import policy_config
from fabric.refcanon import BadRef, canonical
from fabric.refusals import PolicyRefused
from fabric.settings import registry
from fabric.taint import is_tainted
from fabric.task import State
from workers.results import read_result

__all__ = ["Retained", "bank_of", "retain_result"]

_HINT = "write the bank as hindsight://<bank>/ (its id as Hindsight spells it)"


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


def bank_of(ref: str) -> tuple[str, str]:
    """(bank id, canonical key) of a bank ref ``hindsight://<bank>/``; InvalidInput else."""
    parts = urlsplit(ref.strip())
    try:
        key = canonical(ref).key
    except BadRef as exc:
        raise InvalidInput(str(exc), where=ref, hint=_HINT) from None
    bank = unquote(parts.netloc)
    if parts.scheme.lower() != "hindsight" or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInput("not a bank: a retain goes into a whole bank", where=ref, hint=_HINT)
    if not valid_bank_id(bank) or bank != urlsplit(key).netloc:
        raise InvalidInput(f"{bank!r} is not a Hindsight bank id", where=ref, hint=_HINT)
    return bank, key


def retain_result(
    fab: Fabric, task_id: int, ref: str, client: HindsightClient | None = None, *, consolidate: bool = False
) -> Retained:
    """Retain task ``task_id``'s result into the bank ``ref`` names (see the module)."""
    bank, key = bank_of(ref)
    view = fab.show(task_id)
    cur = view.current
    if cur is None or view.spec is None or cur.state != State.DONE or not cur.result_ref:
        state = cur.state.value if cur is not None else "not a fabric task"
        raise FabricError(
            f"task #{task_id} has no result to retain ({state})",
            where=f"task #{task_id}",
            hint=f"agap watch {task_id} waits for it to be done",
        )
    cfg = policy_config(fab.settings.cards_dir)
    domain = rules_domain(cfg, key)
    check_retain(task_id, Domains(fab.cards, cfg, fab.reader()).task(task_id), bank, domain)
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
    client = client or HindsightClient(
        registry.get_str("AGAP_HINDSIGHT_URL"), registry.get_str("AGAP_HINDSIGHT_KEY", fallback="")
    )
    document = f"agap-task-{view.uid or task_id}"
    item = {
        "content": text,
        "context": f"agap task #{task_id}: {view.spec.intent[:300]}",
        "timestamp": datetime.fromtimestamp(cur.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "document_id": document,
        "tags": ["agap"],
    }
    client.retain(bank, [item])
    operation = None
    if consolidate:
        operation = str(client.consolidate(bank).get("operation_id") or "") or None
    return Retained(task_id, bank, domain, document, operation)
