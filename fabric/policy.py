"""Submit and claim policy: hygiene, privacy domains, taint, and always-ask escalation.

Every refusal is a :class:`PolicyRefused` naming its ``code``, the ``rule`` and the
``limit``, raised before anything is written. The rules (docs/POLICY.md tells the story):

* **creation quota** (``QUOTA_EXCEEDED``): an agent (an actor that is a non-human card)
  may create at most ``limit`` tasks per rolling ``window``;
* **depth cap** (``DEPTH_EXCEEDED``): a provenance chain may be at most ``max_depth`` deep;
* **cycle** (``CYCLE``): a task may not repeat an ancestor's target and intent;
* **privacy** (``PRIVACY``): every ref points into a privacy domain; the target must be
  allowed to see it, a sandboxed or untrusted agent never sees a private one, and work
  done for human H sees only H's private domain and the shared ones;
* **taint** (``TAINT_GATED``): output of untrusted work goes only back to the agent that
  produced it (or to a human); anything else creates a gate task in a human's inbox and
  proceeds only once the gate is approved and cited as a ref.

Configuration: ``cards/_policy.yaml`` (optional; every key has a default).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.cards import Card, CardSet, parse_duration, trust_rank
from fabric.errors import ConfigError, FabricError, InvalidInput
from fabric.kanboard.layout import State, is_uid, receipt_reference
from fabric.kanboard.port import Call
from fabric.task import TaskSpec

if TYPE_CHECKING:
    from fabric.core import Fabric
    from fabric.kanboard.taskboard import TaskView
    from fabric.submit import Receipt

POLICY_FILE = "_policy.yaml"
GATE_ACTOR = "fabric-policy"
SHARED = "shared"
_DOMAIN = re.compile(r"^(?:private:[a-z][a-z0-9_.-]{0,38}|[a-z][a-z0-9-]{0,38})$")
_TASK_REF = re.compile(r"^(?:kanboard://task/|task:)#?(\d+)(?:/.*)?$")


# ---------------------------------------------------------------------------------------
# Errors


class PolicyRefused(FabricError):
    """A submit or claim a rule refuses; ``code``, ``rule`` and ``limit`` name it."""

    exit_code = 6
    code = "POLICY"

    def __init__(self, rule: str, what: str, *, limit: str, where: str = "", hint: str = "") -> None:
        self.rule = rule
        self.limit = limit
        super().__init__(f"{self.code} [{rule}, limit: {limit}]: {what}", where=where, hint=hint)


class QuotaExceeded(PolicyRefused):
    code = "QUOTA_EXCEEDED"


class DepthExceeded(PolicyRefused):
    code = "DEPTH_EXCEEDED"


class CycleDetected(PolicyRefused):
    code = "CYCLE"


class PrivacyViolation(PolicyRefused):
    code = "PRIVACY"


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
# Configuration


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(ge=0)
    window: str = "1h"

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        try:
            parse_duration(v)
        except FabricError as exc:
            raise ValueError(exc.what) from None
        return v


class _QuotaFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: _Quota = _Quota(limit=60, window="1h")
    agents: dict[str, _Quota] = Field(default_factory=dict)


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    quota: _QuotaFile = _QuotaFile()
    max_depth: int = Field(default=8, ge=0)
    gate_to: str | None = None
    default_domain: str = SHARED
    domains: dict[str, str] = Field(default_factory=dict)
    tainted: dict[str, str] = Field(default_factory=dict)

    @field_validator("default_domain")
    @classmethod
    def _default(cls, v: str) -> str:
        return _check_domain(v)

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: dict[str, str]) -> dict[str, str]:
        for d in v.values():
            _check_domain(d)
        return v


def _check_domain(value: str) -> str:
    if not _DOMAIN.match(value) or value == "private":
        raise ValueError(f"{value!r} is not a privacy domain (write 'shared' or 'private:<human>')")
    return value


@dataclass(frozen=True)
class Quota:
    limit: int
    window: float  # seconds
    text: str  # as written, e.g. "60 per 1h"


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's limits and ref annotations (``cards/_policy.yaml``)."""

    quota: Quota = Quota(60, 3600.0, "60 per 1h")
    quota_agents: Mapping[str, Quota] = field(default_factory=dict)
    max_depth: int = 8
    gate_to: str | None = None
    default_domain: str = SHARED
    domains: tuple[tuple[str, str], ...] = ()  # (ref prefix, domain), longest prefix first
    tainted: tuple[tuple[str, str], ...] = ()  # (ref prefix, producing agent)
    source: str = "built-in"

    def quota_for(self, agent: str) -> Quota:
        return self.quota_agents.get(agent, self.quota)


def _quota(q: _Quota) -> Quota:
    return Quota(q.limit, parse_duration(q.window), f"{q.limit} per {q.window}")


def load_policy_config(path: str | Path) -> PolicyConfig:
    """Read a policy file; a missing file gives the defaults."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        return PolicyConfig()
    return _load(str(p), mtime)


@lru_cache(maxsize=8)
def _load(path: str, _mtime: int) -> PolicyConfig:
    try:
        data = _PolicyFile.model_validate(yaml.safe_load(Path(path).read_text()) or {})
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", where=path) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{loc}: {first['msg'].removeprefix('Value error, ')}", where=path) from None

    def by_length(m: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(m.items(), key=lambda kv: (-len(kv[0]), kv[0])))

    return PolicyConfig(
        _quota(data.quota.default),
        {k: _quota(v) for k, v in data.quota.agents.items()},
        data.max_depth,
        data.gate_to,
        data.default_domain,
        by_length(data.domains),
        by_length(data.tainted),
        path,
    )


def policy_config(cards_dir: str | Path) -> PolicyConfig:
    """The policy configuration next to the cards."""
    return load_policy_config(Path(cards_dir) / POLICY_FILE)


# ---------------------------------------------------------------------------------------
# Refs: privacy domains and the tasks they point at


def ref_domain(ref: str, cfg: PolicyConfig | None = None) -> str:
    """The privacy domain a ref points into.

    An explicit ``#domain=<d>`` fragment wins (``file:///x/notes.md#domain=private:alvis``);
    else the longest configured prefix; else the default domain (``shared``).
    """
    cfg = cfg or PolicyConfig()
    frag = urlsplit(ref).fragment
    if frag:
        for k, v in parse_qsl(frag, keep_blank_values=True):
            if k == "domain":
                try:
                    return _check_domain(unquote(v))
                except ValueError as exc:
                    raise PrivacyViolation(
                        "privacy.annotation", str(exc), limit="shared or private:<human>", where=ref
                    ) from None
    for prefix, domain in cfg.domains:
        if ref.startswith(prefix):
            return domain
    return cfg.default_domain


def task_of_ref(ref: str) -> tuple[str, int | str] | None:
    """("id", n) for a task ref, ("uid", u) for a file under a task's uid, else None."""
    m = _TASK_REF.match(ref)
    if m:
        return "id", int(m.group(1))
    if ref.startswith("file:"):
        for part in reversed(unquote(urlsplit(ref).path).split("/")):
            if is_uid(part):
                return "uid", part
    return None


def find_by_uid(fabric: Fabric, uids: Iterable[str]) -> dict[str, tuple[int, TaskSpec, str | None]]:
    """uid -> (task id, spec, assignee), from task descriptions (one round trip).

    A task's description embeds its spec and uid; descendants mention the uid too, so the
    hits are filtered on the embedded uid.
    """
    from fabric.submit import parse_description

    wanted = sorted(set(uids))
    if not wanted:
        return {}
    project = fabric.board.layout.project_id
    out = fabric.port.batch(
        [Call("searchTasks", {"project_id": project, "query": f"desc:{u}"}) for u in wanted]
    )
    found: dict[str, tuple[int, TaskSpec, str | None]] = {}
    for o in out:
        for row in o.unwrap() or []:
            parsed = parse_description(str(row.get("description", "")), fabric.board.seal_key)
            if parsed and parsed[0] in wanted:
                found[parsed[0]] = (int(row["id"]), parsed[1], parsed[2])
    return found


def human_of(cards: CardSet, name: str) -> Card | None:
    """The human card with this id or Kanboard username."""
    for card in cards.humans():
        if card.id == name or (card.human is not None and card.human.username == name):
            return card
    return None


def recall_scope(cards: CardSet, human: str) -> frozenset[str]:
    """What work for (a conversation with) ``human`` may see: their private domain and the
    shared domains, nothing of another human's."""
    card = human_of(cards, human)
    own = f"private:{card.id if card else human}"
    return frozenset({own} | {d for c in cards for d in c.privacy_domains if not d.startswith("private:")})


def _norm(intent: str) -> str:
    return " ".join(intent.split()).casefold()


# ---------------------------------------------------------------------------------------
# The submit policies


class CreationQuota:
    """At most ``limit`` tasks per rolling ``window`` per agent (actors that are cards).

    Counted from the board (tasks whose provenance names the agent, created inside the
    window: one search), so it holds across processes. An idempotent replay of a task that
    already exists is never refused. Two racing submits at ``limit - 1`` may both pass.
    """

    def check(self, fabric: Fabric, spec: TaskSpec, card: Card, parent: TaskView | None) -> None:
        actor = spec.actor
        if actor not in fabric.cards or fabric.cards.get(actor).is_human:
            return
        quota = policy_config(fabric.settings.cards_dir).quota_for(actor)
        since = fabric.clock() - quota.window
        rows = fabric.board.search(f'desc:"submitted by `{actor}` at"')
        used = sum(1 for r in rows if int(r.get("date_creation") or 0) >= since)
        if used < quota.limit:
            return
        if (
            spec.action_id
            and fabric.board.find_by_reference(receipt_reference(actor, spec.action_id)) is not None
        ):
            return  # a replay: submit returns the existing task
        raise QuotaExceeded(
            "creation-quota",
            f"agent {actor!r} created {used} tasks in the last {quota.text.split(' per ')[1]}",
            limit=quota.text,
            where="--actor",
            hint="wait for the window to roll, or raise quota.agents in cards/_policy.yaml",
        )


class DepthCap:
    """A provenance chain may be at most ``max_depth`` tasks deep (a root task is depth 0)."""

    def check(self, fabric: Fabric, spec: TaskSpec, card: Card, parent: TaskView | None) -> None:
        cap = policy_config(fabric.settings.cards_dir).max_depth
        depth = len(spec.ancestry)
        if depth > cap:
            raise DepthExceeded(
                "ancestry-depth",
                f"the task would be at depth {depth} of its provenance chain (root {spec.ancestry[0]})",
                limit=str(cap),
                where="--parent",
                hint="agents submitting tasks that submit tasks look like a loop",
            )


class Lineage:
    """Cycle detection over the provenance chain, and the interlocutor's privacy scope.

    Reads the ancestors' specs (one search, only for tasks with a grandparent).
    """

    def check(self, fabric: Fabric, spec: TaskSpec, card: Card, parent: TaskView | None) -> None:
        ancestors = self.ancestors(fabric, spec, parent)
        for uid, (tid, a) in ancestors.items():
            if a.target == spec.target and _norm(a.intent) == _norm(spec.intent):
                raise CycleDetected(
                    "provenance-cycle",
                    f"ancestor {f'#{tid}' if tid else uid} already asked {a.target!r} for the same intent",
                    where="--parent",
                    limit="no target+intent twice in one chain",
                    hint="a task that re-submits itself is a loop; change the intent or the target",
                )
        cfg = policy_config(fabric.settings.cards_dir)
        humans = {
            h.id
            for h in (human_of(fabric.cards, a.actor) for a in [*(x for _, x in ancestors.values()), spec])
            if h
        }
        for h in sorted(humans):
            scope = recall_scope(fabric.cards, h)
            for ref in spec.refs:
                d = ref_domain(ref, cfg)
                if d.startswith("private:") and d not in scope:
                    raise PrivacyViolation(
                        "privacy.interlocutor",
                        f"work for {h} may not reference {d} ({ref})",
                        limit=f"{h}: " + ", ".join(sorted(scope)),
                        where="--ref",
                        hint="content from one human's conversations never reaches another",
                    )

    @staticmethod
    def ancestors(
        fabric: Fabric, spec: TaskSpec, parent: TaskView | None
    ) -> dict[str, tuple[int | None, TaskSpec]]:
        if parent is None or parent.spec is None or parent.uid is None:
            return {}
        out: dict[str, tuple[int | None, TaskSpec]] = {parent.uid: (parent.id, parent.spec)}
        rest = [u for u in spec.ancestry if u != parent.uid]
        if rest:
            # Every descendant of the root mentions the root's uid: one search finds them all.
            rows = fabric.board.search(f"desc:{spec.ancestry[0]}")
            from fabric.submit import parse_description

            for row in rows:
                parsed = parse_description(str(row.get("description", "")), fabric.board.seal_key)
                if parsed and parsed[0] in rest:
                    out[parsed[0]] = (int(row["id"]), parsed[1])
        return out


class PrivacyDomains:
    """The target must be allowed to see every domain the refs point into; sandboxed and
    untrusted agents never see a private domain."""

    def check(self, fabric: Fabric, spec: TaskSpec, card: Card, parent: TaskView | None) -> None:
        check_domains(card, spec.refs, policy_config(fabric.settings.cards_dir))


def check_domains(card: Card, refs: Sequence[str], cfg: PolicyConfig) -> None:
    for ref in refs:
        d = ref_domain(ref, cfg)
        if d.startswith("private:") and trust_rank(card.trust) <= trust_rank("sandboxed"):
            raise PrivacyViolation(
                "privacy.sandboxed",
                f"{card.id} is {card.trust} and may not receive {ref} ({d})",
                limit="shared domains only",
                where="--ref",
            )
        if d not in card.privacy_domains:
            raise PrivacyViolation(
                "privacy.card-domains",
                f"{card.id} may not see {d} ({ref})",
                limit=", ".join(card.privacy_domains),
                where="--ref",
                hint=f"send it to an agent whose card lists {d}",
            )


@dataclass(frozen=True)
class TaintedRef:
    ref: str
    producer: str
    task_id: int | None = None


def is_tainted(fabric: Fabric, spec: TaskSpec) -> bool:
    """Whether a task's output is tainted: it ran on an untrusted agent."""
    if spec.constraints.get("taint"):
        return True
    return spec.target in fabric.cards and fabric.cards.get(spec.target).trust == "untrusted"


def tainted_refs(
    fabric: Fabric, refs: Sequence[str], views: dict[int, TaskView] | None = None
) -> list[TaintedRef]:
    """The refs that point at tainted output (at most two round trips, none without task refs)."""
    cfg = policy_config(fabric.settings.cards_dir)
    out: list[TaintedRef] = []
    ids: dict[str, int] = {}
    uids: dict[str, str] = {}
    for ref in refs:
        hit = next((p for pre, p in cfg.tainted if ref.startswith(pre)), None)
        if hit is not None:
            out.append(TaintedRef(ref, hit))
            continue
        t = task_of_ref(ref)
        if t is not None and t[0] == "id":
            ids[ref] = int(t[1])
        elif t is not None:
            uids[ref] = str(t[1])
    if ids:
        read = fabric.board.read_many(sorted(set(ids.values())))
        if views is not None:
            views.update(read)
        for ref, tid in ids.items():
            v = read.get(tid)
            if v is not None and v.spec is not None and is_tainted(fabric, v.spec):
                out.append(TaintedRef(ref, v.spec.target, tid))
    if uids:
        found = find_by_uid(fabric, uids.values())
        for ref, uid in uids.items():
            if uid in found and is_tainted(fabric, found[uid][1]):
                out.append(TaintedRef(ref, found[uid][1].target, found[uid][0]))
    return out


def gate_key(target: str, tainted: Sequence[TaintedRef], intent: str = "") -> str:
    """The action id of the gate for promoting ``tainted`` into ``target``."""
    refs = hashlib.sha256("\n".join(sorted(t.ref for t in tainted)).encode()).hexdigest()[:16]
    prefix = f"taint-gate/{target}/{refs}/"
    return prefix + hashlib.sha256(intent.encode()).hexdigest()[:12] if intent else prefix


class TaintGate:
    """Tainted output may go back only to the agent that produced it, or to a human.

    Anything else (a trusted agent's task or memory, an outward action, another agent)
    creates a gate task for a human and is refused with :class:`TaintGated`. Once the gate
    is approved (moved to Done, or closed as verified) the same submit passes when it
    cites the gate task as a ref.
    """

    def check(self, fabric: Fabric, spec: TaskSpec, card: Card, parent: TaskView | None) -> None:
        tainted = ungated_taint(fabric, spec, card)
        if not tainted:
            return
        human = gate_human(fabric, spec)
        producers = ", ".join(sorted({t.producer for t in tainted}))
        refs = sorted(t.ref for t in tainted)
        intent = (
            f"Approve tainted input for {card.id}? Output of {producers} (untrusted)\n\n"
            f"{spec.actor} asked {card.id} ({card.trust}) to: {spec.title()}\n"
            f"using output of untrusted work: {', '.join(refs)}.\n\n"
            "Approve: move this card to Done. Refuse: close it. After approval the "
            f"request passes when it cites this gate task as a ref."
        )
        gate = fabric.submit(
            intent,
            target=human,
            refs=refs,
            priority="high",
            key=gate_key(card.id, tainted, spec.canonical()),
            actor=GATE_ACTOR,
        )
        raise TaintGated(
            "taint.promotion",
            f"{', '.join(refs)} is output of untrusted work by "
            f"{producers}; it may reach {card.id} only through an approved gate",
            limit="tainted output stays in its producer's own context",
            gate=gate,
            human=human,
        )


def ungated_taint(fabric: Fabric, spec: TaskSpec, card: Card) -> list[TaintedRef]:
    """The tainted refs of ``spec`` that may not reach ``card``: not its own output, not
    for a human, and not covered by an approved gate cited among the refs."""
    if card.is_human:
        return []
    views: dict[int, TaskView] = {}
    tainted = [t for t in tainted_refs(fabric, spec.refs, views) if t.producer != card.id]
    if not tainted:
        return []
    prefix = gate_key(card.id, tainted)
    for v in views.values():
        s, cur = v.spec, v.current
        if (
            s is not None
            and cur is not None
            and s.actor == GATE_ACTOR
            and (s.action_id or "").startswith(prefix)
            and cur.state in (State.DONE, State.CLOSED)
        ):
            return []  # an approved gate covers exactly these refs into this target
    return tainted


def gate_human(fabric: Fabric, spec: TaskSpec) -> str:
    """Whose inbox a gate or decision goes to: the submitting human, else ``gate_to``,
    else the first human card."""
    h = human_of(fabric.cards, spec.actor)
    if h is not None:
        return h.id
    cfg = policy_config(fabric.settings.cards_dir)
    if cfg.gate_to and human_of(fabric.cards, cfg.gate_to) is not None:
        return cfg.gate_to
    humans = sorted(c.id for c in fabric.cards.humans())
    if not humans:
        raise ConfigError("no human card to send a gate to", where="cards/", hint="add a kind: human card")
    return humans[0]


def default_policies() -> list[Any]:
    """The policies every :class:`~fabric.core.Fabric` applies, cheapest first."""
    return [DepthCap(), CreationQuota(), Lineage(), PrivacyDomains(), TaintGate()]


def vet_unrecorded(fabric: Fabric, view: TaskView, spec: TaskSpec) -> None:
    """Routing and policy, re-applied before a task is rebuilt from its sealed block.

    The target's card must still drain the spec's queue, and the card must sit in that
    queue's lane. Every submit rule applies except the creation quota (the task exists
    already, so counting it would refuse its own repair); tainted input is refused rather
    than gated, since a repair never creates tasks.
    """
    card = fabric.cards.get(spec.target)
    lane = fabric.board.layout.swimlanes.get(spec.queue)
    if card.queue_name != spec.queue or int(view.row.get("swimlane_id") or 0) != lane:
        raise InvalidInput(
            f"its spec names queue {spec.queue!r}, which is not where it is or not its target's",
            where=f"task #{view.id}",
            hint="submit it again",
        )
    parent = None
    if spec.parent:
        found = find_by_uid(fabric, [spec.parent])
        if spec.parent in found:
            parent = fabric.board.read(found[spec.parent][0])
    for policy in (DepthCap(), Lineage(), PrivacyDomains()):
        policy.check(fabric, spec, card, parent)
    tainted = ungated_taint(fabric, spec, card)
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


def check_claim_on_board(fabric: Fabric, card: Card, spec: TaskSpec) -> None:
    """:func:`check_claim`, plus the taint rule (reads the referenced tasks: at most two
    round trips, none when the refs name no task). Never creates a gate: a task that
    carries ungated tainted refs to another agent was not submitted through the policy."""
    check_claim(card, spec, policy_config(fabric.settings.cards_dir))
    tainted = ungated_taint(fabric, spec, card)
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


def escalate_dead_letter(fabric: Fabric, view: TaskView, *, actor: str = "keeper") -> Receipt | None:
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
    if human_of(fabric.cards, spec.target) is not None:
        return None
    human = None
    for key in ("escalate_to", "human"):
        value = spec.constraints.get(key)
        if isinstance(value, str) and human_of(fabric.cards, value) is not None:
            human = value
            break
    human = human or gate_human(fabric, spec)
    card = fabric.cards.get(spec.target) if spec.target in fabric.cards else None
    on = f"{spec.target} (tier {card.tier})" if card and card.tier else spec.target
    title = str(view.row.get("title") or spec.title())
    intent = (
        f"Decide: task #{view.id} died on {spec.target}\n\n"
        f'#{view.id} "{title}" dead-lettered on {on}: {cur.reason or "no reason given"}.\n'
        "The fabric does not retry it on a bigger model by itself. Options: move "
        f"#{view.id} back to Queued to retry it as is; submit it again with wider "
        f"constraints (e.g. a bigger tier); or close #{view.id} to drop it. "
        "Close this decision task when you have decided."
    )
    return fabric.submit(
        intent,
        target=human,
        refs=[f"task:{view.id}"],
        priority="high",
        key=f"escalate/{view.uid}/e{view.epoch}",
        actor=actor,
    )


def explain_refusal(exc: PolicyRefused) -> dict[str, Any]:
    """A refusal as plain data (for ``--json`` outputs)."""
    d: dict[str, Any] = {"code": exc.code, "rule": exc.rule, "limit": exc.limit, "message": exc.line()}
    if isinstance(exc, TaintGated):
        d["gate"] = exc.gate.ref
        d["human"] = exc.human
    return d


__all__ = [
    "GATE_ACTOR",
    "ClaimRefused",
    "CreationQuota",
    "CycleDetected",
    "DepthCap",
    "DepthExceeded",
    "Lineage",
    "PolicyConfig",
    "PolicyRefused",
    "PrivacyDomains",
    "PrivacyViolation",
    "QuotaExceeded",
    "TaintGate",
    "TaintGated",
    "TaintRefused",
    "TrustViolation",
    "check_claim",
    "check_claim_on_board",
    "default_policies",
    "escalate_dead_letter",
    "find_by_uid",
    "is_tainted",
    "load_policy_config",
    "policy_config",
    "recall_scope",
    "ref_domain",
    "tainted_refs",
    "task_of_ref",
]
