"""Receiving events: the per-task filter, ``watch`` with its board fallback, and wake-ups.

:class:`TaskStream` decides what a watcher believes. It drops payloads that are unsigned,
badly signed, of another schema version, for another task, from an epoch older than
the board's, or not newer (by seq) than the last one accepted; after a terminal event
nothing changes any more.

:func:`watch` runs one task's watch to an exit code. It subscribes first, then asks the
board (so nothing that finished in between is missed), asks again whenever the broker
comes back or goes away, and polls the board while the broker is away. It gives up with
:data:`EXIT_UNAVAILABLE` only when the broker is away *and* the board does not answer.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import field
from typing import Any

from fabric.errors import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_UNREACHABLE
from fabric.events.schema import (
    KIND_FIELD,
    SCHEMA_VERSION,
    WIRE_EVENT,
    Event,
    EventType,
    WireEvent,
    make_seq,
    utc_stamp,
)
from fabric.events.signing import Dropped, open_sealed
from fabric.events.transport import Signal, Subscription, Transport, queue_topic, task_topic
from fabric.kanboard.port import BoardError
from fabric.plain import Plain
from fabric.task import State

log = logging.getLogger("agap.events.watch")

# agap watch's outcomes, from the one exit-code table.
EXIT_COMPLETED = EXIT_OK
# EXIT_FAILED: failed or canceled; EXIT_TIMEOUT: the wait ran out
EXIT_UNAVAILABLE = EXIT_UNREACHABLE  # broker away and the board did not answer either

EXIT_OF_EVENT = {WireEvent.COMPLETED: EXIT_COMPLETED, WireEvent.ERROR: EXIT_FAILED}
EVENT_OF_STATE = {
    State.DONE: EventType.COMPLETED,
    State.CLOSED: EventType.COMPLETED,
    State.DEAD: EventType.FAILED,
    State.CANCELED: EventType.CANCELED,
    State.DROPPED: EventType.FAILED,
}


class TaskStream:
    """What a watcher of one task accepts, in order."""

    def __init__(self, task_id: int, secret: bytes) -> None:
        self.task_id = task_id
        self.secret = secret
        self.floor = 0  # events from epochs below this are stale (the board is past them)
        self.last_seq = -1
        self.terminal: Event | None = None
        self.dropped: Counter[str] = Counter()

    def raise_floor(self, epoch: int) -> None:
        self.floor = max(self.floor, epoch)

    def offer(self, raw: bytes) -> Event | None:
        """The event if it changes what the watcher knows; None (counted, logged) if not."""
        try:
            event = open_sealed(raw, self.secret, expected_task=self.task_id)
        except Dropped as exc:
            return self._drop(exc.reason)
        if self.terminal is not None:
            return self._drop("after terminal")
        if event.epoch < self.floor:
            return self._drop("stale epoch")
        if event.seq <= self.last_seq:
            return self._drop("duplicate or out of order")
        self.last_seq = event.seq
        if event.terminal:
            self.terminal = event
        return event

    def _drop(self, reason: str) -> Event | None:
        self.dropped[reason] += 1
        log.debug("task #%s: dropped an event (%s)", self.task_id, reason)
        return None


class BoardStatus(Plain):
    """What the board says about the task (the authority)."""

    state: State
    epoch: int
    result_ref: str | None = None
    reason: str | None = None

    @property
    def final_event(self) -> EventType | None:
        return EVENT_OF_STATE.get(self.state)

    def line(self, task_id: int, kind: EventType) -> dict[str, Any]:
        """The watch line for what the board says: the keys of a live line (:func:`live_line`).

        Not an :class:`Event`: nothing here is published, so the reason and the result
        ref print as the board has them. ``seq`` is that of the event the transition
        that wrote this record publishes.
        """
        data: dict[str, Any] = {KIND_FIELD: kind.value, "state": self.state.value}
        if self.result_ref:
            data["result_ref"] = self.result_ref
        return {
            "source": "board",
            "schema_version": SCHEMA_VERSION,
            "seq": make_seq(self.epoch, 0),
            "job_id": str(task_id),
            "event": WIRE_EVENT[kind].value,
            "timestamp": utc_stamp(),
            "detail": self.reason or kind.value,
            "data": data,
        }


def live_line(event: Event) -> dict[str, Any]:
    """The watch line for an accepted live event: its fields, as sent (minus the signature)."""
    return {"source": "broker", **event.body()}


BoardCheck = Callable[[], BoardStatus]  # raises BoardError when the board is away


class WatchOptions(Plain, frozen=False):
    timeout: float = 3600.0  # wall clock
    idle_timeout: float = 600.0  # no accepted event (nor board change) for this long
    board_poll: float = 2.0  # board poll interval while the broker is away
    recheck: float = 30.0  # a safety board check while the broker is up (0: never)
    connect_grace: float = 3.0  # how long "connecting" may last before it counts as away


class WatchResult(Plain, frozen=False):
    code: int
    reason: str
    events: int = 0
    board_checks: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def watch(
    task_id: int,
    *,
    board: BoardCheck,
    emit: Callable[[dict[str, Any]], None],
    transport: Transport | None,
    secret: bytes | None,
    options: WatchOptions | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_live: Callable[[], None] | None = None,
) -> WatchResult:
    """Watch one task until it ends, a timeout passes, or neither broker nor board answers.

    ``on_live`` is called each time the subscription is up and the board was checked
    after it (from then on nothing the task does is missed).
    """
    stream = TaskStream(task_id, secret or b"")
    signals: queue.Queue[Signal] = queue.Queue()
    sub: Subscription | None = None
    if transport is not None and secret:
        sub = transport.subscribe(task_topic(task_id), signals.put)
    run = _Watch(task_id, board, emit, options or WatchOptions(), clock, on_live, stream, sub is not None)
    try:
        while not run.turn(signals):
            pass
        return run.result
    finally:
        run.result.dropped = dict(stream.dropped)
        if sub is not None:
            sub.close()


class _Watch:
    """The state of one :func:`watch`: the broker's, the board's, and the result so far.

    Each method that may end the watch returns True when it does (``result`` says how).
    """

    def __init__(
        self,
        task_id: int,
        board: BoardCheck,
        emit: Callable[[dict[str, Any]], None],
        opts: WatchOptions,
        clock: Callable[[], float],
        on_live: Callable[[], None] | None,
        stream: TaskStream,
        subscribed: bool,
    ) -> None:
        self.task_id = task_id
        self.board = board
        self.emit = emit
        self.opts = opts
        self.clock = clock
        self.on_live = on_live
        self.stream = stream
        self.start = clock()
        self.broker = "connecting" if subscribed else "off"
        self.result = WatchResult(EXIT_TIMEOUT, "")
        self.last_activity = self.start
        self.next_board = self.start
        self.board_epoch: int | None = None

    def turn(self, signals: queue.Queue[Signal]) -> bool:
        """One turn: the board if it is due, the timeouts, then one signal (or none)."""
        now = self.clock()
        if now >= self.next_board and self._ends(self.check_board(now)):
            return True
        if self._timed_out(now):
            return True
        opts = self.opts
        wait = min(self.start + opts.timeout, self.last_activity + opts.idle_timeout, self.next_board) - now
        try:
            sig = signals.get(timeout=max(0.0, min(wait, 0.25)))
        except queue.Empty:
            self._quiet()
            return False
        if sig.kind == "up":
            return self._up()
        if sig.kind == "down":
            self._down(sig.detail)
            return False
        return self._message(sig.payload)

    def check_board(self, now: float) -> int | None:
        """Ask the board; the exit code when it says the task ended (or nobody answers)."""
        self.result.board_checks += 1
        try:
            status = self.board()
        except BoardError as exc:
            if self.broker in ("down", "off"):
                log.error(
                    "task #%s: the event broker is away and the board does not answer (%s)", self.task_id, exc
                )
                self.result.reason = "broker and board unavailable"
                return EXIT_UNAVAILABLE
            log.warning("task #%s: the board does not answer (%s); following the broker", self.task_id, exc)
            self.next_board = now + (0.5 if self.broker == "connecting" else self.opts.board_poll)
            return None
        if (kind := status.final_event) is not None:
            self.emit(status.line(self.task_id, kind))
            self.result.reason = f"board: {status.state.value}"
            return EXIT_OF_EVENT[WIRE_EVENT[kind]]
        if self.board_epoch is not None and status.epoch > self.board_epoch:
            self.last_activity = now  # the task moved: that is activity too
        self.board_epoch = status.epoch
        self.stream.raise_floor(status.epoch)
        if self.broker == "up":
            self.next_board = now + self.opts.recheck if self.opts.recheck > 0 else float("inf")
        else:
            self.next_board = now + self.opts.board_poll
        return None

    def _ends(self, code: int | None) -> bool:
        if code is None:
            return False
        self.result.code = code
        return True

    def _timed_out(self, now: float) -> bool:
        if now >= self.start + self.opts.timeout:
            self.result.reason = f"wall-clock timeout ({self.opts.timeout:g}s)"
            return True
        if now >= self.last_activity + self.opts.idle_timeout:
            self.result.reason = f"idle timeout ({self.opts.idle_timeout:g}s)"
            return True
        return False

    def _quiet(self) -> None:
        """No signal this turn: a connection that takes too long counts as away."""
        if self.broker == "connecting" and self.clock() - self.start >= self.opts.connect_grace:
            self.broker = "down"
            log.warning("task #%s: the event broker does not answer; following the board", self.task_id)
            self.next_board = self.clock()

    def _up(self) -> bool:
        if self.broker == "up":
            return False
        log.info("task #%s: subscribed to live events", self.task_id)
        self.broker = "up"
        # anything missed while away is on the board
        if self._ends(self.check_board(self.clock())):
            return True
        if self.on_live is not None:
            self.on_live()
        return False

    def _down(self, detail: str) -> None:
        if self.broker != "down":
            log.warning(
                "task #%s: event broker away (%s); following the board",
                self.task_id,
                detail or "disconnected",
            )
            self.broker = "down"
            self.next_board = self.clock()

    def _message(self, payload: bytes) -> bool:
        event = self.stream.offer(payload)
        if event is None:
            return False
        self.result.events += 1
        self.last_activity = self.clock()
        self.emit(live_line(event))
        if event.terminal:
            self.result.code = EXIT_OF_EVENT[event.event]
            self.result.reason = f"event: {event.kind.value}"
            return True
        return False


class QueueWaker:
    """Calls ``hint(task_id, uid)`` when a signed submit event for ``queue`` arrives, and
    ``hint(None, None)`` after a reconnect (submits may have been missed: poll).

    A hint makes an idle worker look now; the board decides. Forged or malformed payloads
    are ignored (the seal), and a task a hint names is read before it is claimed.
    """

    def __init__(
        self,
        transport: Transport,
        queue_name: str,
        secret: bytes,
        hint: Callable[[int | None, str | None], None],
    ) -> None:
        self.queue = queue_name
        self.secret = secret
        self.hint = hint
        self.hints = 0
        self._was_up = False
        self.sub = transport.subscribe(queue_topic(queue_name), self._on)

    def _on(self, sig: Signal) -> None:
        if sig.kind == "up":
            if self._was_up:  # submits may have been missed while away
                self._fire(None, None)
            self._was_up = True
            return
        if sig.kind != "msg":
            return
        try:
            event = open_sealed(sig.payload, self.secret)
        except Dropped as exc:
            log.debug("queue %s: ignored a wake-up payload (%s)", self.queue, exc.reason)
            return
        if event.kind == EventType.SUBMITTED and event.data.get("queue") in (None, self.queue):
            uid = event.data.get("uid")
            self._fire(int(event.job_id), uid if isinstance(uid, str) else None)

    def _fire(self, task_id: int | None, uid: str | None) -> None:
        self.hints += 1
        self.hint(task_id, uid)

    def close(self) -> None:
        self.sub.close()


__all__ = [
    "EXIT_COMPLETED",
    "EXIT_FAILED",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "BoardCheck",
    "BoardStatus",
    "QueueWaker",
    "TaskStream",
    "WatchOptions",
    "WatchResult",
    "live_line",
    "watch",
]
