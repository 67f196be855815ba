"""The one duration grammar: a number and a unit, repeated (``30s``, ``5m``, ``4h``, ``30d``,
``1w``, ``1h30m``, ``1.5h``), case and spaces ignored.

Cards, the policy file and schedules require the unit, because "300" is ambiguous to the
person reading the card. Settings (environment variables) also take a bare number of
seconds (``AGAP_POLL_SECONDS=2``), as they always have: they ask with ``bare_seconds``.

Standard library only: the container healthcheck reads settings through this module.
"""

from __future__ import annotations

import re

from fabric.errors import InvalidInput

__all__ = ["HINT", "duration_seconds", "parse_duration", "parse_setting_duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_BARE_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
#: How to write a duration, for refusals.
HINT = "write a number and a unit (s, m, h, d, w), e.g. 30s, 5m, 5h, 7d, 1w or 1h30m"


def duration_seconds(text: object) -> float:
    """Seconds in ``text`` (the unit required); :class:`ValueError` with a readable message
    otherwise. ``text`` is ``object`` because a card's YAML may hold a bare number."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"a duration must be text like '5m' — {HINT}")
    if isinstance(text, int | float):
        raise ValueError(f"a duration needs a unit: write '{text}s' for seconds — {HINT}")
    compact = text.strip().lower().replace(" ", "")
    if not _DURATION.match(compact):
        raise ValueError(f"bad duration {text!r} — {HINT}")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(compact))


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """Seconds in a duration: ``"30s"``, ``"5m"``, ``"5h"``, ``"7d"``, ``"1w"``, ``"1h30m"``.

    Raises :class:`InvalidInput` for anything else, including a bare number unless
    ``bare_seconds`` says it means seconds (settings only).
    """
    if bare_seconds and isinstance(text, str) and _BARE_SECONDS.match(text.strip()):
        return float(text.strip())
    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def parse_setting_duration(text: str) -> float:
    """A setting's duration (``AGAP_POLL_SECONDS=2``, ``AGAP_KEEPER_GC_EVERY=12h``):
    :func:`parse_duration` where a bare number is seconds."""
    return parse_duration(text, bare_seconds=True)
