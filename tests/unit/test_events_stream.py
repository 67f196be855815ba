"""What watchers accept, how publishers number events, and how workers map onto them."""

from __future__ import annotations

import pytest

from fabric.errors import EXIT_TIMEOUT, ConfigError
from fabric.events.publisher import Publisher, Sequencer
from fabric.events.schema import Event, EventType
from fabric.events.signing import seal
from fabric.events.subscriber import TaskStream
from fabric.events.transport import Topic, queue_topic, task_topic, token
from fabric.ledger import Lease
from fabric.settings.events import EventsConfig
from fabric.task import TaskSpec
from workers.attach import WorkerEvents

SECRET = b"unit-test-secret-0123456789"


def sealed(tid: int, epoch: int, counter: int, kind: str) -> bytes:
    return seal(Event.make(tid, epoch, counter, kind), SECRET)


def test_the_stream_accepts_each_seq_once_in_order() -> None:
    s = TaskStream(4, SECRET)
    assert s.offer(sealed(4, 1, 0, "started")) is not None
    assert s.offer(sealed(4, 1, 0, "started")) is None  # duplicate
    assert s.offer(sealed(4, 1, 2, "progress")) is not None
    assert s.offer(sealed(4, 1, 1, "progress")) is None  # late
    assert s.offer(sealed(4, 3, 0, "started")) is not None  # a newer owner wins
    assert s.offer(sealed(4, 1, 3, "progress")) is None  # the old owner, late
    assert s.dropped == {"duplicate or out of order": 3}


def test_nothing_changes_after_a_terminal_event() -> None:
    s = TaskStream(4, SECRET)
    assert s.offer(sealed(4, 2, 0, "completed")) is not None
    assert s.offer(sealed(4, 2, 1, "progress")) is None
    assert s.offer(sealed(4, 5, 0, "failed")) is None
    assert s.terminal is not None and s.terminal.kind == EventType.COMPLETED
    assert s.dropped == {"after terminal": 2}


def test_events_from_epochs_the_board_has_passed_are_stale() -> None:
    s = TaskStream(4, SECRET)
    s.raise_floor(3)
    assert s.offer(sealed(4, 2, 0, "completed")) is None  # e.g. a retained one, reopened since
    assert s.offer(sealed(4, 3, 0, "started")) is not None
    assert s.dropped == {"stale epoch": 1}


def test_the_sequencer_numbers_within_an_epoch_and_refuses_stale_epochs() -> None:
    q = Sequencer()
    assert [q.next(1, 2, start=True), q.next(1, 2), q.next(1, 2)] == [0, 1, 2]
    assert q.next(1, 4, start=True) == 0
    assert q.next(1, 2) is None  # a fenced owner's late progress is not published
    q.forget(1, 5)
    assert q.next(1, 2) == 0


class Captured(Publisher):
    """The real publisher, with the send captured (what the mapping queues, in order)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.secret = SECRET

    def publish(self, event: Event, *, also: tuple[Topic, ...] = ()) -> None:
        self.events.append(event)


def lease(epoch: int) -> Lease:
    spec = TaskSpec.from_dict(
        {
            "intent": "x",
            "target": "tester",
            "queue": "tester",
            "actor": "cli",
            "submitted_at": 1.0,
            "priority": 1,
            "max_attempts": 3,
        }
    )
    return Lease(7, "0123456789abcdef", epoch, "w1", 99.0, 1, spec)


def test_worker_events_map_onto_the_schema() -> None:
    pub = Captured()
    listener = WorkerEvents(pub)
    listener("started", lease(1), "attempt 1")
    listener("progress", lease(1), "half")
    listener("progress", lease(1), "most")
    listener("completed", lease(1), "kanboard://task/7/file/r.md")
    listener("fenced", lease(3), "a newer epoch exists")
    listener("started", lease(5), "attempt 2")
    listener("released", lease(5), "worker stopping")
    listener("started", lease(7), "")
    listener("input_required", lease(7), "which one?")
    listener("started", lease(9), "")
    listener("failed", lease(9), "attempts exhausted")
    got = [(e.event.value, e.kind.value, e.epoch, e.counter) for e in pub.events]
    assert got == [
        ("started", "started", 1, 0),
        ("progress", "progress", 1, 1),
        ("progress", "progress", 1, 2),
        ("completed", "completed", 2, 0),
        ("started", "started", 5, 0),
        ("progress", "progress", 6, 0),
        ("started", "started", 7, 0),
        ("permission_required", "input_required", 8, 0),
        ("started", "started", 9, 0),
        ("error", "failed", 10, 0),
    ]
    assert pub.events[3].data == {"kind": "completed", "result_ref": "kanboard://task/7/file/r.md"}
    assert pub.events[5].data == {"kind": "progress", "requeued": True}
    seqs = [e.seq for e in pub.events]
    assert seqs == sorted(seqs)


def test_a_local_result_path_is_not_published() -> None:
    pub = Captured()
    WorkerEvents(pub)("completed", lease(1), "file:///home/me/out.md")
    assert pub.events[0].data == {"kind": "completed"} and "/home" not in pub.events[0].detail


def test_topics_are_safe_tokens() -> None:
    assert token("a.b c/#+>*") == "a_b_c_____"
    assert task_topic(12) == Topic("task", "12") and queue_topic("q") == Topic("queue", "q")


def test_config_from_the_environment() -> None:
    assert EventsConfig.from_env({}) is None
    cfg = EventsConfig.from_env(
        {
            "AGAP_EVENTS_URL": "mqtts://u:p%40ss@broker:9999",
            "AGAP_EVENTS_SECRET": "s" * 16,
            "AGAP_EVENTS_PREFIX": "fab",
            "AGAP_EVENTS_WEBHOOK": "127.0.0.1:8099",
        }
    )
    assert cfg is not None
    assert (cfg.scheme, cfg.host, cfg.port, cfg.tls, cfg.username, cfg.password, cfg.prefix) == (
        "mqtt",
        "broker",
        9999,
        True,
        "u",
        "p@ss",
        "fab",
    )
    assert cfg.webhook == ("127.0.0.1", 8099)
    assert "p@ss" not in repr(cfg) and "sss" not in repr(cfg) and cfg.url == "mqtts://broker:9999"
    nats = EventsConfig.from_env(
        {"AGAP_EVENTS_URL": "nats://127.0.0.1", "AGAP_EVENTS_SECRET": "s" * 16, "AGAP_EVENTS_JETSTREAM": "0"}
    )
    assert nats is not None and (nats.scheme, nats.port, nats.jetstream) == ("nats", 4222, False)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"AGAP_EVENTS_URL": "mqtt://x"}, "AGAP_EVENTS_SECRET is not"),
        ({"AGAP_EVENTS_URL": "mqtt://x", "AGAP_EVENTS_SECRET": "short"}, "too short"),
        ({"AGAP_EVENTS_URL": "amqp://x", "AGAP_EVENTS_SECRET": "s" * 16}, "scheme"),
        *[
            (
                {"AGAP_EVENTS_URL": "mqtt://x", "AGAP_EVENTS_SECRET": "s" * 16, "AGAP_EVENTS_PREFIX": bad},
                "prefix",
            )
            for bad in ("a/+", "a//b", "/a", "a/b/c/d/e", "a.b", "#")
        ],
    ],
)
def test_bad_config_is_refused_clearly(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EventsConfig.from_env(env)


def test_a_publisher_refuses_to_exist_without_a_secret() -> None:
    with pytest.raises(ValueError, match="unsigned"):
        Publisher(object(), b"")  # type: ignore[arg-type]


def test_without_a_broker_watch_follows_the_board() -> None:
    from fabric.events.subscriber import BoardStatus, WatchOptions, watch
    from fabric.kanboard.port import BoardUnavailable
    from fabric.task import State

    states = iter(
        [
            BoardStatus(State.QUEUED, 0),
            BoardStatus(State.WORKING, 1),
            BoardStatus(State.CANCELED, 2, reason="stop"),
        ]
    )
    lines: list[dict[str, object]] = []
    opts = WatchOptions(timeout=5, idle_timeout=5, board_poll=0.01)
    result = watch(
        3, board=lambda: next(states), emit=lines.append, transport=None, secret=None, options=opts
    )
    assert (result.code, result.board_checks) == (1, 3)
    (line,) = lines
    assert str(line.pop("timestamp")).endswith("Z")
    assert line == {
        "source": "board",
        "schema_version": 1,
        "seq": 2_000_001,
        "job_id": "3",
        "event": "error",
        "detail": "stop",
        "data": {"kind": "canceled", "state": "canceled"},
    }

    def away() -> BoardStatus:
        raise BoardUnavailable("down")

    assert watch(3, board=away, emit=lines.append, transport=None, secret=None, options=opts).code == 3
    idle = WatchOptions(timeout=5, idle_timeout=0.2, board_poll=0.05)
    assert (
        watch(
            3,
            board=lambda: BoardStatus(State.WORKING, 1),
            emit=lines.append,
            transport=None,
            secret=None,
            options=idle,
        ).code
        == EXIT_TIMEOUT
    )
