"""The broker transports, by the scheme of ``AGAP_EVENTS_URL``: MQTT or NATS."""

from __future__ import annotations

from fabric.events.transport import Transport
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import warn_if_plaintext


def open_transport(config: EventsConfig) -> Transport:
    """The transport the config's URL names (nothing connects until first use).

    A plaintext broker off loopback is warned about here, once, before anything connects.
    """
    warn_if_plaintext(config.url, "the events broker")
    # A process pays only for the client library of the broker it uses (nats-py brings
    # aiohttp and dnspython, ~8 MB a worker that speaks MQTT never needs).
    if config.scheme == "mqtt":
        from fabric.events.mqtt import MqttTransport  # only the broker in use: see above

        return MqttTransport(config)
    from fabric.events.nats import NatsTransport  # only the broker in use: see above

    return NatsTransport(config)


__all__ = ["open_transport"]
