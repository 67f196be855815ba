"""The keeper's memory duty: a done task's result retained into a Hindsight bank, for the
cards that ask for it (``memory: {retain: [hindsight://<bank>/, …]}``).

The keeper does it, not the worker: a worker needs no Hindsight credentials for it, and
a result is retained whatever ran the task (a persona, a person, OpenClaw). Each task is
retained through the checks and the item of ``agap memory retain``
(:func:`fabric.retain.plan_retain`): only into the card's bank of the task's own
privacy domain, never across people; a task of no listed bank's domain is not retained.

What happened is the task's metadata (``fabric.retained``, JSON), written before and
after each attempt, so a restarted keeper never retains a result twice:

* ``sending`` (an attempt under way: a keeper stopped in it counts it as made; the next
  one sends the same document, which Hindsight replaces rather than adds);
* ``retained`` with its receipt (bank, domain, document id, consolidation), and one line
  in the task's journal;
* ``failed`` (Hindsight down, 401, 404, 422, …): tried again no sooner than
  ``AGAP_KEEPER_RETAIN_BACKOFF`` later, ``AGAP_KEEPER_RETAIN_ATTEMPTS`` times in all,
  then ``gave-up`` with one line in the journal naming the last error and the command
  that sends it by hand. The ids waiting for another attempt are kept in the work
  project's metadata, so a task a person closes meanwhile is still tried;
* ``refused`` (the privacy rules, a tainted result, no stored result), with one line;
  ``skipped`` (no bank of the task's domain), without one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fabric.cards import Card
from fabric.core import Fabric
from fabric.domains import Domains
from fabric.errors import FabricError
from fabric.hindsight import HindsightClient, HindsightError
from fabric.kanboard.layout import META_RETAINED, META_RETAINING
from fabric.kanboard.taskboard import TaskView
from fabric.memorybanks import bank_domains, memory_problems
from fabric.policy_file import policy_config
from fabric.retain import plan_retain
from fabric.task import State
from keeper.duties import is_keepers_own
from keeper.snapshot import Snapshot
from keeper.sweeps import SweepReport, guarded, usable

log = logging.getLogger("agap.keeper.memory")

_warned: set[str] = set()  # cards whose refused banks were said (once per process)
FINAL = frozenset({"retained", "refused", "skipped", "gave-up"})


@dataclass(frozen=True)
class RetainSettings:
    attempts: int = 3  # AGAP_KEEPER_RETAIN_ATTEMPTS
    backoff: float = 120.0  # AGAP_KEEPER_RETAIN_BACKOFF: the least time between two attempts


@dataclass
class MemoryReport(SweepReport):
    retained: dict[int, str] = field(default_factory=dict)  # task -> bank
    failed: list[int] = field(default_factory=list)  # to be tried again
    gave_up: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def state_of(view: TaskView) -> dict[str, Any]:
    """The task's ``fabric.retained`` record ({} when none, or unreadable)."""
    raw = view.meta.get(META_RETAINED)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def pending_ids(snap: Snapshot) -> set[int]:
    """The tasks waiting for another attempt (the work project's metadata)."""
    try:
        ids = json.loads(snap.project_meta.get(META_RETAINING) or "[]")
        return {int(i) for i in ids}
    except (ValueError, TypeError):
        return set()


def candidates(fab: Fabric, snap: Snapshot) -> list[TaskView]:
    """Done (or since verified) tasks this sweep can see, and those waiting for another
    attempt wherever they are now (one more read, only when some are waiting)."""
    seen: dict[int, TaskView] = {}
    for view in (*snap.views, *snap.closed_active, *snap.vanished):
        if view.current is not None and view.current.state in (State.DONE, State.CLOSED):
            seen.setdefault(view.id, view)
    missing = sorted(pending_ids(snap) - set(seen))
    if missing:
        seen.update(fab.board.read_many(missing))
    return list(seen.values())


def sweep_memory(
    fab: Fabric,
    snap: Snapshot,
    client: Callable[[], HindsightClient],
    settings: RetainSettings = RetainSettings(),
) -> MemoryReport:
    """Retain the results of the cards that ask for it (see the module)."""
    report = MemoryReport()
    # Cards given by a caller that did not judge their banks (agap up keeps going with
    # the cards that load): one whose banks are wrong retains nothing.
    bad = {p.file.rsplit("/", 1)[-1].removesuffix(".yaml") for p in memory_problems(fab.cards)}
    for name in sorted(bad - _warned):
        _warned.add(name)
        log.warning("%s's memory.retain is refused (agap cards validate says why): not retained", name)
    waiting = pending_ids(snap)
    now = fab.clock()
    for view in candidates(fab, snap):
        report.scanned += 1
        if not usable(view, report) or view.spec is None or is_keepers_own(view):
            continue
        card = fab.cards.get(view.spec.target) if view.spec.target in fab.cards else None
        if card is None or card.memory is None or card.id in bad:
            waiting.discard(view.id)
            continue
        state = state_of(view)
        if state.get("outcome") in FINAL:
            waiting.discard(view.id)
            continue
        if state and now - float(state.get("at") or 0) < settings.backoff:
            waiting.add(view.id)
            continue
        guarded(view, report, partial(_retain, fab, view, card, state, client, settings, report))
        if view.id in report.failed:
            waiting.add(view.id)
        else:
            waiting.discard(view.id)
    if waiting != pending_ids(snap):
        fab.board.save_project_meta({META_RETAINING: json.dumps(sorted(waiting))})
    return report


def _save(fab: Fabric, view: TaskView, record: dict[str, Any], comment: str | None = None) -> None:
    fab.board.save_meta(view.id, {META_RETAINED: json.dumps(record, sort_keys=True)}, comment=comment)


def _choose(fab: Fabric, view: TaskView, card: Card, found: Iterable[str]) -> str | None:
    """The card's bank of the task's own domain (one per domain: the cards' rule)."""
    domains = set(found)
    banks = bank_domains(card, fab.settings.cards_dir)
    private = [ref for ref, d in banks if d in domains and d.startswith("private:")]
    # A task carrying a person's domain goes into that person's bank (if any), never into
    # a shared one: check_retain refuses that, so it is not even tried.
    if private:
        return private[0]
    if any(d.startswith("private:") for d in domains):
        return None
    return next((ref for ref, d in banks if d in domains), None)


def _retain(
    fab: Fabric,
    view: TaskView,
    card: Card,
    state: dict[str, Any],
    client: Callable[[], HindsightClient],
    settings: RetainSettings,
    report: MemoryReport,
) -> None:
    now = fab.clock()
    attempts = int(state.get("attempts") or 0)
    if attempts >= settings.attempts:  # the last attempt was cut short by a stop
        _give_up(fab, view, state, attempts, state.get("error") or "the keeper stopped during the attempt")
        report.gave_up.append(view.id)
        return
    found = Domains(fab.cards, policy_config(fab.settings.cards_dir), fab.reader()).task(view.id)
    ref = _choose(fab, view, card, found)
    if ref is None:
        _save(fab, view, {"outcome": "skipped", "at": now, "domains": sorted(found)})
        log.info(
            "task #%s: no bank of %s in %s's memory.retain: not retained", view.id, sorted(found), card.id
        )
        report.skipped.append(view.id)
        return
    try:
        plan = plan_retain(fab, view, ref, found)
    except FabricError as exc:  # the privacy rules, a tainted result, no stored result
        record = {"outcome": "refused", "at": now, "bank": ref, "error": exc.line()}
        _save(fab, view, record, comment=f"Not retained into {ref}: {exc.line()}")
        report.refused.append(view.id)
        return
    record = {"bank": plan.bank, "document_id": plan.document_id, "attempts": attempts + 1, "at": now}
    _save(fab, view, {**record, "outcome": "sending"})
    api = client()
    try:
        api.retain(plan.bank, [plan.item])
    except HindsightError as exc:
        if attempts + 1 < settings.attempts:
            _save(fab, view, {**record, "outcome": "failed", "error": exc.line()})
            log.warning(
                "task #%s: retain into %s failed (attempt %s): %s",
                view.id,
                plan.bank,
                record["attempts"],
                exc,
            )
            report.failed.append(view.id)
        else:
            _give_up(fab, view, record, attempts + 1, exc.line())
            report.gave_up.append(view.id)
        return
    receipt: dict[str, Any] = {"bank": plan.bank, "domain": plan.domain, "document_id": plan.document_id}
    assert card.memory is not None
    if card.memory.consolidate:
        receipt["consolidation"] = _consolidate(api, plan.bank)
    _save(
        fab,
        view,
        {**record, "outcome": "retained", "at": fab.clock(), "receipt": receipt},
        comment=f"Result retained in Hindsight bank {plan.bank} ({plan.domain}) as {plan.document_id}.",
    )
    report.retained[view.id] = plan.bank


def _consolidate(api: HindsightClient, bank: str) -> str:
    """Hindsight's consolidation, asked once; its operation id, or why not (the retain
    stands either way: Hindsight also consolidates after every retain by default)."""
    try:
        return str(api.consolidate(bank).get("operation_id") or "queued")
    except HindsightError as exc:
        return f"not queued: {exc.line()}"


def _give_up(fab: Fabric, view: TaskView, record: dict[str, Any], attempts: int, error: str) -> None:
    bank = str(record.get("bank") or "")
    _save(
        fab,
        view,
        {**record, "outcome": "gave-up", "attempts": attempts, "at": fab.clock(), "error": error},
        comment=f"Not retained into Hindsight bank {bank} after {attempts} attempts: {error}. "
        f"Send it by hand: agap memory retain {view.id} hindsight://{bank}/",
    )
    log.warning("task #%s: retain into %s given up after %s attempts: %s", view.id, bank, attempts, error)


__all__ = ["MemoryReport", "RetainSettings", "state_of", "sweep_memory"]
