"""Real events on real Mosquitto and NATS JetStream, read by plain clients and seed 003's verifier.

The subscribers here are paho-mqtt and nats-py themselves, on the topics the README
names; the checks are tests/seed003.py (written from the seed alone) with the token the
README's example derives. Nothing on the reading side uses fabric.events.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import paho.mqtt.client as mqtt
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from paho.mqtt.enums import CallbackAPIVersion

from fabric.core import Fabric
from fabric.events.attach import attach_submitter
from tests import seed003
from tests.helpers import Running, wait_until
from tests.integration.test_events_helpers import QUEUE, SECRET, Broker, Gate, OwnBroker, make_worker
from workers.attach import attach_worker
from workers.job import JobOutcome

pytest_plugins = ["tests.integration.test_events_helpers"]  # the fixtures

README = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOLS.md").read_text(encoding="utf-8")


class MqttReader:
    """paho on ``topic``: every message with its retain flag, by task id."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.got: list[tuple[int, bytes, bool]] = []
        self.subscribed = threading.Event()
        c = self.client = mqtt.Client(CallbackAPIVersion.VERSION2)
        c.on_connect = lambda cl, u, f, rc, p: cl.subscribe(topic, qos=1)
        c.on_subscribe = lambda cl, u, mid, rcs, p: self.subscribed.set()
        c.on_message = self._message
        c.connect(broker.host, broker.port)
        c.loop_start()
        assert self.subscribed.wait(20), f"no SUBACK for {topic}"

    def _message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.payload:  # an empty retained message is a test's cleanup
            self.got.append((int(msg.topic.split("/")[-2]), bytes(msg.payload), bool(msg.retain)))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class NatsReader:
    """nats-py on ``subject`` (core NATS), in a thread of its own."""

    def __init__(self, broker: Broker, subject: str) -> None:
        self.got: list[tuple[int, bytes, bool]] = []
        self.url = f"nats://{broker.host}:{broker.port}"
        self.subscribed = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = self.run(self._start(subject))
        assert self.subscribed.is_set()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    async def _start(self, subject: str) -> Any:
        nc = await nats.connect(self.url, connect_timeout=5, allow_reconnect=False)

        async def on(msg: Any) -> None:
            self.got.append((int(msg.subject.split(".")[-2]), bytes(msg.data), False))

        await nc.subscribe(subject, cb=on)
        await nc.flush()
        self.subscribed.set()
        return nc

    def kept(self, stream: str, subject: str) -> list[bytes]:
        """What JetStream keeps on ``subject``: its last message, as a late subscriber gets it."""

        async def fetch() -> list[bytes]:
            js = self.nc.jetstream(timeout=5)
            psub = await js.pull_subscribe(
                subject,
                stream=stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE
                ),
            )
            try:
                return [bytes(m.data) for m in await psub.fetch(1, timeout=5)]
            finally:
                await psub.unsubscribe()

        return list(self.run(fetch()))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def reader(shared_broker: Broker) -> Iterator[MqttReader | NatsReader]:
    """A plain subscriber to every task topic of the test's prefix, up before anything is sent."""
    p = shared_broker.prefix
    r: MqttReader | NatsReader
    if shared_broker.kind == "mqtt":
        r = MqttReader(shared_broker, f"{p}/jobs/+/events")
    else:
        r = NatsReader(shared_broker, f"{p}.jobs.*.*")
    yield r
    r.close()


def run_to_end(
    fab: Fabric, broker: Broker, reader: MqttReader | NatsReader, gate: Gate, end: str
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run one task with a hooked worker until the plain subscriber saw its ``end`` event.

    Returns the task id, its token (derived as the README shows) and its events, each
    checked by the seed's verifier, in the order the subscriber got them.
    """
    worker = make_worker(fab, gate)
    att = attach_worker(worker, env=broker.env(), wake=False)
    assert att is not None
    tid = fab.submit(f"be seen by a seed-003 subscriber ({end})", target=QUEUE).task_id
    broker.retained_tasks.append(tid)
    if fab.submit_listeners:
        # The submit's event leaves from another connection than the worker's: nothing
        # orders the two on the wire, so the worker starts once the subscriber has it.
        wait_until(lambda: any(t == tid for t, _, _ in reader.got), 30, "the submitted event")
    marker = f'"event":"{end}"'.encode()
    with Running(worker):

        def ended() -> bool:
            return any(marker in raw for t, raw, _ in reader.got if t == tid)

        wait_until(ended, 30, f"the {end} event on the plain subscriber")
    att.close()
    token = seed003.readme_verifier(README)["task_token"](SECRET, str(tid))
    return tid, token, seed003.check_stream([raw for t, raw, _ in reader.got if t == tid], token, str(tid))


def kept_for_later(broker: Broker, reader: MqttReader | NatsReader, tid: int) -> list[bytes]:
    """What a subscriber that comes after the end gets: the retained message (MQTT), or
    the last message JetStream keeps on the task's terminal subject (NATS)."""
    if isinstance(reader, NatsReader):
        stream = broker.prefix.replace("/", "_").upper() + "_EVENTS"  # the README's stream name
        return reader.kept(stream, f"{broker.prefix.replace('/', '.')}.jobs.{tid}.end")
    late = MqttReader(broker, f"{broker.prefix}/jobs/{tid}/events")
    try:
        wait_until(lambda: bool(late.got), 20, "the retained message")
    finally:
        late.close()
    assert [retained for _, _, retained in late.got] == [True]
    return [raw for _, raw, _ in late.got]


def test_a_task_s_live_events_pass_the_seed_verifier(
    shared_broker: Broker, fab: Fabric, reader: MqttReader | NatsReader
) -> None:
    assert attach_submitter(fab, env=shared_broker.env()) is not None
    tid, token, events = run_to_end(fab, shared_broker, reader, Gate(steps=2, hold=False), "completed")
    assert [(e["event"], e["data"]["kind"]) for e in events] == [
        ("progress", "submitted"),
        ("started", "started"),
        ("progress", "progress"),
        ("progress", "progress"),
        ("completed", "completed"),
    ]
    assert events[0]["seq"] == 1  # the first publish of the task
    assert events[-1]["data"]["result_ref"] == f"kanboard://task/{tid}/file/r.md"
    raws = kept_for_later(shared_broker, reader, tid)
    (final,) = [seed003.check(raw, token, str(tid)) for raw in raws]
    assert (final["event"], final["seq"]) == ("completed", events[-1]["seq"])
    other = seed003.readme_verifier(README)["task_token"](SECRET, str(tid + 1))
    with pytest.raises(seed003.Rejected, match="HMAC"):  # another task's token does not open it
        seed003.check(raws[0], other, str(tid))


def test_a_failed_task_ends_with_a_retained_error_event(
    shared_broker: Broker, fab: Fabric, reader: MqttReader | NatsReader
) -> None:
    gate = Gate(outcome=JobOutcome.failed("it broke", poison=True), hold=False)
    tid, token, events = run_to_end(fab, shared_broker, reader, gate, "error")
    assert [e["event"] for e in events] == ["started", "progress", "progress", "error"]  # no submitter
    assert events[-1]["data"]["kind"] == "failed"
    (final,) = [seed003.check(raw, token, str(tid)) for raw in kept_for_later(shared_broker, reader, tid)]
    assert (final["event"], final["seq"]) == ("error", events[-1]["seq"])


def test_with_the_seed_s_prefix_the_events_are_on_the_seed_s_own_topics(
    own_broker: OwnBroker, fab: Fabric
) -> None:
    """AGAP_EVENTS_PREFIX=python/mqtt: a seed-003 subscriber of python/mqtt/jobs/<id>/events
    (on NATS, python.mqtt.jobs.<id>.*) reads the fabric's events unchanged."""
    broker = replace(own_broker.broker(), prefix="python/mqtt")
    r: MqttReader | NatsReader
    if broker.kind == "mqtt":
        r = MqttReader(broker, "python/mqtt/jobs/+/events")
    else:
        r = NatsReader(broker, "python.mqtt.jobs.*.*")
    try:
        tid, token_, events = run_to_end(fab, broker, r, Gate(steps=1, hold=False), "completed")
        assert events[-1]["event"] == "completed"
        (final,) = [seed003.check(raw, token_, str(tid)) for raw in kept_for_later(broker, r, tid)]
        assert final["event"] == "completed"
    finally:
        r.close()
