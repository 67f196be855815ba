"""The cron submitter: schedule files, planned times, keys, missed firings, the state file."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fabric.apps.cron import (
    GRACE_SECONDS,
    MISSED_SCAN_CAP,
    CronRunner,
    CronState,
    Schedule,
    _missed_runs,
    fire,
    fire_once,
    load_schedules,
)
from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.kanboard.port import BoardUnavailable
from tests.conftest import ROOT, FakeClock

# The fake clock starts at 1_800_000_000 = 2027-01-15 08:00:00 UTC.
START = datetime.fromtimestamp(1_800_000_000, UTC)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "schedules.yaml"
    p.write_text(text)
    return p


HOURLY = """
timezone: UTC
schedules:
  - name: hourly
    cron: "0 * * * *"
    target: gemma-local
    intent: "Check the queue at {planned:%H:%M}"
    deadline: 30m
  - name: nightly
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    constraints: "tier>=large"
    intent: "Nightly reflection for {planned_local:%Y-%m-%d}"
    priority: low
    must_not_miss: true
  - name: every-20m
    every: 20m
    target: auto
    intent: "ping"
"""


def test_the_example_schedule_file_loads() -> None:
    names = [s.name for s in load_schedules(ROOT / "schedules.example.yaml")]
    assert names == ["morning-digest", "reflect", "consolidation", "research-queue"]
    text = (ROOT / "schedules.example.yaml").read_text()
    # It states the rule the runner follows: no late firing, the cap it counts to.
    assert "not fired once it is back" in text and f"up to {MISSED_SCAN_CAP} planned times" in text
    assert f"within {GRACE_SECONDS:.0f} s" in text


@pytest.mark.parametrize(
    "text, message",
    [
        ("schedules: [{name: a, intent: x, target: kimi}]", "exactly one of cron"),
        (
            "schedules: [{name: a, cron: '* * * * *', every: 1h, intent: x, target: kimi}]",
            "exactly one of cron",
        ),
        ("schedules: [{name: a, cron: '* * * * *', intent: x}]", "give a target"),
        ("schedules: [{name: a, cron: 'nope', intent: x, target: kimi}]", "cannot read the schedule"),
        ("schedules: [{name: a, every: soon, intent: x, target: kimi}]", "cannot read the schedule"),
        (
            "schedules: [{name: a, cron: '0 * * * *', intent: x, target: kimi, key: fixed}]",
            "does not use the planned fire time",
        ),
        ("schedules: [{name: a, cron: '0 * * * *', intent: 'x {when}', target: kimi}]", "bad template"),
        (
            "schedules: [{name: a, cron: '0 * * * *', intent: x, target: kimi, priority: asap}]",
            "unknown priority",
        ),
        ("timezone: Mars/Olympus\nschedules: []", "not an IANA time zone"),
        (
            "schedules: [{name: a, cron: '0 * * * *', intent: x, target: kimi},"
            " {name: a, every: 1h, intent: y, target: kimi}]",
            "used twice",
        ),
        ("schedules: [{name: a, cron: '0 * * * *', intent: x, target: kimi, colour: red}]", "colour"),
    ],
)
def test_bad_schedule_files_are_refused_with_the_place(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_schedules(write(tmp_path, text))
    assert "schedules.yaml" in err.value.line()


def test_planned_times_for_cron_and_interval_schedules(tmp_path: Path) -> None:
    hourly, nightly, every = load_schedules(write(tmp_path, HOURLY))
    at = datetime(2027, 1, 15, 8, 17, tzinfo=UTC)
    assert hourly.latest_at(at) == datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    assert hourly.next_after(at) == datetime(2027, 1, 15, 9, 0, tzinfo=UTC)
    assert hourly.latest_at(datetime(2027, 1, 15, 8, 0, tzinfo=UTC)) == datetime(
        2027, 1, 15, 8, 0, tzinfo=UTC
    )
    # 02:30 in Berlin (CET, UTC+1) is 01:30 UTC.
    assert nightly.latest_at(at) == datetime(2027, 1, 15, 1, 30, tzinfo=UTC)
    assert every.latest_at(at) == datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    assert every.next_after(at) == datetime(2027, 1, 15, 8, 20, tzinfo=UTC)
    assert hourly.key(datetime(2027, 1, 15, 8, tzinfo=UTC)) == "cron/hourly/2027-01-15T08:00:00Z"
    assert nightly.render_intent(nightly.latest_at(at)) == "Nightly reflection for 2027-01-15"  # type: ignore[arg-type]


def test_a_firing_submits_one_task_keyed_by_the_planned_time(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    hourly = load_schedules(write(tmp_path, HOURLY))[0]
    state = CronState(tmp_path / "state")
    planned = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    first = fire(local_fabric, hourly, planned, state)
    clock.advance(7)
    second = fire(local_fabric, hourly, planned, state)
    assert first.created and not second.created and first.task_id == second.task_id
    view = local_fabric.show(first.task_id)  # type: ignore[arg-type]
    assert view.spec is not None and view.spec.action_id == "cron/hourly/2027-01-15T08:00:00Z"
    assert view.spec.actor == "cron" and view.spec.intent == "Check the queue at 08:00"
    assert view.spec.deadline == planned.timestamp() + 1800
    data = json.loads((tmp_path / "state" / "cron-state.json").read_text())["schedules"]["hourly"]
    assert data["last_planned"] == planned.timestamp()
    assert data["last_planned_iso"] == "2027-01-15T08:00:00+00:00"
    assert data["last_actual"] == clock.now and data["last_task"] == first.task_id
    assert data["fired"] == 1 and data["deduplicated"] == 1


def test_the_runner_fires_due_schedules_once_even_with_two_runners(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    schedules = load_schedules(write(tmp_path, HOURLY))
    state = CronState(tmp_path / "state")
    a = CronRunner(local_fabric, schedules, state)
    b = CronRunner(local_fabric, schedules, CronState(tmp_path / "state"))
    # Started exactly at 08:00:00, a planned time of two schedules (nightly's 01:30 was
    # before the first start: not owed).
    assert sorted(f.schedule for f in a.tick()) == ["every-20m", "hourly"]
    assert b.tick() == []
    clock.now = datetime(2027, 1, 15, 8, 20, 5, tzinfo=UTC).timestamp()
    fired = a.tick()
    assert [f.schedule for f in fired] == ["every-20m"] and fired[0].created
    assert b.tick() == []  # the shared state says it is done
    # A runner with a state file of its own (another host, or its file lost): the board's
    # record says 08:20 was made, so it fires nothing (and the receipt would make one task).
    c = CronRunner(local_fabric, schedules, CronState(tmp_path / "other"))
    assert c.tick() == []
    assert fire(local_fabric, schedules[2], fired[0].planned).task_id == fired[0].task_id
    clock.now = datetime(2027, 1, 15, 9, 0, 1, tzinfo=UTC).timestamp()
    assert sorted(f.schedule for f in a.tick()) == ["every-20m", "hourly"]
    assert a.next_wake(clock.now) == datetime(2027, 1, 15, 9, 1, 1, tzinfo=UTC).timestamp()


def test_missed_times_are_never_fired_but_published_for_the_keeper(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    schedules = load_schedules(write(tmp_path, HOURLY))
    state = CronState(tmp_path / "state")
    runner = CronRunner(local_fabric, schedules, state)
    clock.advance(60)
    assert runner.tick() == []  # first start at 08:01 on the 15th: nothing owed
    # Down for two days: from 08:01 on the 15th until 12:10 on the 17th.
    clock.now = datetime(2027, 1, 17, 12, 10, tzinfo=UTC).timestamp()
    assert runner.tick() == [], "the fabric never re-fires a missed run by itself"
    # 09:00 on the 15th to 12:00 on the 17th; every 20 minutes from 08:20; 01:30 twice.
    data = state.read()
    assert data["hourly"]["missed"] == 52 and data["every-20m"]["missed"] == 156
    assert data["nightly"]["missed"] == 2
    assert data["hourly"]["last_planned_iso"] == "2027-01-17T12:00:00+00:00"
    nightly = board_record(local_fabric, "nightly")
    assert nightly["must_not_miss"] is True and nightly["missed"] == 2
    assert nightly["missed_runs"] == [[at(16, 1, 30), at(17, 1, 30), 2, False]]
    assert nightly["next_planned"] == at(18, 1, 30)
    assert no_task_for(local_fabric, schedules[1], [at(16, 1, 30), at(17, 1, 30)])
    assert runner.tick() == []
    assert runner.publish(clock.now) is False, "unchanged state is not written again"


def at(day: int, hour: int, minute: int) -> float:
    """A planned time in January 2027 (UTC), as the board records it."""
    return datetime(2027, 1, day, hour, minute, tzinfo=UTC).timestamp()


def board_record(fab: Fabric, name: str) -> dict[str, Any]:
    """A schedule's record as the board holds it (what a restarted process and the keeper read)."""
    return fab.board.schedule_states()[name]


def no_task_for(fab: Fabric, schedule: Schedule, times: list[float]) -> bool:
    keys = [(schedule.actor, schedule.key(datetime.fromtimestamp(t, UTC))) for t in times]
    return fab.board.tasks_by_keys(keys) == [None] * len(times)


MINUTELY = """
timezone: UTC
schedules:
  - name: minutely
    cron: "* * * * *"
    target: gemma-local
    intent: "Poll the mailbox for {planned:%H:%M}"
    must_not_miss: true
"""


def restart(fab: Fabric, path: Path, state_dir: Path, clock: FakeClock) -> CronRunner:
    """A new cron process: new memory, and (unless ``state_dir`` is reused) a new state file."""
    return CronRunner(fab, load_schedules(path), CronState(state_dir), clock=clock)


def test_a_restart_after_a_gap_counts_every_missed_run_from_the_board(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    """The issue's case: a 1-minute schedule stopped for 2.5 and for 5.7 minutes."""
    path = write(tmp_path, MINUTELY)
    clock.now = at(15, 8, 0)
    first = restart(local_fabric, path, tmp_path / "a", clock)
    fired = []
    for minute in range(3):  # 08:00 (its first start), 08:01, 08:02 fire on time
        clock.now = at(15, 8, minute)
        fired += first.tick()
    # Stopped at 08:02:30; back 2.5 minutes later with no state file at all.
    clock.now = at(15, 8, 5)
    second = restart(local_fabric, path, tmp_path / "b", clock)
    fired += second.tick()  # 08:05 is due; 08:03 and 08:04 were missed
    rec = board_record(local_fabric, "minutely")
    assert rec["missed"] == 2 and rec["missed_runs"] == [[at(15, 8, 3), at(15, 8, 4), 2, False]]
    clock.now = at(15, 8, 6) + 1
    fired += second.tick()
    # Stopped at 08:06:10, back at 08:11:52 (5.7 minutes).
    clock.now = at(15, 8, 11) + 52
    third = restart(local_fabric, path, tmp_path / "c", clock)
    fired += third.tick()  # 08:11 is 52 s late: within the grace, fired
    rec = board_record(local_fabric, "minutely")
    assert rec["missed"] == 6 and rec["missed_capped"] is False
    assert rec["missed_runs"][-1] == [at(15, 8, 7), at(15, 8, 10), 4, False]
    assert rec["last_missed"] == at(15, 8, 10)
    assert [f.planned.minute for f in fired] == [0, 1, 2, 5, 6, 11] and all(f.created for f in fired)
    missed = [at(15, 8, m) for m in (3, 4, 7, 8, 9, 10)]
    assert no_task_for(local_fabric, load_schedules(path)[0], missed), "a missed run is never fired"
    # Another start at the same time counts nothing twice.
    assert restart(local_fabric, path, tmp_path / "d", clock).tick() == []
    assert board_record(local_fabric, "minutely")["missed"] == 6


def test_a_task_made_just_before_a_crash_is_not_missed(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    """A process that submitted 08:01 and died before it wrote its record: the board has the
    task, so the next start finds it instead of calling it missed."""
    path = write(tmp_path, MINUTELY)
    clock.now = at(15, 8, 0)
    runner = restart(local_fabric, path, tmp_path / "a", clock)
    assert [f.planned.minute for f in runner.tick()] == [0]
    fire(local_fabric, runner.schedules[0], datetime.fromtimestamp(at(15, 8, 1), UTC))  # then it died
    clock.now = at(15, 8, 3) + 5
    assert [f.planned.minute for f in restart(local_fabric, path, tmp_path / "b", clock).tick()] == [3]
    rec = board_record(local_fabric, "minutely")
    assert rec["missed"] == 1 and rec["missed_runs"] == [[at(15, 8, 2), at(15, 8, 2), 1, False]]
    assert rec["last_planned"] == at(15, 8, 3)


def test_a_month_away_is_counted_up_to_the_cap_and_says_so(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, MINUTELY)
    clock.now = at(15, 8, 0)
    restart(local_fabric, path, tmp_path / "a", clock).tick()
    clock.now = datetime(2027, 2, 14, 8, 0, 30, tzinfo=UTC).timestamp()  # 30 days: 43,199 missed
    runner = CronRunner(
        local_fabric, load_schedules(path), CronState(tmp_path / "b"), clock=clock, scan_cap=200
    )
    with caplog.at_level("WARNING", logger="agap.cron"):
        assert [f.planned for f in runner.tick()] == [datetime(2027, 2, 14, 8, 0, tzinfo=UTC)]
    rec = board_record(local_fabric, "minutely")
    assert rec["missed"] == 201 and rec["missed_capped"] is True, "a lower bound, marked as one"
    assert rec["missed_runs"] == [
        [at(15, 8, 1), datetime(2027, 2, 14, 7, 59, tzinfo=UTC).timestamp(), 201, True]
    ]
    assert "at least 201 planned run(s) missed" in caplog.text and "counting stops at" in caplog.text
    # Planned times are enumerated only up to the cap, whatever the length of the gap.
    s = load_schedules(path)[0]
    times, more = s.planned_between(START, START.replace(year=2028), 200)
    assert len(times) == 200 and more == times[-1] + timedelta(minutes=1)


def test_planned_between_and_missed_runs_group_consecutive_times(tmp_path: Path) -> None:
    s = load_schedules(write(tmp_path, MINUTELY))[0]
    times, more = s.planned_between(START, START + timedelta(minutes=5), 10)
    assert [t.minute for t in times] == [1, 2, 3, 4, 5] and more is None
    assert s.planned_between(START, START, 10) == ([], None)
    runs = _missed_runs(times, [None, 7, None, None, 8], None, times[-1])
    assert [(r.first.minute, r.last.minute, r.count, r.capped) for r in runs] == [
        (1, 1, 1, False),
        (3, 4, 2, False),
    ]
    capped = _missed_runs(times[:2], [None, None], times[2], times[-1])
    assert [(r.first.minute, r.last.minute, r.count, r.capped) for r in capped] == [(1, 5, 3, True)]


def test_a_board_that_goes_away_is_said_once_and_the_daemon_goes_on(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, MINUTELY)
    runner = restart(local_fabric, path, tmp_path / "a", clock)
    real = local_fabric.board.schedule_states
    calls = {"n": 0}

    def flaky() -> dict[str, dict[str, Any]]:
        calls["n"] += 1
        if 2 <= calls["n"] <= 4:
            raise BoardUnavailable("connection refused", where="http://127.0.0.1:9/jsonrpc.php")
        return real()

    local_fabric.board.schedule_states = flaky  # type: ignore[method-assign]
    stop = threading.Event()

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if calls["n"] >= 6:
            stop.set()

    with caplog.at_level("INFO", logger="agap.cron"):
        runner.run(stop, sleep)
    assert caplog.text.count("the board is unreachable") == 1
    assert caplog.text.count("the board answers again") == 1
    assert "Traceback" not in caplog.text


def test_a_failed_firing_is_recorded_and_retried(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "schedules: [{name: s, cron: '*/5 * * * *', target: torgash, "
        "intent: x, refs: ['file:///srv/agap/private/alvis/a.md'],"
        " must_not_miss: true}]",
    )
    [s] = load_schedules(path)
    state = CronState(tmp_path / "state")
    f = fire_once(local_fabric, s, state)
    assert f.error is not None and "PRIVACY" in f.error and f.task_id is None
    e = state.read()["s"]
    assert e["errors"] == 1 and "privacy.sandboxed" in e["last_error"] and "last_planned" not in e


def test_the_keeper_reports_the_missed_count_after_a_restart(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    from fabric.settings.keeper import KeeperConfig  # the keeper is a layer above fabric.apps' tests
    from keeper.daemon import Keeper  # likewise

    schedules = load_schedules(write(tmp_path, HOURLY))
    runner = CronRunner(local_fabric, schedules, CronState(tmp_path / "state"))
    clock.advance(60)
    runner.tick()  # 08:01 on the 15th: publishes every schedule's next planned time
    keeper = Keeper.for_fabric(local_fabric, KeeperConfig())

    def missed() -> dict[str, int]:
        assert keeper.run_job("leases")
        return {x["schedule"]: x["missed"] for x in keeper.metrics.to_json()["schedules"]}

    assert missed() == {"hourly": 0, "nightly": 0, "every-20m": 0}
    # The cron process dies; nightly (01:30 UTC, must_not_miss) passes unfired, twice.
    clock.now = at(16, 1, 35)
    assert missed() == {"hourly": 0, "nightly": 1, "every-20m": 0}, "overdue now; hourly may be missed"
    assert 'keeper_cron_missed{schedule="nightly"} 1' in keeper.metrics.to_prometheus()
    clock.now = at(17, 1, 35)
    # A new process (no memory, no state file) comes back: it records both runs, fires neither.
    fresh = CronRunner(local_fabric, schedules, CronState(tmp_path / "fresh"))
    assert [f.schedule for f in fresh.tick()] == []
    assert missed()["nightly"] == 2
    data = keeper.metrics.to_json()
    nightly = next(x for x in data["schedules"] if x["schedule"] == "nightly")
    assert nightly["missed_runs"] == [
        {
            "first": "2027-01-16T01:30:00+00:00",
            "last": "2027-01-17T01:30:00+00:00",
            "count": 2,
            "capped": False,
        }
    ]
    assert nightly["last_missed"] == at(17, 1, 30) and data["missed_schedules"] == 1
    prom = keeper.metrics.to_prometheus()
    assert 'keeper_cron_missed{schedule="nightly"} 2' in prom
    assert f'keeper_cron_last_missed_timestamp{{schedule="nightly"}} {at(17, 1, 30):.0f}' in prom
    # The next nightly fires on time: the count stays (a person closes the problem in Zabbix).
    clock.now = at(18, 1, 30) + 5
    assert [f.schedule for f in fresh.tick()] == ["nightly"]
    assert missed()["nightly"] == 2
