"""Planned slots: a submit fired by an outside scheduler (OpenClaw's cron) for a planned time.

An outside scheduler knows when it fires, not always when it was *meant* to: it may
stagger a job, fire it twice, or catch up runs missed while it was down. The fabric's
rule for proactive work is the one its own cron keeps (:mod:`fabric.apps.cron`): a
planned time runs on time, within :data:`GRACE_SECONDS`, or it is missed — never fired
late. A submit that names its slot (a cron expression and an explicit IANA time zone) is
held to the same rule:

* the planned time is the slot's latest time at or before the fabric's clock (never the
  scheduler's word), in the slot's own zone (never the host's);
* the action id is the caller's key (which names the job) plus that planned time, so
  every firing of one slot — a retry, a double firing, a second gateway — is one task;
* relative times (``deadline: +2h``) count from the planned time, so a second firing
  submits the same content;
* a firing later than the grace is refused with :class:`MissedSlot` (exit 1) unless the
  slot already has its task (then it is that task, ``created: false``): a catch-up never
  runs as if it were on time. The refusal line names the slot and how late it came.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from fabric.errors import EXIT_FAILED, FabricError, InvalidInput
from fabric.plain import Plain

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

    from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]

# The fabric's own cron counts a planned time not fired within this as missed.
GRACE_SECONDS = 60.0
KEY_TIME = "%Y-%m-%dT%H:%M:%SZ"
_LOOKBACK_DAYS = 800  # a yearly slot's latest time is found within this


class MissedSlot(FabricError):
    """A firing of a slot that came later than the grace, for a slot with no task yet."""

    exit_code = EXIT_FAILED
    code = "MISSED_SLOT"


class SlotFiring(Plain):
    """One firing of a slot: its planned time, the action id, and how late it came."""

    cron: str
    zone: ZoneInfo
    planned: datetime
    key: str
    late_by: float

    @property
    def on_time(self) -> bool:
        return self.late_by <= GRACE_SECONDS

    def missed(self, where: str) -> MissedSlot:
        local = self.planned.astimezone(self.zone).strftime("%Y-%m-%d %H:%M %Z")
        return MissedSlot(
            f"slot {local} ({self.cron!r} in {self.zone.key}) fired {self.late_by:.0f} s late, past the "
            f"{GRACE_SECONDS:.0f} s grace: missed, not run late",
            where=where,
            hint="a catch-up or staggered firing is refused; the next slot runs on time "
            "(OpenClaw: set cron.skipMissedJobs true and add the job with --exact)",
        )


def _zone(name: str | None, where: str) -> ZoneInfo:
    if not name or not name.strip():
        raise InvalidInput(
            "a slot needs its time zone, said explicitly",
            where=where,
            hint="an IANA zone such as Europe/Berlin or UTC; the host's zone is never assumed",
        )
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # here: only a slot reads a zone

    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"{name!r} is not an IANA time zone", where=where, hint="e.g. Europe/Berlin"
        ) from None


def latest_planned(trigger: CronTrigger, now: datetime) -> datetime | None:
    """The trigger's last fire time at or before ``now`` (None within the lookback)."""
    lookback = timedelta(seconds=60)
    first: datetime | None = None
    while lookback <= timedelta(days=_LOOKBACK_DAYS):
        first = trigger.get_next_fire_time(None, now - lookback)
        if first is not None and first <= now:
            break
        first = None
        lookback *= 2
    if first is None:
        return None
    while True:
        nxt = trigger.get_next_fire_time(None, first + timedelta(microseconds=1))
        if nxt is None or nxt > now:
            return first
        first = nxt


def plan_slot(
    cron: str | None,
    zone: str | None,
    key: str | None,
    now: float,
    *,
    where: str = "--slot",
    zone_where: str = "--timezone",
    key_where: str = "--key",
) -> SlotFiring:
    """The firing of slot ``cron`` in ``zone`` that ``now`` belongs to, keyed by ``key``."""
    if not cron or not cron.strip():
        raise InvalidInput(
            "a time zone was given without a slot", where=where, hint="give the cron expression of the job"
        )
    tz = _zone(zone, zone_where)
    if not key or not key.strip():
        raise InvalidInput(
            "a slot needs a key that names the job",
            where=key_where,
            hint="e.g. openclaw/morning-digest; the planned time is added to it",
        )
    # Imported here: apscheduler brings asyncio (~10 MB), and every worker imports this
    # module through Fabric; only a scheduler's firing needs the cron arithmetic.
    from apscheduler.triggers.cron import CronTrigger

    try:
        trigger = CronTrigger.from_crontab(cron.strip(), timezone=tz)
    except ValueError as exc:
        raise InvalidInput(
            f"{cron!r} is not a cron expression: {exc}", where=where, hint="five fields, e.g. '0 7 * * *'"
        ) from None
    at = datetime.fromtimestamp(now, UTC)
    planned = latest_planned(trigger, at)
    if planned is None:
        raise InvalidInput(
            f"slot {cron!r} has no planned time in the last {_LOOKBACK_DAYS} days", where=where
        )
    utc = planned.astimezone(UTC)
    return SlotFiring(cron.strip(), tz, utc, f"{key.strip()}/{utc.strftime(KEY_TIME)}", now - utc.timestamp())


__all__ = ["GRACE_SECONDS", "MissedSlot", "SlotFiring", "latest_planned", "plan_slot"]
