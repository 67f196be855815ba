"""NATS transport (nats-py): core subjects, with JetStream keeping terminal events.

Subjects: ``<prefix>.jobs.<id>.ev`` (started, progress, …), ``<prefix>.jobs.<id>.end``
(terminal events) and ``<prefix>.queue.<queue>.submitted``. When JetStream is there,
the publisher keeps a stream over ``<prefix>.jobs.*.end`` holding the last message per
subject (MQTT's retained message, in JetStream terms) and publishes terminal events to
it with an acknowledgement; a subscriber fetches that last message after every
(re)connect. Without JetStream, terminal events are live only and watchers rely on the
board check they make at start and after every reconnect.

nats-py is asyncio; one event-loop thread per process runs every connection and the
synchronous methods here wait on it with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError

from fabric.events.transport import Signal, Sink, Topic, TransportError, token
from fabric.settings.events import EventsConfig

log = logging.getLogger("agap.events.nats")

T = TypeVar("T")
RETAIN_SECONDS = 7 * 86400.0


class _Loop:
    """The process's asyncio loop for NATS, in a daemon thread (started on first use)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="agap-nats", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def submit(cls, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, cls.get())

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        fut = cls.submit(coro)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            fut.cancel()
            raise


async def _quiet(exc: Exception) -> None:
    log.debug("nats: %s", exc)


class NatsTransport:
    """Publishes to NATS (JetStream-acknowledged for terminal events when available)."""

    name = "nats"

    def __init__(self, config: EventsConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._nc: NatsClient | None = None
        self.jetstream: bool | None = None  # None until the first connection tells

    @property
    def server(self) -> str:
        return f"{'tls' if self.config.tls else 'nats'}://{self.config.host}:{self.config.port}"

    @property
    def stream(self) -> str:
        return f"{token(self.config.prefix).upper()}_EVENTS"

    def subject(self, topic: Topic, *, terminal: bool = False) -> str:
        p = self.subject_prefix
        if topic.kind == "queue":
            return f"{p}.queue.{token(topic.name)}.submitted"
        return f"{p}.jobs.{token(topic.name)}.{'end' if terminal else 'ev'}"

    @property
    def subject_prefix(self) -> str:
        """The prefix's levels as subject tokens (``python/mqtt`` → ``python.mqtt``)."""
        return self.config.prefix.replace("/", ".")

    def connect_options(self, timeout: float) -> dict[str, Any]:
        cfg = self.config
        # No built-in reconnection: a failed connect fails fast (two tries, no wait) and
        # callers reconnect on their own schedule, so "down" is reported at once.
        opts: dict[str, Any] = {
            "servers": [self.server],
            "connect_timeout": max(1, math.ceil(timeout)),
            "error_cb": _quiet,
            "name": f"{token(cfg.prefix)}-events",
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0,
        }
        if cfg.username:
            opts["user"], opts["password"] = cfg.username, cfg.password
        if cfg.tls:
            ctx = ssl.create_default_context(cafile=cfg.ca_file)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
            opts["tls"] = ctx
        return opts

    # -- publishing -----------------------------------------------------------------

    def publish(self, topic: Topic, payload: bytes, *, retain: bool, timeout: float) -> None:
        with self._lock:
            try:
                _Loop.run(self._publish(topic, payload, retain, timeout), timeout + 1.0)
            except TransportError:
                self._drop()
                raise
            except Exception as exc:  # nats-py raises many kinds; all mean "not delivered"
                self._drop()
                raise TransportError(f"publish to {self.server} failed: {type(exc).__name__}: {exc}") from exc

    async def _publish(self, topic: Topic, payload: bytes, retain: bool, timeout: float) -> None:
        nc = await self._ensure(timeout)
        if retain and self.jetstream:
            js = nc.jetstream(timeout=timeout)
            await js.publish(self.subject(topic, terminal=True), payload, timeout=timeout, stream=self.stream)
            return
        await nc.publish(self.subject(topic, terminal=retain), payload)
        await nc.flush(timeout=max(1, math.ceil(timeout)))

    async def _ensure(self, timeout: float) -> NatsClient:
        nc = self._nc
        if nc is not None and nc.is_connected:
            return nc
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        self._nc = None
        nc = await nats.connect(**self.connect_options(timeout))
        if self.config.jetstream:
            self.jetstream = await self._ensure_stream(nc, timeout)
        else:
            self.jetstream = False
        self._nc = nc
        return nc

    async def _ensure_stream(self, nc: NatsClient, timeout: float) -> bool:
        js = nc.jetstream(timeout=timeout)
        config = js_api.StreamConfig(
            name=self.stream,
            subjects=[f"{self.subject_prefix}.jobs.*.end"],
            max_msgs_per_subject=1,
            max_age=RETAIN_SECONDS,
            storage=js_api.StorageType.FILE,
            discard=js_api.DiscardPolicy.OLD,
        )
        try:
            await js.add_stream(config)
            return True
        except NotFoundError:
            return False
        except APIError as exc:
            # Already there with other settings is fine; no JetStream (503) is not.
            try:
                await js.stream_info(self.stream)
                return True
            except Exception:
                log.info("nats: JetStream unavailable (%s); terminal events are live only", exc)
                return False
        except Exception as exc:
            log.info("nats: JetStream unavailable (%s); terminal events are live only", exc)
            return False

    def _drop(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                _Loop.run(nc.close(), 2.0)

    # -- subscribing ----------------------------------------------------------------

    def subscribe(self, topic: Topic, sink: Sink) -> NatsSubscription:
        return NatsSubscription(self, topic, sink)

    def close(self) -> None:
        with self._lock:
            self._drop()


class NatsSubscription:
    """A subscription on its own connection, reconnected here after every loss."""

    def __init__(self, transport: NatsTransport, topic: Topic, sink: Sink) -> None:
        self.transport = transport
        self.topic = topic
        self.sink = sink
        self._closed = False
        self._nc: NatsClient | None = None
        self._task = _Loop.submit(self._run())

    async def _run(self) -> None:
        delay = 0.25
        while not self._closed:
            gone = asyncio.Event()

            async def lost(gone: asyncio.Event = gone) -> None:
                gone.set()

            try:
                nc = await nats.connect(
                    disconnected_cb=lost, closed_cb=lost, **self.transport.connect_options(2.0)
                )
            except Exception as exc:
                self.sink(Signal("down", detail=f"cannot connect: {type(exc).__name__}"))
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            self._nc = nc
            try:
                await nc.subscribe(self._subject(), cb=self._message)
                await nc.flush()
            except Exception as exc:
                gone.set()
                log.debug("nats: subscribe failed: %s", exc)
            if self._closed:
                break
            if not gone.is_set():
                delay = 0.25
                self.sink(Signal("up"))
                await self._retained(nc)
                await gone.wait()
            with contextlib.suppress(Exception):
                await nc.close()
            self._nc = None
            if not self._closed:
                self.sink(Signal("down", detail="disconnected"))
                await asyncio.sleep(delay)

    def _subject(self) -> str:
        subject = self.transport.subject(self.topic)
        return subject.rsplit(".", 1)[0] + ".*" if self.topic.kind == "task" else subject

    async def _message(self, msg: Msg) -> None:
        self.sink(Signal("msg", payload=bytes(msg.data)))

    async def _retained(self, nc: NatsClient) -> None:
        """Deliver the task's kept terminal event, if JetStream holds one.

        Read through an ephemeral consumer (deliver the last message of the subject),
        not the "get last message" API: nats-server 2.9 (Debian's) dereferences nil and
        crashes when that message is replaced or expires during such a get, which a
        stream keeping one message per subject does by design.
        """
        if self.topic.kind != "task" or not self.transport.config.jetstream:
            return
        subject = self.transport.subject(self.topic, terminal=True)
        try:
            js = nc.jetstream(timeout=2.0)
            psub = await js.pull_subscribe(
                subject,
                stream=self.transport.stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=10.0,
                ),
            )
            try:
                info = await psub.consumer_info()
                msgs = await psub.fetch(1, timeout=2.0) if info.num_pending else []
            finally:
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
        except Exception as exc:  # no stream, no message, no JetStream: nothing kept
            log.debug("nats: no retained event for %s: %s", self.topic, exc)
            return
        for raw in msgs:
            if raw.data:
                self.sink(Signal("msg", payload=bytes(raw.data)))

    def close(self) -> None:
        self._closed = True
        nc = self._nc
        if nc is not None:
            with contextlib.suppress(Exception):
                _Loop.run(nc.close(), 2.0)
        self._task.cancel()


__all__ = ["NatsSubscription", "NatsTransport"]
