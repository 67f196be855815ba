"""``hindsight://<bank>/…`` refs: memories of a Hindsight bank, as prompt text.

Three kinds of read, each one of Hindsight's own endpoints (:mod:`fabric.hindsight`):

* ``hindsight://adolf-alvis/what%20is%20on%20this%20week?budget=low&max_tokens=1200`` —
  a **recall** (``POST …/memories/recall``): the query is the path, percent-decoded once.
  A recall that matches nothing returns no memories, as Hindsight's does.
* ``hindsight://adolf-alvis/?newest=50`` — the **newest** memories (``GET
  …/memories/list``, newest first by ``mentioned_at``): what "recent" means to a person,
  which no recall query finds.
* ``hindsight://adolf-alvis/what%20changed?via=reflect`` — Hindsight's **reflect**
  (``POST …/reflect``): an answer its own LLM writes from the bank.

Options, each mapped to a field Hindsight has:

* ``types=world,experience`` (``world``, ``experience``, ``observation``): the recall's
  ``types``; for ``newest`` the list's ``type``, one call per type, merged newest first;
* ``since=6h`` (a duration): the recall's ``temporal_window`` ending now and its
  ``query_timestamp`` (Hindsight *ranks* by the window, it does not filter); for ``newest``
  only memories mentioned in the window are kept (the list API has no date filter);
* ``budget`` (low, mid, high; default mid) and ``max_tokens`` (1 to 16384; default 4096),
  for recall and reflect.

Nothing else: an unknown option, ``newest`` with a query, or a fragment is refused.

* The bank is the ref's host as written, percent-decoded once: **case-sensitive**, as
  Hindsight's bank ids are (``Adolf-Upper`` is not ``adolf-upper``), and the very text the
  privacy rules judged (:func:`fabric.refcanon.canonical` keeps a store's host as it is).
  ``::`` separates parts (``agent::channel::user``, the names Hindsight's OpenClaw plugin
  gives its banks); no ``..``, no port, no user.
* A bank Hindsight does not know (404), refused credentials (401, 403) or a request it
  rejects (400, 422) is an :class:`~workers.refs.UnresolvableRef`; no answer, a timeout,
  429 or 5xx is a :class:`~workers.refs.RefUnavailable` (a later attempt may succeed) —
  except for ``via=reflect``, which spends Hindsight's LLM quota: only a refused
  connection or a 429 (nothing spent) is retried, anything else is final. A reflect first
  lists one memory of the bank (no LLM; its failures are retried as a recall's): Hindsight
  answers a reflect on a bank it does not know by making the bank, not with a 404.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from fabric.durations import duration_seconds
from fabric.hindsight import BUDGETS, FACT_TYPES, HindsightClient, HindsightError
from fabric.plain import Plain
from fabric.refcanon import BadRef, canonical
from workers.refs import ReadScope, RefUnavailable, UnresolvableRef, cap

if TYPE_CHECKING:
    import requests

__all__ = ["BUDGETS", "HindsightRecall", "Recall", "parse_recall", "render", "render_reflect"]

MAX_TOKENS = 16384
MAX_NEWEST = 500
_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9_])?"
_BANK = re.compile(rf"^{_SEGMENT}(?:::{_SEGMENT})*$")
_HINT = (
    "write hindsight://<bank>/<query>[?types=…&since=6h&budget=low|mid|high&max_tokens=N], "
    "hindsight://<bank>/?newest=N or hindsight://<bank>/<question>?via=reflect"
)
_OPTIONS = "types (world, experience, observation), since (e.g. 6h), budget (low, mid, high), " + (
    f"max_tokens (1 to {MAX_TOKENS}), newest (1 to {MAX_NEWEST}), via=reflect"
)


class Recall(Plain):
    """What a ``hindsight://`` ref asks: a bank, a query (none for ``newest``) and options."""

    bank: str
    query: str
    budget: str = "mid"
    max_tokens: int = 4096
    types: tuple[str, ...] = ()
    since: float | None = None  # seconds before now
    newest: int | None = None  # the list API, this many
    reflect: bool = False

    @property
    def kind(self) -> str:
        return "newest" if self.newest else "reflect" if self.reflect else "recall"

    def body(self, now: float | None = None) -> dict[str, Any]:
        """The recall (or reflect) request: only the fields the ref set beyond the defaults."""
        out: dict[str, Any] = {"query": self.query, "budget": self.budget, "max_tokens": self.max_tokens}
        if self.types and not self.reflect:
            out["types"] = list(self.types)
        if self.since is not None and not self.reflect:
            end = time.time() if now is None else now
            out["query_timestamp"] = _iso(end)
            out["temporal_window"] = {"start": _iso(end - self.since), "end": _iso(end)}
        return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_recall(ref: str) -> Recall:
    """The read ``ref`` names; :class:`UnresolvableRef` says what is wrong with it."""
    try:
        key = canonical(ref).key
    except BadRef as exc:
        raise UnresolvableRef(ref, str(exc), hint=_HINT) from None
    parts = urlsplit(ref.strip())
    bank = unquote(parts.netloc)
    # The whole decoded host must be the canonical one: an encoded slash may not move
    # part of it into the path the rules match.
    if bank != urlsplit(key).netloc or not _BANK.match(bank) or ".." in bank:
        raise UnresolvableRef(ref, f"{bank!r} is not a Hindsight bank id", hint=_HINT)
    if parts.fragment:
        raise UnresolvableRef(ref, "a hindsight ref has no fragment", hint=_HINT)
    query = unquote(parts.path).lstrip("/").strip()
    recall = Recall(bank, query, **_rename(_options(ref, parts.query)))
    if recall.newest and (query or recall.reflect):
        raise UnresolvableRef(ref, "newest=N lists the bank: it takes no query and no via", hint=_HINT)
    if not recall.newest and not query:
        raise UnresolvableRef(ref, "a recall needs a query (or newest=N for the newest memories)", hint=_HINT)
    if recall.reflect and (recall.types or recall.since is not None):
        raise UnresolvableRef(ref, "via=reflect takes budget and max_tokens only", hint=_HINT)
    return recall


def _options(ref: str, text: str) -> dict[str, Any]:
    try:
        pairs = parse_qsl(text, strict_parsing=True) if text else []
    except ValueError:
        raise UnresolvableRef(ref, f"cannot read the options {text!r}", hint=_HINT) from None
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise UnresolvableRef(ref, f"option {name} given twice", hint=_OPTIONS)
        parsed = _option(name, value)
        if parsed is None:
            raise UnresolvableRef(ref, f"option {name}={value!r}", hint=_OPTIONS)
        out[name] = parsed
    return out


def _types(value: str) -> tuple[str, ...] | None:
    types = tuple(t.strip() for t in value.split(","))
    return types if types and all(t in FACT_TYPES for t in types) and len(set(types)) == len(types) else None


def _since(value: str) -> float | None:
    try:
        seconds = duration_seconds(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def _bounded(limit: int) -> Callable[[str], int | None]:
    return lambda v: int(v) if v.isdigit() and 1 <= int(v) <= limit else None


_PARSERS: dict[str, Callable[[str], Any]] = {
    "budget": lambda v: v if v in BUDGETS else None,
    "max_tokens": _bounded(MAX_TOKENS),
    "newest": _bounded(MAX_NEWEST),
    "types": _types,
    "since": _since,
    "via": lambda v: True if v == "reflect" else None,
}


def _option(name: str, value: str) -> Any:
    parser = _PARSERS.get(name)
    return None if parser is None else parser(value)


def _rename(opts: dict[str, Any]) -> dict[str, Any]:
    return {("reflect" if k == "via" else k): v for k, v in opts.items()}


class HindsightRecall(Plain, frozen=False):
    """The :class:`~workers.refs.SchemeReader` of ``hindsight://`` refs."""

    url: str
    key: str = ""
    session: requests.Session | None = field(default=None, repr=False)
    clock: Callable[[], float] = time.time

    def read(self, ref: str, scope: ReadScope) -> str:
        recall = parse_recall(ref)
        client = HindsightClient(self.url, self.key, timeout=scope.timeout, session=self.session)
        client.limit = 16 * scope.max_bytes  # JSON around the memories; the text is capped after
        try:
            if recall.reflect:
                text = client.reflect(recall.bank, recall.body())
                return cap(render_reflect(recall, text).encode("utf-8"), scope.max_bytes)
            results = (
                self._newest(client, recall)
                if recall.newest
                else client.recall(recall.bank, recall.body(self.clock()))
            )
        except HindsightError as exc:
            raise _ref_error(ref, recall, exc) from None
        return cap(render(recall, results).encode("utf-8"), scope.max_bytes)

    def _newest(self, client: HindsightClient, recall: Recall) -> list[dict[str, Any]]:
        assert recall.newest is not None
        found: list[dict[str, Any]] = []
        for t in recall.types or (None,):
            found += client.list_memories(recall.bank, fact_type=t, limit=recall.newest)
        if recall.since is not None:
            start = self.clock() - recall.since
            found = [m for m in found if _when(m) >= start]
        found.sort(key=_when, reverse=True)
        return found[: recall.newest]


def _when(memory: dict[str, Any]) -> float:
    """When a memory was mentioned (unix seconds; 0 when it does not say or is unreadable)."""
    try:
        return datetime.fromisoformat(str(memory.get("mentioned_at"))).timestamp()
    except ValueError:
        return 0.0


def _ref_error(ref: str, recall: Recall, exc: HindsightError) -> Exception:
    """The ref error a Hindsight error means: retried only where a retry spends nothing."""
    # A reflect that timed out or failed may have run Hindsight's LLM: only a refused
    # connection, a 429, or the listing a reflect asks first (no LLM) says nothing was spent.
    spent_nothing = (
        exc.status == 429
        or (exc.status == 0 and "ConnectionError" in exc.what)
        or exc.where.endswith("/memories/list")
    )
    if exc.transient and (spent_nothing or not recall.reflect):
        return RefUnavailable(ref, f"Hindsight at {exc.where or 'its URL'}: {exc.what}")
    return UnresolvableRef(ref, exc.what, hint=exc.hint)


def render(recall: Recall, results: list[dict[str, Any]]) -> str:
    """The prompt text of a recall or a listing: a heading, then one line per memory with
    its type, context and date."""
    n = len(results)
    what = f"the newest {recall.newest}" if recall.newest else f"recall {recall.query!r}"
    extra = [f"types {','.join(recall.types)}"] if recall.types else []
    extra += [f"since {_iso_ago(recall.since)}"] if recall.since is not None else []
    head = f"Hindsight bank {recall.bank}, {what}" + (f" ({'; '.join(extra)})" if extra else "")
    lines = [f"{head}: {n} memor{'y' if n == 1 else 'ies'}"]
    for r in results:
        # A recall says "type", a listing "fact_type".
        about = [str(r.get(k) or "") for k in ("type", "fact_type", "context", "mentioned_at") if r.get(k)]
        lines.append(f"- {' '.join(str(r['text']).split())}" + (f" [{'; '.join(about)}]" if about else ""))
    return "\n".join(lines) + "\n"


def _iso_ago(seconds: float | None) -> str:
    s = int(seconds or 0)
    return f"{s // 3600}h ago" if s % 3600 == 0 else f"{s}s ago"


def render_reflect(recall: Recall, text: str) -> str:
    """The prompt text of Hindsight's reflect answer."""
    return f"Hindsight bank {recall.bank}, reflect {recall.query!r}:\n{text.strip()}\n"
