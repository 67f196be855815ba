"""Proactive work: schedules that submit tasks at planned times (``agap cron``).

A schedule file (YAML) lists schedules; each fires at the times of a cron expression or
a fixed interval and submits one task. The task's action id is derived from the schedule's
name and the **planned** fire time (never the actual one), so two cron processes firing
the same schedule at once, or one firing twice, make one task: the second submit returns
the first one's receipt.

::

    timezone: Europe/Berlin        # default zone for cron expressions
    schedules:
      - name: morning-digest
        cron: "0 7 * * *"          # or: every: 6h   (aligned to `start`, default 2000-01-01)
        target: adolf              # or: constraints: "tier>=large,cap=reflect"; or target: auto
        intent: "Morning digest for {planned_local:%A %d %B}"
        refs: ["kanboard://task/1"]
        priority: normal
        deadline: 2h               # after the planned time
        key: "cron/{name}/{planned:%Y-%m-%dT%H:%MZ}"   # the default
        must_not_miss: true        # a missed run raises a problem in the keeper's metrics

Templates (``intent``, ``key``) may use ``{name}``, ``{planned}`` (UTC), ``{planned_local}``
(the schedule's zone) and ``{ts}`` (unix seconds). The key must use the planned time.

Missed times are never fired by the fabric: a time missed by more than the grace period
(60 s) is recorded as missed, not caught up. For a ``must_not_miss`` schedule that is an
incident: the keeper's metrics (and the Zabbix template) raise it, and a person decides.
Times planned before a schedule was first seen are never owed.

The last planned and actual firing of each schedule go to ``<state dir>/cron-state.json``
and, with the next planned time, to the board (project metadata ``fabric.cron.<name>``),
where the keeper sees them even when this process is the one that is down.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fabric.durations import parse_duration
from fabric.errors import ConfigError, FabricError, InvalidInput
from fabric.kanboard.layout import META_CRON_PREFIX, cron_key
from fabric.submit import ActionIdCollision
from fabric.task import parse_priority

if TYPE_CHECKING:
    from fabric.core import Fabric

log = logging.getLogger("agap.cron")

DEFAULT_KEY = "cron/{name}/{planned:%Y-%m-%dT%H:%M:%SZ}"
DEFAULT_ACTOR = "cron"
STATE_FILE = "cron-state.json"
GRACE_SECONDS = 60.0
_ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)


class _ScheduleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")
    cron: str | None = None
    every: str | None = None
    start: datetime | None = None
    timezone: str | None = None
    target: str | None = None
    constraints: str | None = None
    intent: str = Field(min_length=1)
    refs: list[str] = Field(default_factory=list)
    priority: str | int = "normal"
    deadline: str | None = None
    key: str = DEFAULT_KEY
    actor: str = DEFAULT_ACTOR
    must_not_miss: bool = False

    @model_validator(mode="after")
    def _one_each(self) -> _ScheduleFile:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron (an expression) or every (a duration)")
        if self.target is None and self.constraints is None:
            raise ValueError("give a target (an agent id or auto) or constraints")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timezone: str = "UTC"
    schedules: list[_ScheduleFile] = Field(default_factory=list)


@dataclass(frozen=True)
class Schedule:
    """One schedule: when it fires and the task it submits."""

    name: str
    trigger: BaseTrigger
    when: str  # human form: "cron 0 7 * * * (Europe/Berlin)" or "every 6h"
    zone: ZoneInfo
    intent: str
    target: str | None = None
    constraints: str | None = None
    refs: tuple[str, ...] = ()
    priority: int = 1
    deadline: float | None = None  # seconds after the planned time
    key_template: str = DEFAULT_KEY
    actor: str = DEFAULT_ACTOR
    must_not_miss: bool = False
    interval: float | None = None
    anchor: datetime = _ANCHOR

    def _vars(self, planned: datetime) -> dict[str, Any]:
        utc = planned.astimezone(UTC)
        return {
            "name": self.name,
            "planned": utc,
            "planned_local": planned.astimezone(self.zone),
            "ts": int(utc.timestamp()),
        }

    def key(self, planned: datetime) -> str:
        """The action id for the firing planned at ``planned``."""
        return self.key_template.format(**self._vars(planned))

    def render_intent(self, planned: datetime) -> str:
        return self.intent.format(**self._vars(planned))

    def next_after(self, t: datetime) -> datetime | None:
        """The first planned time strictly after ``t``."""
        nxt: datetime | None = self.trigger.get_next_fire_time(None, t + timedelta(microseconds=1))
        return nxt

    def latest_at(self, now: datetime) -> datetime | None:
        """The last planned time at or before ``now`` (None if there is none yet)."""
        if self.interval is not None:
            if now < self.anchor:
                return None
            steps = math.floor((now - self.anchor).total_seconds() / self.interval)
            return (self.anchor + timedelta(seconds=steps * self.interval)).astimezone(self.zone)
        lookback = timedelta(seconds=60)
        first: datetime | None = None
        while lookback <= timedelta(days=800):
            first = self.trigger.get_next_fire_time(None, now - lookback)
            if first is not None and first <= now:
                break
            first = None
            lookback *= 2
        if first is None:
            return None
        while True:
            nxt = self.next_after(first)
            if nxt is None or nxt > now:
                return first
            first = nxt


def _zone(name: str, where: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{name!r} is not an IANA time zone", where=where) from None


def _schedule(s: _ScheduleFile, default_zone: str, where: str) -> Schedule:
    zone = _zone(s.timezone or default_zone, where)
    interval = None
    anchor = _ANCHOR
    try:
        if s.cron is not None:
            trigger: BaseTrigger = CronTrigger.from_crontab(s.cron, timezone=zone)
            when = f"cron {s.cron} ({zone.key})"
        else:
            assert s.every is not None
            interval = parse_duration(s.every)
            if s.start is not None:
                anchor = s.start if s.start.tzinfo else s.start.replace(tzinfo=zone)
            trigger = IntervalTrigger(seconds=interval, start_date=anchor, timezone=zone)
            when = f"every {s.every}"
    except (ValueError, InvalidInput) as exc:
        raise ConfigError(f"cannot read the schedule: {exc}", where=where) from None
    deadline = parse_duration(s.deadline) if s.deadline else None
    try:
        priority = parse_priority(s.priority)
    except InvalidInput as exc:
        raise ConfigError(exc.what, where=f"{where}.priority") from None
    sched = Schedule(
        s.name,
        trigger,
        when,
        zone,
        s.intent,
        s.target,
        s.constraints,
        tuple(s.refs),
        priority,
        deadline,
        s.key,
        s.actor,
        s.must_not_miss,
        interval,
        anchor,
    )
    a, b = datetime(2030, 1, 1, 7, tzinfo=UTC), datetime(2030, 1, 2, 8, 30, 15, tzinfo=UTC)
    try:
        keys = {sched.key(a), sched.key(b)}
        sched.render_intent(a)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"bad template: {exc!r}",
            where=f"{where}.key/intent",
            hint="use {name}, {planned}, {planned_local} or {ts}",
        ) from None
    if len(keys) != 2 or "" in keys:
        raise ConfigError(
            "the key template does not use the planned fire time",
            where=f"{where}.key",
            hint="e.g. cron/{name}/{planned:%Y-%m-%dT%H:%M:%SZ}",
        )
    return sched


def load_schedules(path: str | Path) -> list[Schedule]:
    """Read and check a schedule file (every schedule, names unique)."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError("no such schedule file", where=str(p), hint="see schedules.example.yaml") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", where=str(p)) from None
    try:
        data = _File.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{loc}: {first['msg'].removeprefix('Value error, ')}", where=str(p)) from None
    _zone(data.timezone, f"{p}: timezone")
    out: list[Schedule] = []
    seen: set[str] = set()
    for i, s in enumerate(data.schedules):
        if s.name in seen:
            raise ConfigError(f"schedule name {s.name!r} is used twice", where=f"{p}: schedules.{i}")
        seen.add(s.name)
        out.append(_schedule(s, data.timezone, f"{p}: schedules.{i}"))
    return out


# ---------------------------------------------------------------------------------------
# State: last planned and actual firing per schedule


class CronState:
    """``cron-state.json``: per schedule, when it was first seen, its last planned and
    actual firing, the task it made, and counts. Updates are locked and atomic, so
    several cron processes may share it."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        schedules = data.get("schedules") if isinstance(data, dict) else None
        return schedules if isinstance(schedules, dict) else {}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / (STATE_FILE + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            yield data
            tmp = self.path.with_suffix(f".tmp.{os.getpid()}")
            tmp.write_text(json.dumps({"schedules": data}, indent=2, sort_keys=True))
            tmp.replace(self.path)

    def since(self, name: str, now: float) -> float:
        """When ``name`` was first seen (set to ``now`` the first time)."""
        with self._locked() as data:
            entry = data.setdefault(name, {})
            entry.setdefault("since", now)
            return float(entry["since"])

    def record(
        self,
        name: str,
        planned: datetime,
        actual: float,
        *,
        task_id: int | None,
        created: bool,
        error: str | None = None,
    ) -> None:
        with self._locked() as data:
            e = data.setdefault(name, {"since": actual})
            if error is not None:
                e.update(last_error=error, last_error_at=actual, errors=int(e.get("errors", 0)) + 1)
                return
            ts = planned.timestamp()
            if ts > float(e.get("last_planned") or 0):
                e.update(last_planned=ts, last_planned_iso=planned.astimezone(UTC).isoformat())
            e.update(
                last_actual=actual,
                last_actual_iso=datetime.fromtimestamp(actual, UTC).isoformat(),
                last_task=task_id,
                last_created=created,
                fired=int(e.get("fired", 0)) + (1 if created else 0),
                deduplicated=int(e.get("deduplicated", 0)) + (0 if created else 1),
            )
            e.pop("last_error", None)

    def skipped(self, name: str, planned: datetime) -> None:
        """A time missed beyond the grace period: counted, never fired."""
        with self._locked() as data:
            e = data.setdefault(name, {})
            ts = planned.timestamp()
            if ts > float(e.get("last_planned") or 0):
                e.update(
                    last_planned=ts,
                    last_planned_iso=planned.astimezone(UTC).isoformat(),
                    missed=int(e.get("missed", 0)) + 1,
                    last_missed=ts,
                )


# ---------------------------------------------------------------------------------------
# Firing


@dataclass(frozen=True)
class Firing:
    """What one firing did."""

    schedule: str
    planned: datetime
    key: str
    task_id: int | None
    created: bool
    error: str | None = None

    def line(self) -> str:
        when = self.planned.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if self.error:
            return f"{self.schedule} @ {when}: failed: {self.error}"
        what = "created" if self.created else "already there"
        return f"{self.schedule} @ {when}: task:{self.task_id} ({what}, key {self.key})"


def fire(fabric: Fabric, schedule: Schedule, planned: datetime, state: CronState | None = None) -> Firing:
    """Submit the task for ``schedule`` at ``planned`` (idempotent by the derived key)."""

    key = schedule.key(planned)
    deadline = planned.timestamp() + schedule.deadline if schedule.deadline else None
    try:
        receipt = fabric.submit(
            schedule.render_intent(planned),
            target=schedule.target,
            constraints=schedule.constraints,
            refs=schedule.refs,
            priority=schedule.priority,
            deadline=deadline,
            key=key,
            actor=schedule.actor,
        )
        result = Firing(schedule.name, planned, key, receipt.task_id, receipt.created)
    except ActionIdCollision as exc:
        # Another firing of the same planned time routed differently (a park changed in
        # between): the planned time has its task, which is what matters.
        result = Firing(schedule.name, planned, key, exc.task_id, False)
    except FabricError as exc:
        result = Firing(schedule.name, planned, key, None, False, exc.line())
    if state is not None:
        state.record(
            schedule.name,
            planned,
            fabric.clock(),
            task_id=result.task_id,
            created=result.created,
            error=result.error,
        )
    return result


def fire_once(fabric: Fabric, schedule: Schedule, state: CronState | None = None) -> Firing:
    """``agap cron --once``: fire ``schedule`` for its latest planned time (or the next,
    when it has none yet). Two of these at once make one task."""
    now = datetime.fromtimestamp(fabric.clock(), UTC)
    planned = schedule.latest_at(now) or schedule.next_after(now)
    if planned is None:
        raise InvalidInput(f"schedule {schedule.name!r} never fires", where="--once")
    return fire(fabric, schedule, planned, state)


CRON_META_PREFIX = META_CRON_PREFIX


class CronRunner:
    """Fires due schedules: call :meth:`tick` (tests) or :meth:`run` (the daemon)."""

    def __init__(
        self, fabric: Fabric, schedules: list[Schedule], state: CronState, *, grace: float = GRACE_SECONDS
    ) -> None:
        self.fabric = fabric
        self.schedules = schedules
        self.state = state
        self.grace = grace
        self._published: dict[str, str] = {}

    def due(self, now: float) -> list[tuple[Schedule, datetime]]:
        """(schedule, planned time) pairs to fire at ``now``; skips what is missed for good."""
        at = datetime.fromtimestamp(now, UTC)
        known = self.state.read()
        out = []
        for s in self.schedules:
            entry = known.get(s.name, {})
            since = float(entry["since"]) if "since" in entry else self.state.since(s.name, now)
            planned = s.latest_at(at)
            if planned is None or planned.timestamp() < since - 1e-6:
                continue
            if planned.timestamp() <= float(entry.get("last_planned") or 0):
                continue  # already fired (by us or another process) or skipped
            if now - planned.timestamp() <= self.grace:
                out.append((s, planned))
            else:
                # Never re-fired by the fabric: a missed run is an incident, reported in
                # the keeper's metrics (and Zabbix) for a schedule that must not be missed.
                log.warning(
                    "%s: planned %s missed by %.0fs; not fired%s",
                    s.name,
                    planned.isoformat(),
                    now - planned.timestamp(),
                    " (must_not_miss: reported as missed)" if s.must_not_miss else "",
                )
                self.state.skipped(s.name, planned)
        return out

    def publish(self, now: float) -> bool:
        """Publish each schedule's planned, actual and next firing to the board, when changed.

        The keeper reads these (project metadata ``fabric.cron.<name>``) to tell Zabbix
        that a schedule which must not be missed did not fire, even when this process is
        the one that is down (``next_planned`` then lies in the past).
        """
        at = datetime.fromtimestamp(now, UTC)
        known = self.state.read()
        values: dict[str, str] = {}
        for s in self.schedules:
            e = known.get(s.name, {})
            nxt = s.next_after(at)
            entry = {
                "schedule": s.name,
                "must_not_miss": s.must_not_miss,
                "grace": self.grace,
                "last_planned": e.get("last_planned"),
                "last_actual": e.get("last_actual"),
                "next_planned": nxt.timestamp() if nxt else None,
                "missed": int(e.get("missed", 0)),
                "last_missed": e.get("last_missed"),
            }
            text = json.dumps(entry, sort_keys=True)
            if self._published.get(s.name) != text:
                values[cron_key(s.name)] = text
        if not values:
            return False
        try:
            self.fabric.board.save_project_meta(values)
        except FabricError as exc:
            log.warning("could not publish the schedules' state: %s", exc.line())
            return False
        for key, text in values.items():
            self._published[key[len(CRON_META_PREFIX) :]] = text
        return True

    def tick(self, now: float | None = None) -> list[Firing]:
        now = self.fabric.clock() if now is None else now
        firings = []
        for s, planned in self.due(now):
            f = fire(self.fabric, s, planned, self.state)
            (log.error if f.error else log.info)("%s", f.line())
            firings.append(f)
        self.publish(now)
        return firings

    def next_wake(self, now: float) -> float:
        """When the next schedule is planned to fire (at most a minute away, to pick up
        failed firings and clock changes)."""
        at = datetime.fromtimestamp(now, UTC)
        times = [n.timestamp() for s in self.schedules if (n := s.next_after(at)) is not None]
        return min([now + 60.0, *times])

    def run(
        self, stop: threading.Event | None = None, sleep: Callable[[float], object] | None = None
    ) -> None:
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # a board outage must not end the daemon
                log.exception("cron tick failed; retrying")
            now = self.fabric.clock()
            delay = max(0.05, self.next_wake(now) - now)
            (sleep or stop.wait)(delay)


__all__ = ["CronRunner", "CronState", "Firing", "Schedule", "fire", "fire_once", "load_schedules"]
