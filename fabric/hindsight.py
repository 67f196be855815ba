"""The part of Hindsight's HTTP API the fabric speaks (Hindsight 1.1.0, ``hindsight-api-slim``).

Every call names a bank under ``{url}/v1/default/banks/{bank_id}``:

* ``POST …/memories/recall`` ``{query, budget, max_tokens, types, query_timestamp,
  temporal_window}`` → ``{"results": [...]}``: what ``hindsight://`` refs read;
* ``GET …/memories/list?type=&limit=`` → ``{"items": [...]}``, newest first (by
  ``mentioned_at``): the newest memories, which no recall query returns;
* ``POST …/memories`` ``{"items": [{content, context, timestamp, document_id, tags}]}``: a
  retain (Hindsight extracts facts with its LLM, synchronously);
* ``POST …/reflect`` ``{query, budget, max_tokens}`` → ``{"text": ...}``: an answer its LLM
  writes from the bank (after ``GET …/memories/list?limit=1``: a reflect on a bank Hindsight
  does not know makes the bank and runs its LLM on nothing, where the list API says 404);
* ``POST …/consolidate`` → ``{"operation_id": ...}``: its consolidation into observations
  (queued; Hindsight also runs it after every retain by default).

A bank id is case-sensitive, as Hindsight's are, and may contain ``::`` (the separator of
the bank names Hindsight's own OpenClaw plugin makes, ``agent::channel::user``).

Nothing here retries. Hindsight away, 408, 429 or 5xx is a :class:`HindsightUnavailable`
(``transient``: a caller may try again later, where doing so spends no quota); refused
credentials (401, 403), an unknown bank (404) or a request it rejects (400, 422) is a
:class:`HindsightRefused`. Each error is one line naming the URL and what to do.
"""

from __future__ import annotations

import json
import re
from dataclasses import field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from fabric.errors import EXIT_INVALID, EXIT_UNREACHABLE, FabricError, InvalidInput
from fabric.plain import Plain
from fabric.refcanon import BadRef, canonical

if TYPE_CHECKING:
    import requests

__all__ = [
    "BANK_ID",
    "BUDGETS",
    "FACT_TYPES",
    "HindsightClient",
    "HindsightError",
    "HindsightRefused",
    "HindsightUnavailable",
    "bank_of",
    "valid_bank_id",
]

BUDGETS = ("low", "mid", "high")
FACT_TYPES = ("world", "experience", "observation")
#: The bank ids the fabric sends: letters (either case), digits, ``_ . : -``, no ``..``.
#: Hindsight takes any path segment; this keeps ids plain enough to judge and to log.
BANK_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]{0,254}[A-Za-z0-9])?$")
LIMIT = 4 << 20  # bytes of an answer read at most: a recall capped by max_tokens is far less


def valid_bank_id(bank: str) -> bool:
    """Whether ``bank`` is a bank id the fabric sends (see :data:`BANK_ID`)."""
    return bool(BANK_ID.match(bank)) and ".." not in bank


_BANK_HINT = "write the bank as hindsight://<bank>/ (its id as Hindsight spells it)"


def bank_of(ref: str) -> tuple[str, str]:
    """(bank id, canonical key) of a bank ref ``hindsight://<bank>/``; InvalidInput else.

    What a retain goes into (``agap memory retain``, a card's ``memory.retain``): a whole
    bank, never a query in it.
    """
    parts = urlsplit(ref.strip())
    try:
        key = canonical(ref).key
    except BadRef as exc:
        raise InvalidInput(str(exc), where=ref, hint=_BANK_HINT) from None
    bank = unquote(parts.netloc)
    if parts.scheme.lower() != "hindsight" or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInput("not a bank: a retain goes into a whole bank", where=ref, hint=_BANK_HINT)
    if not valid_bank_id(bank) or bank != urlsplit(key).netloc:
        raise InvalidInput(f"{bank!r} is not a Hindsight bank id", where=ref, hint=_BANK_HINT)
    return bank, key


class HindsightError(FabricError):
    """Hindsight did not do what was asked; :attr:`status` is its HTTP status (0: no answer)."""

    transient = False

    def __init__(self, what: str, *, status: int = 0, where: str = "", hint: str = "") -> None:
        self.status = status
        super().__init__(what, where=where, hint=hint)


class HindsightUnavailable(HindsightError):
    """No answer, a timeout, 408, 429 or 5xx: a later attempt may succeed."""

    exit_code = EXIT_UNREACHABLE
    transient = True


class HindsightRefused(HindsightError):
    """401/403 (credentials: exit 3), 404 (no such bank) or 400/422 (a request it rejects)."""

    exit_code = EXIT_INVALID


class HindsightClient(Plain, frozen=False):
    """One Hindsight API: ``url`` (``AGAP_HINDSIGHT_URL``) and its bearer ``key``."""

    url: str
    key: str = ""
    timeout: float = 30.0
    session: requests.Session | None = field(default=None, repr=False)
    limit: int = LIMIT

    def recall(self, bank: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        data = self.call("POST", bank, "memories/recall", json_body=body)
        return _memories(data, "results", self._where(bank, "memories/recall"))

    def list_memories(
        self, bank: str, *, fact_type: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if fact_type:
            params["type"] = fact_type
        data = self.call("GET", bank, "memories/list", params=params)
        return _memories(data, "items", self._where(bank, "memories/list"))

    def retain(self, bank: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return _object(
            self.call("POST", bank, "memories", json_body={"items": items}), self._where(bank, "memories")
        )

    def reflect(self, bank: str, body: dict[str, Any]) -> str:
        # Hindsight 1.1.0 answers a reflect on a bank it does not know by making the bank and
        # running its LLM on nothing: the list API (no LLM) says 404 for it first.
        self.list_memories(bank, limit=1)
        data = _object(self.call("POST", bank, "reflect", json_body=body), self._where(bank, "reflect"))
        text = data.get("text")
        if not isinstance(text, str):
            raise HindsightRefused(
                "Hindsight's reflect answer has no text", where=self._where(bank, "reflect")
            )
        return text

    def consolidate(self, bank: str) -> dict[str, Any]:
        return _object(self.call("POST", bank, "consolidate", json_body={}), self._where(bank, "consolidate"))

    # -- the wire --------------------------------------------------------------------

    def _where(self, bank: str, tail: str) -> str:
        return f"{self.url.rstrip('/')}/v1/default/banks/{quote(bank, safe='')}/{tail}"

    def call(
        self,
        method: str,
        bank: str,
        tail: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """One request to ``…/banks/{bank}/{tail}``; its JSON answer, or an error."""
        if not valid_bank_id(bank):
            raise HindsightRefused(f"{bank!r} is not a Hindsight bank id", hint="letters, digits, _ . : -")
        where = self._where(bank, tail)
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        import requests  # only a memory call pays for it (a worker's memory)

        session = self.session or requests.Session()
        try:
            with session.request(
                method,
                where,
                json=json_body,
                params=params,
                headers=headers,
                timeout=self.timeout,
                allow_redirects=False,
                stream=True,
            ) as resp:
                status, raw = resp.status_code, _head(resp, self.limit)
        except requests.RequestException as exc:
            raise HindsightUnavailable(
                f"no answer ({type(exc).__name__})",
                where=where,
                hint="is Hindsight running? check AGAP_HINDSIGHT_URL",
            ) from None
        finally:
            if self.session is None:
                session.close()
        check_status(status, raw, where, bank)
        if len(raw) > self.limit:
            raise HindsightRefused(
                "Hindsight's answer is too large", status=status, where=where, hint="lower max_tokens"
            )
        try:
            return json.loads(raw)
        except ValueError:
            raise HindsightRefused("Hindsight's answer is not JSON", status=status, where=where) from None


def _head(resp: requests.Response, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the body: enough to tell it is too large."""
    data = b""
    for chunk in resp.iter_content(65536):
        data += chunk
        if len(data) > limit:
            break
    return data


def detail(raw: bytes) -> str:
    """Hindsight's (FastAPI's) error ``detail`` as one short line."""
    try:
        d = json.loads(raw).get("detail")
    except (ValueError, AttributeError):  # not Hindsight's JSON: a proxy's page, say
        text = re.sub(r"<[^>]*>", " ", raw[:2000].decode("utf-8", "replace"))
        return " ".join(text.split())[:160]
    if isinstance(d, list) and d and isinstance(d[0], dict):  # a validation error
        first = d[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return f"{loc}: {first.get('msg', '')}".strip(": ")
    return " ".join(str(d).split())[:200]


def check_status(status: int, raw: bytes, where: str, bank: str) -> None:
    """Raise the error an HTTP ``status`` means (nothing for 2xx)."""
    if 200 <= status < 300:
        return
    if status in (408, 429) or status >= 500:
        raise HindsightUnavailable(
            f"Hindsight answered HTTP {status}", status=status, where=where, hint="try later"
        )
    if status in (401, 403):
        raise HindsightRefused(
            f"Hindsight refused the credentials (HTTP {status})",
            status=status,
            where=where,
            hint="set AGAP_HINDSIGHT_KEY to its HINDSIGHT_API_TENANT_API_KEY",
        ).with_exit(EXIT_UNREACHABLE)
    if status == 404 and detail(raw) == f"Bank '{bank}' not found":
        raise HindsightRefused(
            f"Hindsight has no bank {bank!r} (HTTP 404)",
            status=status,
            where=where,
            hint="bank ids are case-sensitive: check the spelling",
        )
    if status == 404:  # FastAPI's "Not Found": no such route, so no Hindsight API at this URL
        raise HindsightRefused(
            f"no Hindsight API at this URL (HTTP 404: {detail(raw)})",
            status=status,
            where=where,
            hint="set AGAP_HINDSIGHT_URL to Hindsight's base URL, e.g. http://127.0.0.1:8888 (no /v1 path)",
        )
    raise HindsightRefused(
        f"Hindsight refused the request (HTTP {status}): {detail(raw)}", status=status, where=where
    )


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise HindsightRefused("Hindsight's answer is not a JSON object", where=where)
    return data


def _memories(data: Any, key: str, where: str) -> list[dict[str, Any]]:
    items = _object(data, where).get(key)
    if not isinstance(items, list):
        raise HindsightRefused(f"Hindsight's answer has no {key} list", where=where)
    return [r for r in items if isinstance(r, dict) and isinstance(r.get("text"), str)]
