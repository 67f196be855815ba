"""When a provider's rate limit resets, read from a 429's headers: the one reader.

The LiteLLM proxy relays the provider's headers with an ``llm_provider-`` prefix
(``llm_provider-retry-after: 7``); the SDK and a direct provider send them plain. Both are
read here, the proxy's own unprefixed header winning where both exist.
:func:`parse_rate_limit_headers` says until when to park a queue
(:meth:`fabric.availability.Availability.on_rate_limited_headers`); :func:`parse_rate_limit`
gives the model clients the wait and the latest reset for their error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime

__all__ = ["budget_exhausted", "parse_rate_limit", "parse_rate_limit_headers", "provider_headers"]

_PROVIDER_PREFIX = "llm_provider-"

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s|d)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def _duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``6m0s``, ``1.5s``, ``20ms``, ``1h2m``) or a bare
    number of seconds."""
    text = text.strip().lower()
    if _NUMBER.match(text):
        return float(text)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _http_date(text: str) -> float | None:
    import email.utils  # here: only a Retry-After given as a date needs the email package

    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _rfc3339(text: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _epoch_or_delta(text: str, now: float) -> float | None:
    """``x-ratelimit-reset``: unix seconds, unix milliseconds, or seconds from now."""
    value = text.strip()
    if _NUMBER.match(value):
        number = float(value)
        if number >= 1e12:
            return number / 1000.0
        if number >= 1e9:
            return number
        return now + number
    delta = _duration(value)
    if delta is not None:
        return now + delta
    return _rfc3339(value) or _http_date(value)


def provider_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased headers, with the provider's relayed (``llm_provider-``) ones unprefixed;
    a header the proxy sent itself wins over the provider's of the same name."""
    h = {str(k).lower(): str(v) for k, v in headers.items()}
    for name, value in list(h.items()):
        if name.startswith(_PROVIDER_PREFIX):
            h.setdefault(name.removeprefix(_PROVIDER_PREFIX), value)
    return h


def parse_rate_limit_headers(headers: Mapping[str, str], now: float) -> float | None:
    """When (unix seconds) a 429's limit resets, from its headers; None if not announced.

    ``Retry-After`` (seconds or an HTTP-date) and ``retry-after-ms`` win: they are the
    provider's instruction. Otherwise the reset headers are read — ``x-ratelimit-reset-
    requests`` / ``-tokens`` (OpenAI durations like ``6m0s``), ``x-ratelimit-reset`` (unix
    seconds or seconds), ``anthropic-ratelimit-*-reset`` (RFC 3339) — preferring the limits
    whose ``remaining`` header says 0, and taking the latest. Prefixed headers count
    (:func:`provider_headers`).
    """
    h = provider_headers(headers)
    told = _retry_after(h, now)
    if told is not None:
        return told
    resets: dict[str, float] = {}  # limit name -> reset time
    for name, value in h.items():
        reset = _reset(name, value, now)
        if reset is not None and reset[1] is not None:
            resets[reset[0]] = reset[1]
    if not resets:
        return None
    exhausted = [key for key in resets if _remaining(h, key) == 0]
    chosen = exhausted or list(resets)
    return max(resets[k] for k in chosen)


def _retry_after(h: Mapping[str, str], now: float) -> float | None:
    """``Retry-After`` (seconds or an HTTP-date), else ``retry-after-ms``, when readable."""
    retry_after = h.get("retry-after")
    if retry_after is not None:
        seconds = _duration(retry_after)
        if seconds is not None:
            return now + seconds
        when = _http_date(retry_after)
        if when is not None:
            return when
    retry_ms = h.get("retry-after-ms")
    if retry_ms is not None and _NUMBER.match(retry_ms.strip()):
        return now + float(retry_ms) / 1000.0
    return None


def _reset(name: str, value: str, now: float) -> tuple[str, float | None] | None:
    """(limit key, reset time or None if unreadable) for a reset header; None for another."""
    if name.startswith("x-ratelimit-reset-"):
        delta = _duration(value)
        at = now + delta if delta is not None else _rfc3339(value)
        return "x:" + name.removeprefix("x-ratelimit-reset-"), at
    if name == "x-ratelimit-reset":
        return "x:", _epoch_or_delta(value, now)
    if name == "ratelimit-reset":  # the IETF draft's header: seconds from now
        delta = _duration(value)
        return "r:", now + delta if delta is not None else None
    if name.startswith("anthropic-ratelimit-") and name.endswith("-reset"):
        return "a:" + name.removeprefix("anthropic-ratelimit-").removesuffix("-reset"), _rfc3339(value)
    return None


def _remaining(h: Mapping[str, str], key: str) -> float | None:
    source, _, limit = key.partition(":")
    if source == "r":
        name = "ratelimit-remaining"
    elif source == "x":
        name = f"x-ratelimit-remaining-{limit}" if limit else "x-ratelimit-remaining"
    else:
        name = f"anthropic-ratelimit-{limit}-remaining"
    value = h.get(name, "").strip()
    return float(value) if _NUMBER.match(value) else None


def parse_rate_limit(
    headers: Mapping[str, str], now: float | None = None
) -> tuple[float | None, float | None]:
    """``(retry_after_seconds, reset_at_epoch)`` from a 429's headers, for the error a model
    client raises: the wait the provider asked for (``Retry-After``, ``retry-after-ms``), and
    the latest reset any header announced, since a caller must wait for all of them. With no
    wait asked for, the wait is the time to that reset."""
    now = time.time() if now is None else now
    h = provider_headers(headers)
    told = _retry_after(h, now)
    resets = [at for name, value in h.items() if (r := _reset(name, value, now)) and (at := r[1]) is not None]
    if told is not None:
        resets.append(told)
    reset_at = max(resets) if resets else None
    if told is not None:
        return max(0.0, told - now), reset_at
    return (max(0.0, reset_at - now) if reset_at is not None else None), reset_at


# A spent budget is answered 400/402/403 with words rather than headers (Anthropic: "You have
# reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC.",
# OpenAI: "You exceeded your current quota"). LiteLLM's own router treats these as plain bad
# requests (BerriAI/litellm#37592); here they are a cool-down, never the task's fault.
_BUDGET_STATUSES = (400, 402, 403)
_BUDGET = re.compile(
    r"regain access on|usage limits?|spend(?:ing)? limit|budget (?:has been |was )?(?:exceeded|exhausted)"
    r"|exceeded (?:your )?(?:current )?(?:quota|budget)|insufficient (?:credits?|balance|quota)"
    r"|credit balance is too low|quota (?:has been |was )?(?:exceeded|exhausted)",
    re.IGNORECASE,
)
_REGAIN = re.compile(
    r"regain access on (\d{4}-\d{2}-\d{2})(?:\s+at\s+(\d{1,2}:\d{2}(?::\d{2})?))?\s*(UTC|Z)?", re.IGNORECASE
)


def budget_exhausted(status: int | None, message: str) -> tuple[bool, float | None]:
    """``(True, regain_at)`` when a 400/402/403 says the account's budget or usage limit is
    spent (``regain_at`` is the unix time it names, or None); ``(False, None)`` otherwise."""
    if status not in _BUDGET_STATUSES or not _BUDGET.search(message):
        return False, None
    m = _REGAIN.search(message)
    if m is None:
        return True, None
    return True, _rfc3339(f"{m.group(1)}T{m.group(2) or '00:00'}+00:00")
