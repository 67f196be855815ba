"""The broker transports, by the scheme of ``AGAP_EVENTS_URL``: MQTT or NATS."""

from __future__ import annotations

from fabric.events.mqtt import MqttTransport
from fabric.events.nats import NatsTransport
from fabric.events.transport import Transport
from fabric.settings.events import EventsConfig


def open_transport(config: EventsConfig) -> Transport:
    """The transport the config's URL names (nothing connects until first use)."""
    if config.scheme == "mqtt":
        return MqttTransport(config)
    return NatsTransport(config)


__all__ = ["open_transport"]
