"""Live task events (docs/PROTOCOLS.md): signed, ordered, advisory; the board stays the authority.

Modules: :mod:`.schema` (the v1 event: seed 003's wire schema), :mod:`.signing` (HMAC-SHA256,
per-task keys), :mod:`fabric.settings.events` (the ``AGAP_EVENTS_*`` environment),
:mod:`.transport` with :mod:`.mqtt` and :mod:`.nats` (picked by :mod:`.brokers`),
:mod:`.publisher`, :mod:`.subscriber` (the filter, ``watch`` and wake-ups) and
:mod:`.wiring` (the submitters' hook; the workers' is :mod:`workers.attach`).
"""

from fabric.events.schema import SCHEMA_VERSION, TERMINAL_EVENTS, Event, EventType, WireEvent
from fabric.settings.events import EventsConfig

__all__ = ["SCHEMA_VERSION", "TERMINAL_EVENTS", "Event", "EventType", "EventsConfig", "WireEvent"]
