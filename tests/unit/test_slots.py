"""Planned slots: a scheduler's firing is keyed by its planned time, on time or missed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fabric.apps.mcp.agent import AgentTools, tool_error
from fabric.core import Fabric
from fabric.errors import InvalidInput
from fabric.results import store_for
from fabric.slots import GRACE_SECONDS, MissedSlot, plan_slot
from tests.conftest import FakeClock

# 07:00 in Berlin on 15 January 2027 is 06:00 UTC.
SEVEN = datetime(2027, 1, 15, 6, 0, tzinfo=UTC).timestamp()
SLOT: dict[str, Any] = {"slot": "0 7 * * *", "timezone": "Europe/Berlin", "key": "openclaw/morning-digest"}


def test_the_planned_time_is_the_slots_in_its_own_zone() -> None:
    firing = plan_slot("0 7 * * *", "Europe/Berlin", "openclaw/digest", SEVEN + 12)
    assert firing.planned == datetime(2027, 1, 15, 6, 0, tzinfo=UTC)
    assert firing.key == "openclaw/digest/2027-01-15T06:00:00Z"
    assert firing.late_by == 12 and firing.on_time
    # The same wall-clock slot in another zone is another planned time (never the host's).
    assert plan_slot("0 7 * * *", "UTC", "k", SEVEN + 3600 + 5).key == "k/2027-01-15T07:00:00Z"
    late = plan_slot("0 7 * * *", "Europe/Berlin", "k", SEVEN + GRACE_SECONDS + 1)
    assert not late.on_time
    assert (
        "slot 2027-01-15 07:00 CET ('0 7 * * *' in Europe/Berlin) fired 61 s late" in late.missed("x").line()
    )


@pytest.mark.parametrize(
    "cron, zone, key, where, what",
    [
        ("0 7 * * *", None, "k", "--timezone", "a slot needs its time zone, said explicitly"),
        ("0 7 * * *", "Mars/Olympus", "k", "--timezone", "'Mars/Olympus' is not an IANA time zone"),
        ("0 7 * * *", "UTC", None, "--key", "a slot needs a key that names the job"),
        ("daily", "UTC", "k", "--slot", "'daily' is not a cron expression"),
        (None, "UTC", "k", "--slot", "a time zone was given without a slot"),
    ],
)
def test_a_bad_slot_is_one_line(
    cron: str | None, zone: str | None, key: str | None, where: str, what: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        plan_slot(cron, zone, key, SEVEN)
    assert err.value.where == where and what in err.value.what and "\n" not in err.value.line()


def test_one_slot_fired_twice_is_one_task(local_fabric: Fabric, clock: FakeClock) -> None:
    clock.now = SEVEN + 3
    first = local_fabric.submit("Morning digest", target="adolf", deadline="+2h", **SLOT)
    clock.now = SEVEN + 40  # a second gateway, or a retry: inside the grace
    again = local_fabric.submit("Morning digest", target="adolf", deadline="+2h", **SLOT)
    assert first.created and not again.created and again.task_id == first.task_id
    spec = local_fabric.show(first.task_id).spec
    assert spec is not None and spec.action_id == "openclaw/morning-digest/2027-01-15T06:00:00Z"
    assert spec.deadline == SEVEN + 7200  # counted from the planned time, not the firing
    # Worded otherwise by a model: still the slot's one task.
    clock.now = SEVEN + 50
    reworded = local_fabric.submit("Digest for this morning", target="adolf", **SLOT)
    assert reworded.task_id == first.task_id and not reworded.created
    # The next day's slot is a task of its own.
    clock.now = SEVEN + 86400 + 1
    assert (
        local_fabric.submit("Morning digest", target="adolf", deadline="+2h", **SLOT).task_id != first.task_id
    )


def test_a_late_firing_of_a_slot_without_its_task_is_refused_and_writes_nothing(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    before = len(local_fabric.listing(include_closed=True))
    clock.now = SEVEN + 5 * 3600  # a catch-up after the gateway was down all morning
    with pytest.raises(MissedSlot) as err:
        local_fabric.submit("Morning digest", target="adolf", **SLOT)
    assert err.value.exit_code == 1 and err.value.where == "--slot"
    assert "fired 18000 s late, past the 60 s grace: missed, not run late" in err.value.line()
    assert len(local_fabric.listing(include_closed=True)) == before


def test_a_late_firing_of_a_slot_that_has_its_task_is_that_task(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    clock.now = SEVEN + 1
    first = local_fabric.submit("Morning digest", target="adolf", **SLOT)
    clock.now = SEVEN + 600  # OpenClaw's catch-up of a run that did happen
    late = local_fabric.submit("Morning digest", target="adolf", **SLOT)
    assert late.task_id == first.task_id and not late.created


def test_a_missed_slot_reads_as_missed_to_a_model(local_fabric: Fabric, clock: FakeClock) -> None:
    tools = AgentTools(local_fabric, "adolf", owner="t", results=store_for("attachment", local_fabric.board))
    clock.now = SEVEN + 3600
    with pytest.raises(MissedSlot) as err:
        tools.submit("Morning digest", target="adolf", **SLOT)
    line = tool_error(err.value)
    assert line.startswith("MISSED_SLOT (exit 1: ") and "slot: slot 2027-01-15 07:00 CET" in line
