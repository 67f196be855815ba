"""The keeper's settings, read from ``AGAP_KEEPER_*`` environment variables.

Every duty runs as its own job with its own interval. The variables, their defaults and
their grammar (durations: ``90``, ``30s``, ``5m``, ``4h``, ``30d``, ``1h30m``) are declared in
:mod:`fabric.settings.registry`; the defaults below are read from there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import time as dtime

from fabric.errors import ConfigError
from fabric.settings import registry

# Job name -> the environment variable of its interval.
JOB_INTERVALS: dict[str, str] = {
    "leases": "AGAP_KEEPER_LEASES_EVERY",
    "backlog": "AGAP_KEEPER_BACKLOG_EVERY",
    "gaps": "AGAP_KEEPER_GAPS_EVERY",
    "gestures": "AGAP_KEEPER_GESTURES_EVERY",
    "inbox": "AGAP_KEEPER_INBOX_EVERY",
    "deadlines": "AGAP_KEEPER_DEADLINES_EVERY",
    "reminders": "AGAP_KEEPER_REMINDERS_EVERY",
    "gc": "AGAP_KEEPER_GC_EVERY",
    "policy": "AGAP_KEEPER_POLICY_EVERY",
    "matrix": "AGAP_KEEPER_MATRIX_EVERY",
    "memory": "AGAP_KEEPER_MEMORY_EVERY",
}
JOBS = (*JOB_INTERVALS, "digest")


def _hhmm(text: str, where: str) -> dtime:
    m = re.match(r"^([01]?\d|2[0-3]):([0-5]\d)$", text.strip())
    if not m:
        raise ConfigError(f"cannot read {text!r} as a time of day", where=where, hint="use HH:MM (24 h)")
    return dtime(int(m.group(1)), int(m.group(2)))


def _default(var: str) -> float:
    return registry.get_duration(var, {})  # {}: no environment, the registered default


_DIGEST_AT = _hhmm(registry.get_str("AGAP_KEEPER_DIGEST_AT", {}), "AGAP_KEEPER_DIGEST_AT")


@dataclass(frozen=True)
class KeeperConfig:
    """What the keeper does, and how often (defaults: the registry's)."""

    intervals: dict[str, float] = field(
        default_factory=lambda: {job: _default(var) for job, var in JOB_INTERVALS.items()}
    )
    # Leases are written with the worker's clock and judged with the keeper's: an
    # expired lease is requeued only this long after it ran out.
    lease_grace: float = _default("AGAP_KEEPER_LEASE_GRACE")
    # A card whose column disagrees with its record and was moved no later than
    # record.at + this is the fabric's own lagging projection, not a human's gesture.
    move_tolerance: float = _default("AGAP_KEEPER_MOVE_TOLERANCE")
    # Half-submitted tasks (created, no records) are repaired after this long.
    repair_after: float = _default("AGAP_KEEPER_REPAIR_AFTER")
    reminder_interval: float = _default("AGAP_KEEPER_REMIND_EVERY")
    retention: float = _default("AGAP_KEEPER_RETENTION")
    digest_at: dtime = _DIGEST_AT
    digest_tz: str = registry.get_str("AGAP_KEEPER_DIGEST_TZ", {})
    escalate_to: str = ""  # a human card id or Kanboard username; "" = the first human
    backoff_base: float = _default("AGAP_KEEPER_BACKOFF")
    backoff_cap: float = _default("AGAP_KEEPER_BACKOFF_CAP")
    metrics_host: str = registry.get_str("AGAP_KEEPER_METRICS_HOST", {})
    metrics_port: int = registry.get_int("AGAP_KEEPER_METRICS_PORT", {})  # 0 = no endpoint
    metrics_token: str = field(default="", repr=False)
    metrics_allow: tuple[str, ...] = ()  # client IPs/CIDRs allowed without a token
    notify_allow: tuple[str, ...] = ()  # private/loopback webhook targets allowed (CIDRs)
    hook_host: str = registry.get_str("AGAP_KEEPER_HOOK_HOST", {})
    hook_port: int = 0  # the receiver for Kanboard's webhook (0 = none: the sweeps alone)
    hook_token: str = field(default="", repr=False)
    openclaw_token: str = field(default="", repr=False)  # OpenClaw's cron.webhookToken
    # A card's memory.retain: how many attempts a retain gets, and the least time between two.
    retain_attempts: int = registry.get_int("AGAP_KEEPER_RETAIN_ATTEMPTS", {})
    retain_backoff: float = _default("AGAP_KEEPER_RETAIN_BACKOFF")

    def interval(self, job: str) -> float:
        return self.intervals[job]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KeeperConfig:
        """The settings from ``env`` (default: the process environment)."""

        def dur(var: str) -> float:
            return registry.get_duration(var, env)

        return cls(
            intervals={job: dur(var) for job, var in JOB_INTERVALS.items()},
            lease_grace=dur("AGAP_KEEPER_LEASE_GRACE"),
            move_tolerance=dur("AGAP_KEEPER_MOVE_TOLERANCE"),
            repair_after=dur("AGAP_KEEPER_REPAIR_AFTER"),
            reminder_interval=dur("AGAP_KEEPER_REMIND_EVERY"),
            retention=dur("AGAP_KEEPER_RETENTION"),
            digest_at=_hhmm(registry.get_str("AGAP_KEEPER_DIGEST_AT", env), "AGAP_KEEPER_DIGEST_AT"),
            digest_tz=registry.get_str("AGAP_KEEPER_DIGEST_TZ", env),
            escalate_to=registry.get_str("AGAP_KEEPER_ESCALATE_TO", env),
            backoff_base=dur("AGAP_KEEPER_BACKOFF"),
            backoff_cap=dur("AGAP_KEEPER_BACKOFF_CAP"),
            metrics_host=registry.get_str("AGAP_KEEPER_METRICS_HOST", env),
            metrics_port=registry.get_int("AGAP_KEEPER_METRICS_PORT", env),
            metrics_token=registry.get_str("AGAP_KEEPER_METRICS_TOKEN", env),
            metrics_allow=registry.get_list("AGAP_KEEPER_METRICS_ALLOW", env),
            notify_allow=registry.get_list("AGAP_KEEPER_NOTIFY_ALLOW", env),
            hook_host=registry.get_str("AGAP_KEEPER_HOOK_HOST", env),
            hook_port=registry.get_int("AGAP_KEEPER_HOOK_PORT", env),
            hook_token=registry.get_str("AGAP_KEEPER_HOOK_TOKEN", env),
            openclaw_token=registry.get_str("AGAP_KEEPER_OPENCLAW_TOKEN", env),
            retain_attempts=registry.get_int("AGAP_KEEPER_RETAIN_ATTEMPTS", env),
            retain_backoff=dur("AGAP_KEEPER_RETAIN_BACKOFF"),
        )
