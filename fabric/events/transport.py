"""One interface over the brokers: publish a payload to a topic, subscribe with a sink.

Topics are logical: one per task (every event of the task), one per queue (its submit
events, the workers' wake-up hints). Each transport maps them onto its own namespace
under the configured prefix. Subscriptions connect in the background and report to a
sink: ``up`` when (re)connected and subscribed, ``down`` when the broker is away,
``msg`` for each payload. Sinks must be quick and must not raise.

The brokers' implementations (:mod:`.mqtt`, :mod:`.nats`) build on these types;
:func:`fabric.events.brokers.open_transport` picks one by URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, Protocol

from fabric.plain import Plain


class TransportError(Exception):
    """A publish did not reach the broker (or was not acknowledged in time)."""


class Topic(Plain):
    kind: Literal["task", "queue"]
    name: str


def task_topic(task_id: int) -> Topic:
    return Topic("task", str(int(task_id)))


def queue_topic(queue: str) -> Topic:
    return Topic("queue", queue)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(name: str) -> str:
    """A name made safe for both MQTT topic levels and NATS subject tokens."""
    return _UNSAFE.sub("_", name) or "_"


class Signal(Plain):
    kind: Literal["up", "down", "msg"]
    payload: bytes = b""
    detail: str = ""


Sink = Callable[[Signal], None]


class Subscription(Protocol):
    def close(self) -> None: ...


class Transport(Protocol):
    """A broker connection for publishing, and a factory of subscriptions."""

    name: str

    def publish(self, topic: Topic, payload: bytes, *, retain: bool, timeout: float) -> None:
        """Deliver ``payload`` (at least once); raise :class:`TransportError` if not acknowledged."""
        ...

    def subscribe(self, topic: Topic, sink: Sink) -> Subscription:
        """Start a background subscription; it reconnects by itself until closed."""
        ...

    def close(self) -> None: ...


__all__ = [
    "Signal",
    "Sink",
    "Subscription",
    "Topic",
    "Transport",
    "TransportError",
    "queue_topic",
    "task_topic",
    "token",
]
