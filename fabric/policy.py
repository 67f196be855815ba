"""Submit and claim policy: hygiene, privacy domains, taint, and always-ask escalation.

Every refusal is a :class:`PolicyRefused` naming its ``code``, the ``rule`` and the
``limit``, raised before anything is written. The rules (docs/POLICY.md tells the story):

* **creation quota** (``QUOTA_EXCEEDED``): an agent (an actor that is a non-human card)
  may create at most ``limit`` tasks per rolling ``window``;
* **depth cap** (``DEPTH_EXCEEDED``): a provenance chain may be at most ``max_depth`` deep;
* **cycle** (``CYCLE``): a task may not repeat an ancestor's target and intent;
* **privacy** (``PRIVACY``): every ref resolves into privacy domains (what it points to,
  never a label on it: :mod:`fabric.domains`); the target must be allowed to see them, a
  sandboxed or untrusted agent never sees a private one, work done for human H sees only
  H's private domain and the shared ones, and what the parent chain read counts too;
* **taint** (``TAINT_GATED``): output of untrusted work goes only back to the agent that
  produced it (or to a human); anything else creates a gate task in a human's inbox and
  proceeds only once the gate is approved and cited as a ref.

Configuration: ``cards/_policy.yaml`` (optional; every key has a default), read by
:mod:`fabric.policy_file`. :mod:`fabric.taint` finds the refs that point at tainted output.

Policies decide and never write: they read a :class:`PolicyContext` (the cards, the
policy file, a read-only board). A taint gate is a :class:`GateRequest` the submitter
creates (:meth:`fabric.core.Fabric.submit`); a dead letter's decision task is an
:class:`Escalation` the keeper submits (:mod:`keeper.decisions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fabric.cards import Card, CardSet, trust_rank
from fabric.domains import (
    Domains,
    ReadGuard,
    canon_ref,
    check_file,
    check_visible,
    person_of,
    recall_scope,
    rules_domain,
    scopes_of,
)
from fabric.errors import ConfigError, InvalidInput
from fabric.kanboard.layout import receipt_reference
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.views import TaskView
from fabric.people import find_person
from fabric.plain import Plain
from fabric.policy_file import PolicyConfig, policy_config
from fabric.refusals import PolicyRefused, PrivacyViolation
from fabric.submit import Receipt
from fabric.taint import GATE_ACTOR, find_by_uid, gate_key, ungated_taint
from fabric.task import State, TaskSpec

# ---------------------------------------------------------------------------------------
# Errors


class QuotaExceeded(PolicyRefused):
    code = "QUOTA_EXCEEDED"


class DepthExceeded(PolicyRefused):
    code = "DEPTH_EXCEEDED"


class CycleDetected(PolicyRefused):
    code = "CYCLE"


class TrustViolation(PolicyRefused):
    code = "TRUST"


class TaintRefused(PolicyRefused):
    """Tainted output found at claim time on its way to another agent."""

    code = "TAINTED"


class TaintGated(PolicyRefused):
    """Tainted output was headed for another agent: a gate task now waits on a human."""

    code = "TAINT_GATED"

    def __init__(self, rule: str, what: str, *, limit: str, gate: Receipt, human: str) -> None:
        self.gate = gate
        self.human = human
        super().__init__(
            rule,
            what,
            limit=limit,
            where="--ref",
            hint=f"gate task {gate.ref} waits on {human}; once approved, submit again with --ref {gate.ref}",
        )


# ---------------------------------------------------------------------------------------
# Refs: privacy domains


def ref_domain(ref: str, cfg: PolicyConfig | None = None) -> str:
    """The owner rules' domain of what ``ref`` resolves to (:mod:`fabric.domains`; no
    board, so a task ref gets the default: :class:`PrivacyDomains` reads the task).

    A ``#domain=`` label on a ref is refused (``privacy.label``), never obeyed.
    """
    return rules_domain(cfg or PolicyConfig(), canon_ref(ref).key)


def gate_human(cards: CardSet, cards_dir: str | Path, spec: TaskSpec) -> str:
    """Whose inbox a gate or decision goes to: the submitting human, else ``gate_to``
    (in the policy file next to the cards), else the first human card."""
    h = find_person(cards, spec.actor)
    if h is not None:
        return h.id
    cfg = policy_config(cards_dir)
    if cfg.gate_to and find_person(cards, cfg.gate_to) is not None:
        return cfg.gate_to
    humans = sorted(c.id for c in cards.humans())
    if not humans:
        raise ConfigError("no human card to send a gate to", where="cards/", hint="add a kind: human card")
    return humans[0]


def _norm(intent: str) -> str:
    return " ".join(intent.split()).casefold()


# ---------------------------------------------------------------------------------------
# What the policies read, and what they may ask for


class PolicyContext(Plain):
    """What the policies read: the cards, the policy file next to them, a read-only board
    and the time of the submit. Nothing in it writes."""

    cards: CardSet
    board: ReadOnlyBoard
    cards_dir: str | Path
    now: float

    @property
    def config(self) -> PolicyConfig:
        """The policy configuration (``cards/_policy.yaml``; read again when it changes)."""
        return policy_config(self.cards_dir)


class GateRequest(Plain):
    """Tainted input headed for another agent: the gate task a human must approve first.

    The submitter creates it (``intent`` for ``human``, citing ``refs``, priority high,
    under the action id ``key`` as :data:`~fabric.taint.GATE_ACTOR`), then refuses the submit with
    :meth:`refusal`.
    """

    human: str
    key: str
    intent: str
    refs: tuple[str, ...]
    target: str
    producers: str

    def refusal(self, gate: Receipt) -> TaintGated:
        """The refusal of the submit that asked for the gate, naming the gate task."""
        return TaintGated(
            "taint.promotion",
            f"{', '.join(self.refs)} is output of untrusted work by "
            f"{self.producers}; it may reach {self.target} only through an approved gate",
            limit="tainted output stays in its producer's own context",
            gate=gate,
            human=self.human,
        )


class SubmitPolicy(Protocol):
    """Checks a validated, routed task before it is created (hygiene, trust, quotas).

    Raises a :class:`~fabric.errors.FabricError` naming the rule and the limit to refuse;
    returns a :class:`GateRequest` when the task may pass only through a gate, else None.
    """

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None: ...


# ---------------------------------------------------------------------------------------
# The submit policies


class CreationQuota:
    """At most ``limit`` tasks per rolling ``window`` per agent (actors that are cards).

    Counted from the board (tasks whose provenance names the agent, created inside the
    window: one search), so it holds across processes. An idempotent replay of a task that
    already exists is never refused. Two racing submits at ``limit - 1`` may both pass.
    """

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        actor = spec.actor
        if actor not in ctx.cards or ctx.cards.get(actor).is_human:
            return None
        quota = ctx.config.quota_for(actor)
        since = ctx.now - quota.window
        rows = ctx.board.search(f'desc:"submitted by `{actor}` at"')
        used = sum(1 for r in rows if r.created_at >= since)
        if used < quota.limit:
            return None
        if (
            spec.action_id
            and ctx.board.find_by_reference(receipt_reference(actor, spec.action_id)) is not None
        ):
            return None  # a replay: submit returns the existing task
        raise QuotaExceeded(
            "creation-quota",
            f"agent {actor!r} created {used} tasks in the last {quota.text.split(' per ')[1]}",
            limit=quota.text,
            where="--actor",
            hint="wait for the window to roll, or raise quota.agents in cards/_policy.yaml",
        )


class DepthCap:
    """A provenance chain may be at most ``max_depth`` tasks deep (a root task is depth 0)."""

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        cap = ctx.config.max_depth
        depth = len(spec.ancestry)
        if depth > cap:
            raise DepthExceeded(
                "ancestry-depth",
                f"the task would be at depth {depth} of its provenance chain (root {spec.ancestry[0]})",
                limit=str(cap),
                where="--parent",
                hint="agents submitting tasks that submit tasks look like a loop",
            )
        return None


class Lineage:
    """Cycle detection over the provenance chain.

    Reads the ancestors' specs (one search, only for tasks with a grandparent).
    """

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        ancestors = self.ancestors(ctx.board, spec, parent)
        for uid, (tid, a) in ancestors.items():
            if a.target == spec.target and _norm(a.intent) == _norm(spec.intent):
                raise CycleDetected(
                    "provenance-cycle",
                    f"ancestor {f'#{tid}' if tid else uid} already asked {a.target!r} for the same intent",
                    where="--parent",
                    limit="no target+intent twice in one chain",
                    hint="a task that re-submits itself is a loop; change the intent or the target",
                )
        return None

    @staticmethod
    def ancestors(
        board: ReadOnlyBoard, spec: TaskSpec, parent: TaskView | None
    ) -> dict[str, tuple[int | None, TaskSpec]]:
        if parent is None or parent.spec is None or parent.uid is None:
            return {}
        out: dict[str, tuple[int | None, TaskSpec]] = {parent.uid: (parent.id, parent.spec)}
        rest = [u for u in spec.ancestry if u != parent.uid]
        if rest:
            # Every descendant of the root mentions the root's uid: one search finds them all.
            rows = board.search(f"desc:{spec.ancestry[0]}")
            for row in rows:
                parsed = board.sealed(row.description)
                if parsed and parsed[0] in rest:
                    out[parsed[0]] = (row.id, parsed[1])
        return out


class PrivacyDomains:
    """Every domain the refs resolve into (:mod:`fabric.domains`) must be visible to the
    target, working for every person in the provenance chain; and so must what the chain
    read on the way (an agent that read private context carries it into its child tasks).

    Reads the ancestors (as :class:`Lineage`) and the tasks the refs lead to.
    """

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        ancestors = [a for _, a in Lineage.ancestors(ctx.board, spec, parent).values()]
        check_refs(ctx, card, spec, ancestors)
        return None


def chain_people(cards: CardSet, specs: Sequence[TaskSpec]) -> list[str]:
    """The people a chain of tasks works for: every human who submitted one of them."""
    return sorted({h.id for h in (person_of(cards, s.actor) for s in specs) if h is not None})


def check_refs(ctx: PolicyContext, card: Card, spec: TaskSpec, ancestors: Sequence[TaskSpec]) -> None:
    """Refuse ``spec`` for ``card`` when a ref, or a ref its ancestors read, resolves into a
    domain the card may not see while working for the people in the chain."""
    domains = Domains(ctx.cards, ctx.config, ctx.board)
    scopes = scopes_of(ctx.cards, chain_people(ctx.cards, [*ancestors, spec]))
    for ref in spec.refs:
        c = canon_ref(ref)
        check_file(ref, c)
        check_visible(card, ref, domains.of_canon(c), scopes=scopes)
    for a in ancestors:
        for ref in a.refs:
            found = domains.stored(ref)
            check_visible(card, f"{ref}, read by its parent chain", found, scopes=scopes, where="--parent")


def chain_of(ctx: PolicyContext, spec: TaskSpec) -> list[TaskSpec]:
    """The specs above an existing task: its parent (one search by uid), then one search
    for the older ancestors."""
    parent = None
    if spec.parent:
        found = find_by_uid(ctx.board, [spec.parent])
        if spec.parent in found:
            parent = ctx.board.read(found[spec.parent][0])
    return [a for _, a in Lineage.ancestors(ctx.board, spec, parent).values()]


def read_guard(ctx: PolicyContext, card: Card, spec: TaskSpec) -> ReadGuard:
    """The check a worker for ``card`` applies where it reads ``spec``'s refs, for the
    people in its chain."""
    people = chain_people(ctx.cards, [*chain_of(ctx, spec), spec])
    return ReadGuard(Domains(ctx.cards, ctx.config, ctx.board), card, tuple(people))


def check_domains(card: Card, refs: Sequence[str], cfg: PolicyConfig) -> None:
    """Refuse a ref whose owner rules put it in a domain ``card`` may not see (no board:
    task refs are judged where the board is, by :func:`check_refs`)."""
    for ref in refs:
        c = canon_ref(ref)
        check_file(ref, c)
        if c.task_id is None:
            check_visible(card, ref, {rules_domain(cfg, c.key)})


class TaintGate:
    """Tainted output may go back only to the agent that produced it, or to a human.

    Anything else (a trusted agent's task or memory, an outward action, another agent)
    creates a gate task for a human and is refused with :class:`TaintGated`. Once the gate
    is approved (moved to Done, or closed as verified) the same submit passes when it
    cites the gate task as a ref.
    """

    def check(
        self, ctx: PolicyContext, spec: TaskSpec, card: Card, parent: TaskView | None
    ) -> GateRequest | None:
        tainted = ungated_taint(ctx.cards, ctx.board, ctx.config, spec, card)
        if not tainted:
            return None
        human = gate_human(ctx.cards, ctx.cards_dir, spec)
        producers = ", ".join(sorted({t.producer for t in tainted}))
        refs = sorted(t.ref for t in tainted)
        intent = (
            f"Approve tainted input for {card.id}? Output of {producers} (untrusted)\n\n"
            f"{spec.actor} asked {card.id} ({card.trust}) to: {spec.title()}\n"
            f"using output of untrusted work: {', '.join(refs)}.\n\n"
            "Approve: move this card to Done. Refuse: close it. After approval the "
            f"request passes when it cites this gate task as a ref."
        )
        return GateRequest(
            human, gate_key(card.id, tainted, spec.canonical()), intent, tuple(refs), card.id, producers
        )


def default_policies() -> list[SubmitPolicy]:
    """The policies every :class:`~fabric.core.Fabric` applies, cheapest first."""
    return [DepthCap(), CreationQuota(), Lineage(), PrivacyDomains(), TaintGate()]


def vet_unrecorded(ctx: PolicyContext, view: TaskView, spec: TaskSpec) -> None:
    """Routing and policy, re-applied before a task is rebuilt from its sealed block.

    The target's card must still drain the spec's queue, and the card must sit in that
    queue's lane. Every submit rule applies except the creation quota (the task exists
    already, so counting it would refuse its own repair); tainted input is refused rather
    than gated, since a repair never creates tasks.
    """
    card = ctx.cards.get(spec.target)
    lane = ctx.board.layout.swimlanes.get(spec.queue)
    if card.queue_name != spec.queue or view.task.swimlane_id != lane:
        raise InvalidInput(
            f"its spec names queue {spec.queue!r}, which is not where it is or not its target's",
            where=f"task #{view.id}",
            hint="submit it again",
        )
    parent = None
    if spec.parent:
        found = find_by_uid(ctx.board, [spec.parent])
        if spec.parent in found:
            parent = ctx.board.read(found[spec.parent][0])
    for policy in (DepthCap(), Lineage(), PrivacyDomains()):
        policy.check(ctx, spec, card, parent)
    tainted = ungated_taint(ctx.cards, ctx.board, ctx.config, spec, card)
    if tainted:
        raise TaintRefused(
            "taint.repair",
            f"{', '.join(sorted(t.ref for t in tainted))} is output of untrusted work",
            limit="no ungated taint",
            where=f"task #{view.id}",
        )


# ---------------------------------------------------------------------------------------
# At claim


class ClaimRefused(PolicyRefused):
    code = "CLAIM_REFUSED"


def check_claim(card: Card, spec: TaskSpec, cfg: PolicyConfig | None = None) -> None:
    """Re-check, at claim time, what a worker for ``card`` may take (pure: no board calls).

    Refuses a task meant for another queue, one whose refs point into a domain the card
    may not see (cards change between submit and claim), and one whose constraint set
    asks for more trust than the card has.
    """
    cfg = cfg or PolicyConfig()
    if spec.queue != card.queue_name:
        raise ClaimRefused(
            "claim.queue",
            f"the task is for queue {spec.queue!r}, not {card.queue_name!r}",
            limit=spec.queue,
            where=card.id,
        )
    check_domains(card, spec.refs, cfg)
    floor = spec.constraints.get("trust")
    if isinstance(floor, str) and trust_rank(card.trust) < trust_rank(floor):
        raise TrustViolation(
            "trust.floor", f"{card.id} is {card.trust}; the task needs {floor}", limit=floor, where=card.id
        )


def check_claim_on_board(ctx: PolicyContext, card: Card, spec: TaskSpec) -> None:
    """:func:`check_claim`, plus the domains of task refs and of the parent chain
    (:func:`check_refs`) and the taint rule (reads the referenced tasks; none when the
    refs name no task and the task has no parent). Never creates a gate: a task that
    carries ungated tainted refs to another agent was not submitted through the policy."""
    check_claim(card, spec, ctx.config)
    check_refs(ctx, card, spec, chain_of(ctx, spec))
    tainted = ungated_taint(ctx.cards, ctx.board, ctx.config, spec, card)
    if tainted:
        raise TaintRefused(
            "taint.claim",
            f"{', '.join(t.ref for t in tainted)} is output of untrusted work "
            f"by {', '.join(sorted({t.producer for t in tainted}))} with no approved gate",
            limit="tainted output stays in its producer's own context",
            where=card.id,
        )


# ---------------------------------------------------------------------------------------
# Escalation: always ask


class Escalation(Plain):
    """A dead letter's decision task: ``intent`` for ``human``, citing the dead task
    (``ref``), submitted by ``actor`` under the action id ``key`` (one per dead epoch)."""

    human: str
    intent: str
    ref: str
    key: str
    actor: str


def plan_escalation(
    cards: CardSet, cards_dir: str | Path, view: TaskView, *, actor: str = "keeper"
) -> Escalation | None:
    """A dead-lettered task becomes a decision task for the responsible human.

    Never a silent retry on a bigger model: the human decides (retry as is, re-submit with
    wider constraints, or drop it). Idempotent per dead epoch. Returns None when the task
    is not dead, is itself a decision or gate, or targets a human.
    """
    spec, cur = view.spec, view.current
    if spec is None or cur is None or view.uid is None or cur.state != State.DEAD:
        return None
    if spec.actor in (actor, GATE_ACTOR) or (spec.action_id or "").startswith("escalate/"):
        return None
    if find_person(cards, spec.target) is not None:
        return None
    human = None
    for key in ("escalate_to", "human"):
        value = spec.constraints.get(key)
        if isinstance(value, str) and find_person(cards, value) is not None:
            human = value
            break
    human = human or gate_human(cards, cards_dir, spec)
    card = cards.get(spec.target) if spec.target in cards else None
    on = f"{spec.target} (tier {card.tier})" if card and card.tier else spec.target
    title = view.task.title or spec.title()
    intent = (
        f"Decide: task #{view.id} died on {spec.target}\n\n"
        f'#{view.id} "{title}" dead-lettered on {on}: {cur.reason or "no reason given"}.\n'
        "The fabric does not retry it on a bigger model by itself. Options: move "
        f"#{view.id} back to Queued to retry it as is; submit it again with wider "
        f"constraints (e.g. a bigger tier); or close #{view.id} to drop it. "
        "Close this decision task when you have decided."
    )
    return Escalation(human, intent, f"task:{view.id}", f"escalate/{view.uid}/e{view.epoch}", actor)


def explain_refusal(exc: PolicyRefused) -> dict[str, Any]:
    """A refusal as plain data (for ``--json`` outputs)."""
    d: dict[str, Any] = {"code": exc.code, "rule": exc.rule, "limit": exc.limit, "message": exc.line()}
    if isinstance(exc, TaintGated):
        d["gate"] = exc.gate.ref
        d["human"] = exc.human
    return d


__all__ = [
    "ClaimRefused",
    "CreationQuota",
    "CycleDetected",
    "DepthCap",
    "DepthExceeded",
    "Escalation",
    "GateRequest",
    "Lineage",
    "PolicyContext",
    "PolicyRefused",
    "PrivacyDomains",
    "PrivacyViolation",
    "QuotaExceeded",
    "SubmitPolicy",
    "TaintGate",
    "TaintGated",
    "TaintRefused",
    "TrustViolation",
    "chain_of",
    "chain_people",
    "check_claim",
    "check_claim_on_board",
    "check_domains",
    "check_refs",
    "default_policies",
    "gate_human",
    "plan_escalation",
    "read_guard",
    "recall_scope",
    "ref_domain",
]
