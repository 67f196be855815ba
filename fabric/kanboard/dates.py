"""Kanboard's date input rules, which the embedded board must reproduce exactly.

Kanboard validates ``date_due``/``date_started`` with PHP's ``DateTime::createFromFormat``
and the formats ``m/d/Y``, ``Y-m-d``, ``Y_m_d``, ``m/d/Y H:i``, ``Y-m-d H:i`` and
``Y_m_d H:i``. A date without a time keeps the *current* time of day (there is no ``!``
in the format); seconds, ISO-8601, unix numbers (even as strings), 0 and dates not after
1970-01-01 00:00 UTC are refused with ``false``. Dates come out as unix seconds, 0 when
unset. The board runs in UTC.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_YEAR, _NUM, _TIME = r"(\d{1,4})", r"(\d{1,2})", r"(?: (\d{1,2}):(\d{2}))?"
_FORMATS = (
    # (pattern, index of year, month, day in the groups)
    (re.compile(rf"^{_NUM}/{_NUM}/{_YEAR}{_TIME}$"), (2, 0, 1)),
    (re.compile(rf"^{_YEAR}-{_NUM}-{_NUM}{_TIME}$"), (0, 1, 2)),
    (re.compile(rf"^{_YEAR}_{_NUM}_{_NUM}{_TIME}$"), (0, 1, 2)),
)


class BadDate(ValueError):
    """A date the board refuses."""


def parse_input_date(value: object, now: float | None = None) -> int:
    """Unix seconds for a Kanboard date input; 0 for ``""``/``None``; :class:`BadDate`
    for anything Kanboard's validator refuses."""
    if value is None or value == "":
        return 0
    if not isinstance(value, str):
        raise BadDate(f"unsupported date {value!r}")
    now = time.time() if now is None else now
    for pattern, (yi, mi, di) in _FORMATS:
        m = pattern.match(value)
        if m is None:
            continue
        g = m.groups()
        year, month, day = int(g[yi]), int(g[mi]), int(g[di])
        if g[3] is None:
            t = datetime.fromtimestamp(now, UTC)
            hour, minute, second = t.hour, t.minute, t.second
        else:
            hour, minute, second = int(g[3]), int(g[4]), 0
            if hour > 23 or minute > 59:
                raise BadDate(f"invalid time in {value!r}")
        try:
            ts = int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp())
        except ValueError as exc:  # day 31 of a 30-day month, month 13, year 0...
            raise BadDate(f"invalid date {value!r}") from exc
        if ts <= 0:
            raise BadDate(f"date before 1970 {value!r}")
        return ts
    raise BadDate(f"unsupported date {value!r}")


def format_input_date(ts: float) -> str:
    """The ``Y-m-d H:i`` form Kanboard accepts (UTC), for sending a timestamp to a board."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")
