"""Reading a 429's headers: how long to wait, and until when.

Both real model clients (the gateway over HTTP, litellm in process) raise
:class:`~workers.llm.RateLimited` with what :func:`parse_rate_limit` reads here. The queue's
park itself is read from the same headers by :mod:`fabric.retry_after` (per limit, with the
``remaining`` counts), which the executor hands them to.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping

__all__ = ["parse_rate_limit"]

_PROVIDER_PREFIX = "llm_provider-"
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_GO_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float | None:
    """Seconds in ``"7"``, ``"7.5"``, ``"1m30s"``, ``"250ms"`` (OpenAI's reset headers)."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def _with_provider_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased headers; the LiteLLM proxy relays the provider's with an ``llm_provider-``
    prefix, and its own (unprefixed) headers win."""
    h = {k.lower(): v for k, v in headers.items()}
    for name, value in list(h.items()):
        if name.startswith(_PROVIDER_PREFIX):
            h.setdefault(name[len(_PROVIDER_PREFIX) :], value)
    return h


def _retry_after(h: Mapping[str, str], now: float) -> float | None:
    """The longest of ``retry-after-ms`` and ``Retry-After`` (seconds or an HTTP date)."""
    waits: list[float] = []
    if "retry-after-ms" in h:
        ms = _duration(h["retry-after-ms"])
        if ms is not None:
            waits.append(ms / 1000.0)
    if "retry-after" in h:
        raw = h["retry-after"].strip()
        seconds = _duration(raw)
        if seconds is None:
            try:
                seconds = max(0.0, email.utils.parsedate_to_datetime(raw).timestamp() - now)
            except (TypeError, ValueError, IndexError):
                seconds = None
        if seconds is not None:
            waits.append(seconds)
    return max(waits) if waits else None


def _resets(h: Mapping[str, str], now: float) -> list[float]:
    """Epoch times announced by the ``x-ratelimit-reset*`` family."""
    resets: list[float] = []
    for name, raw in h.items():
        if not name.startswith(("x-ratelimit-reset", "ratelimit-reset")):
            continue
        seconds = _duration(raw)
        if seconds is None:
            continue
        # A huge number is an epoch timestamp; a small one a delay.
        resets.append(seconds if seconds > 1_000_000_000 else now + seconds)
    return resets


def parse_rate_limit(
    headers: Mapping[str, str], now: float | None = None
) -> tuple[float | None, float | None]:
    """``(retry_after_seconds, reset_at_epoch)`` from a 429's headers.

    Reads ``Retry-After`` (seconds or an HTTP date), ``retry-after-ms``, and the
    ``x-ratelimit-reset*`` family (durations like ``6m0s``, or epoch seconds); the latest
    announced reset wins, since the caller must wait for all of them.
    """
    now = time.time() if now is None else now
    h = _with_provider_headers(headers)
    retry_after = _retry_after(h, now)
    resets = _resets(h, now)
    if retry_after is not None:
        resets.append(now + retry_after)
    reset_at = max(resets) if resets else None
    if retry_after is None and reset_at is not None:
        retry_after = max(0.0, reset_at - now)
    return retry_after, reset_at
