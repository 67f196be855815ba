"""The keeper's settings, read from ``AGAP_KEEPER_*`` environment variables.

Every duty runs as its own job with its own interval. Durations accept seconds or a unit
suffix (``90``, ``30s``, ``5m``, ``4h``, ``30d``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import time as dtime

from fabric.errors import ConfigError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

# Job name -> (environment variable of its interval, default interval in seconds).
JOB_INTERVALS: dict[str, tuple[str, float]] = {
    "leases": ("AGAP_KEEPER_LEASES_EVERY", 15.0),
    "gaps": ("AGAP_KEEPER_GAPS_EVERY", 30.0),
    "gestures": ("AGAP_KEEPER_GESTURES_EVERY", 20.0),
    "inbox": ("AGAP_KEEPER_INBOX_EVERY", 30.0),
    "deadlines": ("AGAP_KEEPER_DEADLINES_EVERY", 60.0),
    "reminders": ("AGAP_KEEPER_REMINDERS_EVERY", 300.0),
    "gc": ("AGAP_KEEPER_GC_EVERY", 86400.0),
    "policy": ("AGAP_KEEPER_POLICY_EVERY", 60.0),
}
JOBS = (*JOB_INTERVALS, "digest")


def parse_duration(text: str, *, where: str) -> float:
    """Seconds from ``90``, ``30s``, ``5m``, ``4h``, ``30d`` or ``1w``."""
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise ConfigError(f"cannot read {text!r} as a duration", where=where,
                          hint="use seconds or a unit suffix: 30s, 5m, 4h, 30d")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _hhmm(text: str, where: str) -> dtime:
    m = re.match(r"^([01]?\d|2[0-3]):([0-5]\d)$", text.strip())
    if not m:
        raise ConfigError(f"cannot read {text!r} as a time of day", where=where,
                          hint="use HH:MM (24 h)")
    return dtime(int(m.group(1)), int(m.group(2)))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


@dataclass(frozen=True)
class KeeperConfig:
    """What the keeper does, and how often."""

    intervals: dict[str, float] = field(
        default_factory=lambda: {name: d for name, (_, d) in JOB_INTERVALS.items()})
    # Leases are written with the worker's clock and judged with the keeper's: an
    # expired lease is requeued only this long after it ran out.
    lease_grace: float = 5.0
    # A card whose column disagrees with its record and was moved no later than
    # record.at + this is the fabric's own lagging projection, not a human's gesture.
    move_tolerance: float = 5.0
    # Half-submitted tasks (created, no records) are repaired after this long.
    repair_after: float = 60.0
    reminder_interval: float = 4 * 3600.0
    retention: float = 30 * 86400.0
    digest_at: dtime = dtime(7, 0)
    digest_tz: str = "UTC"
    escalate_to: str = ""  # a human card id or Kanboard username; "" = the first human
    backoff_base: float = 5.0
    backoff_cap: float = 300.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0 = no metrics endpoint
    metrics_token: str = field(default="", repr=False)
    metrics_allow: tuple[str, ...] = ()  # client IPs/CIDRs allowed without a token
    notify_allow: tuple[str, ...] = ()  # private/loopback webhook targets allowed (CIDRs)

    def interval(self, job: str) -> float:
        return self.intervals[job]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KeeperConfig:
        e = dict(os.environ if env is None else env)
        intervals = {}
        for name, (var, default) in JOB_INTERVALS.items():
            intervals[name] = parse_duration(e[var], where=var) if e.get(var) else default

        def dur(var: str, default: float) -> float:
            return parse_duration(e[var], where=var) if e.get(var) else default

        port_text = e.get("AGAP_KEEPER_METRICS_PORT", "0") or "0"
        if not port_text.isdigit():
            raise ConfigError(f"not a port number: {port_text!r}", where="AGAP_KEEPER_METRICS_PORT")
        return cls(
            intervals=intervals,
            lease_grace=dur("AGAP_KEEPER_LEASE_GRACE", 5.0),
            move_tolerance=dur("AGAP_KEEPER_MOVE_TOLERANCE", 5.0),
            repair_after=dur("AGAP_KEEPER_REPAIR_AFTER", 60.0),
            reminder_interval=dur("AGAP_KEEPER_REMIND_EVERY", 4 * 3600.0),
            retention=dur("AGAP_KEEPER_RETENTION", 30 * 86400.0),
            digest_at=_hhmm(e.get("AGAP_KEEPER_DIGEST_AT", "07:00"), "AGAP_KEEPER_DIGEST_AT"),
            digest_tz=e.get("AGAP_KEEPER_DIGEST_TZ", "UTC") or "UTC",
            escalate_to=e.get("AGAP_KEEPER_ESCALATE_TO", ""),
            backoff_base=dur("AGAP_KEEPER_BACKOFF", 5.0),
            backoff_cap=dur("AGAP_KEEPER_BACKOFF_CAP", 300.0),
            metrics_host=e.get("AGAP_KEEPER_METRICS_HOST", "127.0.0.1") or "127.0.0.1",
            metrics_port=int(port_text),
            metrics_token=e.get("AGAP_KEEPER_METRICS_TOKEN", ""),
            metrics_allow=_csv(e.get("AGAP_KEEPER_METRICS_ALLOW", "")),
            notify_allow=_csv(e.get("AGAP_KEEPER_NOTIFY_ALLOW", "")),
        )
