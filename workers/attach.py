"""Hooking live events into a worker, switched on by the environment.

The hook does nothing when ``AGAP_EVENTS_URL`` is unset, and refuses to start (a
:class:`~fabric.errors.ConfigError`) when it is set without ``AGAP_EVENTS_SECRET``::

    attach_worker(worker)        # in workers/assembly.py, after build_worker

A worker publishes its lifecycle after each ledger transition, subscribes to its
queue's submit events to poll at once when one arrives (the poll interval stays as the
safety net), and optionally serves a Kanboard webhook that only hints.

Worker events map onto the schema as follows (E = the lease's epoch; seq (E, n) is
``E * SEQ_STRIDE + n + 1``; the wire ``event``, then ``data.kind``)::

    started         -> started              started          seq (E, 0)
    progress        -> progress             progress         seq (E, 1), (E, 2), …
    completed       -> completed            completed        seq (E+1, 0), retained
    failed          -> error                failed           seq (E+1, 0), retained (the task is dead)
    input_required  -> permission_required  input_required   seq (E+1, 0)
    released        -> progress "requeued"  progress         seq (E+1, 0) (a retry or a clean stop)
    fenced          -> nothing (a fenced owner is no longer the owner)
"""

from __future__ import annotations

import atexit
import hmac
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fabric.events.attach import FLUSH_AT_EXIT
from fabric.events.brokers import open_transport
from fabric.events.publisher import Publisher, Sequencer, transition_event
from fabric.events.schema import Event, EventType, publishable_ref
from fabric.events.subscriber import QueueWaker
from fabric.events.transport import Transport
from fabric.ledger import Lease
from fabric.plain import Plain
from fabric.settings.events import EventsConfig
from workers.loop import Worker

log = logging.getLogger("agap.events")

# The loop's events that end an epoch: each is published as the next epoch's first event.
ENDINGS = ("completed", "failed", "input_required", "released")


class WorkerEvents:
    """A worker listener: maps the loop's events onto the schema and publishes them."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.seq = Sequencer()

    def __call__(self, what: str, lease: Lease, detail: str) -> None:
        tid, epoch = lease.task_id, lease.epoch
        event: Event | None = None
        if what == "started":
            counter = self.seq.next(tid, epoch, start=True)
            if counter is not None:
                event = Event.make(tid, epoch, counter, EventType.STARTED, detail, {"attempt": lease.attempt})
        elif what == "progress":
            counter = self.seq.next(tid, epoch)
            if counter is not None:
                event = Event.make(tid, epoch, counter, EventType.PROGRESS, detail)
        elif what in ENDINGS:
            self.seq.forget(tid, epoch + 1)
            event = ending_event(what, tid, epoch + 1, detail)
        elif what == "fenced":
            self.seq.forget(tid, epoch)
        if event is not None:
            self.publisher.publish(event)


def ending_event(what: str, task_id: int, epoch: int, detail: str) -> Event:
    """The first event of ``epoch`` after the loop's ``what`` (one of :data:`ENDINGS`)."""
    if what == "completed":
        ref = publishable_ref(detail)
        return transition_event(
            task_id,
            epoch,
            EventType.COMPLETED,
            "completed" if ref is None else f"completed: {ref}",
            {"result_ref": ref} if ref else None,
        )
    if what == "failed":
        return transition_event(task_id, epoch, EventType.FAILED, detail)
    if what == "input_required":
        return transition_event(task_id, epoch, EventType.INPUT_REQUIRED, detail)
    return transition_event(
        task_id,
        epoch,
        EventType.PROGRESS,
        f"requeued: {detail}" if detail else "requeued",
        {"requeued": True},
    )


class WebhookHint:
    """A Kanboard webhook endpoint that answers at once (204) and only hints.

    Point Kanboard's webhook URL at ``http://HOST:PORT/?token=…``. Nothing in the body is
    trusted: any accepted POST just makes the idle worker poll now.
    """

    def __init__(self, host: str, port: int, hint: Callable[[], None], token: str | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # only a webhook worker: 1.2 MB

        self.hints = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), 1 << 16)
                if length:
                    self.rfile.read(length)
                given = parse_qs(urlsplit(self.path).query).get("token", [""])[0]
                if token and not hmac.compare_digest(given.encode(), token.encode()):
                    self.send_response(403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(204)
                self.end_headers()
                outer.hints += 1
                hint()

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("webhook: " + format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="agap-webhook", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WorkerAttachment(Plain, frozen=False):
    """What :func:`attach_worker` set up; :meth:`close` undoes it."""

    config: EventsConfig
    publisher: Publisher
    listener: WorkerEvents
    waker: QueueWaker | None = None
    webhook: WebhookHint | None = None
    closed: bool = field(default=False)

    def close(self, timeout: float = FLUSH_AT_EXIT) -> None:
        if self.closed:
            return
        self.closed = True
        if self.webhook is not None:
            self.webhook.close()
        if self.waker is not None:
            self.waker.close()
        self.publisher.close(timeout)


def attach_worker(
    worker: Worker,
    queue: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    config: EventsConfig | None = None,
    wake: bool = True,
    transport: Transport | None = None,
) -> WorkerAttachment | None:
    """Publish ``worker``'s lifecycle and wake it on submits; None when events are off."""
    config = config or EventsConfig.from_env(env)
    if config is None:
        return None
    queue = queue or worker.config.queue
    publisher = Publisher(transport or open_transport(config), config.secret)
    listener = WorkerEvents(publisher)
    worker.add_listener(listener)
    att = WorkerAttachment(config, publisher, listener)
    if wake:
        att.waker = QueueWaker(open_transport(config), queue, config.secret, worker.hinted)
        if config.webhook is not None:
            host, port = config.webhook
            att.webhook = WebhookHint(host, port, worker.wake.set, config.webhook_token)
            log.info("queue %s: Kanboard webhook hints on %s", queue, att.webhook.url)
    atexit.register(att.close)
    log.info("queue %s: live events on %s (prefix %s)", queue, config.url, config.prefix)
    return att


__all__ = ["WebhookHint", "WorkerAttachment", "WorkerEvents", "attach_worker"]
