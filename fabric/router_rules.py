"""The auto router policy (``cards/_router.yaml``): task sizes and ordered rules.

The first rule that matches the task (its intent, its size, the capabilities the caller
asks for) gives the constraint set it is routed by; no model is called to route.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.cards.problems import error_message
from fabric.constraints import Constraints, parse_constraints
from fabric.errors import ConfigError, InvalidInput

ROUTER_FILE = "_router.yaml"


class _RuleWhen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

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
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(min_length=1)
    when: _RuleWhen = _RuleWhen()
    constraints: str = ""


class _SizeLimit(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    max_chars: int = Field(gt=0)
    max_refs: int = Field(ge=0)


class _RouterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

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
        raise ConfigError(f"{loc}: {error_message(first)}", where=path) from None
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


def router_policy(cards_dir: str | Path) -> RouterPolicy:
    """The router policy next to the cards."""
    return load_router_policy(Path(cards_dir) / ROUTER_FILE)


__all__ = [
    "DEFAULT_POLICY",
    "ROUTER_FILE",
    "RouterPolicy",
    "RouterRule",
    "load_router_policy",
    "router_policy",
]
