"""The cron submitter: schedule files, planned times, keys, missed firings, the state file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fabric.apps.cron import CronRunner, CronState, fire, fire_once, load_schedules
from fabric.core import Fabric
from fabric.errors import ConfigError
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
    assert names == ["morning-digest", "reflect", "research-queue"]


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
    # Two runners with separate state files: the receipt still makes one task.
    c = CronRunner(local_fabric, schedules, CronState(tmp_path / "other"))
    c.state.since("every-20m", 0)
    again = c.tick()
    assert [f.task_id for f in again if f.schedule == "every-20m"] == [fired[0].task_id]
    assert not again[0].created
    clock.now = datetime(2027, 1, 15, 9, 0, 1, tzinfo=UTC).timestamp()
    assert sorted(f.schedule for f in a.tick()) == ["every-20m", "hourly"]
    assert a.next_wake(clock.now) == datetime(2027, 1, 15, 9, 1, 1, tzinfo=UTC).timestamp()


def test_missed_times_are_never_fired_but_published_for_the_keeper(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    import json

    schedules = load_schedules(write(tmp_path, HOURLY))
    state = CronState(tmp_path / "state")
    runner = CronRunner(local_fabric, schedules, state)
    clock.advance(60)
    assert runner.tick() == []  # first start at 08:01 on the 15th: nothing owed
    # Down for two days: from 08:00 on the 15th until 12:10 on the 17th.
    clock.now = datetime(2027, 1, 17, 12, 10, tzinfo=UTC).timestamp()
    assert runner.tick() == [], "the fabric never re-fires a missed run by itself"
    data = state.read()
    assert data["hourly"]["missed"] == 1 and data["every-20m"]["missed"] == 1
    assert data["nightly"]["missed"] == 1
    assert data["hourly"]["last_planned_iso"] == "2027-01-17T12:00:00+00:00"
    meta = local_fabric.port.call("getProjectMetadata", {"project_id": local_fabric.board.layout.project_id})
    nightly = json.loads(meta["fabric.cron.nightly"])
    assert nightly["must_not_miss"] is True and nightly["missed"] == 1
    assert nightly["next_planned"] == datetime(2027, 1, 18, 1, 30, tzinfo=UTC).timestamp()
    assert runner.tick() == []
    assert runner.publish(clock.now) is False, "unchanged state is not written again"


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


def test_the_keeper_raises_a_missed_must_not_miss_schedule(
    local_fabric: Fabric, clock: FakeClock, tmp_path: Path
) -> None:
    from fabric.settings.keeper import KeeperConfig
    from keeper.daemon import Keeper

    schedules = load_schedules(write(tmp_path, HOURLY))
    runner = CronRunner(local_fabric, schedules, CronState(tmp_path / "state"))
    clock.advance(60)
    runner.tick()  # 08:01 on the 15th: publishes every schedule's next planned time
    keeper = Keeper.for_fabric(local_fabric, KeeperConfig())

    def missed() -> dict[str, int]:
        assert keeper.run_job("leases")
        return {x["schedule"]: x["missed"] for x in keeper.metrics.to_json()["schedules"]}

    assert missed() == {"hourly": 0, "nightly": 0, "every-20m": 0}
    # The cron process dies; nightly (01:30 UTC, must_not_miss) passes unfired.
    clock.now = datetime(2027, 1, 16, 1, 35, tzinfo=UTC).timestamp()
    assert missed() == {"hourly": 0, "nightly": 1, "every-20m": 0}, "hourly may be missed"
    prom = keeper.metrics.to_prometheus()
    assert 'keeper_cron_missed{schedule="nightly"} 1' in prom
    # It comes back: it records the miss (never re-fires it), the problem stays raised.
    assert runner.tick() == []
    assert missed()["nightly"] == 1
    # The next nightly fires on time: the problem clears.
    clock.now = datetime(2027, 1, 17, 1, 30, 5, tzinfo=UTC).timestamp()
    assert [f.schedule for f in runner.tick()] == ["nightly"]
    assert missed()["nightly"] == 0
