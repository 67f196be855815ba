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
to route.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.cards import TIERS, Card, CardSet, cost_rank, tier_rank, trust_rank
from fabric.errors import ConfigError, InvalidInput

if TYPE_CHECKING:
    from fabric.core import Fabric
    from fabric.kanboard.taskboard import TaskView
    from fabric.submit import Receipt

AUTO = "auto"
#: The ranking rule among qualifying agents, as recorded on routed tasks.
RULE = "available first, then the cheapest cost class, then the smallest sufficient tier, then the id"
#: Keys of a spec's constraints that describe a constraint set (the rest are annotations).
CONSTRAINT_KEYS = ("tier", "capabilities", "trust", "cost_class", "max_cost_usd")
ROUTER_FILE = "_router.yaml"

Mode = Literal["direct", "constraints", "auto"]


# ---------------------------------------------------------------------------------------
# Constraint sets


@dataclass(frozen=True)
class Constraints:
    """What a constraint target asks for."""

    tier: str | None = None  # minimum tier
    capabilities: frozenset[str] = frozenset()
    trust: str | None = None  # minimum trust
    cost_class: str | None = None  # maximum cost class
    max_cost_usd: float | None = None  # the agent's per-task cap must be at most this

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {}
        if self.tier:
            d["tier"] = self.tier
        if self.capabilities:
            d["capabilities"] = sorted(self.capabilities)
        if self.trust:
            d["trust"] = self.trust
        if self.cost_class:
            d["cost_class"] = self.cost_class
        if self.max_cost_usd is not None:
            d["max_cost_usd"] = self.max_cost_usd
        return d

    def text(self) -> str:
        """Back to the ``--constraints`` syntax (empty for "any agent")."""
        parts = []
        if self.tier:
            parts.append(f"tier>={self.tier}")
        if self.capabilities:
            parts.append("cap=" + "+".join(sorted(self.capabilities)))
        if self.trust:
            parts.append(f"trust>={self.trust}")
        if self.cost_class:
            parts.append(f"cost<={self.cost_class}")
        if self.max_cost_usd is not None:
            parts.append(f"max_cost<={self.max_cost_usd:g}")
        return ",".join(parts)

    def merged(self, other: Constraints) -> Constraints:
        """Both sets at once: the stronger tier and trust, all capabilities, the lower costs."""

        def hi(a: str | None, b: str | None, rank: Any) -> str | None:
            return a if b is None else b if a is None else (a if rank(a) >= rank(b) else b)

        def lo(a: str | None, b: str | None) -> str | None:
            return a if b is None else b if a is None else (a if cost_rank(a) <= cost_rank(b) else b)

        costs = [x for x in (self.max_cost_usd, other.max_cost_usd) if x is not None]
        return Constraints(
            tier=hi(self.tier, other.tier, tier_rank),
            capabilities=self.capabilities | other.capabilities,
            trust=hi(self.trust, other.trust, trust_rank),
            cost_class=lo(self.cost_class, other.cost_class),
            max_cost_usd=min(costs) if costs else None,
        )


_CONSTRAINT_HINT = "e.g. tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5"


def parse_constraints(text: str) -> Constraints:
    """``tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5``."""
    tier = trust = cost = None
    max_cost: float | None = None
    caps: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, op, value = _split(part)
        if key == "tier" and op in (">=", "="):
            if value not in TIERS:
                raise InvalidInput(
                    f"unknown tier {value!r}", where="--constraints", hint=f"tiers: {', '.join(TIERS)}"
                )
            tier = value
        elif key in ("cap", "caps", "capabilities") and op == "=":
            caps.update(filter(None, value.split("+")))
        elif key == "trust" and op in (">=", "="):
            trust_rank(value)
            trust = value
        elif key == "cost" and op in ("<=", "="):
            cost_rank(value)
            cost = value
        elif key in ("max_cost", "maxcost", "max_cost_usd") and op in ("<=", "="):
            try:
                max_cost = float(value.removeprefix("$"))
            except ValueError:
                max_cost = -1.0
            if not max_cost > 0 or math.isinf(max_cost):
                raise InvalidInput(
                    f"max_cost must be a positive number of dollars, not {value!r}",
                    where="--constraints",
                    hint=_CONSTRAINT_HINT,
                )
        else:
            raise InvalidInput(
                f"cannot read constraint {part!r}", where="--constraints", hint=_CONSTRAINT_HINT
            )
    return Constraints(tier, frozenset(caps), trust, cost, max_cost)


def constraints_from_dict(d: Mapping[str, Any]) -> Constraints:
    """The constraint set recorded in a spec's ``constraints`` (annotations are ignored)."""
    caps = d.get("capabilities") or ()
    cost = d.get("max_cost_usd")
    return Constraints(
        tier=d.get("tier") or None,
        capabilities=frozenset(str(c) for c in caps),
        trust=d.get("trust") or None,
        cost_class=d.get("cost_class") or None,
        max_cost_usd=float(cost) if cost is not None else None,
    )


def is_routed(constraints: Mapping[str, Any]) -> bool:
    """Whether a spec's constraints say it was routed by constraints or auto (not direct)."""
    return any(k in constraints for k in CONSTRAINT_KEYS) or "route" in constraints


def _split(part: str) -> tuple[str, str, str]:
    for op in (">=", "<=", "="):
        if op in part:
            key, _, value = part.partition(op)
            return key.strip().lower(), op, value.strip()
    raise InvalidInput(
        f"cannot read constraint {part!r}",
        where="--constraints",
        hint="write key>=value, key<=value or key=value",
    )


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
    domains = frozenset(domains)
    skip = frozenset(exclude)
    cands: list[tuple[Candidate, Card]] = []
    for card in sorted(cards, key=lambda k: k.id):
        cand = Candidate(card.id, unmet(card, c, domains=domains))
        if card.id in skip:
            cand.misses.insert(0, "excluded: the agent being re-routed from")
        park = park_of(card, parks, now, interactive=interactive)
        if park is not None:
            cand.parked, cand.until = park
        cands.append((cand, card))
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

    def rank(pair: tuple[Candidate, Card]) -> tuple[int, int, str]:
        card = pair[1]
        return cost_rank(card.cost_class), tier_rank(card.tier) if card.tier else 0, card.id

    free = sorted((p for p in fit if p[0].parked is None), key=rank)
    waiting = not free
    if free:
        ordered = free + sorted((p for p in fit if p[0].parked is not None), key=rank)
    else:
        ordered = sorted(fit, key=lambda p: (p[0].until if p[0].until is not None else math.inf, *rank(p)))
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
    pick = ordered[0][1]
    return Choice(
        pick,
        {cand.id: cand.verdict for cand, _ in cands},
        "constraints",
        c,
        [cand for cand, _ in cands],
        waiting=waiting,
    )


def _behind(card: Card, best: Card, cand: Candidate, waiting: bool) -> str:
    if cost_rank(card.cost_class) > cost_rank(best.cost_class):
        return f"costs more ({card.cost_class} > {best.cost_class})"
    if (card.tier and best.tier) and tier_rank(card.tier) > tier_rank(best.tier):
        return f"a bigger tier than needed ({card.tier} > {best.tier})"
    if waiting:
        return f"parked ({cand.parked}{_until(cand.until)}), resumes later"
    return f"same cost and tier, {best.id} sorts first"


# ---------------------------------------------------------------------------------------
# The auto router policy


class _RuleWhen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    intent: str | None = None  # a regular expression searched in the intent
    size: list[Literal["small", "medium", "large"]] | None = None
    capabilities: list[str] | None = None  # the caller asked for all of these

    @field_validator("size", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("intent")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"is not a regular expression: {exc}") from None
        return v


class _RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    when: _RuleWhen = _RuleWhen()
    constraints: str = ""


class _SizeLimit(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_chars: int = Field(gt=0)
    max_refs: int = Field(ge=0)


class _RouterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sizes: dict[Literal["small", "medium"], _SizeLimit] = Field(default_factory=dict)
    rules: list[_RuleFile] = Field(min_length=1)


@dataclass(frozen=True)
class RouterRule:
    """One auto-routing rule: when it matches, the task gets ``constraints``."""

    name: str
    constraints: Constraints
    intent: str | None = None
    sizes: frozenset[str] = frozenset()
    capabilities: frozenset[str] = frozenset()

    def test(self, intent: str, size: str, asked: frozenset[str]) -> str | None:
        """None when the rule matches, else why it does not."""
        if self.intent is not None and not re.search(self.intent, intent):
            return f"intent does not match /{self.intent}/"
        if self.sizes and size not in self.sizes:
            return f"size {size} not in {'/'.join(sorted(self.sizes))}"
        missing = sorted(self.capabilities - asked)
        if missing:
            return "capabilities not asked for: " + "+".join(missing)
        return None

    def condition(self) -> str:
        parts = []
        if self.intent is not None:
            parts.append(f"intent ~ /{self.intent}/")
        if self.sizes:
            parts.append("size in " + "/".join(sorted(self.sizes)))
        if self.capabilities:
            parts.append("asks " + "+".join(sorted(self.capabilities)))
        return " and ".join(parts) or "always"


@dataclass(frozen=True)
class RouterPolicy:
    """The auto router: task size thresholds and an ordered list of rules."""

    rules: tuple[RouterRule, ...]
    small: tuple[int, int] = (280, 1)  # (max intent chars, max refs)
    medium: tuple[int, int] = (2000, 5)
    source: str = "built-in"

    def size_of(self, intent: str, refs: Sequence[str]) -> str:
        """``small``, ``medium`` or ``large``, from the intent's length and the ref count."""
        for name, (chars, nrefs) in (("small", self.small), ("medium", self.medium)):
            if len(intent) <= chars and len(refs) <= nrefs:
                return name
        return "large"

    def pick(
        self, intent: str, refs: Sequence[str], asked: Constraints
    ) -> tuple[RouterRule, Constraints, str, list[str]]:
        """(rule, its constraints merged with what was asked, size, trace of rules tried)."""
        size = self.size_of(intent, refs)
        trace: list[str] = []
        for rule in self.rules:
            why_not = rule.test(intent, size, asked.capabilities)
            if why_not is None:
                trace.append(
                    f"* {rule.name}: matches ({rule.condition()}) → {rule.constraints.text() or 'any agent'}"
                )
                return rule, rule.constraints.merged(asked), size, trace
            trace.append(f"- {rule.name}: {why_not}")
        raise ConfigError(
            "no router rule matches the task",
            where=self.source,
            hint="end the rules with a catch-all rule that has no `when`",
        )


DEFAULT_POLICY = RouterPolicy((RouterRule("default", Constraints()),))


def load_router_policy(path: str | Path) -> RouterPolicy:
    """Read a router rules file; a missing file gives the built-in catch-all policy."""
    p = Path(path)
    try:
        stat = p.stat()
    except FileNotFoundError:
        return DEFAULT_POLICY
    return _load_router_policy(str(p), stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _load_router_policy(path: str, _mtime: int) -> RouterPolicy:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        data = _RouterFile.model_validate(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", where=path) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{loc}: {first['msg']}", where=path) from None
    rules = []
    for i, r in enumerate(data.rules):
        try:
            c = parse_constraints(r.constraints)
        except InvalidInput as exc:
            raise ConfigError(exc.what, where=f"{path}: rules.{i}.constraints") from None
        w = r.when
        rules.append(
            RouterRule(r.name, c, w.intent, frozenset(w.size or ()), frozenset(w.capabilities or ()))
        )
    small, medium = data.sizes.get("small"), data.sizes.get("medium")
    return RouterPolicy(
        tuple(rules),
        (small.max_chars, small.max_refs) if small else DEFAULT_POLICY.small,
        (medium.max_chars, medium.max_refs) if medium else DEFAULT_POLICY.medium,
        path,
    )


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
    fabric: Fabric,
    *,
    intent: str,
    target: str | None = None,
    constraints: str | Constraints | None = None,
    refs: Sequence[str] = (),
    priority: str | int = "normal",
    exclude: Iterable[str] = (),
) -> Choice:
    """Resolve a submit's target to a card, explained. Reads the park states (one round
    trip) for constraint and auto targets; a direct target costs nothing."""
    from fabric.policy import policy_config, ref_domain

    auto = is_auto(fabric.cards, target)
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
    asked = (
        constraints
        if isinstance(constraints, Constraints)
        else parse_constraints(str(constraints))
        if constraints is not None
        else None
    )
    if target is not None and not auto:
        card = fabric.cards.get(target)
        cand = Candidate(card.id, verdict="named directly")
        return Choice(card, {card.id: cand.verdict}, "direct", None, [cand], rule="")
    cfg = policy_config(fabric.settings.cards_dir)
    domains = {ref_domain(r, cfg) for r in refs}
    if auto:
        policy = load_router_policy(Path(fabric.settings.cards_dir) / ROUTER_FILE)
        rule, wanted, size, trace = policy.pick(intent, refs, asked or Constraints())
    else:
        assert asked is not None
        wanted = asked
    # Nobody qualifying is an error whatever the park states: refuse before reading them.
    choose(fabric.cards, wanted, domains=domains, exclude=exclude)
    from fabric.task import parse_priority

    choice = choose(
        fabric.cards,
        wanted,
        parks=fabric.board.park_states(),
        now=fabric.clock(),
        domains=domains,
        exclude=exclude,
        interactive=parse_priority(priority) >= 2,
    )
    if auto:
        choice.mode, choice.auto_rule, choice.auto_trace, choice.size = "auto", rule.name, trace, size
    return choice


def note_route(fabric: Fabric, receipt: Receipt, choice: Choice) -> None:
    """Record why a routed task went where it went, as a comment (never raises)."""
    if choice.mode == "direct" or not receipt.created:
        return
    try:
        fabric.board.comment(receipt.task_id, "Routed — " + choice.why())
    except Exception:  # the spec already records the constraint set; this is for humans
        import logging

        logging.getLogger("agap.route").warning("could not record the route of task #%s", receipt.task_id)


# ---------------------------------------------------------------------------------------
# Re-routing a constraint task whose agent parked


def reroute_parked(
    fabric: Fabric,
    view: TaskView,
    *,
    by: str = "router",
    parks: Mapping[str, Mapping[str, Any]] | None = None,
) -> Receipt | None:
    """Move a queued, constraint-routed task off a parked queue to an available agent.

    Returns the new task's receipt, or None when nothing is to be done: a direct target
    (never re-routed), a task that is not queued, a queue that is not parked, or no other
    available agent satisfying the same constraint set. The old task is canceled first
    (its epoch lock guarantees no worker holds it), then the new one is submitted with
    the same intent, refs, constraint set, priority, deadline and parent under an action
    id derived from the old uid, so a crash between the two steps is finished by calling
    again.
    """
    from fabric.kanboard.layout import State

    spec, cur = view.spec, view.current
    if spec is None or cur is None or view.uid is None or not is_routed(spec.constraints):
        return None
    key = f"reroute/{view.uid}"
    resuming = cur.state == State.CANCELED and cur.by == by and (cur.reason or "").startswith("re-routed")
    if not resuming:
        if cur.state != State.QUEUED:
            return None
        parks = fabric.board.park_states() if parks is None else parks
        now = fabric.clock()
        card = fabric.cards.get(spec.target) if spec.target in fabric.cards else None
        if card is None or park_of(card, parks, now, interactive=spec.priority >= 2) is None:
            return None
        try:
            choice = _reroute_choice(fabric, view, parks, now)
        except InvalidInput:
            return None
        if choice.waiting:
            return None  # every other qualifier is parked too: stay put
        reason, until = park_of(card, parks, now) or ("parked", None)
        fabric.ledger.cancel(
            view.id,
            by,
            reason=f"re-routed: {spec.target} is parked ({reason}"
            f"{_until(until)}); continued on {choice.card.id}",
            view=view,
        )
    parent_id = _task_id_of_uid(fabric, spec.parent) if spec.parent else None
    # The same constraint set, routed afresh (an auto task keeps the set its rule gave).
    return fabric.submit(
        spec.intent,
        constraints=constraints_from_dict(spec.constraints),
        refs=spec.refs,
        priority=spec.priority,
        deadline=spec.deadline,
        not_before=spec.not_before,
        key=key,
        actor=spec.actor,
        parent=parent_id,
    )


def _reroute_choice(
    fabric: Fabric, view: TaskView, parks: Mapping[str, Mapping[str, Any]], now: float
) -> Choice:
    from fabric.policy import policy_config, ref_domain

    assert view.spec is not None
    cfg = policy_config(fabric.settings.cards_dir)
    domains = {ref_domain(r, cfg) for r in view.spec.refs}
    return choose(
        fabric.cards,
        constraints_from_dict(view.spec.constraints),
        parks=parks,
        now=now,
        domains=domains,
        exclude=(view.spec.target,),
        interactive=view.spec.priority >= 2,
    )


def _task_id_of_uid(fabric: Fabric, uid: str) -> int | None:
    from fabric.policy import find_by_uid

    found = find_by_uid(fabric, [uid])
    return found[uid][0] if uid in found else None


def digest(text: str) -> str:
    """A short stable digest (used in derived action ids)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "AUTO",
    "RULE",
    "Candidate",
    "Choice",
    "Constraints",
    "RouterPolicy",
    "RouterRule",
    "choose",
    "constraints_from_dict",
    "is_auto",
    "is_routed",
    "load_router_policy",
    "note_route",
    "park_of",
    "parse_constraints",
    "reroute_parked",
    "route",
    "unmet",
]
