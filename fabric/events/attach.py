"""Hooking live events into submitters, switched on by the environment.

The hook does nothing when ``AGAP_EVENTS_URL`` is unset, and refuses to start (a
:class:`~fabric.errors.ConfigError`) when it is set without ``AGAP_EVENTS_SECRET``::

    attach_submitter(fab)        # in the CLI, after Fabric.connect() (submit, cancel)

A submitter publishes ``submitted`` (on the task's topic and its queue's) and
``canceled``. Workers are hooked up by :mod:`workers.attach`.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fabric.events.publisher import Publisher, transition_event
from fabric.events.schema import Event, EventType
from fabric.events.transport import queue_topic
from fabric.settings.events import EventsConfig
from fabric.submit import Receipt
from fabric.task import Record, TaskSpec

if TYPE_CHECKING:
    from fabric.core import Fabric

# What an exiting process gives its last events (within the 3 s stop bound, fabric.signals).
FLUSH_AT_EXIT = 1.0


def submitted_event(receipt: Receipt) -> Event:
    return transition_event(
        receipt.task_id,
        0,
        EventType.SUBMITTED,
        f"queued on {receipt.queue}",
        # The uid lets a woken worker read the task and try its first claim's lock in one
        # round trip (workers.queue.WakeHints): the event is signed, the read checks it.
        {"queue": receipt.queue, "uid": receipt.uid},
    )


def canceled_event(task_id: int, record: Record) -> Event:
    return transition_event(task_id, record.epoch, EventType.CANCELED, record.reason or "canceled")


_SHARED: dict[tuple[str, str], Publisher] = {}
_SHARED_LOCK = threading.Lock()


def shared_publisher(config: EventsConfig) -> Publisher:
    """One publisher per broker and prefix for the whole process, flushed at exit."""
    key = (config.url, config.prefix)
    with _SHARED_LOCK:
        pub = _SHARED.get(key)
        if pub is None:
            from fabric.events.brokers import open_transport  # heavy (nats, aiohttp): off the CLI path

            pub = _SHARED[key] = Publisher(open_transport(config), config.secret)
            atexit.register(pub.close, FLUSH_AT_EXIT)
        return pub


def attach_submitter(
    fab: Fabric,
    env: Mapping[str, str] | None = None,
    *,
    config: EventsConfig | None = None,
    publisher: Publisher | None = None,
) -> Publisher | None:
    """Publish ``submitted`` after each submit and ``canceled`` after each cancel of ``fab``.

    The cancel hook wraps this connection's ``ledger.cancel``: the transition is made
    first, then the event is queued. None when events are off.
    """
    config = config or EventsConfig.from_env(env)
    if config is None:
        return None
    pub = publisher or shared_publisher(config)

    def on_submit(receipt: Receipt, spec: TaskSpec) -> None:
        if receipt.created:
            pub.publish(submitted_event(receipt), also=(queue_topic(receipt.queue),))

    fab.submit_listeners.append(on_submit)
    ledger = fab.ledger
    cancel = ledger.cancel

    def cancel_and_publish(task_id: int, by: str, reason: str = "", view: Any = None) -> Record:
        record = cancel(task_id, by, reason, view)
        with contextlib.suppress(Exception):  # publishing is never on the correctness path
            pub.publish(canceled_event(task_id, record))
        return record

    setattr(ledger, "cancel", cancel_and_publish)  # noqa: B010 (an instance hook, on purpose)
    return pub


__all__ = [
    "FLUSH_AT_EXIT",
    "attach_submitter",
    "canceled_event",
    "shared_publisher",
    "submitted_event",
]
