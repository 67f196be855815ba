"""Publishing events: sealed, ordered, retried a little, and never in the way.

Callers publish *after* the ledger transition they report. :meth:`Publisher.publish`
only queues the event; one background thread sends the queue in order, retrying a
broker that is away with a bounded backoff and then skipping the event (the board is
the authority; watchers fall back to it). After a skip the publisher makes a single
quick attempt per event until the broker answers again, so a dead broker never builds
a backlog. :meth:`flush` waits (bounded) for the queue to drain, for short-lived
processes such as ``agap submit``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from fabric.events.schema import SEQ_STRIDE, Event, EventType
from fabric.events.signing import seal
from fabric.events.transport import Topic, Transport, TransportError, task_topic
from fabric.plain import Plain
from fabric.signals import stop_requested

log = logging.getLogger("agap.events")


class PublisherStats(Plain, frozen=False):
    published: int = 0
    skipped: int = 0  # the broker did not take it after the retries
    overflowed: int = 0  # the outbox was full: the oldest waiting event was dropped
    attempts: int = 0


class Publisher:
    """Seals events with the fabric secret and sends them through one transport."""

    def __init__(
        self,
        transport: Transport,
        secret: bytes,
        *,
        attempts: int = 3,
        first_delay: float = 0.2,
        max_delay: float = 1.0,
        timeout: float = 2.0,
        outbox: int = 1000,
        background: bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not secret:
            raise ValueError("events are never published unsigned: a secret is required")
        self.transport = transport
        self.secret = secret
        self.attempts = max(1, attempts)
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.timeout = timeout
        self.stats = PublisherStats()
        self._sleep = sleep
        self._degraded = False  # the last event was skipped: one quick try each until back
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Event, tuple[Topic, ...]]] = collections.deque(maxlen=outbox)
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._drain, name="agap-events", daemon=True)
            self._thread.start()

    # -- the API --------------------------------------------------------------------

    def publish(self, event: Event, *, also: tuple[Topic, ...] = ()) -> None:
        """Queue ``event`` for its task's topic (and ``also`` these). Never raises, never blocks."""
        if self._thread is None:
            self.send(event, also=also)
            return
        with self._cond:
            if self._closed:
                return
            if len(self._queue) == self._queue.maxlen:
                self.stats.overflowed += 1
            self._queue.append((event, also))
            self._cond.notify_all()

    def send(self, event: Event, *, also: tuple[Topic, ...] = ()) -> bool:
        """Send now, with bounded retries; True if the broker acknowledged every topic."""
        payload = seal(event, self.secret)
        ok = True
        for topic in (task_topic(event.task_id), *also):
            ok = (
                self._send_one(
                    topic,
                    payload,
                    retain=event.terminal and topic.kind == "task",
                    what=f"{event.kind} #{event.task_id} seq {event.seq}",
                )
                and ok
            )
        return ok

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until the outbox is empty (or ``timeout``); True when it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Flush, stop the sender and close the transport, all within ``timeout``."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self.transport.close()

    # -- internals ------------------------------------------------------------------

    def _send_one(self, topic: Topic, payload: bytes, *, retain: bool, what: str) -> bool:
        tries = 1 if self._degraded else self.attempts
        delay = self.first_delay
        for attempt in range(1, tries + 1):
            self.stats.attempts += 1
            try:
                self.transport.publish(topic, payload, retain=retain, timeout=self.timeout)
            except TransportError as exc:
                if attempt == tries:
                    self.stats.skipped += 1
                    if not self._degraded:
                        log.warning(
                            "event broker unavailable (%s): skipping %s; the board stays the authority",
                            exc,
                            what,
                        )
                    self._degraded = True
                    return False
                if stop_requested():  # a stopping process does not wait for a broker
                    self.stats.skipped += 1
                    return False
                self._sleep(delay)
                delay = min(self.max_delay, delay * 2)
                continue
            if self._degraded:
                log.info("event broker is back")
            self._degraded = False
            self.stats.published += 1
            return True
        return False  # pragma: no cover

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                event, also = self._queue.popleft()
                self._busy = True
            try:
                self.send(event, also=also)
            except Exception:  # a bug here must not kill the sender
                log.exception("publishing %s for task #%s failed", event.kind, event.task_id)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class Sequencer:
    """Per-task counters within an epoch (see :mod:`fabric.events.schema` for seq)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[int, tuple[int, int]] = {}  # task id -> (epoch, next counter)

    def next(self, task_id: int, epoch: int, *, start: bool = False) -> int | None:
        """The next counter in ``epoch``; None when the epoch is stale or the counter spent.

        ``start`` resets the epoch's counter to 0 (a claim: the first event of the epoch).
        """
        with self._lock:
            held = self._at.get(task_id)
            if held is not None and epoch < held[0]:
                return None
            counter = 0 if start or held is None or epoch > held[0] else held[1]
            if counter >= SEQ_STRIDE:
                return None
            self._at[task_id] = (epoch, counter + 1)
            return counter

    def forget(self, task_id: int, epoch: int) -> None:
        """The process is done with the task at ``epoch``: keep only a floor."""
        with self._lock:
            held = self._at.get(task_id)
            if held is None or held[0] <= epoch:
                self._at.pop(task_id, None)


def transition_event(
    task_id: int,
    epoch: int,
    type: EventType,
    detail: str = "",
    data: dict[str, str | int | float | bool | None] | None = None,
) -> Event:
    """An event reporting the record a transition wrote at ``epoch`` (counter 0)."""
    return Event.make(task_id, epoch, 0, type, detail, data)


__all__ = ["Publisher", "PublisherStats", "Sequencer", "transition_event"]
