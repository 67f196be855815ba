"""The keeper's policy job: always-ask escalation of dead letters, re-routing off parked queues."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fabric.core import Fabric
from fabric.kanboard.views import TaskView
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import FakeClock


def _dead(fab: Fabric, intent: str = "summarise the contract") -> int:
    tid = fab.submit(intent, target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.fail(lease, "the model keeps timing out", poison=True)
    return tid


def test_a_dead_letter_becomes_one_decision_task_for_a_human(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = _dead(fab)
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("policy")
    report = keeper.last["policy"]
    (decision,) = report.escalated.values()
    view = fab.board.read(decision)
    assert view.spec is not None and view.spec.target in {"alvis", "elizaveta"}
    assert view.spec.refs == (f"task:{tid}",) and view.spec.priority == 2
    assert view.row["column_id"] == fab.board.layout.columns["Waiting on me"]  # type: ignore[index]
    assert "not retry it on a bigger model" in view.spec.intent
    # Never a silent retry: the dead task itself is untouched.
    assert fab.board.read(tid).current.state == State.DEAD  # type: ignore[union-attr]
    # Later sweeps (and a restarted keeper) do not escalate it again.
    assert keeper.run_job("policy") and keeper.last["policy"].escalated == {}
    fresh = Keeper.for_fabric(fab, KeeperConfig())
    assert fresh.run_job("policy")
    assert list(fresh.last["policy"].escalated.values()) in ([], [decision])
    decisions = [t for t in fab.listing() if t["queue"] in ("alvis", "elizaveta")]
    assert len(decisions) == 1


def test_a_routed_task_on_a_parked_queue_is_rerouted(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    # tier>=medium: qwen-remote is picked (cheapest), kimi also qualifies.
    receipt = fab.submit("think it through", constraints="tier>=medium")
    assert receipt.queue == "qwen-remote"
    fab.board.publish_park(
        "qwen-remote",
        {
            "queue": "qwen-remote",
            "parked": True,
            "reason": "asleep: health probe failed",
            "until": clock() + 3600,
            "since": clock(),
        },
    )
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("policy")
    assert keeper.last["policy"].requeued == [receipt.task_id]
    assert fab.board.read(receipt.task_id).current.state == State.CANCELED  # type: ignore[union-attr]
    moved = [t for t in fab.listing() if t["title"] == "think it through"]
    assert [t["queue"] for t in moved] == ["kimi"]


def test_a_direct_target_is_never_rerouted(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    receipt = fab.submit("only qwen will do", target="qwen-remote")
    fab.board.publish_park(
        "qwen-remote",
        {
            "queue": "qwen-remote",
            "parked": True,
            "reason": "asleep",
            "until": clock() + 3600,
            "since": clock(),
        },
    )
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("policy") and keeper.last["policy"].requeued == []
    assert fab.board.read(receipt.task_id).current.state == State.QUEUED  # type: ignore[union-attr]


def test_a_task_refused_at_claim_is_dead_lettered_with_the_reason(local_fabric: Fabric) -> None:
    from fabric.ledger import Ledger
    from fabric.policy import check_claim_on_board
    from workers.queue import QueueReader

    fab = local_fabric
    # Submitted before the rules applied (e.g. the card changed since): the submit-time
    # policy is off here, so only the claim-time check stands between the task and torgash.
    fab.policies = []
    tid = fab.submit(
        "compare with alvis's notes", target="torgash", refs=["file:///srv/agap/private/alvis/n.md"]
    ).task_id
    card = fab.cards.get("torgash")

    def claim_check(v: TaskView) -> None:
        assert v.spec is not None  # submitted above: the task has its spec
        check_claim_on_board(fab.policy_context(), card, v.spec)

    # torgash is sandboxed: its queue lives in its home (fabric.kanboard.principals).
    home = fab.board_for(card)
    reader = QueueReader(home, Ledger(home, clock=fab.clock), "torgash", claim_check=claim_check)
    assert reader.claim_next("torgash@w", lease_seconds=60) is None
    cur = fab.board.read(tid).current
    assert cur is not None and cur.state == State.DEAD
    assert (cur.reason or "").startswith("refused at claim:") and "private:alvis" in (cur.reason or "")


class _Recorder:
    """A notifier that records instead of sending."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, bool]] = []
        self.sent = 0  # the counters the keeper's metrics read
        self.failed = 0

    def notify(
        self,
        human: str,
        subject: str,
        body: str,
        *,
        urgent: bool,
        ref: str | None = None,
        url: str | None = None,
        key: str | None = None,
        about: object = None,
    ) -> bool:
        self.messages.append((human, subject, urgent))
        self.sent += 1
        return True


def _with_alvis(fab: Fabric, **hours: Any) -> None:
    from fabric.cards import CardSet

    alvis = fab.cards.get("alvis")
    shapes = [replace(s, **hours) if s.shape == "hours" else s for s in alvis.availability]
    fab.cards = CardSet(
        [replace(alvis, availability=shapes), *[c for c in fab.cards if c.id != "alvis"]],
        base_dir=fab.cards.base_dir,
    )


def test_reminders_wait_for_waking_hours_and_vacation_parks_the_inbox(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    from datetime import UTC, datetime

    fab = local_fabric
    cfg = KeeperConfig()
    # 02:00 in Berlin: alvis (awake 08:00-23:30) is asleep.
    clock.now = datetime(2027, 1, 15, 1, 0, tzinfo=UTC).timestamp()
    gate = fab.submit("approve the purchase", target="alvis").task_id
    rec = _Recorder()
    keeper = Keeper.for_fabric(fab, cfg, notifier=rec)
    clock.advance(cfg.reminder_interval + 60)  # 06:01 Berlin: still asleep
    assert keeper.run_job("inbox") and keeper.run_job("reminders")
    assert rec.messages == [] and keeper.last["reminders"].reminded == []
    fab.listing()
    assert fab.parks["alvis"]["parked"] and fab.parks["alvis"]["reason"].startswith("outside waking hours")
    clock.now = datetime(2027, 1, 15, 7, 30, tzinfo=UTC).timestamp()  # 08:30 Berlin
    assert keeper.run_job("inbox") and keeper.run_job("reminders")
    assert [m[1] for m in rec.messages][:1] == [f"Waiting on you: #{gate} approve the purchase"]
    assert keeper.last["reminders"].reminded == [gate]
    fab.listing()
    assert not fab.parks["alvis"]["parked"]
    # On vacation: nothing goes out, not even urgent; the gate waits, never approved.
    _with_alvis(fab, vacation=True)
    rec.messages.clear()
    urgent = fab.submit("urgent: renew the domain", target="alvis", priority="urgent").task_id
    clock.advance(cfg.reminder_interval + 60)
    assert keeper.run_job("inbox") and keeper.run_job("reminders")
    assert rec.messages == []
    fab.listing()
    assert fab.parks["alvis"]["reason"].startswith("on vacation")
    for tid in (gate, urgent):
        assert fab.board.read(tid).current.state == State.QUEUED  # type: ignore[union-attr]
