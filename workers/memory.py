"""``hindsight://<bank>/<query>`` refs: a recall from a Hindsight memory bank, as prompt text.

``hindsight://adolf-alvis/what%20is%20on%20this%20week?budget=low&max_tokens=1200`` posts
``{"query": "what is on this week", "budget": "low", "max_tokens": 1200}`` to
``{AGAP_HINDSIGHT_URL}/v1/default/banks/adolf-alvis/memories/recall`` (with
``Authorization: Bearer <AGAP_HINDSIGHT_KEY>`` when a key is set) and renders the
``results`` as one line per memory, capped like every ref.

* The bank is the ref's host in canonical form (:func:`fabric.refcanon.canonical`: percent-
  decoded once, lower case), the very text the privacy rules judged, and it must be a plain
  bank id (letters, digits, ``-``, ``_``, ``.``; no ``..``): what is recalled is what was
  judged. The query is the path, percent-decoded once.
* Options: ``budget`` (low, mid or high; default mid) and ``max_tokens`` (1 to 16384;
  default 4096), nothing else; a fragment is refused.
* A bank Hindsight does not know (404), refused credentials (401, 403) or a request it
  rejects (other 4xx) is an :class:`~workers.refs.UnresolvableRef`; no answer, a timeout,
  429 or 5xx is a :class:`~workers.refs.RefUnavailable` (a later attempt may succeed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import requests

from fabric.refcanon import BadRef, canonical
from workers.refs import ReadScope, RefUnavailable, UnresolvableRef, cap

__all__ = ["BUDGETS", "HindsightRecall", "Recall", "parse_recall", "render"]

BUDGETS = ("low", "mid", "high")
MAX_TOKENS = 16384
_BANK = re.compile(r"^[a-z0-9](?:[a-z0-9_.-]{0,126}[a-z0-9])?$")
_HINT = "write hindsight://<bank>/<query>[?budget=low|mid|high&max_tokens=N]"


@dataclass(frozen=True)
class Recall:
    """What a ``hindsight://`` ref asks: a bank, a query and the recall's options."""

    bank: str
    query: str
    budget: str = "mid"
    max_tokens: int = 4096

    def body(self) -> dict[str, Any]:
        return {"query": self.query, "budget": self.budget, "max_tokens": self.max_tokens}


def parse_recall(ref: str) -> Recall:
    """The recall ``ref`` names; :class:`UnresolvableRef` says what is wrong with it."""
    try:
        key = canonical(ref).key
    except BadRef as exc:
        raise UnresolvableRef(ref, str(exc), hint=_HINT) from None
    parts = urlsplit(ref.strip())
    bank = unquote(parts.netloc).lower()
    # The whole decoded host must be the canonical one: an encoded slash may not move
    # part of it into the path the rules match.
    if bank != urlsplit(key).netloc or not _BANK.match(bank) or ".." in bank:
        raise UnresolvableRef(ref, f"{bank!r} is not a Hindsight bank id", hint=_HINT)
    if parts.fragment:
        raise UnresolvableRef(ref, "a hindsight ref has no fragment", hint=_HINT)
    query = unquote(parts.path).lstrip("/").strip()
    if not query:
        raise UnresolvableRef(ref, "a recall needs a query", hint=_HINT)
    return Recall(bank, query, **_options(ref, parts.query))


def _options(ref: str, text: str) -> dict[str, Any]:
    try:
        pairs = parse_qsl(text, strict_parsing=True) if text else []
    except ValueError:
        raise UnresolvableRef(ref, f"cannot read the options {text!r}", hint=_HINT) from None
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name == "budget" and value in BUDGETS:
            out["budget"] = value
        elif name == "max_tokens" and value.isdigit() and 1 <= int(value) <= MAX_TOKENS:
            out["max_tokens"] = int(value)
        else:
            raise UnresolvableRef(
                ref,
                f"option {name}={value!r}",
                hint=f"budget: low, mid or high; max_tokens: 1 to {MAX_TOKENS}",
            )
    return out


@dataclass
class HindsightRecall:
    """The :class:`~workers.refs.SchemeReader` of ``hindsight://`` refs."""

    url: str
    key: str = ""
    session: requests.Session | None = field(default=None, repr=False)

    def read(self, ref: str, scope: ReadScope) -> str:
        recall = parse_recall(ref)
        endpoint = f"{self.url.rstrip('/')}/v1/default/banks/{quote(recall.bank, safe='')}/memories/recall"
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        session = self.session or requests.Session()
        limit = 16 * scope.max_bytes  # JSON around the memories; the text is capped after
        try:
            with session.post(
                endpoint,
                json=recall.body(),
                headers=headers,
                timeout=scope.timeout,
                allow_redirects=False,
                stream=True,
            ) as resp:
                status, data = resp.status_code, _head(resp, limit)
        except requests.RequestException as exc:
            raise RefUnavailable(ref, f"Hindsight at {self.url}: {type(exc).__name__}") from None
        finally:
            if self.session is None:
                session.close()
        _check_status(ref, recall, status, data)
        return cap(render(recall, _results(ref, data, scope.max_bytes)).encode("utf-8"), scope.max_bytes)


def _head(resp: requests.Response, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the body: enough to tell it is too large."""
    data = b""
    for chunk in resp.iter_content(16384):
        data += chunk
        if len(data) > limit:
            break
    return data


def _check_status(ref: str, recall: Recall, status: int, data: bytes) -> None:
    if status == 200:
        return
    if status in (408, 429) or status >= 500:
        raise RefUnavailable(ref, f"Hindsight answered HTTP {status}")
    if status == 404:
        raise UnresolvableRef(ref, f"Hindsight has no bank {recall.bank!r}", hint="check the bank id")
    if status in (401, 403):
        raise UnresolvableRef(
            ref, f"Hindsight refused the credentials (HTTP {status})", hint="set AGAP_HINDSIGHT_KEY"
        )
    raise UnresolvableRef(ref, f"Hindsight refused the recall (HTTP {status}): {data[:200]!r}")


def _results(ref: str, data: bytes, max_bytes: int) -> list[dict[str, Any]]:
    if len(data) > 16 * max_bytes:
        raise UnresolvableRef(ref, "Hindsight's answer is too large", hint="lower max_tokens")
    try:
        results = json.loads(data)["results"]
    except (ValueError, KeyError, TypeError):
        raise UnresolvableRef(ref, "Hindsight's answer has no results list") from None
    if not isinstance(results, list):
        raise UnresolvableRef(ref, "Hindsight's answer has no results list")
    return [r for r in results if isinstance(r, dict) and isinstance(r.get("text"), str)]


def render(recall: Recall, results: list[dict[str, Any]]) -> str:
    """The prompt text of a recall: a heading, then one line per memory with its type,
    context and date."""
    n = len(results)
    lines = [f"Hindsight bank {recall.bank}, recall {recall.query!r}: {n} memor{'y' if n == 1 else 'ies'}"]
    for r in results:
        about = [str(r[k]) for k in ("type", "context", "mentioned_at") if r.get(k)]
        lines.append(f"- {' '.join(str(r['text']).split())}" + (f" [{'; '.join(about)}]" if about else ""))
    return "\n".join(lines) + "\n"
