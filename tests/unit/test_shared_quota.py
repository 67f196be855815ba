"""One quota across hosts: slots on the board, taken with the tag test-and-set.

Every test runs the real storage code against the in-process embedded board (its
``createTag`` is the unique-index INSERT Kanboard's is), with the clock injected.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fabric.availability import Availability, reason_key
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.quotas import (
    COLOR_ROOM,
    QuotaHolder,
    QuotaStore,
    SlotRef,
    SlotTag,
    model_key,
    parse_slot_tags,
)
from fabric.kanboard.rows import BoardTag
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.sharedquota import COLLECT_AFTER, HOLDER, Cap, SlotTable, collectable, in_use
from keeper.daemon import Keeper
from keeper.quotas import sweep_quotas
from tests.conftest import ROOT, FakeClock, make_fabric
from workers.endpoint import SharedShape
from workers.quota import QuotaWindow
from workers.shared_quota import BoardQuota

HOUR = 3600.0


@pytest.fixture
def port(clock: FakeClock) -> LocalPort:
    return LocalPort(clock=clock)


def store_on(port: LocalPort, project: str = "Agent Fabric Quotas") -> QuotaStore:
    store = QuotaStore(port, project)
    store.ensure_project()
    return store


def host(
    port: LocalPort,
    clock: FakeClock,
    limit: int = 3,
    *,
    seed: int = 0,
    reserve: float = 0.0,
    refresh: float = 30.0,
    second: Cap | None = None,
) -> BoardQuota:
    caps = [Cap(limit, HOUR)] + ([second] if second else [])
    store = QuotaStore(port, "Agent Fabric Quotas")
    return BoardQuota(
        "pool",
        caps,
        lambda: store,
        reserve_interactive=reserve,
        refresh=refresh,
        monotonic=clock,
        rng=random.Random(seed),
    )


def test_two_hosts_take_exactly_the_limit_between_them(port: LocalPort, clock: FakeClock) -> None:
    store_on(port)
    a, b = host(port, clock, seed=1), host(port, clock, seed=2)
    a.check(clock())  # both read the empty ledger first: their views go stale at once
    b.check(clock())
    admitted = []
    for i in range(8):
        clock.advance(1)
        who = (a, b)[i % 2]
        admitted.append(who.admit(clock()).available)
    assert sum(admitted) == 3
    refusal = a.admit(clock())
    assert not refusal.available and refusal.reason.startswith("quota spent across hosts: 3 of 3 per 1h")
    tags = store_on(port).read()["pool"]
    assert len(tags) == 3 and {t.ref.slot for t in tags} == {0, 1, 2}


def test_a_stale_view_loses_the_race_reads_again_and_takes_another_slot(
    port: LocalPort, clock: FakeClock
) -> None:
    store_on(port)
    a, b = host(port, clock, limit=2, seed=3), host(port, clock, limit=2, seed=3)
    a.check(clock())
    b.check(clock())
    assert b.admit(clock()).available  # same seed: a will pick the slot b just took
    reads = a.reads
    assert a.admit(clock()).available
    assert a.reads == reads + 1  # one lost createTag, one read, one won createTag
    assert not b.admit(clock()).available
    assert {t.ref.slot for t in store_on(port).read()["pool"]} == {0, 1}


def test_slots_free_as_their_calls_leave_the_rolling_window(port: LocalPort, clock: FakeClock) -> None:
    store_on(port)
    a, b = host(port, clock, limit=2), host(port, clock, limit=2)
    assert a.admit(clock()).available
    clock.advance(600)
    assert b.admit(clock()).available
    refusal = a.admit(clock())
    assert not refusal.available
    # The first call leaves the window an hour after it was made: a(t) says so.
    assert refusal.until is not None and refusal.until <= clock() + 30
    clock.advance(HOUR - 600)
    assert a.admit(clock()).available  # the first slot, next generation
    assert not b.admit(clock()).available
    gens = sorted(t.ref.gen for t in store_on(port).read()["pool"])
    assert gens == [0, 0, 1]


def test_a_refund_gives_the_slot_back_to_every_host(port: LocalPort, clock: FakeClock) -> None:
    store_on(port)
    a, b = host(port, clock, limit=1, refresh=5), host(port, clock, limit=1, refresh=5)
    at = clock()
    assert a.admit(at).available
    assert not b.admit(clock()).available
    a.refund(at)  # the provider never took the call (a 429, an unreachable model)
    clock.advance(5)  # b's view of a spent quota is re-read once it is `refresh` old
    assert b.check(clock()).available
    assert b.admit(clock()).available


def test_a_host_that_sees_the_quota_spent_reads_the_board_once_per_refresh(
    port: LocalPort, clock: FakeClock
) -> None:
    store_on(port)
    a = host(port, clock, limit=1, refresh=30)
    assert a.admit(clock()).available
    trips = port.stats.trips
    for _ in range(10):
        clock.advance(1)
        assert not a.check(clock()).available
    assert port.stats.trips == trips  # answered from memory
    clock.advance(20)
    assert not a.check(clock()).available
    assert port.stats.trips == trips + 1


def test_the_local_ledger_is_the_fast_path_a_spent_host_never_asks_the_board(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    store_on(port)
    board = host(port, clock, limit=2)
    local = SharedShape(QuotaWindow(2, HOUR), tmp_path / "pool.quota0.json")
    av = Availability([local, board], queue="pool")
    assert av.admit(clock()).available and av.admit(clock()).available
    trips = port.stats.trips
    clock.advance(HOUR / 2)  # the board view is old now, but the host spent the quota by itself
    for _ in range(5):
        verdict = av.admit(clock())
        assert not verdict.available and verdict.reason.startswith("quota spent: 2 of 2")
        assert not av.check(clock()).available
    assert port.stats.trips == trips


def test_a_refusal_on_the_board_gives_the_local_count_back(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    store_on(port)
    other = host(port, clock, limit=2)
    assert other.admit(clock()).available and other.admit(clock()).available
    local = SharedShape(QuotaWindow(2, HOUR), tmp_path / "pool.quota0.json")
    av = Availability([local, host(port, clock, limit=2)], queue="pool")
    assert not av.admit(clock()).available
    assert local.inner.calls == type(local.inner.calls)()  # all or none


def test_interactive_work_keeps_the_reserved_tail(port: LocalPort, clock: FakeClock) -> None:
    store_on(port)
    a = host(port, clock, limit=5, reserve=0.4)
    assert [a.admit(clock()).available for _ in range(4)] == [True, True, True, False]
    refusal = a.check(clock())
    assert refusal.reason == "reserved for interactive work: 2 of 5 left per 1h across hosts"
    # The head the worker's loop reads to let interactive work through, as a local reserve's.
    assert reason_key(refusal.reason) == "reserved for interactive work"
    assert a.admit(clock(), interactive=True).available
    assert a.admit(clock(), interactive=True).available
    assert not a.admit(clock(), interactive=True).available


def test_a_call_takes_one_slot_of_each_cap_in_one_round_trip(port: LocalPort, clock: FakeClock) -> None:
    store_on(port)
    a = host(port, clock, limit=5, second=Cap(2, 7 * 86400))
    a.check(clock())
    trips = port.stats.trips
    assert a.admit(clock()).available
    assert port.stats.trips == trips + 1  # one batch: a createTag per cap
    assert a.admit(clock()).available
    refusal = a.admit(clock())
    assert not refusal.available and "2 of 2 per 7d" in refusal.reason
    caps = sorted(t.ref.cap for t in store_on(port).read()["pool"])
    assert caps == [0, 0, 1, 1]


def test_the_board_away_parks_the_model_with_a_reason_never_an_exception(clock: FakeClock) -> None:
    port = LocalPort(clock=clock)
    a = host(port, clock)  # no quota project: `agap init` was not run
    verdict = a.admit(clock())
    assert not verdict.available
    assert verdict.reason.startswith(
        "shared quota unreadable: AGAP_QUOTA_PROJECT: the quota project 'Agent Fabric Quotas' does not exist"
    )
    assert verdict.until is not None


def test_reservation_colours_fit_the_column_and_read_back() -> None:
    holder = QuotaHolder(2**31 - 1, "f" * 16, 999_999)
    store_colour = __import__("fabric.kanboard.quotas", fromlist=["_holder_color"])._holder_color
    colour = store_colour(holder, 4_102_444_800.123)
    assert len(colour) <= COLOR_ROOM
    tags = parse_slot_tags(
        [
            BoardTag(1, "q/pool/c0/s3/g7", colour),
            BoardTag(2, "q/pool/c0/s4/g0", "garbled"),
            BoardTag(3, "q/pool/c0/s3/g7/x", "r.1"),
            BoardTag(4, "somebody's tag", ""),
        ]
    )["pool"]
    by_slot = {t.ref.slot: t for t in tags}
    assert by_slot[3].holder == holder and by_slot[3].returned and by_slot[3].at == 4_102_444_800.123
    assert by_slot[4].at == float("inf")  # unreadable: busy, the safe reading
    table = SlotTable.of([Cap(5, HOUR)], tags)
    assert SlotRef(0, 3, 8) in table.free(0, 0.0) and all(r.slot != 4 for r in table.free(0, 0.0))


def test_model_keys_are_lowercase_and_short() -> None:
    assert model_key("kimi") == "kimi"
    assert model_key("Kimi") != "kimi" and model_key("Kimi").islower()
    assert len(model_key("x" * 200)) <= 40


def test_superseded_generations_are_collected_only_long_after() -> None:
    now = 10 * COLLECT_AFTER
    tags = parse_slot_tags(
        [
            BoardTag(1, "q/pool/c0/s0/g0", f"aaaaaaaaaaaa.{int((now - 3 * COLLECT_AFTER) * 1000)}"),
            BoardTag(2, "q/pool/c0/s0/g0/x", "r.1"),
            BoardTag(3, "q/pool/c0/s0/g1", f"aaaaaaaaaaaa.{int((now - 2 * COLLECT_AFTER) * 1000)}"),
            BoardTag(4, "q/pool/c0/s0/g2", f"aaaaaaaaaaaa.{int((now - 10) * 1000)}"),
            BoardTag(5, "q/pool/c0/s1/g0", f"aaaaaaaaaaaa.{int((now - 3 * COLLECT_AFTER) * 1000)}"),
        ]
    )["pool"]
    # g0 (and its marker) goes: g1 is old. g1 stays: g2 is recent. Heads are never removed.
    assert sorted(collectable(tags, now)) == [1, 2]


# -- the keeper gives back what dead leases hold ------------------------------------------

HUMAN = (ROOT / "tests" / "integration" / "cards_worker" / "alvis.yaml").read_text()
POOL = """
id: pool
kind: model
name: A quota-limited model on two hosts
tier: medium
trust: trusted
capabilities: [chat]
availability:
  - shape: quota
    limit: 1
    window: 1h
    across_hosts: true
runtime:
  mode: gateway
  model: openai/pool
  lease_seconds: 30
"""


def shared_cards(tmp: Path) -> CardSet:
    d = tmp / "cards"
    d.mkdir()
    (d / "alvis.yaml").write_text(HUMAN)
    (d / "pool.yaml").write_text(POOL)
    return load_cards(d, base_dir=tmp)


def _fabric(port: LocalPort, clock: FakeClock, tmp: Path) -> Fabric:
    settings = Settings(cards_dir=tmp / "cards", board_url="local://", board_token="x")
    return make_fabric(port, shared_cards(tmp), clock, settings=settings)


def test_init_makes_the_quota_project_when_a_card_shares_a_quota(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    _fabric(port, clock, tmp_path)
    assert QuotaStore(port, "Agent Fabric Quotas").read() == {}


def _admit_under(fab: Fabric, shape: BoardQuota, worker: str) -> tuple[int, float]:
    tid = fab.submit("work", target="pool").task_id
    lease = fab.ledger.claim(fab.board.read(tid), worker, lease_seconds=30)
    token = HOLDER.set(QuotaHolder(lease.task_id, lease.uid, lease.epoch))
    try:
        at = fab.clock()
        assert shape.admit(at).available
    finally:
        HOLDER.reset(token)
    return tid, at


def test_the_keeper_gives_back_the_slot_of_a_lease_that_died(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    fab = _fabric(port, clock, tmp_path)
    dead, other = host(port, clock, limit=1, refresh=1), host(port, clock, limit=1, refresh=1)
    _admit_under(fab, dead, "host-a")  # ... and host a is SIGKILLed here
    assert not other.admit(clock()).available
    report = sweep_quotas(fab, [])
    assert report.returned == []  # the lease is still live: nothing is given back
    clock.advance(31)
    report = sweep_quotas(fab, [])
    assert report.returned == ["q/pool/c0/s0/g0"]
    clock.advance(1)
    assert other.admit(clock()).available
    assert sweep_quotas(fab, []).returned == []  # given back once; the new slot's lease lives


def test_the_keeper_keeps_the_slot_of_a_call_that_ran(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    fab = _fabric(port, clock, tmp_path)
    a = host(port, clock, limit=1)
    tid, _ = _admit_under(fab, a, "host-a")
    view = fab.board.read(tid)
    lease = fab.ledger.held(view, view.epoch, "host-a")
    effect = fab.ledger.effect(lease, "model-call")
    fab.ledger.effect_done(lease, effect, "file:result")  # the call ran, then host a died
    clock.advance(31)
    assert sweep_quotas(fab, []).returned == []
    settled: set[int] = set()
    store = QuotaStore(port, "Agent Fabric Quotas")
    fab.ledger.complete(fab.ledger.held(fab.board.read(tid), view.epoch, "host-a"), "file:result")
    report = sweep_quotas(fab, [], store=store, settled=settled)
    assert report.returned == [] and len(settled) == 1  # finished normally: decided for good
    trips = port.stats.trips
    sweep_quotas(fab, [], store=store, settled=settled)
    assert port.stats.trips == trips + 1  # one read of the slots, no task read


def test_no_board_trip_for_models_not_shared(local_fabric: Fabric) -> None:
    trips = local_fabric.port.stats.trips
    report = sweep_quotas(local_fabric, [])
    assert report.trips == 0 and local_fabric.port.stats.trips == trips


def test_the_keeper_counts_slots_in_use_and_those_it_gave_back(
    port: LocalPort, clock: FakeClock, tmp_path: Path
) -> None:
    fab = _fabric(port, clock, tmp_path)
    keeper = Keeper.for_fabric(fab, KeeperConfig(lease_grace=0.0))
    keeper.job_leases()
    assert (keeper.metrics.quota_slots_in_use, keeper.metrics.quota_slots_returned_total) == (0, 0)
    _admit_under(fab, host(port, clock, limit=1), "host-a")  # ... and host a dies
    keeper.job_leases()
    assert (keeper.metrics.quota_slots_in_use, keeper.metrics.quota_slots_returned_total) == (1, 0)
    clock.advance(31)
    keeper.job_leases()
    assert (keeper.metrics.quota_slots_in_use, keeper.metrics.quota_slots_returned_total) == (0, 1)
    text = keeper.metrics.to_prometheus()
    assert "keeper_quota_slots_in_use 0" in text and "keeper_quota_slots_returned_total 1" in text
    clock.advance(1)
    keeper.job_leases()  # given back once
    assert keeper.metrics.quota_slots_returned_total == 1


def test_slots_in_use_judge_each_cap_by_its_own_window() -> None:
    caps = [Cap(2, HOUR), Cap(10, 24 * HOUR)]
    tags = [
        SlotTag("m", SlotRef(0, 0, 0), 0.0, None, "a.0", 1),
        SlotTag("m", SlotRef(1, 0, 0), 0.0, None, "a.0", 2),
        SlotTag("m", SlotRef(0, 1, 0), 5000.0, None, "b.5000000", 3, returned=True),
    ]
    # Two hours on: the first cap's slot is free again, the day-long cap's still holds.
    assert in_use({"m": tags}, {"m": caps}, 2 * HOUR) == 1
    assert in_use({"m": tags}, {"m": caps}, 60.0) == 2
