"""Deadlines, gate reminders, urgent notices, digests and lock-tag GC (in-process board)."""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.kanboard.layout import epoch_lock, receipt_lock
from fabric.kanboard.weblinks import links_for
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from keeper.duties import META_ESCALATED
from keeper.matrix import MatrixNotifier
from keeper.notify import Notifier, NotifyError, WebhookNotifier, check_target
from tests.conftest import FakeClock

DAY = 86400.0


class Receiver:
    """A loopback webhook receiver that keeps every request."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.status = status
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((dict(self.headers), json.loads(body)))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/notify"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def cards_to(cards: CardSet, url: str) -> CardSet:
    """The same cards, with every human's webhook pointing at ``url``."""
    out = []
    for card in cards:
        if card.human is not None:
            chans = [replace(c, url=url) if c.type == "webhook" else c for c in card.human.channels]
            card = replace(card, human=replace(card.human, channels=chans))
        out.append(card)
    return CardSet(out)


def keeper(fab: Fabric, notifier: Notifier | None = None, **cfg: Any) -> Keeper:
    return Keeper.for_fabric(fab, KeeperConfig(**cfg), notifier=notifier or Notifier(fab.cards))


def comments(fab: Fabric, tid: int, needle: str) -> int:
    return sum(needle in c.text for c in fab.board.comments(tid))


# -- deadlines ---------------------------------------------------------------------------


def test_an_overdue_task_is_escalated_once_and_left_alone(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = local_fabric.submit("report before noon", target="kimi", deadline="+1h").task_id
    k = keeper(local_fabric)
    assert k.run_job("deadlines") and k.last["deadlines"].escalated == {}
    clock.advance(2 * 3600)
    assert k.run_job("deadlines")
    decision = k.last["deadlines"].escalated[tid]
    view = local_fabric.board.read(tid)
    assert view.current is not None and view.current.state == State.QUEUED, "no default action"
    assert json.loads(view.meta[META_ESCALATED])["to"] == "alvis"
    assert comments(local_fabric, tid, "escalated to @alvis") == 1
    dv = local_fabric.board.read(decision)
    assert dv.spec is not None and dv.spec.target == "alvis" and dv.spec.priority == 3
    assert f"task:{tid}" in dv.spec.refs
    clock.advance(3600)
    assert k.run_job("deadlines") and k.last["deadlines"].escalated == {}, "once, not every sweep"
    assert comments(local_fabric, tid, "escalated") == 1
    assert k.notifier is not None and k.notifier.outbox[0][2] is True  # urgent
    assert k.metrics.escalations_total == 1


def test_escalation_goes_to_the_configured_human(local_fabric: Fabric, clock: FakeClock) -> None:
    tid = local_fabric.submit("due soon", target="kimi", deadline="+1m").task_id
    clock.advance(120)
    k = keeper(local_fabric, escalate_to="elizaveta")
    assert k.run_job("deadlines")
    decision = k.last["deadlines"].escalated[tid]
    dv = local_fabric.board.read(decision)
    assert dv.spec is not None and dv.spec.target == "elizaveta"


# -- gate reminders ----------------------------------------------------------------------


def test_an_ignored_gate_is_re_reminded_on_schedule_and_never_approved(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    tid = local_fabric.submit("approve the purchase", target="alvis").task_id
    k = keeper(local_fabric, reminder_interval=4 * 3600)
    clock.advance(3600)
    assert k.run_job("reminders") and k.last["reminders"].reminded == []
    clock.advance(3 * 3600 + 1)
    assert k.run_job("reminders") and k.last["reminders"].reminded == [tid]
    clock.advance(60)
    assert k.run_job("reminders") and k.last["reminders"].reminded == [], "at most once an interval"
    clock.advance(4 * 3600)
    assert k.run_job("reminders") and k.last["reminders"].reminded == [tid]
    for _ in range(5):
        clock.advance(DAY)
        k.run_once()
    view = local_fabric.board.read(tid)
    assert view.current is not None and view.current.state == State.QUEUED
    assert view.epoch == 0, "a gate is never approved by default"
    assert comments(local_fabric, tid, "Reminder") >= 3


# -- notifications -----------------------------------------------------------------------


def test_a_new_gate_is_notified_at_once_to_a_loopback_webhook(
    local_fabric: Fabric, clock: FakeClock, receiver: Receiver
) -> None:
    cards = cards_to(local_fabric.cards, receiver.url)
    notifier = Notifier(cards, allow=("127.0.0.1/32",), env={"AGAP_WEBHOOK_TOKEN": "s3cret"})
    tid = local_fabric.submit("approve the urgent thing", target="alvis", priority="urgent").task_id
    k = keeper(local_fabric, notifier)
    assert k.run_job("inbox") and k.last["inbox"].notified == [tid]
    assert len(receiver.requests) == 1
    headers, body = receiver.requests[0]
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"
    assert body["urgent"] is True and body["ref"] == f"task:{tid}"
    assert "approve the urgent thing" in body["subject"] and body["sent_at"] > 0
    assert k.run_job("inbox") and k.last["inbox"].notified == [], "once per epoch"
    assert len(receiver.requests) == 1 and k.metrics.notifications_total == 1


def test_a_notification_links_to_the_card_in_kanboard(
    local_fabric: Fabric, clock: FakeClock, receiver: Receiver
) -> None:
    """The message opens the card in one click: KANBOARD_WEB_URL's task page."""
    local_fabric.board.links = links_for("http://kanboard:80/jsonrpc.php", "https://kb.home.arpa")
    cards = cards_to(local_fabric.cards, receiver.url)
    notifier = Notifier(cards, allow=("127.0.0.1/32",), env={"AGAP_WEBHOOK_TOKEN": "s3cret"})
    tid = local_fabric.submit("approve the new router", target="alvis", priority="urgent").task_id
    assert keeper(local_fabric, notifier).run_job("inbox")
    _, body = receiver.requests[0]
    assert body["url"] == f"https://kb.home.arpa/?controller=TaskViewController&action=show&task_id={tid}"
    matrix = MatrixNotifier.content("s", "b", urgent=False, ref=f"task:{tid}", url=body["url"])
    assert f'<a href="{html.escape(body["url"])}">task:{tid}</a>' in matrix["formatted_body"]
    assert body["url"] in matrix["body"]


def test_private_webhook_targets_need_the_allow_list(receiver: Receiver) -> None:
    with pytest.raises(NotifyError, match="private"):
        WebhookNotifier(receiver.url, "t").send("s", "b", urgent=False, ref=None)
    assert receiver.requests == []
    with pytest.raises(NotifyError, match="private"):
        check_target("http://10.1.2.3/x", ["127.0.0.1/32"])
    check_target("http://10.1.2.3/x", ["10.0.0.0/8"])
    check_target("https://example.org/x", [], resolve=lambda h: ["93.184.216.34"])


def test_webhook_retries_a_failing_receiver_then_gives_up() -> None:
    r = Receiver(status=503)
    try:
        ch = WebhookNotifier(r.url, "t", allow=("127.0.0.1/32",), attempts=3, sleep=lambda s: None)
        with pytest.raises(NotifyError, match="503"):
            ch.send("s", "b", urgent=True, ref=None)
        assert len(r.requests) == 3
        r.status = 401
        r.requests.clear()
        with pytest.raises(NotifyError):
            ch.send("s", "b", urgent=True, ref=None)
        assert len(r.requests) == 1, "a refusal is not retried"
    finally:
        r.close()


# -- digest --------------------------------------------------------------------------------


def test_the_digest_is_one_task_per_human_per_day_even_when_fired_twice(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    gate = local_fabric.submit("sign the form", target="alvis").task_id
    done = local_fabric.submit("summarise the week", target="kimi", actor="alvis").task_id
    lease = local_fabric.ledger.claim(local_fabric.board.read(done), "w1", lease_seconds=60)
    local_fabric.ledger.complete(lease, "file:///week.md")
    dead = local_fabric.submit("parse the bad file", target="kimi", actor="alvis").task_id
    lease = local_fabric.ledger.claim(local_fabric.board.read(dead), "w1", lease_seconds=60)
    local_fabric.ledger.fail(lease, "unparseable", poison=True)
    k = keeper(local_fabric)
    assert k.run_job("digest")
    first = {r.task_id for r in k.last["digest"]}
    assert k.run_job("digest"), "a second firing the same day"
    assert {r.task_id for r in k.last["digest"]} == first and len(first) == 2
    assert not any(r.created for r in k.last["digest"])
    by_target = {}
    for tid in first:
        v = local_fabric.board.read(tid)
        assert v.spec is not None and v.spec.actor == "keeper"
        by_target[v.spec.target] = v.spec.intent
    text = by_target["alvis"]
    assert f"#{gate} sign the form" in text.split("Finished")[0]
    assert f"#{done} summarise the week: awaiting verification" in text
    assert f"#{dead} parse the bad file" in text.split("Failed")[1]
    assert "kimi: 2 tasks" in text
    assert "Waiting on you (0)" in by_target["elizaveta"]
    clock.advance(DAY)
    assert k.run_job("digest")
    assert {r.task_id for r in k.last["digest"]}.isdisjoint(first), "a new day, new digests"
    k.run_job("inbox")
    assert k.last["inbox"].notified == [gate], "digests themselves are not notified"


def test_a_second_digest_firing_after_more_work_keeps_the_days_task(local_fabric: Fabric) -> None:
    # `agap keeper --once` twice in a day, with a completion in between: the day's digest
    # has other content now, and that is not a collision to fail on.
    k = keeper(local_fabric)
    assert k.run_job("digest")
    first = {r.task_id for r in k.last["digest"]}
    done = local_fabric.submit("tidy the notes", target="kimi", actor="alvis").task_id
    lease = local_fabric.ledger.claim(local_fabric.board.read(done), "w1", lease_seconds=60)
    local_fabric.ledger.complete(lease, "file:///notes.md")
    assert k.run_job("digest"), "the second firing of the day must not fail"
    again = k.last["digest"]
    assert {r.task_id for r in again} == first and not any(r.created for r in again)
    assert all(r.uid and r.queue for r in again)


# -- lock-tag GC --------------------------------------------------------------------------------


def tag_names(fab: Fabric) -> set[str]:
    tags = fab.port.call("getTagsByProject", {"project_id": fab.board.layout.locks_project_id})
    return {str(t["name"]) for t in tags or []}


def closed_task(fab: Fabric, intent: str, key: str | None = None) -> str:
    tid = fab.submit(intent, target="kimi", key=key, actor="cron").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.complete(lease, "file:///r")
    fab.ledger.verify(tid, "alvis")
    uid = fab.board.read(tid).uid
    assert uid is not None
    return uid


def test_gc_removes_only_the_tags_of_tasks_closed_longer_than_the_retention(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    old = closed_task(local_fabric, "old", key="old-action")
    clock.advance(31 * DAY)
    recent = closed_task(local_fabric, "recent", key="recent-action")
    active_id = local_fabric.submit("still running", target="kimi").task_id
    local_fabric.ledger.claim(local_fabric.board.read(active_id), "w1", lease_seconds=60)
    active = local_fabric.board.read(active_id).uid
    assert active is not None
    before = tag_names(local_fabric)
    assert {epoch_lock(old, 1), epoch_lock(old, 3), receipt_lock("cron", "old-action")} <= before
    k = keeper(local_fabric, retention=30 * DAY)
    assert k.run_job("gc")
    removed = set(k.last["gc"].removed)
    # e0 is the tag binding the uid to its task (fabric.submit): it goes with the others.
    assert removed == {epoch_lock(old, n) for n in (0, 1, 2, 3)} | {receipt_lock("cron", "old-action")}
    after = tag_names(local_fabric)
    assert after == before - removed
    assert epoch_lock(recent, 3) in after and epoch_lock(active, 1) in after
    assert k.metrics.gc_removed_total == 5


def test_gc_removes_orphaned_tags_only_after_the_retention(local_fabric: Fabric, clock: FakeClock) -> None:
    gone = closed_task(local_fabric, "to be deleted")
    row = local_fabric.port.call(
        "getTaskByReference", {"project_id": local_fabric.board.layout.project_id, "reference": f"uid:{gone}"}
    )
    assert row is None or row  # reference is the action id when given; here it is the uid
    tid = next(r.id for r in local_fabric.board.search("status:closed"))
    local_fabric.port.call("removeTask", {"task_id": tid})
    k = keeper(local_fabric, retention=30 * DAY)
    assert k.run_job("gc") and k.last["gc"].removed == [] and k.last["gc"].orphans_seen == 4
    clock.advance(31 * DAY)
    assert k.run_job("gc")
    assert set(k.last["gc"].removed) == {epoch_lock(gone, n) for n in (0, 1, 2, 3)}
