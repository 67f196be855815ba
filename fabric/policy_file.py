"""The policy file (``cards/_policy.yaml``): limits, privacy domains of refs, tainted
prefixes, where promoted files are copied.

Optional, and every key has a default. :mod:`fabric.policy` applies what it says. The file
is checked by :mod:`fabric.policy_models` (pydantic), imported when a file is read: a
process that starts from the checked snapshot (:mod:`fabric.cardcache`) reads none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from fabric.durations import parse_duration
from fabric.errors import ConfigError
from fabric.plain import Plain
from fabric.refcanon import BadRef, canonical_prefix, local_service, under

POLICY_FILE = "_policy.yaml"
SHARED = "shared"
#: The domain of a ref whose owner cannot be decided; no card lists it.
UNKNOWN = "unknown"

if TYPE_CHECKING:
    from fabric.policy_models import QuotaLimit


class Quota(Plain):
    """How many tasks an agent may create per rolling window."""

    limit: int
    window: float  # seconds
    text: str  # as written, e.g. "60 per 1h"


class PolicyConfig(Plain):
    """The policy's limits and ref annotations (``cards/_policy.yaml``)."""

    quota: Quota = Quota(60, 3600.0, "60 per 1h")
    quota_agents: Mapping[str, Quota] = field(default_factory=dict)
    max_depth: int = 8
    gate_to: str | None = None
    default_domain: str = SHARED
    domains: tuple[tuple[str, str], ...] = ()  # (ref prefix, domain), longest prefix first
    tainted: tuple[tuple[str, str], ...] = ()  # (ref prefix, producing agent)
    source: str = "built-in"
    promote_to: str | None = None  # a file:// folder in the shared domain: promoted copies

    def quota_for(self, agent: str) -> Quota:
        return self.quota_agents.get(agent, self.quota)


def _quota(q: QuotaLimit) -> Quota:
    return Quota(q.limit, parse_duration(q.window), f"{q.limit} per {q.window}")


def load_policy_config(path: str | Path) -> PolicyConfig:
    """Read a policy file; a missing file gives the defaults."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        return PolicyConfig()
    return _REMEMBERED.get((str(p), mtime)) or _load(str(p), mtime)


# Policy files read in an earlier process (fabric.cardcache's snapshot), by path and
# modification time: an edit is read afresh.
_REMEMBERED: dict[tuple[str, int], PolicyConfig] = {}


def remember_policy(path: str | Path, cfg: PolicyConfig) -> None:
    """``cfg`` is what the policy file at ``path``, as it is now, reads as."""
    with contextlib.suppress(FileNotFoundError):  # no file: the defaults, read without a check
        _REMEMBERED[(str(Path(path)), Path(path).stat().st_mtime_ns)] = cfg


@lru_cache(maxsize=8)
def _load(path: str, _mtime: int) -> PolicyConfig:
    # Here, not at the top: only reading the file needs yaml,
    import yaml

    # and the file's check (pydantic's).
    from fabric.policy_models import PolicyFile, ValidationError

    try:
        data = PolicyFile.model_validate(yaml.safe_load(Path(path).read_text()) or {})
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
        data.promote_to,
    )


def rules_domain(cfg: PolicyConfig, key: str) -> str:
    """The owner rules' domain for a canonical key: the longest matching prefix; else
    :data:`UNKNOWN` for an http(s) service on this machine (whose owner only a rule can
    name); else the default domain."""
    best, domain = -1, UNKNOWN if local_service(key) else cfg.default_domain
    for prefix, d in cfg.domains:
        try:
            p = canonical_prefix(prefix)
        except BadRef:
            continue
        if len(p) > best and under(key, p):
            best, domain = len(p), d
    return domain


def policy_config(cards_dir: str | Path) -> PolicyConfig:
    """The policy configuration next to the cards."""
    return load_policy_config(Path(cards_dir) / POLICY_FILE)


__all__ = [
    "POLICY_FILE",
    "SHARED",
    "UNKNOWN",
    "PolicyConfig",
    "Quota",
    "load_policy_config",
    "policy_config",
    "remember_policy",
    "rules_domain",
]
