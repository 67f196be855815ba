"""The broker transports, by the scheme of ``AGAP_EVENTS_URL``: MQTT or NATS."""

from __future__ import annotations

from fabric.events.mqtt import MqttTransport
from fabric.events.nats import NatsTransport
from fabric.events.transport import Transport
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import warn_if_plaintext


def open_transport(config: EventsConfig) -> Transport:
    """The transport the config's URL names (nothing connects until first use).

    A plaintext broker off loopback is warned about here, once, before anything connects.
    """
    warn_if_plaintext(config.url, "the events broker")
    if config.scheme == "mqtt":
        return MqttTransport(config)
    return NatsTransport(config)


__all__ = ["open_transport"]
