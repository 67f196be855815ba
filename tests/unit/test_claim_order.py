"""Claim order: priority, then the soonest deadline, then the oldest task, for a worker alone.

Jitter (spreading contending workers over the best candidates) starts only once a reader
has lost a race, so it never reorders a single worker's choice.
"""

from __future__ import annotations

import random

import pytest

from fabric.core import Fabric
from tests.conftest import FakeClock
from workers.queue import QueueReader


@pytest.mark.parametrize("seed", range(6))
def test_a_single_worker_claims_in_the_documented_order(
    local_fabric: Fabric, clock: FakeClock, seed: int
) -> None:
    fab = local_fabric
    oldest = fab.submit("oldest, no deadline", target="kimi").task_id
    clock.advance(1)
    late = fab.submit("deadline in two hours", target="kimi", deadline="+2h").task_id
    clock.advance(1)
    soon = fab.submit("deadline in one hour", target="kimi", deadline="+1h").task_id
    clock.advance(1)
    newer = fab.submit("newer, no deadline", target="kimi").task_id
    clock.advance(1)
    urgent = fab.submit("urgent, newest", target="kimi", priority="urgent").task_id
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock, rng=random.Random(seed))
    order = []
    while (lease := reader.claim_next("alone", lease_seconds=60)) is not None:
        order.append(lease.task_id)
    assert order == [urgent, soon, late, oldest, newer]


def test_a_reader_that_lost_a_race_spreads_within_a_priority(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    ids = []
    for i in range(8):
        ids.append(fab.submit(f"task {i}", target="kimi").task_id)
        clock.advance(1)
    other = QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock)
    mine = QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock, rng=random.Random(3))
    stale = fab.board.read(ids[0])  # both read the first task; the other worker claims it first
    assert (taken := other.claim_next("other", lease_seconds=60)) is not None and taken.task_id == ids[0]
    assert mine._try(stale, "mine", 60) is None  # mine loses the race for it
    got = [lease.task_id for lease in iter(lambda: mine.claim_next("mine", lease_seconds=60), None)]
    assert sorted(got) == ids[1:] and got != ids[1:], "contended: spread, not in order"
