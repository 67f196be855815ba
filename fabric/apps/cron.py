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

Missed times are never fired by the fabric: a planned time not fired within the grace
period (60 s) is missed, not caught up. For a ``must_not_miss`` schedule that is an
incident for Zabbix (through the keeper's metrics), and a person decides. Times planned
before a schedule was first seen are never owed.

What was made and what was missed is kept on the board, per schedule (project metadata
``fabric.cron.<name>``): when it was first seen, the last planned time a task was made
for and when, the next planned time, the latest planned time accounted for, and the
missed runs (a count and the most recent gaps, each its first and last planned time and
count). A cron process that starts after a gap (its host was down, the process was
stopped) compares the schedule's planned times since then with the tasks on the board and
records every one without a task as missed, whatever its own state file says. The count
stops at ``MISSED_SCAN_CAP`` planned times per gap (a host down for a month does not
enumerate 43,200 minutes); the gap then still names its last planned time, and its count
is marked as a lower bound. The keeper sees these records even when this process is the
one that is down.

``<state dir>/cron-state.json`` keeps this process's own counters (fired, deduplicated,
errors, the last task) for ``agap cron --list``.
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

from fabric.cards.problems import error_message
from fabric.durations import parse_duration
from fabric.errors import ConfigError, FabricError, InvalidInput
from fabric.kanboard.port import BoardError
from fabric.slots import GRACE_SECONDS, latest_planned
from fabric.submit import ActionIdCollision
from fabric.task import parse_priority

if TYPE_CHECKING:
    from fabric.core import Fabric

log = logging.getLogger("agap.cron")

DEFAULT_KEY = "cron/{name}/{planned:%Y-%m-%dT%H:%M:%SZ}"
DEFAULT_ACTOR = "cron"
STATE_FILE = "cron-state.json"
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

    def planned_between(
        self, after: datetime, upto: datetime, cap: int
    ) -> tuple[list[datetime], datetime | None]:
        """Planned times ``t`` with ``after < t <= upto``, oldest first, at most ``cap`` of
        them; and the next one when there are more (None when the list is complete)."""
        out: list[datetime] = []
        t = self.next_after(after)
        while t is not None and t <= upto:
            if len(out) >= cap:
                return out, t
            out.append(t)
            t = self.next_after(t)
        return out, None

    def latest_at(self, now: datetime) -> datetime | None:
        """The last planned time at or before ``now`` (None if there is none yet)."""
        if self.interval is not None:
            if now < self.anchor:
                return None
            steps = math.floor((now - self.anchor).total_seconds() / self.interval)
            return (self.anchor + timedelta(seconds=steps * self.interval)).astimezone(self.zone)
        return latest_planned(self.trigger, now)


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
        raise ConfigError(f"{loc}: {error_message(first)}", where=str(p)) from None
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

    def skipped(self, name: str, planned: datetime, *, count: int = 1) -> None:
        """``count`` times missed beyond the grace period, the last at ``planned``: counted,
        never fired."""
        with self._locked() as data:
            e = data.setdefault(name, {})
            ts = planned.timestamp()
            if ts > float(e.get("last_planned") or 0):
                e.update(last_planned=ts, last_planned_iso=planned.astimezone(UTC).isoformat())
            if ts > float(e.get("last_missed") or 0):
                e.update(missed=int(e.get("missed", 0)) + count, last_missed=ts)


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


def fire(
    fabric: Fabric,
    schedule: Schedule,
    planned: datetime,
    state: CronState | None = None,
    *,
    actual: float | None = None,
) -> Firing:
    """Submit the task for ``schedule`` at ``planned`` (idempotent by the derived key);
    ``actual`` is when it fires (default: the fabric's clock)."""

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
            fabric.clock() if actual is None else actual,
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


MISSED_SCAN_CAP = 1000  # planned times counted per gap (a month on a 1-minute schedule: 43,200)
MISSED_RUNS_KEPT = 5  # the most recent gaps listed in a schedule's board record


@dataclass(frozen=True)
class MissedRuns:
    """Consecutive planned runs of a schedule that no task was made for, and never will be."""

    first: datetime
    last: datetime
    count: int
    capped: bool = False  # more planned times than the scan cap: ``count`` is a lower bound

    def to_json(self) -> list[Any]:
        return [self.first.timestamp(), self.last.timestamp(), self.count, self.capped]

    def line(self, schedule: Schedule) -> str:
        span = _utc(self.first) if self.count == 1 else f"{_utc(self.first)} .. {_utc(self.last)}"
        n = f"at least {self.count}" if self.capped else str(self.count)
        cap = f" (counting stops at {MISSED_SCAN_CAP} planned times per gap)" if self.capped else ""
        must = "; must_not_miss: reported for Zabbix" if schedule.must_not_miss else ""
        return f"{schedule.name}: {n} planned run(s) missed, {span}{cap}; never fired{must}"


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _missed_runs(
    times: list[datetime], made: list[int | None], more: datetime | None, last: datetime
) -> list[MissedRuns]:
    """The runs of consecutive planned times in ``times`` that have no task.

    ``more``: the first planned time beyond the scan cap (None when ``times`` is the whole
    span). Those beyond it, up to ``last``, are neither looked up nor counted one by one:
    the last gap then reaches ``last``, and its count (at least one more) is a lower bound.
    """
    gaps: list[MissedRuns] = []
    run: list[datetime] = []
    for t, task in zip(times, made, strict=True):
        if task is None:
            run.append(t)
            continue
        if run:
            gaps.append(MissedRuns(run[0], run[-1], len(run)))
        run = []
    if more is not None:
        gaps.append(MissedRuns(run[0] if run else more, last, len(run) + 1, capped=True))
    elif run:
        gaps.append(MissedRuns(run[0], run[-1], len(run)))
    return gaps


class CronRunner:
    """Fires due schedules: call :meth:`tick` (tests, ``--tick``) or :meth:`run` (the daemon).

    Each tick reads the schedules' records from the board (``fabric.cron.<name>``), so what
    was made and what was missed is known across restarts and processes, not only from this
    process's memory or its state file. Planned times since the last one accounted for
    that are past their grace are looked up on the board (a task may exist: another
    process fired it, or this one died before it published) and the ones without a task
    are recorded as missed, never fired.
    """

    def __init__(
        self,
        fabric: Fabric,
        schedules: list[Schedule],
        state: CronState,
        *,
        grace: float = GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
        scan_cap: int = MISSED_SCAN_CAP,
    ) -> None:
        self.fabric = fabric
        self.schedules = schedules
        self.state = state
        self.grace = grace
        self.clock = clock or fabric.clock
        self.scan_cap = scan_cap
        self.records: dict[str, dict[str, Any]] = {}  # name -> its record, as last worked out
        self._published: dict[str, str] = {}  # name -> the record's text last written

    # -- the record ---------------------------------------------------------------------

    def _merge(self, s: Schedule, board: dict[str, Any], local: dict[str, Any], now: float) -> dict[str, Any]:
        """The schedule's record: the board's, unless this process knows more (its last
        write did not reach the board), with the first-seen time of any process."""
        mine = self.records.get(s.name, {})
        rec = dict(mine if _num(mine.get("accounted")) > _num(board.get("accounted")) else board)
        seen = [_num(x) for x in (board.get("since"), mine.get("since"), local.get("since")) if _num(x)]
        rec["since"] = min(seen) if seen else self.state.since(s.name, now)
        # A record written before "accounted" existed: what it fired is accounted for.
        rec["accounted"] = max(_num(rec.get("accounted")), _num(rec.get("last_planned")))
        return rec

    def _account(self, s: Schedule, rec: dict[str, Any], now: float) -> datetime | None:
        """Record the missed runs since ``rec`` was last accounted for; return the planned
        time to fire now (None when there is none within the grace)."""
        latest = s.latest_at(datetime.fromtimestamp(now, UTC))
        since = _num(rec["since"])
        if latest is None or latest.timestamp() < since - 1e-6 or latest.timestamp() <= rec["accounted"]:
            return None
        due = latest if now - latest.timestamp() <= self.grace else None
        after = datetime.fromtimestamp(max(rec["accounted"], since - 1e-3), UTC)
        upto = latest - timedelta(microseconds=1) if due else latest
        times, more = s.planned_between(after, upto, self.scan_cap)
        if not times:
            return due
        last = (s.latest_at(upto) or times[-1]) if more else times[-1]
        made = self.fabric.board.tasks_by_keys([(s.actor, s.key(t)) for t in times])
        found = [t.timestamp() for t, task in zip(times, made, strict=True) if task is not None]
        if found:
            rec["last_planned"] = max(_num(rec.get("last_planned")), found[-1])
        gaps = _missed_runs(times, made, more, last)
        for gap in gaps:
            log.warning("%s", gap.line(s))
            self.state.skipped(s.name, gap.last, count=gap.count)
        if gaps:
            rec["missed"] = int(_num(rec.get("missed"))) + sum(g.count for g in gaps)
            rec["missed_capped"] = bool(rec.get("missed_capped")) or any(g.capped for g in gaps)
            rec["last_missed"] = gaps[-1].last.timestamp()
            rec["missed_runs"] = [*(rec.get("missed_runs") or []), *(g.to_json() for g in gaps)][
                -MISSED_RUNS_KEPT:
            ]
        rec["accounted"] = last.timestamp()
        return due

    def _entry(self, s: Schedule, rec: dict[str, Any], at: datetime) -> dict[str, Any]:
        nxt = s.next_after(at)
        return {
            "schedule": s.name,
            "must_not_miss": s.must_not_miss,
            "grace": self.grace,
            "since": rec.get("since"),
            "last_planned": rec.get("last_planned"),
            "last_actual": rec.get("last_actual"),
            "next_planned": nxt.timestamp() if nxt else None,
            "accounted": rec.get("accounted") or None,
            "missed": int(_num(rec.get("missed"))),
            "missed_capped": bool(rec.get("missed_capped")),
            "last_missed": rec.get("last_missed"),
            "missed_runs": rec.get("missed_runs") or [],
        }

    def publish(self, now: float) -> bool:
        """Publish each schedule's record to the board, when it changed.

        The keeper reads these to tell Zabbix about missed must-not-miss runs: the ones
        recorded here, and the one a cron process that is itself down is missing now
        (``next_planned`` then lies in the past).
        """
        at = datetime.fromtimestamp(now, UTC)
        changed: dict[str, dict[str, Any]] = {}
        for s in self.schedules:
            entry = self._entry(s, self.records.get(s.name, {}), at)
            if self._published.get(s.name) != json.dumps(entry, sort_keys=True):
                changed[s.name] = entry
        if not changed:
            return False
        try:
            self.fabric.board.publish_schedules(changed)
        except FabricError as exc:
            log.warning("could not publish the schedules' state: %s", exc.line())
            return False
        for name, entry in changed.items():
            self._published[name] = json.dumps(entry, sort_keys=True)
        return True

    # -- ticking ------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> list[Firing]:
        """Fire what is due at ``now`` (default: the clock), record what was missed, publish.

        Costs one read of the board, plus the firings, plus one lookup batch for a schedule
        with planned times past their grace that were never accounted for, plus one write
        when a record changed.
        """
        now = self.clock() if now is None else now
        board = self.fabric.board.schedule_states()
        local = self.state.read()
        firings = []
        for s in self.schedules:
            rec = self._merge(s, board.get(s.name, {}), local.get(s.name, {}), now)
            self.records[s.name] = rec
            due = self._account(s, rec, now)
            if due is None:
                continue
            f = fire(self.fabric, s, due, self.state, actual=now)
            (log.error if f.error else log.info)("%s", f.line())
            firings.append(f)
            if not f.error:  # a failed firing is retried until its grace runs out
                rec.update(last_planned=due.timestamp(), accounted=due.timestamp(), last_actual=now)
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
        """Tick until ``stop``. A board that goes away is said once, and ticking goes on."""
        stop = stop or threading.Event()
        away = False
        while not stop.is_set():
            try:
                self.tick()
                if away:
                    log.info("the board answers again")
                away = False
            except BoardError as exc:  # a board outage must not end the daemon
                if not away:
                    log.warning("the board is unreachable (%s); retrying every tick", exc.line())
                away = True
            except Exception:  # nor a bug in one tick
                log.exception("cron tick failed; retrying")
            now = self.clock()
            delay = max(0.05, self.next_wake(now) - now)
            (sleep or stop.wait)(delay)


__all__ = [
    "GRACE_SECONDS",
    "CronRunner",
    "CronState",
    "Firing",
    "MissedRuns",
    "Schedule",
    "fire",
    "fire_once",
    "load_schedules",
]
