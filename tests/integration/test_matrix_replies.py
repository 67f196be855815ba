"""Matrix both ways, on a real homeserver: Synapse on loopback (the ``matrix`` extra).

The keeper's bot posts a person's notices to their room; the person answers by replying
to one. Each test gets fresh rooms (and a fresh board), so no message of another test is
in reach. Skipped, with the reason, only when Synapse is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import pytest

from fabric.cards import CardSet, MatrixChannel
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.ledger import Lease
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import GATE_ACTOR, State
from keeper.daemon import Keeper
from keeper.matrix import NOTICE
from keeper.notify import Notifier
from keeper.replies import MatrixReplies, ReplyReport, sync_key
from tests.conftest import ROOT, FakeClock, make_fabric
from tests.helpers import wait_until
from tests.integration import synapse
from tests.integration.synapse import Synapse, User

WHY_SKIP = synapse.available()
# One homeserver per module and worker (a start costs ~25 s idle, more under load).
pytestmark = pytest.mark.skipif(WHY_SKIP is not None, reason=WHY_SKIP or "")
TOKEN_ENV = "AGAP_MATRIX_TOKEN"
WEB = "http://127.0.0.1:9/kanboard/"


@dataclass
class People:
    bot: User
    alvis: User
    elizaveta: User
    eve: User  # in alvis's room, on no card


@pytest.fixture(scope="module")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Synapse, People]]:
    hs = synapse.start(tmp_path_factory.mktemp("synapse"))
    try:
        people = People(*(hs.register(name) for name in ("agap-bot", "alvis", "elizaveta", "eve")))
        yield hs, people
    finally:
        hs.stop()


@dataclass
class World:
    hs: Synapse
    people: People
    fab: Fabric
    clock: FakeClock
    env: dict[str, str]
    room: str  # alvis's room: alvis, elizaveta (his deputy) and eve

    def keeper(self, **kw: Any) -> Keeper:
        """A keeper as it starts: nothing in memory, everything from the board."""
        return Keeper.for_fabric(
            self.fab,
            KeeperConfig(),
            notifier=Notifier(self.fab.cards, env=self.env),
            replies=MatrixReplies(env=self.env, timeout=30.0, **kw),
        )

    def bot_messages(self) -> list[dict[str, Any]]:
        return [
            m
            for m in self.hs.messages(self.people.alvis, self.room)
            if m["sender"] == self.people.bot.user_id
        ]

    def replies_to(self, event_id: str) -> list[str]:
        return [
            m["content"]["body"]
            for m in self.bot_messages()
            if m["content"].get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id") == event_id
        ]

    def notice(self, tid: int) -> str:
        """The event id of the (one) notice about task ``tid``."""
        found = [
            m["event_id"] for m in self.bot_messages() if m["content"].get(NOTICE, {}).get("task") == tid
        ]
        assert len(found) == 1, found
        return str(found[0])


def _cards(cards: CardSet, hs: Synapse, rooms: dict[str, str], users: dict[str, str]) -> CardSet:
    """The repo's cards, each person's Matrix channel on the test homeserver (alvis's
    deputy: elizaveta)."""
    out = []
    for card in cards:
        if card.human is not None and card.id in rooms:
            chan = MatrixChannel(
                room=rooms[card.id], homeserver=hs.url, token_env=TOKEN_ENV, user=users[card.id]
            )
            deputies = ["elizaveta"] if card.id == "alvis" else card.human.deputies
            human = replace(card.human, channels=[chan], deputies=deputies)
            card = replace(card, human=human)
        out.append(card)
    return CardSet(out)


@pytest.fixture
def world(homeserver: tuple[Synapse, People], cards: CardSet) -> World:
    hs, p = homeserver
    room = hs.direct_room(p.bot, p.alvis)
    for other in (p.elizaveta, p.eve):
        hs.call(p.bot, "POST", f"/rooms/{quote(room, safe='')}/invite", {"user_id": other.user_id})
        hs.call(other, "POST", f"/join/{quote(room, safe='')}", {})
    liza = hs.direct_room(p.bot, p.elizaveta)
    mine = _cards(
        cards,
        hs,
        {"alvis": room, "elizaveta": liza},
        {"alvis": p.alvis.user_id, "elizaveta": p.elizaveta.user_id},
    )
    clock = FakeClock()
    settings = Settings(cards_dir=ROOT / "cards", board_url="local://", board_token="x", web_url=WEB)
    fab = make_fabric(LocalPort(clock=clock), mine, clock, settings=settings)
    w = World(hs, p, fab, clock, {TOKEN_ENV: p.bot.token}, room)
    assert w.keeper().run_job("matrix"), "the first sync saves a token"
    return w


def run(k: Keeper, job: str) -> Any:
    assert k.run_job(job), k.metrics.job(job).last_error
    return k.last[job]


def replies(k: Keeper, until: Callable[[ReplyReport], bool] | None = None) -> ReplyReport:
    """One matrix sweep; with ``until``, sweeps until one's report satisfies it (bounded:
    a message reaches /sync a moment after it was sent)."""

    def sweep() -> ReplyReport | None:
        report: ReplyReport = run(k, "matrix")
        return report if until is None or until(report) else None

    found: ReplyReport = wait_until(sweep, timeout=30, what="the matrix sweep to read the reply")
    return found


def state(fab: Fabric, tid: int) -> tuple[State, str, str | None, str]:
    cur = fab.board.read(tid).current
    assert cur is not None
    return cur.state, cur.op, cur.reason, cur.by


def gate(w: World) -> int:
    tid = w.fab.submit("publish the notes", target="alvis", actor=GATE_ACTOR).task_id
    assert run(w.keeper(), "inbox").notified == [tid]
    return tid


def claim(fab: Fabric, tid: int) -> Lease:
    return fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=300)


# -- notifications --------------------------------------------------------------------------


def test_a_gate_lands_in_the_persons_room_formatted_with_its_link_once(world: World) -> None:
    tid = gate(world)
    [msg] = world.bot_messages()
    content = msg["content"]
    assert content["body"].startswith(f"Waiting on you: #{tid}")
    assert content["format"] == "org.matrix.custom.html"
    assert f'<a href="{WEB}' in content["formatted_body"] and f"task:{tid}" in content["formatted_body"]
    assert content[NOTICE] == {"task": tid, "epoch": world.fab.board.read(tid).epoch, "state": "queued"}
    # The keeper restarts having lost its mark (or retries after a lost response): the
    # notice's transaction id is the same, so the room still shows it once.
    world.fab.board.save_meta(tid, {"fabric.notified": ""})
    assert run(world.keeper(), "inbox").notified == [tid]
    assert len(world.bot_messages()) == 1


# -- answers ------------------------------------------------------------------------------


def test_approve_by_reply_approves_the_gate_once_as_that_person(world: World) -> None:
    tid = gate(world)
    k = world.keeper()
    reply = world.hs.reply(world.people.alvis, world.room, world.notice(tid), "Approve, the sources are fine")
    report = replies(k, until=lambda r: tid in r.acted)
    assert report.by == {tid: "alvis"}
    assert state(world.fab, tid)[0] == State.DONE and state(world.fab, tid)[3] == "alvis"
    assert world.replies_to(reply) == [f"Task #{tid}: approved it."]
    assert replies(k).acted == {}, "read once"
    assert replies(world.keeper()).acted == {}, "and once across a restart (the token is the board's)"
    assert world.replies_to(reply) == [f"Task #{tid}: approved it."]


def test_refuse_with_a_reason_cancels_the_gate_with_it(world: World) -> None:
    tid = gate(world)
    world.hs.reply(world.people.alvis, world.room, world.notice(tid), "refuse: the notes are private")
    replies(world.keeper(), until=lambda r: tid in r.acted)
    assert state(world.fab, tid) == (State.CANCELED, "cancel", "the notes are private", "alvis")


def test_a_question_is_answered_by_reply(world: World) -> None:
    tid = world.fab.submit("clone the repo", target="kimi").task_id
    world.fab.ledger.ask(claim(world.fab, tid), "Which repo?", "alvis")
    run(world.keeper(), "inbox")
    world.hs.reply(world.people.alvis, world.room, world.notice(tid), "the homelab one")
    replies(world.keeper(), until=lambda r: tid in r.acted)
    assert state(world.fab, tid) == (State.QUEUED, "resume", "the homelab one", "alvis")


def test_a_result_is_sent_back_only_with_a_reason(world: World) -> None:
    tid = world.fab.submit("count the disks", target="kimi", priority="urgent", actor="alvis").task_id
    world.fab.ledger.complete(claim(world.fab, tid), "file:///disks.md")
    run(world.keeper(), "inbox")
    notice = world.notice(tid)
    bare = world.hs.reply(world.people.alvis, world.room, notice, "send back")
    replies(world.keeper(), until=lambda r: bare in r.answered)
    [said] = world.replies_to(bare)
    assert "not as an answer" in said and "`send back` followed by what is wrong" in said
    assert state(world.fab, tid)[0] == State.DONE, "nothing changed"
    world.hs.reply(world.people.alvis, world.room, notice, "send back: the NAS is missing")
    replies(world.keeper(), until=lambda r: tid in r.acted)
    assert state(world.fab, tid)[:3] == (State.QUEUED, "reopen", "the NAS is missing")


def test_someone_else_gets_one_reply_and_nothing_changes_a_deputy_may(world: World) -> None:
    tid = gate(world)
    notice = world.notice(tid)
    eve = world.hs.reply(world.people.eve, world.room, notice, "approve")
    k = world.keeper()
    replies(k, until=lambda r: eve in r.answered)
    assert world.replies_to(eve) == [
        f"Only alvis or elizaveta may approve this (@eve:localhost tried). Nothing changed on task #{tid}."
    ]
    assert state(world.fab, tid)[:2] == (State.QUEUED, "submit")
    world.hs.reply(world.people.elizaveta, world.room, notice, "yes")
    assert replies(k, until=lambda r: tid in r.acted).by == {tid: "elizaveta"}
    assert len(world.replies_to(eve)) == 1


def test_an_unparseable_reply_says_what_was_understood_and_what_to_write(world: World) -> None:
    tid = gate(world)
    said = world.hs.reply(world.people.alvis, world.room, world.notice(tid), "maybe after lunch")
    replies(world.keeper(), until=lambda r: said in r.answered)
    [text] = world.replies_to(said)
    assert f"I read “maybe after lunch” as a reply about task #{tid} (an approval waiting on you)" in text
    assert "Write `approve` (a note may follow) or `refuse` followed by why." in text
    assert state(world.fab, tid)[:2] == (State.QUEUED, "submit")


def test_a_reply_to_an_old_or_foreign_message_changes_nothing(world: World) -> None:
    tid = gate(world)
    notice = world.notice(tid)
    k = world.keeper()
    world.hs.reply(world.people.alvis, world.room, notice, "approve")
    replies(k, until=lambda r: tid in r.acted)
    late = world.hs.reply(world.people.alvis, world.room, notice, "refuse")  # it is done already
    mine = world.hs.send(world.people.alvis, world.room, {"msgtype": "m.text", "body": "note to self"})
    foreign = world.hs.reply(world.people.alvis, world.room, mine, "approve")
    replies(k, until=lambda r: foreign in r.answered)
    assert world.replies_to(late) == [f"This notification is old: task #{tid} is done now. Nothing changed."]
    assert world.replies_to(foreign) == ["That is not one of the fabric's notifications, so nothing changed."]
    assert state(world.fab, tid)[0] == State.DONE


def test_replies_sent_while_the_fabric_was_down_are_each_handled_once(world: World) -> None:
    tids = [gate(world) for _ in range(3)]
    notices = [world.notice(t) for t in tids]
    mine: list[str] = []
    for n in notices:  # the keeper is down; more messages than one sync page holds
        mine.append(world.hs.reply(world.people.alvis, world.room, n, "approve"))
        world.hs.send(world.people.alvis, world.room, {"msgtype": "m.text", "body": "(chatter)"})
    key = sync_key(world.hs.url, world.people.bot.user_id)
    before = world.fab.board.project_meta()[key]
    k = world.keeper(limit=2)  # it starts again: two messages a page, the rest from /messages
    wait_until(lambda: run(k, "matrix") and len(state_done(world, tids)) == 3, timeout=30, what="all three")
    assert all(state(world.fab, t)[0] == State.DONE for t in tids)
    assert [len(world.replies_to(m)) for m in mine] == [1, 1, 1]
    # It stopped after acting but before saving its token: the same messages again act on
    # nothing (the tasks moved on) and post nothing (each reply's txn id is its message's).
    world.fab.board.save_project_meta({key: before})
    count = len(world.bot_messages())
    assert world.keeper(limit=2).run_job("matrix")
    assert len(world.bot_messages()) == count
    assert [len(world.replies_to(m)) for m in mine] == [1, 1, 1]


def state_done(world: World, tids: list[int]) -> list[int]:
    return [t for t in tids if state(world.fab, t)[0] == State.DONE]


def test_without_a_token_the_job_does_nothing(world: World) -> None:
    k = Keeper.for_fabric(world.fab, KeeperConfig(), replies=MatrixReplies(env={}))
    assert run(k, "matrix").read == 0
