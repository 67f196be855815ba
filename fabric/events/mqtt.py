"""MQTT transport (paho-mqtt 2.x): QoS 1, terminal events retained, one topic per task.

Topics: ``<prefix>/jobs/<id>/events`` (seed 003's, with ``AGAP_EVENTS_PREFIX=python/mqtt``)
and ``<prefix>/queue/<queue>/submitted``. The
publisher keeps one connection and rebuilds it after any failure (a fresh client, so a
message queued on a dead connection is never sent late from it). Subscriptions run
paho's network thread, which reconnects by itself and re-subscribes in ``on_connect``;
a retained terminal event arrives on every (re)subscribe.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import ssl
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from fabric.events.transport import Signal, Sink, Topic, TransportError, token
from fabric.settings.events import EventsConfig

log = logging.getLogger("agap.events.mqtt")

KEEPALIVE = 15


class MqttTransport:
    """Publishes with QoS 1 (waiting for the PUBACK) and opens subscriptions."""

    name = "mqtt"

    def __init__(self, config: EventsConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._client: mqtt.Client | None = None

    def topic_name(self, topic: Topic) -> str:
        if topic.kind == "task":
            return f"{self.config.prefix}/jobs/{token(topic.name)}/events"
        return f"{self.config.prefix}/queue/{token(topic.name)}/submitted"

    def new_client(self, role: str) -> mqtt.Client:
        cfg = self.config
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{token(cfg.prefix)}-{role}-{secrets.token_hex(6)}",
            clean_session=True,
        )
        if cfg.username:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls:
            client.tls_set(
                ca_certs=cfg.ca_file,
                certfile=cfg.cert_file,
                keyfile=cfg.key_file,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        return client

    # -- publishing -----------------------------------------------------------------

    def _connect(self, timeout: float) -> mqtt.Client:
        client = self.new_client("pub")
        ready = threading.Event()
        result: dict[str, ReasonCode] = {}

        def on_connect(c: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
            result["rc"] = rc
            ready.set()

        client.on_connect = on_connect
        client.connect_timeout = timeout
        try:
            client.connect(self.config.host, self.config.port, keepalive=KEEPALIVE)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {self.config.url}: {exc}") from exc
        client.loop_start()
        if not ready.wait(timeout) or result["rc"].is_failure:
            why = str(result["rc"]) if "rc" in result else f"no CONNACK within {timeout:.1f}s"
            _stop(client)
            raise TransportError(f"{self.config.url} refused the connection: {why}")
        return client

    def publish(self, topic: Topic, payload: bytes, *, retain: bool, timeout: float) -> None:
        name = self.topic_name(topic)
        with self._lock:
            try:
                client = self._client
                if client is None or not client.is_connected():
                    self._drop()
                    client = self._client = self._connect(timeout)
                info = client.publish(name, payload, qos=1, retain=retain)
                info.wait_for_publish(timeout)
                if not info.is_published():
                    raise TransportError(f"no PUBACK from {self.config.url} within {timeout:.1f}s")
            except TransportError:
                self._drop()
                raise
            except (OSError, ValueError, RuntimeError) as exc:
                self._drop()
                raise TransportError(f"publish to {self.config.url} failed: {exc}") from exc

    def _drop(self) -> None:
        if self._client is not None:
            _stop(self._client)
            self._client = None

    # -- subscribing ----------------------------------------------------------------

    def subscribe(self, topic: Topic, sink: Sink) -> MqttSubscription:
        return MqttSubscription(self, self.topic_name(topic), sink)

    def close(self) -> None:
        with self._lock:
            self._drop()


class MqttSubscription:
    """A QoS 1 subscription on its own client; paho's thread reconnects it."""

    def __init__(self, transport: MqttTransport, topic: str, sink: Sink) -> None:
        self.topic = topic
        self.sink = sink
        self._up = False
        client = self.client = transport.new_client("sub")
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.reconnect_delay_set(min_delay=1, max_delay=2)
        cfg = transport.config
        client.connect_timeout = 3.0
        client.connect_async(cfg.host, cfg.port, keepalive=KEEPALIVE)
        client.loop_start()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        if rc.is_failure:
            self.sink(Signal("down", detail=f"connection refused: {rc}"))
            return
        client.subscribe(self.topic, qos=1)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, rcs: Any, props: Any) -> None:
        self._up = True
        self.sink(Signal("up"))

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self.sink(Signal("down", detail="cannot connect"))

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any
    ) -> None:
        self._up = False
        self.sink(Signal("down", detail=f"disconnected: {rc}"))

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.sink(Signal("msg", payload=bytes(msg.payload)))

    def close(self) -> None:
        self.client.on_disconnect = None
        self.client.on_connect_fail = None
        _stop(self.client)


def _stop(client: mqtt.Client) -> None:
    with contextlib.suppress(Exception):
        client.disconnect()
    with contextlib.suppress(Exception):
        client.loop_stop()


__all__ = ["MqttSubscription", "MqttTransport"]
