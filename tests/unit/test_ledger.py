"""The epoch ledger's state machine, fencing, gaps and side-effect keys (in-process board)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from fabric.core import Fabric
from fabric.kanboard.layout import epoch_lock, record_key
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.taskboard import TaskView
from fabric.ledger import LEGAL, Fenced, IllegalTransition, Lease, LostRace
from fabric.task import Record, State
from tests.conftest import FakeClock
from workers.queue import QueueReader

LEASE = 60.0


def submit(fab: Fabric, intent: str = "do a thing", **kw: object) -> int:
    return fab.submit(intent, target="kimi", **kw).task_id  # type: ignore[arg-type]


def claim(fab: Fabric, task_id: int, owner: str = "w1") -> Lease:
    return fab.ledger.claim(fab.board.read(task_id), owner, lease_seconds=LEASE)


def state(fab: Fabric, task_id: int) -> State:
    cur = fab.board.read(task_id).current
    assert cur is not None
    return cur.state


# -- reaching each state --------------------------------------------------------------


def to_state(fab: Fabric, clock: FakeClock, target: State) -> int:
    tid = submit(fab)
    if target == State.QUEUED:
        return tid
    lease = claim(fab, tid)
    if target == State.WORKING:
        return tid
    if target == State.DONE:
        fab.ledger.complete(lease, "file:///r.md")
    elif target == State.INPUT_REQUIRED:
        fab.ledger.ask(lease, "which one?", "alvis")
    elif target == State.DEAD:
        fab.ledger.fail(lease, "bad input", poison=True)
    elif target == State.CANCELED:
        fab.ledger.cancel(tid, "alvis")
    elif target == State.CLOSED:
        fab.ledger.complete(lease, "file:///r.md")
        fab.ledger.verify(tid, "alvis")
    elif target == State.DROPPED:
        fab.ledger.fail(lease, "bad input", poison=True)
        fab.ledger.drop(tid, "alvis")
    assert state(fab, tid) == target
    return tid


def attempt(fab: Fabric, clock: FakeClock, op: str, tid: int) -> Record:
    """Run ``op`` on task ``tid`` as a plausible actor."""
    view = fab.board.read(tid)
    cur = view.current
    assert cur is not None and view.uid is not None and view.spec is not None
    ledger = fab.ledger
    if op == "claim":
        return ledger._transition(
            view,
            "claim",
            "w2",
            lambda n, p: ledger._record(
                n, p, State.WORKING, "claim", "w2", owner="w2", lease_until=clock() + LEASE
            ),
        )
    if op in ("complete", "fail", "ask", "release"):
        return _owner_op(fab, clock, op, tid, view)
    if op == "requeue":
        clock.advance(LEASE + 1)
        return ledger.requeue_expired(fab.board.read(tid))
    return _person_op(fab, op, tid)


def _owner_op(fab: Fabric, clock: FakeClock, op: str, tid: int, view: TaskView) -> Record:
    """An op only the lease owner may run: with a lease if working, else as the last owner."""
    cur, ledger = view.current, fab.ledger
    assert cur is not None and view.uid is not None and view.spec is not None
    lease = Lease(tid, view.uid, cur.epoch, cur.owner or "w1", clock() + LEASE, cur.attempt, view.spec)
    if cur.state != State.WORKING:
        # An owner op needs a working lease: try it as the last owner would.
        return ledger._transition(view, op, "w1", lambda n, p: ledger._record(n, p, State.DONE, op, "w1"))
    return {
        "complete": lambda: ledger.complete(lease, "file:///x"),
        "fail": lambda: ledger.fail(lease, "boom"),
        "ask": lambda: ledger.ask(lease, "q?", "alvis"),
        "release": lambda: ledger.release(lease),
    }[op]()


def _person_op(fab: Fabric, op: str, tid: int) -> Record:
    """An op a person or the keeper runs on the task by id."""
    ledger = fab.ledger
    ops: dict[str, Callable[[], Record]] = {
        "resume": lambda: ledger.resume(tid, "alvis", "yes"),
        "cancel": lambda: ledger.cancel(tid, "alvis", "no longer needed"),
        "dead_letter": lambda: ledger.dead_letter(tid, "keeper", "poison"),
        "verify": lambda: ledger.verify(tid, "alvis"),
        "reopen": lambda: ledger.reopen(tid, "alvis", "wrong answer"),
        "revive": lambda: ledger.revive(tid, "alvis"),
        "drop": lambda: ledger.drop(tid, "alvis", "not worth it"),
    }
    if op not in ops:
        raise AssertionError(op)
    return ops[op]()


EXPECTED = {
    "claim": State.WORKING,
    "complete": State.DONE,
    "fail": State.QUEUED,
    "ask": State.INPUT_REQUIRED,
    "release": State.QUEUED,
    "requeue": State.QUEUED,
    "resume": State.QUEUED,
    "cancel": State.CANCELED,
    "dead_letter": State.DEAD,
    "verify": State.CLOSED,
    "reopen": State.QUEUED,
    "revive": State.QUEUED,
    "drop": State.DROPPED,
}
ALL_STATES = [
    State.QUEUED,
    State.WORKING,
    State.INPUT_REQUIRED,
    State.DONE,
    State.DEAD,
    State.CANCELED,
    State.CLOSED,
    State.DROPPED,
]


@pytest.mark.parametrize("op", sorted(LEGAL))
@pytest.mark.parametrize("start", ALL_STATES, ids=lambda s: s.value)
def test_every_transition_from_every_state(
    local_fabric: Fabric, clock: FakeClock, op: str, start: State
) -> None:
    fab = local_fabric
    tid = to_state(fab, clock, start)
    before = fab.board.read(tid)
    if start in LEGAL[op]:
        rec = attempt(fab, clock, op, tid)
        assert rec.state == EXPECTED[op]
        after = fab.board.read(tid)
        assert after.epoch == before.epoch + 1
        assert after.current == rec
    else:
        with pytest.raises(IllegalTransition) as err:
            attempt(fab, clock, op, tid)
        assert f"task #{tid}" in str(err.value)
        after = fab.board.read(tid)
        assert after.epoch == before.epoch, "a refused transition must not move the epoch"


def test_claim_sets_owner_lease_and_attempt(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    lease = claim(local_fabric, tid, "w1")
    view = local_fabric.board.read(tid)
    cur = view.current
    assert cur is not None
    assert (cur.state, cur.owner, cur.attempt, lease.epoch) == (State.WORKING, "w1", 1, 1)
    assert cur.lease_until == pytest.approx(clock() + LEASE)
    assert view.row["column_id"] == local_fabric.board.layout.columns["Working"]  # type: ignore[index]


def test_second_claimer_of_the_same_epoch_loses(local_fabric: Fabric) -> None:
    tid = submit(local_fabric)
    stale = local_fabric.board.read(tid)
    claim(local_fabric, tid, "w1")
    with pytest.raises(LostRace) as err:
        local_fabric.ledger.claim(stale, "w2", lease_seconds=LEASE)
    assert not err.value.gap
    cur = local_fabric.board.read(tid).current
    assert cur is not None and cur.owner == "w1"


def test_fenced_owner_cannot_complete_and_output_is_evidence(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    old = claim(fab, tid, "w1")
    clock.advance(LEASE + 1)
    fab.ledger.requeue_expired(fab.board.read(tid))
    new = claim(fab, tid, "w2")
    with pytest.raises(Fenced):
        fab.ledger.complete(old, "file:///late.md")
    with pytest.raises(Fenced):
        fab.ledger.renew(old, lease_seconds=LEASE)
    with pytest.raises(Fenced):
        fab.ledger.check(old)
    fab.ledger.keep_evidence(old, "late output")
    fab.ledger.complete(new, "file:///good.md")
    view = fab.board.read(tid)
    assert view.current is not None and view.current.result_ref == "file:///good.md"
    assert view.meta[f"fabric.evidence.e{old.epoch}"] == "late output"


def test_renew_extends_only_the_owners_record(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    lease = claim(local_fabric, tid)
    clock.advance(30)
    renewed = local_fabric.ledger.renew(lease, lease_seconds=LEASE)
    view = local_fabric.board.read(tid)
    assert view.epoch == lease.epoch
    assert view.current is not None and view.current.lease_until == renewed.lease_until
    assert renewed.lease_until == pytest.approx(clock() + LEASE)


def test_requeue_refused_while_lease_is_live(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = submit(local_fabric)
    claim(local_fabric, tid)
    with pytest.raises(IllegalTransition, match="not expired"):
        local_fabric.ledger.requeue_expired(local_fabric.board.read(tid))


def test_expired_lease_on_last_attempt_dead_letters(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    max_attempts = fab.board.read(tid).spec.max_attempts  # type: ignore[union-attr]
    for _ in range(max_attempts):
        claim(fab, tid)
        clock.advance(LEASE + 1)
        fab.ledger.requeue_expired(fab.board.read(tid))
    assert state(fab, tid) == State.DEAD
    assert fab.board.read(tid).row["column_id"] == fab.board.layout.columns["Dead letter"]  # type: ignore[index]


def test_fail_retries_with_backoff_then_dead_letters(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    submit(fab)
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock, max_age=0)
    lease = reader.claim_next("w1", lease_seconds=LEASE)
    assert lease is not None
    rec = fab.ledger.fail(lease, "timeout", backoff_base=10)
    assert rec.state == State.QUEUED and rec.not_before is not None
    assert rec.not_before >= clock() + 8
    assert reader.claim_next("w1", lease_seconds=LEASE) is None, "not due during backoff"
    clock.advance(3600)
    for _ in range(5):
        lease = reader.claim_next("w1", lease_seconds=LEASE)
        if lease is None:
            break
        rec = fab.ledger.fail(lease, "timeout", backoff_base=10)
        clock.advance(3600)
    assert rec.state == State.DEAD
    assert "attempts exhausted" in (rec.reason or "")


def test_producer_may_not_verify_its_own_task(local_fabric: Fabric) -> None:
    tid = submit(local_fabric)
    lease = claim(local_fabric, tid, "w1")
    local_fabric.ledger.complete(lease, "file:///r.md")
    with pytest.raises(IllegalTransition, match="producer"):
        local_fabric.ledger.verify(tid, "w1")
    rec = local_fabric.ledger.verify(tid, "alvis")
    assert rec.state == State.CLOSED and rec.result_ref == "file:///r.md"
    assert not local_fabric.board.read(tid).is_open


@pytest.mark.parametrize("verifier", ["kimi", "kimi@laptop:99", "kimi@host:1"])
def test_no_instance_of_the_producing_agent_may_verify(local_fabric: Fabric, verifier: str) -> None:
    # The rule is about the agent: another loop of the same agent is still the producer.
    tid = submit(local_fabric)
    local_fabric.ledger.complete(claim(local_fabric, tid, "kimi@host:1"), "file:///r.md")
    with pytest.raises(IllegalTransition, match="producer"):
        local_fabric.ledger.verify(tid, verifier)
    assert local_fabric.ledger.verify(tid, "claude-coder@host:2").state == State.CLOSED


def test_cancel_fences_the_working_owner(local_fabric: Fabric) -> None:
    tid = submit(local_fabric)
    lease = claim(local_fabric, tid)
    local_fabric.ledger.cancel(tid, "alvis", "changed my mind")
    with pytest.raises(Fenced):
        local_fabric.ledger.complete(lease, "file:///x")
    view = local_fabric.board.read(tid)
    assert view.current is not None and view.current.state == State.CANCELED
    assert not view.is_open


def test_release_does_not_count_an_attempt(local_fabric: Fabric) -> None:
    tid = submit(local_fabric)
    lease = claim(local_fabric, tid)
    rec = local_fabric.ledger.release(lease, "SIGTERM")
    assert rec.state == State.QUEUED and rec.attempt == 0


def test_ask_puts_the_task_in_the_humans_inbox(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = submit(fab)
    fab.ledger.ask(claim(fab, tid), "Which account?", "alvis")
    view = fab.board.read(tid)
    assert view.row["column_id"] == fab.board.layout.columns["Waiting on me"]  # type: ignore[index]
    assert view.row["owner_id"] == fab.board.layout.users["alvis"]
    assert any("Which account?" in c.text for c in fab.board.comments(tid))
    fab.ledger.resume(tid, "alvis", "the joint one")
    view = fab.board.read(tid)
    assert view.row["owner_id"] == 0
    assert view.row["column_id"] == fab.board.layout.columns["Queued"]  # type: ignore[index]


# -- stale writes and gaps ---------------------------------------------------------------


def test_a_delayed_write_for_an_old_epoch_never_changes_the_current_state(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid = submit(fab)
    lease = claim(fab, tid, "w1")
    fab.ledger.complete(lease, "file:///r.md")
    # A slow, retried write of epoch 1's record arrives late (e.g. a renewal).
    late = Record(
        epoch=1,
        state=State.WORKING,
        op="claim",
        by="w1",
        at=clock(),
        owner="w1",
        lease_until=clock() + 999,
        attempt=1,
    )
    fab.board.save_meta(tid, {record_key(1): late.to_meta()})
    view = fab.board.read(tid)
    assert view.epoch == 2 and view.current is not None and view.current.state == State.DONE
    # …and the renewal path of a fenced owner says so.
    with pytest.raises(Fenced):
        fab.ledger.renew(lease, lease_seconds=LEASE)
    assert fab.board.read(tid).current == view.current


def test_gap_is_detected_and_resolved(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    view = fab.board.read(tid)
    assert view.uid is not None
    # A claimer wins epoch 1's lock and dies before writing its record.
    assert fab.board.lock(epoch_lock(view.uid, 1))
    reader = QueueReader.for_agent(fab, fab.cards.get("kimi"), clock=clock, max_age=0)
    assert reader.claim_next("w2", lease_seconds=LEASE) is None
    assert fab.board.read(tid).gap is None, "one loss proves nothing: the winner may be live"
    clock.advance(fab.ledger.gap_grace)
    with pytest.raises(LostRace) as err:
        fab.ledger.claim(fab.board.read(tid), "w2", lease_seconds=LEASE)
    assert err.value.gap
    note = fab.board.read(tid).gap
    assert note is not None and note.epoch == 1
    assert not fab.ledger.gap_due(fab.board.read(tid)), "a young gap is left to its winner"
    clock.advance(fab.ledger.gap_timeout + 1)
    assert fab.ledger.gap_due(fab.board.read(tid))
    assert reader.claim_next("w2", lease_seconds=LEASE) is None  # resolves the gap
    view = fab.board.read(tid)
    assert view.epoch == 2 and view.current is not None
    assert (view.current.state, view.current.op) == (State.QUEUED, "resolve_gap")
    lease = reader.claim_next("w2", lease_seconds=LEASE)
    assert lease is not None and lease.epoch == 3


def test_gap_of_a_working_task_requeues_it(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    lease = claim(fab, tid, "w1")
    # The owner's completion wins epoch 2's lock, then the owner dies.
    assert fab.board.lock(epoch_lock(lease.uid, 2))
    clock.advance(LEASE + 1)
    for _ in range(2):  # a second loss past the grace notes the gap
        with pytest.raises(LostRace):
            fab.ledger.requeue_expired(fab.board.read(tid))
        clock.advance(fab.ledger.gap_grace)
    clock.advance(fab.ledger.gap_timeout + 1)
    rec = fab.ledger.resolve_gap(fab.board.read(tid))
    assert (rec.epoch, rec.state, rec.attempt) == (3, State.QUEUED, 1)
    with pytest.raises(Fenced):
        fab.ledger.complete(lease, "file:///late")


# -- side effects ----------------------------------------------------------------------


def test_effect_key_is_stable_across_owners_and_receipts_stop_repeats(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid = submit(fab)
    first = claim(fab, tid, "w1")
    eff = fab.ledger.effect(first, "send-mail")
    assert eff.key == f"{first.uid}:e{first.epoch}:send-mail" and not eff.done
    # The owner dies after recording the intent: the next owner reuses the same key.
    clock.advance(LEASE + 1)
    fab.ledger.requeue_expired(fab.board.read(tid))
    second = claim(fab, tid, "w2")
    again = fab.ledger.effect(second, "send-mail")
    assert again.key == eff.key and not again.done
    fab.ledger.effect_done(second, again, "msg-42")
    clock.advance(LEASE + 1)
    fab.ledger.requeue_expired(fab.board.read(tid))
    third = claim(fab, tid, "w3")
    done = fab.ledger.effect(third, "send-mail")
    assert done.done and done.receipt == "msg-42" and done.key == eff.key


def test_a_receipt_written_after_the_epoch_ended_is_never_adopted(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid = submit(fab)
    frozen = claim(fab, tid, "w1")
    eff = fab.ledger.effect(frozen, "model-call")
    clock.advance(LEASE + 1)  # w1 is frozen past its lease: the keeper requeues
    fab.ledger.requeue_expired(fab.board.read(tid))
    with pytest.raises(Fenced):  # w1 thaws and writes its receipt: it does not count
        fab.ledger.effect_done(frozen, eff, "kanboard://task/1/file/result-e1.md")
    new = claim(fab, tid, "w2")
    again = fab.ledger.effect(new, "model-call")
    assert not again.done and again.key == eff.key, "the new owner calls again, under the same key"
    assert all(not r.receipts for r in fab.board.read(tid).records.values() if r.epoch > frozen.epoch)


def test_a_current_receipt_survives_renewals_and_its_owner_dying(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid = submit(fab)
    first = claim(fab, tid, "w1")
    lease = fab.ledger.effect_done(first, fab.ledger.effect(first, "model-call"), "ref-1")
    lease = fab.ledger.renew(lease)  # a renewal from the returned lease keeps the receipt
    assert fab.board.read(tid).records[lease.epoch].receipts == {"model-call": "ref-1"}
    clock.advance(LEASE + 1)  # the owner died after its receipt: never pay twice
    fab.ledger.requeue_expired(fab.board.read(tid))
    second = claim(fab, tid, "w2")
    assert second.receipt("model-call") == "ref-1"
    assert fab.ledger.effect(second, "model-call").receipt == "ref-1"


def test_rework_after_reopen_gets_a_new_key_no_receipt_and_the_reason(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid = submit(fab)
    first = claim(fab, tid, "w1")
    eff = fab.ledger.effect(first, "model-call")
    first = fab.ledger.effect_done(first, eff, "ref-1")
    fab.ledger.complete(first, "ref-1")
    fab.ledger.reopen(tid, "alvis", "Wrong restaurant")
    rework = claim(fab, tid, "w2")
    assert rework.receipts == () and rework.conversation == (("reopen", "Wrong restaurant"),)
    again = fab.ledger.effect(rework, "model-call")
    assert not again.done and again.key != eff.key and again.key.endswith(f"e{rework.epoch}:model-call")


def test_a_fenced_owner_gets_no_effect_key(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    old = claim(fab, tid, "w1")
    fab.ledger.cancel(tid, "alvis")
    with pytest.raises(Fenced):
        fab.ledger.effect(old, "send-mail")
    assert "fabric.fx.send-mail" not in fab.board.read(tid).meta


def test_corrupted_records_are_reported_not_raised(local_fabric: Fabric) -> None:
    tid = submit(local_fabric)
    local_fabric.board.save_meta(
        tid,
        {
            "fabric.e5": "{not json",
            "fabric.e6": json.dumps({"epoch": 9, "state": "queued", "op": "x", "by": "y", "at": 0}),
        },
    )
    view = local_fabric.board.read(tid)
    assert view.epoch == 0
    assert len(view.problems) == 2 and any("fabric.e5" in p for p in view.problems)


def test_view_of_missing_records_refuses_transitions(local_fabric: Fabric) -> None:
    view = TaskView(id=999, task=BoardTask(id=999), uid=None, spec=None, records={}, meta={}, read_at=0)
    with pytest.raises(Exception, match="no fabric records"):
        local_fabric.ledger.cancel(999, "alvis", view=view)


# -- checkpoints ---------------------------------------------------------------------


def test_a_new_owner_resumes_from_the_last_checkpoint(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    first = claim(fab, tid, "w1")
    assert first.checkpoint is None
    first = fab.ledger.checkpoint(first, "file:///work/step-1")
    first = fab.ledger.checkpoint(first, "file:///work/step-2")
    clock.advance(10)
    first = fab.ledger.renew(first, lease_seconds=LEASE)  # a renewal keeps the checkpoint
    assert fab.board.read(tid).current.checkpoint == "file:///work/step-2"  # type: ignore[union-attr]
    clock.advance(LEASE + 1)
    fab.ledger.requeue_expired(fab.board.read(tid))
    second = claim(fab, tid, "w2")
    assert second.checkpoint == "file:///work/step-2"


def test_a_fenced_owners_late_checkpoint_is_ignored(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    old = fab.ledger.checkpoint(claim(fab, tid, "w1"), "file:///work/step-1")
    clock.advance(LEASE + 1)
    fab.ledger.requeue_expired(fab.board.read(tid))
    # The frozen owner wakes up and checkpoints after it was fenced.
    with pytest.raises(Fenced):
        fab.ledger.checkpoint(old, "file:///work/step-9-late")
    new = claim(fab, tid, "w2")
    assert new.checkpoint == "file:///work/step-1", "the late checkpoint must not be carried"
    assert fab.board.read(tid).records[old.epoch].checkpoint == "file:///work/step-9-late"


def test_a_resolved_gap_carries_the_checkpoint(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid = submit(fab)
    lease = fab.ledger.checkpoint(claim(fab, tid, "w1"), "file:///work/step-3")
    assert fab.board.lock(epoch_lock(lease.uid, 2))  # the owner dies mid-transition
    fab.board.save_meta(tid, {"fabric.gap": json.dumps({"epoch": 2, "seen": clock() - 999})})
    rec = fab.ledger.resolve_gap(fab.board.read(tid))
    assert rec.state == State.QUEUED and rec.checkpoint == "file:///work/step-3"
