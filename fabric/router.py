"""Choosing an agent for a target: direct (an agent id), a constraint set, or ``auto``.

**Direct**: the named agent, whether or not it is available right now (its queue holds
the task until it is). A direct target is never re-routed.

**Constraint set** (``tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5``):
a candidate must be able to take work (not a human, not a router), satisfy every
constraint, and be allowed to see every privacy domain the task's refs point into. Among
those, the rule is, in order:

1. **available first**: an agent whose queue is parked (quota spent, budget spent, node
   asleep, outside hours: the park states the workers publish) is passed over while
   another qualifying agent is available;
2. the **cheapest cost class**;
3. the **smallest sufficient tier**;
4. the **id**, alphabetically.

When every qualifying agent is parked, the one that resumes first (its published
``until``; unknown counts as last) is chosen, then the rule above: the task waits in that
queue instead of failing. The choice, the rule and the fate of every other candidate are
kept in a :class:`Choice`; ``agap route --explain`` prints it and a routed submit
records its one-line :meth:`Choice.why` on the task.

**Auto**: the router policy (``cards/_router.yaml``) maps the task to a constraint set by
rules over its intent, its size and the capabilities the caller asks for; the first
matching rule wins, and the constraint set is then resolved as above. No model is called
to route (:mod:`fabric.router_rules`; constraint sets are :mod:`fabric.constraints`).

Routing decides and never writes: it reads cards, the policy file's privacy domains and
the published park states (a :class:`~fabric.kanboard.reader.ReadOnlyBoard`). Submit
creates the routed task (:meth:`fabric.core.Fabric.submit`); the keeper carries out a
:class:`Reroute` (:mod:`keeper.decisions`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from fabric.cards import Card, CardSet, cost_rank, tier_rank, trust_rank
from fabric.constraints import Constraints, constraints_from_dict, is_routed, parse_constraints
from fabric.errors import InvalidInput
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.views import TaskView
from fabric.policy import ref_domain
from fabric.policy_file import policy_config
from fabric.router_rules import router_policy
from fabric.task import State, TaskSpec, parse_priority

AUTO = "auto"
#: The ranking rule among qualifying agents, as recorded on routed tasks.
RULE = "available first, then the cheapest cost class, then the smallest sufficient tier, then the id"

Mode = Literal["direct", "constraints", "auto"]


# ---------------------------------------------------------------------------------------
# Candidates and the choice


@dataclass
class Candidate:
    """One agent considered for a target, and what became of it."""

    id: str
    misses: list[str] = field(default_factory=list)  # constraints it does not meet
    parked: str | None = None  # why its queue is parked right now, if it is
    until: float | None = None  # when the park is expected to end
    verdict: str = ""

    @property
    def qualifies(self) -> bool:
        return not self.misses

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "qualifies": self.qualifies,
            "available": self.parked is None,
            "misses": self.misses,
            "parked": self.parked,
            "until": self.until,
            "verdict": self.verdict,
        }


@dataclass
class Choice:
    """The pick, and why each candidate was or was not chosen.

    ``reasons`` maps every candidate's id to its verdict (kept for older callers).
    """

    card: Card
    reasons: dict[str, str] = field(default_factory=dict)
    mode: Mode = "constraints"
    constraints: Constraints | None = None
    candidates: list[Candidate] = field(default_factory=list)
    rule: str = RULE
    auto_rule: str | None = None
    auto_trace: list[str] = field(default_factory=list)  # each router rule tried, and why
    size: str | None = None  # the size the auto router measured
    waiting: bool = False  # the pick is parked: the task waits in its queue

    def why(self) -> str:
        """One line recorded on the routed task."""
        if self.mode == "direct":
            return f"direct: {self.card.id} was named" + (
                f" (parked: {self.reasons[self.card.id]})" if self.waiting else ""
            )
        head = f"auto rule {self.auto_rule!r} → " if self.mode == "auto" else ""
        ctext = self.constraints.text() if self.constraints else ""
        fit = [c for c in self.candidates if c.qualifies]
        free = [c for c in fit if c.parked is None]
        tail = (
            f"every qualifying agent is parked; {self.card.id} resumes first"
            if self.waiting
            else f"{len(free)} of {len(fit)} qualifying agents available"
        )
        return f"{head}{ctext or 'any agent'}: {self.card.id} ({RULE}; {tail})"

    def recorded(self) -> dict[str, object]:
        """What the spec records in ``constraints``: the set, and how it was routed."""
        d = {} if self.mode == "direct" or not self.constraints else self.constraints.as_dict()
        if self.mode == "auto":
            d["route"] = f"auto:{self.auto_rule}"
        elif self.mode == "constraints" and not d:
            d["route"] = "constraints"
        if self.card.trust == "untrusted":
            d["taint"] = self.card.id  # its output is tainted (see fabric.policy)
        return d

    def render(self) -> str:
        """The readable explanation ``agap route --explain`` prints."""
        lines: list[str] = []
        if self.mode == "direct":
            lines.append(f"direct target {self.card.id}: never re-routed")
        else:
            if self.mode == "auto":
                lines.append(f"auto: task size {self.size}; router rules, first match wins:")
                lines += [f"  {t}" for t in self.auto_trace]
            ctext = self.constraints.text() if self.constraints else ""
            lines.append(f"constraints: {ctext or '(none: any agent that takes work)'}")
            lines.append(f"rule: {RULE}")
        lines.append("candidates:")
        width = max((len(c.id) for c in self.candidates), default=4)
        for c in self.candidates:
            mark = "*" if c.id == self.card.id else ("+" if c.qualifies else "-")
            lines.append(f"  {mark} {c.id:<{width}}  {c.verdict}")
        lines.append(
            f"pick: {self.card.id} (queue {self.card.queue_name})"
            + ("  [parked: the task will wait]" if self.waiting else "")
        )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "pick": self.card.id,
            "queue": self.card.queue_name,
            "constraints": self.constraints.as_dict() if self.constraints else None,
            "rule": RULE if self.mode != "direct" else None,
            "auto_rule": self.auto_rule,
            "auto_trace": self.auto_trace,
            "size": self.size,
            "waiting": self.waiting,
            "why": self.why(),
            "candidates": [c.as_dict() for c in self.candidates],
        }


RESERVED = "reserved for interactive work"


def park_of(
    card: Card, parks: Mapping[str, Mapping[str, Any]] | None, now: float, *, interactive: bool = False
) -> tuple[str, float | None] | None:
    """(reason, until) when ``card``'s queue is published as parked at ``now``, else None.

    A queue parked only to keep the tail of its window for interactive work (the budget
    governor) is available to interactive tasks (priority high or urgent).
    """
    state = (parks or {}).get(card.queue_name)
    if not state or not state.get("parked"):
        return None
    if interactive and str(state.get("reason") or "").startswith(RESERVED):
        return None
    until = state.get("until")
    until_f = float(until) if isinstance(until, int | float) and until else None
    if until_f is not None and until_f <= now:
        return None  # the park has run out; the worker just has not republished yet
    return str(state.get("reason") or "parked"), until_f


def unmet(card: Card, c: Constraints, *, domains: Iterable[str] = ()) -> list[str]:
    """The constraints ``card`` does not satisfy (empty when it qualifies)."""
    misses: list[str] = []
    if card.kind in ("human", "router"):
        misses.append(f"is a {card.kind}")
    if c.tier and (card.tier is None or tier_rank(card.tier) < tier_rank(c.tier)):
        misses.append(f"tier {card.tier or 'none'} < {c.tier}")
    missing = sorted(c.capabilities - set(card.capabilities))
    if missing:
        misses.append("lacks " + "+".join(missing))
    if c.trust and trust_rank(card.trust) < trust_rank(c.trust):
        misses.append(f"trust {card.trust} < {c.trust}")
    if c.cost_class and cost_rank(card.cost_class) > cost_rank(c.cost_class):
        misses.append(f"cost {card.cost_class} > {c.cost_class}")
    if c.max_cost_usd is not None and card.cost_class != "free":
        if card.max_cost_usd is None:
            misses.append(f"no max_cost_usd on a {card.cost_class} card (asked ≤ ${c.max_cost_usd:g})")
        elif card.max_cost_usd > c.max_cost_usd:
            misses.append(f"max cost ${card.max_cost_usd:g} > ${c.max_cost_usd:g}")
    unseen = sorted(set(domains) - set(card.privacy_domains))
    if unseen:
        misses.append("may not see " + ", ".join(unseen))
    return misses


def _until(ts: float | None) -> str:
    return "" if ts is None else " until " + datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")


def choose(
    cards: CardSet | Iterable[Card],
    c: Constraints,
    *,
    parks: Mapping[str, Mapping[str, Any]] | None = None,
    now: float | None = None,
    domains: Iterable[str] = (),
    exclude: Iterable[str] = (),
    interactive: bool = False,
) -> Choice:
    """The deterministic pick for constraint set ``c`` (raises when nobody qualifies).

    ``parks`` are the published park states (``TaskBoard.park_states()``); without them
    every agent counts as available. ``domains`` are the privacy domains of the task's
    refs; ``exclude`` names agents not to consider (the one a task is re-routed from);
    ``interactive`` tasks may use a window's tail the budget governor reserves for them.
    """
    now = time.time() if now is None else now
    cands = _candidates(cards, c, parks, now, frozenset(domains), frozenset(exclude), interactive)
    fit = [(cand, card) for cand, card in cands if cand.qualifies]
    for cand, _ in cands:
        if not cand.qualifies:
            cand.verdict = "no: " + "; ".join(cand.misses)
    if not fit:
        raise InvalidInput(
            "no agent satisfies the constraints",
            where="--constraints",
            hint="; ".join(f"{x.id}: {'; '.join(x.misses)}" for x, _ in cands),
        )
    ordered, waiting = _ordered(fit)
    _judge(ordered, waiting)
    pick = ordered[0][1]
    return Choice(
        pick,
        {cand.id: cand.verdict for cand, _ in cands},
        "constraints",
        c,
        [cand for cand, _ in cands],
        waiting=waiting,
    )


def _candidates(
    cards: CardSet | Iterable[Card],
    c: Constraints,
    parks: Mapping[str, Mapping[str, Any]] | None,
    now: float,
    domains: frozenset[str],
    skip: frozenset[str],
    interactive: bool,
) -> list[tuple[Candidate, Card]]:
    """Every card as a candidate for ``c``, by id: what it misses, and its park."""
    cands: list[tuple[Candidate, Card]] = []
    for card in sorted(cards, key=lambda k: k.id):
        cand = Candidate(card.id, unmet(card, c, domains=domains))
        if card.id in skip:
            cand.misses.insert(0, "excluded: the agent being re-routed from")
        park = park_of(card, parks, now, interactive=interactive)
        if park is not None:
            cand.parked, cand.until = park
        cands.append((cand, card))
    return cands


def _rank(pair: tuple[Candidate, Card]) -> tuple[int, int, str]:
    card = pair[1]
    return cost_rank(card.cost_class), tier_rank(card.tier) if card.tier else 0, card.id


def _ordered(fit: list[tuple[Candidate, Card]]) -> tuple[list[tuple[Candidate, Card]], bool]:
    """The qualifying candidates by :data:`RULE`, and whether every one of them is parked."""
    free = sorted((p for p in fit if p[0].parked is None), key=_rank)
    if free:
        return free + sorted((p for p in fit if p[0].parked is not None), key=_rank), False
    return sorted(fit, key=lambda p: (p[0].until if p[0].until is not None else math.inf, *_rank(p))), True


def _judge(ordered: list[tuple[Candidate, Card]], waiting: bool) -> None:
    """Each qualifying candidate's verdict: chosen, parked, or ranked behind the pick."""
    for i, (cand, card) in enumerate(ordered):
        if i == 0:
            cand.verdict = (
                "chosen: every qualifying agent is parked and this one resumes first "
                f"({cand.parked}{_until(cand.until)})"
                if waiting
                else f"chosen: available, {card.cost_class}, tier {card.tier or 'none'}"
            )
        elif cand.parked is not None and not waiting:
            cand.verdict = f"qualifies but parked: {cand.parked}{_until(cand.until)}"
        else:
            best = ordered[0][1]
            cand.verdict = f"qualifies, ranked {i + 1}: " + _behind(card, best, cand, waiting)


def _behind(card: Card, best: Card, cand: Candidate, waiting: bool) -> str:
    if cost_rank(card.cost_class) > cost_rank(best.cost_class):
        return f"costs more ({card.cost_class} > {best.cost_class})"
    if (card.tier and best.tier) and tier_rank(card.tier) > tier_rank(best.tier):
        return f"a bigger tier than needed ({card.tier} > {best.tier})"
    if waiting:
        return f"parked ({cand.parked}{_until(cand.until)}), resumes later"
    return f"same cost and tier, {best.id} sorts first"


# ---------------------------------------------------------------------------------------
# Routing a submit


def is_auto(cards: CardSet, target: str | None) -> bool:
    """``auto``, or the id of a router card, means: let the router policy decide."""
    if target is None:
        return False
    if target == AUTO:
        return True
    return target in cards and cards.get(target).kind == "router"


def route(
    cards: CardSet,
    board: ReadOnlyBoard,
    cards_dir: str | Path,
    *,
    intent: str,
    target: str | None = None,
    constraints: str | Constraints | None = None,
    refs: Sequence[str] = (),
    priority: str | int = "normal",
    exclude: Iterable[str] = (),
    clock: Callable[[], float] = time.time,
) -> Choice:
    """Resolve a submit's target to a card, explained. Reads the park states (one round
    trip) for constraint and auto targets; a direct target costs nothing.

    ``cards_dir`` holds the policy file (privacy domains) and the router rules."""
    auto = is_auto(cards, target)
    asked = _asked(target, constraints, auto)
    if target is not None and not auto:
        card = cards.get(target)
        cand = Candidate(card.id, verdict="named directly")
        return Choice(card, {card.id: cand.verdict}, "direct", None, [cand], rule="")
    cfg = policy_config(cards_dir)
    domains = {ref_domain(r, cfg) for r in refs}
    if auto:
        rule, wanted, size, trace = router_policy(cards_dir).pick(intent, refs, asked or Constraints())
    else:
        assert asked is not None
        wanted = asked
    # Nobody qualifying is an error whatever the park states: refuse before reading them.
    choose(cards, wanted, domains=domains, exclude=exclude)
    choice = choose(
        cards,
        wanted,
        parks=board.park_states(),
        now=clock(),
        domains=domains,
        exclude=exclude,
        interactive=parse_priority(priority) >= 2,
    )
    if auto:
        choice.mode, choice.auto_rule, choice.auto_trace, choice.size = "auto", rule.name, trace, size
    return choice


def _asked(target: str | None, constraints: str | Constraints | None, auto: bool) -> Constraints | None:
    """The constraint set the caller asked for (with ``auto``, what it adds to the rule's)."""
    if target is None and constraints is None:
        raise InvalidInput(
            "give exactly one of a target agent or constraints", where="--target/--constraints"
        )
    if target is not None and constraints is not None and not auto:
        raise InvalidInput(
            "give exactly one of a target agent or constraints",
            where="--target/--constraints",
            hint="with --target auto, --constraints adds requirements",
        )
    if constraints is None or isinstance(constraints, Constraints):
        return constraints
    return parse_constraints(str(constraints))


# ---------------------------------------------------------------------------------------
# Re-routing a constraint task whose agent parked


@dataclass(frozen=True)
class Reroute:
    """A queued, constraint-routed task to move off its parked queue.

    The keeper cancels the old task with ``cancel_reason`` (None: a reroute that crashed
    after its cancel is being finished), then submits ``spec``'s work again under the
    action id ``key`` with the same ``constraints``, routed afresh (an auto task keeps the
    set its rule gave).
    """

    task_id: int
    spec: TaskSpec
    key: str
    cancel_reason: str | None
    constraints: Constraints


def plan_reroute(
    cards: CardSet,
    board: ReadOnlyBoard,
    cards_dir: str | Path,
    view: TaskView,
    *,
    by: str = "router",
    parks: Mapping[str, Mapping[str, Any]] | None = None,
    clock: Callable[[], float] = time.time,
) -> Reroute | None:
    """Whether to move a queued, constraint-routed task off a parked queue to an available agent.

    None when nothing is to be done: a direct target (never re-routed), a task that is not
    queued, a queue that is not parked, or no other available agent satisfying the same
    constraint set. The old task is canceled first (its epoch lock guarantees no worker
    holds it), then the new one is submitted with the same intent, refs, constraint set,
    priority, deadline and parent under an action id derived from the old uid, so a crash
    between the two steps is finished by calling again (``by`` names who cancels).
    """
    spec, cur = view.spec, view.current
    if spec is None or cur is None or view.uid is None or not is_routed(spec.constraints):
        return None
    key = f"reroute/{view.uid}"
    resuming = cur.state == State.CANCELED and cur.by == by and (cur.reason or "").startswith("re-routed")
    if resuming:
        return Reroute(view.id, spec, key, None, constraints_from_dict(spec.constraints))
    if cur.state != State.QUEUED:
        return None
    parks = board.park_states() if parks is None else parks
    now = clock()
    card = cards.get(spec.target) if spec.target in cards else None
    if card is None or park_of(card, parks, now, interactive=spec.priority >= 2) is None:
        return None
    try:
        choice = _reroute_choice(cards, cards_dir, spec, parks, now)
    except InvalidInput:
        return None
    if choice.waiting:
        return None  # every other qualifier is parked too: stay put
    reason, until = park_of(card, parks, now) or ("parked", None)
    why = f"re-routed: {spec.target} is parked ({reason}{_until(until)}); continued on {choice.card.id}"
    return Reroute(view.id, spec, key, why, constraints_from_dict(spec.constraints))


def _reroute_choice(
    cards: CardSet, cards_dir: str | Path, spec: TaskSpec, parks: Mapping[str, Mapping[str, Any]], now: float
) -> Choice:
    cfg = policy_config(cards_dir)
    domains = {ref_domain(r, cfg) for r in spec.refs}
    return choose(
        cards,
        constraints_from_dict(spec.constraints),
        parks=parks,
        now=now,
        domains=domains,
        exclude=(spec.target,),
        interactive=spec.priority >= 2,
    )


def digest(text: str) -> str:
    """A short stable digest (used in derived action ids)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "AUTO",
    "RULE",
    "Candidate",
    "Choice",
    "Reroute",
    "choose",
    "is_auto",
    "park_of",
    "plan_reroute",
    "route",
    "unmet",
]
