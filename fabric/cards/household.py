"""A household described in a few answers, written out as cards.

``agap household init`` asks who lives in the house, which model endpoints it has and
which assistants it wants; :class:`Household` holds those answers (and is also the shape
of ``household.yaml``, so the questions can be answered from a file), and
:func:`render` turns them into the files of a cards folder: one card per person, endpoint
and agent, a soul file per agent, the router, ``_policy.yaml`` and, when a model sits on
the GPU, ``_gpu.yaml``. Rendering is a plain function: the caller writes the files and
checks them with :func:`fabric.cards.load_cards` like any other folder.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from fabric.cards.fields import Tier, raise_violations, tier_rank
from fabric.cards.models import Capability, Slug, StrictModel, Text, TimeZoneName, Url, Username

__all__ = ["Assistant", "HouseEndpoint", "Household", "Person", "parse_hours", "parse_quota", "render"]

_HOURS = re.compile(r"^([01]\d|2[0-3]):[0-5]\d-([01]\d|2[0-3]):[0-5]\d$")
_QUOTA = re.compile(r"^(\d+)/(\d+[smhd])$")
_MATRIX_ROOM = re.compile(r"^![^:\s]+:[^\s]+$")

# The variables the written cards name: secrets stay in the environment, never in a card.
MATRIX_TOKEN = "AGAP_MATRIX_TOKEN"
WEBHOOK_TOKEN = "AGAP_WEBHOOK_TOKEN"


def parse_hours(text: str) -> tuple[str, str]:
    """``"08:00-23:00"`` as (start, end); a ValueError saying what to write otherwise."""
    if not _HOURS.match(text.strip()):
        raise ValueError(f"{text!r} is not waking hours: write HH:MM-HH:MM, like 08:00-23:00")
    start, end = text.strip().split("-")
    return start, end


def parse_quota(text: str) -> tuple[int, str]:
    """``"60/5h"`` as (60, "5h"): so many requests per rolling window."""
    m = _QUOTA.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{text!r} is not a quota: write requests/window, like 60/5h or 300/7d")
    return int(m.group(1)), m.group(2)


class Person(StrictModel):
    """Someone who lives here: a Kanboard user whose "Waiting on me" column is an inbox."""

    username: Username
    name: Text
    timezone: TimeZoneName = "UTC"
    hours: str = "08:00-23:00"
    matrix_room: str | None = None
    homeserver: Url | None = None
    webhook: Url | None = None

    @field_validator("hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        parse_hours(value)
        return value.strip()

    @model_validator(mode="after")
    def _matrix(self) -> Person:
        if self.matrix_room is not None and not _MATRIX_ROOM.match(self.matrix_room):
            raise_violations([("matrix_room", "must be a room id like '!abcdef:example.org'")])
        if (self.matrix_room is None) != (self.homeserver is None):
            raise_violations([("homeserver", "give both matrix_room and homeserver, or neither")])
        return self


class HouseEndpoint(StrictModel):
    """A model the house can call: in the cloud (through the LiteLLM proxy, with a
    quota), on a local GPU or CPU, or on a remote node that may sleep."""

    id: Slug
    where: Literal["cloud", "local", "remote"]
    model: Text
    tier: Tier
    capabilities: list[Capability] = Field(default_factory=lambda: ["chat"])
    # Whether the people's private context may be sent to it. A cloud model leaves the
    # house, so it is never the default there.
    private: bool | None = None
    quota: str | None = None
    api_base: Url | None = None
    vram_mb: int = Field(default=0, ge=0)
    health_url: Url | None = None
    wake_command: Text | None = None

    @field_validator("quota")
    @classmethod
    def _quota(cls, value: str | None) -> str | None:
        if value is not None:
            parse_quota(value)
        return value

    @model_validator(mode="after")
    def _where(self) -> HouseEndpoint:
        p: list[tuple[str, str]] = []
        if self.where != "cloud" and self.api_base is None:
            p.append(("api_base", f"a {self.where} endpoint needs the URL it serves on"))
        if self.where == "remote" and self.health_url is None:
            p.append(("health_url", "a remote node needs a health URL to tell it is awake"))
        if self.where != "local" and self.vram_mb:
            p.append(("vram_mb", "only a local endpoint sits on the house GPU"))
        raise_violations(p)
        return self

    @property
    def sees_private(self) -> bool:
        return self.private if self.private is not None else self.where != "cloud"


class Assistant(StrictModel):
    """A persona: an agent with a soul file that thinks with the strongest fitting model."""

    id: Slug
    name: Text
    description: str = "The household's assistant: answers, reminds and delegates."
    # Whose private context it may see: None is everyone's, [] nobody's (shared only).
    serves: list[Username] | None = None
    tier: Tier = "large"
    capabilities: list[Capability] = Field(default_factory=list)


class Household(StrictModel):
    """The answers: who, which models, which assistants, and who decides gates."""

    people: list[Person] = Field(min_length=1)
    endpoints: list[HouseEndpoint] = Field(min_length=1)
    assistants: list[Assistant] = Field(default_factory=list)
    gate_to: Username | None = None
    gpu_vram_mb: int = Field(default=8192, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> Household:
        p: list[tuple[str, str]] = []
        names = [x.username for x in self.people] + [e.id for e in self.endpoints]
        names += [a.id for a in self.assistants]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            p.append(("", f"{dup!r} names two agents: every person, endpoint and assistant needs its own id"))
        if "router" in names:
            p.append(("", "'router' is the router's own id: call that agent something else"))
        people = {x.username for x in self.people}
        if self.gate_to is not None and self.gate_to not in people:
            p.append(("gate_to", f"{self.gate_to!r} is not one of the people"))
        for i, a in enumerate(self.assistants):
            for who in a.serves or []:
                if who not in people:
                    p.append((f"assistants.{i}.serves", f"{who!r} is not one of the people"))
            private = a.serves is None or bool(a.serves)
            fits = [e for e in self.endpoints if tier_rank(e.tier) >= tier_rank(a.tier)]
            if not fits:
                p.append(
                    (f"assistants.{i}.tier", f"no endpoint is {a.tier} or stronger: lower it or add one")
                )
            elif private and not any(e.sees_private for e in fits):
                p.append(
                    (
                        f"assistants.{i}.tier",
                        f"no {a.tier} or stronger endpoint may see private context, which {a.id} sees: "
                        "lower the tier, let an endpoint see it (private: true) or give serves: []",
                    )
                )
        raise_violations(p)
        return self


# ---------------------------------------------------------------------------------------
# Rendering


def render(house: Household) -> dict[str, str]:
    """The files of a household folder, by path relative to it (``cards/…``, ``souls/…``)."""
    files: dict[str, str] = {}
    people = [x.username for x in house.people]
    for person in house.people:
        files[f"cards/{person.username}.yaml"] = _yaml(_person(person), _PERSON_NOTE.format(name=person.name))
    for ep in house.endpoints:
        files[f"cards/{ep.id}.yaml"] = _yaml(_endpoint(ep, people), _ENDPOINT_NOTE[ep.where])
    for a in house.assistants:
        files[f"cards/{a.id}.yaml"] = _yaml(_assistant(a, people), _ASSISTANT_NOTE.format(name=a.name))
        files[f"souls/{a.id}.md"] = _soul(a, house.people)
    files["cards/router.yaml"] = _yaml(_router(house), _ROUTER_NOTE)
    files["cards/_policy.yaml"] = _yaml(
        {"gate_to": house.gate_to or people[0], "default_domain": "shared", "max_depth": 8},
        _POLICY_NOTE,
    )
    if any(ep.vram_mb for ep in house.endpoints):
        gpu = {"gpus": [{"name": "house-gpu", "vram_mb": house.gpu_vram_mb, "reserved_mb": 300}]}
        files["cards/_gpu.yaml"] = _yaml(gpu, _GPU_NOTE)
    files["household.yaml"] = _yaml(house.model_dump(mode="json", exclude_defaults=True), _ANSWERS_NOTE)
    files["env.example"] = _env_example(house)
    return files


def _yaml(data: dict[str, Any], note: str) -> str:
    head = "".join(f"# {line}".rstrip() + "\n" for line in note.strip().splitlines())
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def _person(x: Person) -> dict[str, Any]:
    start, end = parse_hours(x.hours)
    channels: list[dict[str, Any]] = []
    if x.matrix_room and x.homeserver:
        channels.append(
            {"type": "matrix", "room": x.matrix_room, "homeserver": x.homeserver, "token_env": MATRIX_TOKEN}
        )
    if x.webhook:
        channels.append({"type": "webhook", "url": x.webhook, "token_env": WEBHOOK_TOKEN})
    human: dict[str, Any] = {"username": x.username, "display_name": x.name}
    if channels:
        human["channels"] = channels
    return {
        "id": x.username,
        "kind": "human",
        "name": x.name,
        "trust": "human",
        "privacy_domains": ["shared", f"private:{x.username}"],
        "availability": [{"shape": "hours", "timezone": x.timezone, "start": start, "end": end}],
        "runtime": {"mode": "human"},
        "human": human,
    }


def _endpoint(ep: HouseEndpoint, people: list[str]) -> dict[str, Any]:
    shapes: list[dict[str, Any]] = []
    if ep.quota:
        limit, window = parse_quota(ep.quota)
        shapes.append({"shape": "quota", "limit": limit, "window": window, "reserve_interactive": 0.2})
    if ep.vram_mb:
        shapes.append({"shape": "gpu", "vram_mb": ep.vram_mb})
    if ep.where == "remote":
        node: dict[str, Any] = {"shape": "on_demand", "health_url": ep.health_url}
        if ep.wake_command:
            node["wake_command"] = ep.wake_command
        shapes.append(node)
    # A cloud model goes through the LiteLLM proxy (its quota, keys and logs in one
    # place); a model in the house is called in process at its own URL.
    runtime: dict[str, Any] = {"mode": "gateway" if ep.where == "cloud" else "sdk", "model": ep.model}
    if ep.api_base:
        runtime["api_base"] = ep.api_base
    card: dict[str, Any] = {
        "id": ep.id,
        "kind": "model",
        "name": f"{ep.model} ({ep.where})",
        "capabilities": ep.capabilities,
        "tier": ep.tier,
        "cost_class": "standard" if ep.where == "cloud" else "free",
        "trust": "trusted",
        "privacy_domains": ["shared", *(f"private:{p}" for p in people)] if ep.sees_private else ["shared"],
    }
    if shapes:
        card["availability"] = shapes
    card["runtime"] = runtime
    if ep.vram_mb:
        card["gpu"] = {"vram_mb": ep.vram_mb, "never_evict": False}
    return card


def _assistant(a: Assistant, people: list[str]) -> dict[str, Any]:
    constraints: dict[str, Any] = {"tier": a.tier}
    if a.capabilities:
        constraints["capabilities"] = a.capabilities
    return {
        "id": a.id,
        "kind": "persona",
        "name": a.name,
        "description": a.description,
        "capabilities": ["chat", *(c for c in a.capabilities if c != "chat")],
        "trust": "trusted",
        "privacy_domains": ["shared", *(f"private:{p}" for p in (people if a.serves is None else a.serves))],
        "runtime": {"mode": "gateway", "interactive": True},
        "persona": f"souls/{a.id}.md",
        "backbone": {"constraints": constraints},
    }


def _router(house: Household) -> dict[str, Any]:
    # Routing is rules, not a model call; its backbone is the cheapest endpoint there is.
    cheapest = min(house.endpoints, key=lambda e: (e.where == "cloud", tier_rank(e.tier)))
    return {
        "id": "router",
        "kind": "router",
        "name": "Router",
        "description": "Picks an agent for tasks submitted with target auto.",
        "capabilities": ["route"],
        "trust": "trusted",
        "runtime": {"mode": "gateway", "lease_seconds": 30, "poll_seconds": 1, "timeout_seconds": 30},
        "backbone": {"model": cheapest.id},
    }


def _soul(a: Assistant, people: list[Person]) -> str:
    who = ", ".join(x.name for x in people)
    return f"""# {a.name}

## Role

You are {a.name}. {a.description}
You work for {who}. You hand work you are not the best agent for to another agent
through the task fabric, and you ask a person when a decision is theirs.

## Tone

Short and plain: the answer first, then why. Say when you do not know.

## Privacy

Each conversation has one person in it. What they tell you stays in their private
domain; you never repeat one person's private matters to another.

## Limits

Ask first before anything that spends money, deletes data, or leaves the house.
You report a task done; a person verifies it.
"""


def _env_example(house: Household) -> str:
    lines = [
        "# The secrets these cards name. Put them in the environment (or the compose .env),",
        "# never in a card. `agap up` runs offline without any of them (AGAP_MODEL_MODE=demo).",
    ]
    if any(ep.where == "cloud" for ep in house.endpoints):
        lines += ["# the LiteLLM proxy's key, for the cloud endpoints", "LITELLM_MASTER_KEY="]
    if any(x.matrix_room for x in house.people):
        lines += ["# the fabric's Matrix account, to notify people in their rooms", f"{MATRIX_TOKEN}="]
    if any(x.webhook for x in house.people):
        lines += ["# the bearer token the webhook receivers expect", f"{WEBHOOK_TOKEN}="]
    return "\n".join(lines) + "\n"


_PERSON_NOTE = """
{name}: a person. Their inbox is the "Waiting on me" column of their Kanboard swimlane.
Written by `agap household init`; edit it like any card (docs/HOUSEHOLD.md).
"""
_ENDPOINT_NOTE = {
    "cloud": "A cloud model behind the LiteLLM proxy. Its quota parks the queue when used up;\n"
    "the last 20% of each window is kept for interactive work.",
    "local": "A model served in the house: private context never leaves it.",
    "remote": "A model on a node that may sleep: the worker probes its health URL (and wakes\n"
    "it) before it claims work.",
}
_ASSISTANT_NOTE = """
{name}: an assistant. It names the strength it needs, not an endpoint: any model card
that fits its backbone constraints, closest fit first. Its soul file says who it is.
"""
_ROUTER_NOTE = """
The router: `agap submit --target auto` lands here and is sent on by the rules of
cards/_router.yaml (without one: to the cheapest agent available). `agap route --explain`.
"""
_POLICY_NOTE = """
Submit policy (docs/POLICY.md). gate_to: whose inbox gets a gate when no person submitted
the work. Map private stores to domains under `domains:` as you add them.
"""
_GPU_NOTE = """
The house GPU. `agap cards validate` checks that the local models fit it.
"""
_ANSWERS_NOTE = """
The answers these cards were written from: `agap household init --from household.yaml DIR`
writes them again (into a new folder).
"""
