"""Every field of a task's spec survives whatever the fabric does to the task later.

A reroute (a person drags the card to another agent's lane; the keeper moves a routed
task off a parked queue) submits the same work again through ``Fabric.resubmit``: only
the routing, the action id and the submit time may change. Rework (a result sent back),
a revive (a dead letter back to Queued) and an escalation (the dead letter's decision
task, then the revive) keep the same task: its spec does not change at all. Specs are
drawn at random, every field of them; a re-submitter that unpacks a spec and forgets a
field fails here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.layout import Column
from fabric.settings.keeper import KeeperConfig
from fabric.task import State, TaskSpec
from keeper.daemon import Keeper
from keeper.decisions import escalate_dead_letter
from tests.conftest import FakeClock, make_fabric
from tests.unit.test_keeper_gestures import move

NOW = 1_800_000_000.0
# What a re-submit decides anew; everything else is the task's own.
ROUTING = {"target", "queue", "constraints", "action_id", "submitted_at"}

words = st.text(alphabet=st.characters(whitelist_categories=("L", "N", "Zs")), min_size=1, max_size=40)
options = st.fixed_dictionaries(
    {
        "intent": words.filter(lambda s: s.strip()),
        "refs": st.lists(st.sampled_from([f"file:///srv/agap/shared/{n}.md" for n in "abcdef"]), max_size=3),
        "priority": st.integers(0, 3),
        "deadline": st.one_of(st.none(), st.floats(NOW + 7200, NOW + 30 * 86400)),
        "not_before": st.one_of(st.none(), st.floats(NOW + 60, NOW + 3600)),
        "actor": st.sampled_from(["cli", "alvis", "cron"]),
        "key": st.one_of(st.none(), st.text(alphabet="abcdefxyz0123456789-", min_size=1, max_size=20)),
        "child": st.booleans(),
    }
)
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fabric(cards: CardSet) -> tuple[Fabric, FakeClock]:
    clock = FakeClock(NOW)
    return make_fabric(LocalPort(clock=clock), cards, clock), clock


def _submit(fab: Fabric, opts: dict[str, Any], **route: Any) -> tuple[int, TaskSpec]:
    kw = {k: v for k, v in opts.items() if k != "child"}
    if opts["child"]:
        kw["parent"] = fab.submit("the parent of it all", target="kimi").task_id
    tid = fab.submit(**kw, **route).task_id
    spec = fab.board.read(tid).spec
    assert spec is not None
    return tid, spec


def _same_but(a: TaskSpec, b: TaskSpec, changed: set[str]) -> None:
    left, right = a.as_dict(), b.as_dict()
    for field in left:
        if field not in changed:
            assert left[field] == right[field], (field, left[field], right[field])


def _newest(fab: Fabric, old: int) -> TaskSpec:
    title = fab.board.read(old).task.title
    rows = [r for r in fab.listing() if r["id"] != old and r["title"] == title]
    assert rows, "no task was submitted again"
    spec = fab.board.read(max(r["id"] for r in rows)).spec
    assert spec is not None
    return spec


@SETTINGS
@given(opts=options)
def test_a_lane_drag_keeps_every_field_but_the_routing(cards: CardSet, opts: dict[str, Any]) -> None:
    fab, _ = _fabric(cards)
    tid, spec = _submit(fab, opts, target="kimi")
    move(fab, tid, Column.QUEUED, queue="qwen-remote")
    keeper = Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))
    assert keeper.run_job("gestures") and keeper.last["gestures"].acted == {tid: "reroute"}
    again = _newest(fab, tid)
    assert again.target == "qwen-remote"
    _same_but(spec, again, ROUTING)


@SETTINGS
@given(opts=options)
def test_a_reroute_off_a_parked_queue_keeps_every_field_but_the_target(
    cards: CardSet, opts: dict[str, Any]
) -> None:
    fab, clock = _fabric(cards)
    tid, spec = _submit(fab, opts, constraints="tier>=medium")
    assert spec.target == "qwen-remote"
    park = {
        "queue": "qwen-remote",
        "parked": True,
        "reason": "asleep",
        "until": clock() + 3600,
        "since": clock(),
    }
    fab.board.publish_park("qwen-remote", park)
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("policy") and keeper.last["policy"].requeued == [tid]
    again = _newest(fab, tid)
    assert again.target == "kimi"
    _same_but(spec, again, ROUTING - {"constraints"})


@SETTINGS
@given(opts=options)
def test_rework_revive_and_escalation_keep_the_task_as_it_was(cards: CardSet, opts: dict[str, Any]) -> None:
    fab, clock = _fabric(cards)
    tid, spec = _submit(fab, opts, target="kimi")
    clock.advance(7200)  # past any start hint
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.complete(lease, "https://example.org/result")
    fab.ledger.reopen(tid, "alvis", "not what I asked")  # rework
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.fail(lease, "it broke", poison=True)
    dead = fab.board.read(tid)
    assert dead.current is not None and dead.current.state == State.DEAD
    assert escalate_dead_letter(fab, dead) is not None  # the decision task for a person
    fab.ledger.revive(tid, "alvis", "try again")
    after = fab.board.read(tid)
    assert after.current is not None and after.current.state == State.QUEUED
    assert after.spec == spec
