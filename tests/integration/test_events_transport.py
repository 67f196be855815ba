"""Live events over the real brokers: delivery, order, dedupe, signatures, retention."""

from __future__ import annotations

import contextlib
import json
import queue
import time

from fabric.core import Fabric
from fabric.events.brokers import open_transport
from fabric.events.publisher import Publisher
from fabric.events.schema import Event, EventType
from fabric.events.signing import seal
from fabric.events.subscriber import EXIT_COMPLETED, BoardStatus
from fabric.events.transport import Signal, task_topic
from fabric.kanboard.port import BoardUnavailable
from fabric.task import State
from tests.helpers import wait_until
from tests.integration.test_events_helpers import QUEUE, Broker, Watching, board_check

pytest_plugins = ["tests.integration.test_events_helpers"]  # the fixtures


def ev(tid: int, epoch: int, counter: int, kind: EventType, detail: str = "") -> Event:
    return Event.make(tid, epoch, counter, kind, detail)


def test_publish_reaches_a_subscriber_in_order(shared_broker: Broker) -> None:
    cfg = shared_broker.config
    transport = open_transport(cfg)
    got: queue.Queue[Signal] = queue.Queue()
    sub = open_transport(cfg).subscribe(task_topic(7), got.put)
    try:
        assert got.get(timeout=30).kind == "up"
        pub = Publisher(transport, cfg.secret, background=False)
        for i in range(20):
            assert pub.send(ev(7, 1, i, EventType.PROGRESS if i else EventType.STARTED, f"n{i}"))
        seqs: list[int] = []
        while len(seqs) < 20:
            sig = got.get(timeout=30)
            if sig.kind == "msg":
                seqs.append(json.loads(sig.payload)["seq"])
        assert seqs == [1_000_001 + i for i in range(20)]
        assert pub.stats.published == 20 and pub.stats.skipped == 0
    finally:
        sub.close()
        transport.close()


def test_a_late_subscriber_gets_the_retained_terminal_event_only(shared_broker: Broker) -> None:
    cfg = shared_broker.config
    shared_broker.retained_tasks.append(8)
    pub = Publisher(open_transport(cfg), cfg.secret, background=False)
    assert pub.send(ev(8, 1, 0, EventType.STARTED))
    assert pub.send(ev(8, 2, 0, EventType.COMPLETED, "done"))
    pub.close()
    got: queue.Queue[Signal] = queue.Queue()
    sub = open_transport(cfg).subscribe(task_topic(8), got.put)
    try:
        payloads: list[dict[str, object]] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not payloads:
            try:
                sig = got.get(timeout=0.2)
            except queue.Empty:
                continue
            if sig.kind == "msg":
                payloads.append(json.loads(sig.payload))
        assert [p["event"] for p in payloads] == ["completed"]
        # Anything else kept would have come with the subscription, before a message sent now.
        marker = open_transport(cfg)
        try:
            marker.publish(task_topic(8), b"marker", retain=False, timeout=5)
        finally:
            marker.close()
        after: list[bytes] = []
        deadline = time.monotonic() + 20
        while b"marker" not in after:
            assert time.monotonic() < deadline, f"the marker never arrived: {after}"
            with contextlib.suppress(queue.Empty):
                sig = got.get(timeout=0.2)
                if sig.kind == "msg":
                    after.append(sig.payload)
        assert after == [b"marker"], "only the terminal event is kept"
    finally:
        sub.close()


def test_watch_ignores_duplicates_and_late_deliveries(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("watch me", target=QUEUE).task_id
    cfg = shared_broker.config
    shared_broker.retained_tasks.append(tid)
    w = Watching(tid, board_check(fab, tid), cfg)
    transport = open_transport(cfg)
    pub = Publisher(transport, cfg.secret, background=False)
    try:
        w.wait_live()
        started, p1, p2, p3 = (
            ev(tid, 1, 0, EventType.STARTED),
            ev(tid, 1, 1, EventType.PROGRESS, "a"),
            ev(tid, 1, 2, EventType.PROGRESS, "b"),
            ev(tid, 1, 3, EventType.PROGRESS, "c"),
        )
        for e in (started, p1, p1, p3, p2, started):  # a duplicate, and two late ones
            transport.publish(task_topic(tid), seal(e, cfg.secret), retain=False, timeout=2)
        assert pub.send(ev(tid, 2, 0, EventType.COMPLETED, "ok"))
        result = w.join()
    finally:
        transport.close()
    assert result.code == EXIT_COMPLETED
    assert [(line["event"], line["seq"]) for line in w.lines] == [
        ("started", 1_000_001),
        ("progress", 1_000_002),
        ("progress", 1_000_004),
        ("completed", 2_000_001),
    ]
    assert result.dropped == {"duplicate or out of order": 3}


def test_tampered_unsigned_foreign_and_stale_events_are_dropped(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("guard me", target=QUEUE).task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w0", lease_seconds=30)  # the board: epoch 1
    cfg = shared_broker.config
    shared_broker.retained_tasks.append(tid)
    w = Watching(tid, board_check(fab, tid), cfg)
    transport = open_transport(cfg)
    try:
        w.wait_live()
        good = ev(tid, 2, 0, EventType.COMPLETED, "the real one")
        body = json.loads(seal(good, cfg.secret))
        tampered = dict(body, detail="forged")
        unsigned = dict(body, data={k: v for k, v in body["data"].items() if k != "hmac_sig"})
        wrong_version = dict(body, schema_version=2)
        other_key = json.loads(seal(good, b"another-secret-entirely-000"))
        foreign = json.loads(seal(ev(tid + 1000, 2, 0, EventType.COMPLETED), cfg.secret))
        stale = json.loads(seal(ev(tid, 0, 0, EventType.FAILED, "old"), cfg.secret))
        for bad in (tampered, unsigned, wrong_version, other_key, foreign, stale):
            transport.publish(task_topic(tid), json.dumps(bad).encode(), retain=False, timeout=2)
        transport.publish(task_topic(tid), b"not json at all", retain=False, timeout=2)
        # A good event sent after them arrives after them: once it is shown, all were seen.
        marker = seal(ev(tid, 1, 5, EventType.PROGRESS, "after the bad ones"), cfg.secret)
        transport.publish(task_topic(tid), marker, retain=False, timeout=2)
        wait_until(lambda: len(w.lines) >= 1, timeout=20, what="the marker event")
        assert w.thread.is_alive(), "no bad event may end the watch"
        transport.publish(task_topic(tid), seal(good, cfg.secret), retain=True, timeout=2)
        result = w.join()
    finally:
        transport.close()
    assert result.code == EXIT_COMPLETED
    assert [line["detail"] for line in w.lines] == ["after the bad ones", "the real one"]
    assert result.dropped == {
        "bad signature": 2,
        "unsigned": 1,
        "wrong version": 1,
        "unexpected task": 1,
        "stale epoch": 1,
        "not json": 1,
    }
    assert lease.epoch == 1


def test_a_late_watch_sees_the_retained_terminal_event_with_the_board_away(shared_broker: Broker) -> None:
    cfg = shared_broker.config
    tid = 4242
    shared_broker.retained_tasks.append(tid)
    pub = Publisher(open_transport(cfg), cfg.secret, background=False)
    assert pub.send(ev(tid, 3, 0, EventType.COMPLETED, "finished earlier"))
    pub.close()

    def board_away() -> BoardStatus:
        raise BoardUnavailable("the board is down for this test")

    started = time.monotonic()
    w = Watching(tid, board_away, cfg)
    result = w.join(30)
    # At once, not after the watch's 30 s timeouts (the bound is generous for a busy machine).
    assert result.code == EXIT_COMPLETED and time.monotonic() - started < 15
    assert [(line["source"], line["event"]) for line in w.lines] == [("broker", "completed")]


def test_a_finished_task_returns_at_once_from_the_board(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("already done", target=QUEUE).task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w0", lease_seconds=30)
    fab.ledger.complete(lease, "kanboard://x")
    started = time.monotonic()
    w = Watching(tid, board_check(fab, tid), shared_broker.config)
    result = w.join(30)
    assert result.code == EXIT_COMPLETED and time.monotonic() - started < 15  # not the 30 s timeouts
    assert w.lines[0]["source"] == "board" and w.lines[0]["data"]["state"] == State.DONE.value
