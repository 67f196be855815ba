"""Model clients: how a worker sends a prompt to a model and gets text, cost and a call id back.

Three implementations of one :class:`ModelClient` protocol:

* :class:`GatewayClient` — OpenAI-compatible HTTP to a LiteLLM proxy (production). It never
  imports the ``litellm`` package (~4-6 s and ~200 MB at import): it posts over
  :mod:`fabric.httpwire`'s sockets.
* :class:`~workers.llm_sdk.SdkClient` — ``litellm.completion`` in process (the embedded
  default with a real model); ``litellm`` is imported lazily, on the first call. It lives in
  :mod:`workers.llm_sdk`, the one module that knows the optional ``litellm`` package.
* :class:`DemoClient` — an offline, deterministic stand-in that answers every prompt with a
  labelled, canned summary ("[demo model] ..."), so ``make run`` works with no API key.

:func:`workers.answer.client_for` picks one from a card's ``runtime.mode`` (overridable by
``AGAP_MODEL_MODE``).

Errors are typed so the worker can react without parsing messages:

* :class:`RateLimited` (HTTP 429): park the queue until ``reset_at`` (from Retry-After and the
  rate-limit reset headers, all kept in ``headers``; read by :mod:`fabric.retry_after`);
* :class:`ModelUnavailable` (connection refused, timeout, 5xx; :class:`ModelAuthFailed` for a
  refused key): the model plane is down or misconfigured → park and resume, do not burn the task;
* :class:`BadModelResponse` (malformed JSON, no choices; :class:`ModelRejected` for a 4xx the
  provider gave to this very request): a failed attempt.

Every call carries ``metadata`` for tracing. :func:`trace_metadata` turns the worker's keys
(``agent``, ``task_id``, ``queue``, ...) into the keys LiteLLM's Langfuse callback reads:
``tags`` (→ trace tags), ``trace_name``, ``trace_id`` (all attempts on a task share a trace),
``trace_user_id``, ``trace_metadata``, ``generation_name``, ``session_id``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Protocol

from fabric.errors import ConfigError, FabricError
from fabric.httpwire import Ambiguous, HttpReply, KeptAlive, NotSent
from fabric.plain import Plain
from fabric.retry_after import budget_exhausted, parse_rate_limit

__all__ = [
    "DEFAULT_GATEWAY_URL",
    "BadModelResponse",
    "Completion",
    "DemoClient",
    "GatewayClient",
    "ModelAuthFailed",
    "ModelClient",
    "ModelError",
    "ModelRejected",
    "ModelUnavailable",
    "RateLimited",
    "as_cost",
    "malformed_text",
    "parse_chat",
    "text_or_none",
    "trace_metadata",
]

DEFAULT_GATEWAY_URL = "http://127.0.0.1:4000"
DEMO_PREFIX = "[demo model] "
USER_AGENT = "agap-fabric-worker"


# ---------------------------------------------------------------------------------------
# Result and errors


class Completion(Plain):
    """One model answer. ``cost_usd`` is 0.0 when the plane did not report a cost."""

    text: str
    cost_usd: float
    model: str
    usage: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


class ModelError(FabricError):
    """Base of the errors a model client raises on purpose."""


class RateLimited(ModelError):
    """HTTP 429. ``retry_after`` is seconds from when it was raised; ``reset_at`` an epoch
    time (either may be None when the provider announced nothing); ``headers`` the raw
    response headers (lower-cased names) for anything finer."""

    def __init__(
        self,
        what: str,
        *,
        retry_after: float | None = None,
        reset_at: float | None = None,
        headers: Mapping[str, str] | None = None,
        where: str = "",
    ) -> None:
        self.retry_after = retry_after
        self.reset_at = reset_at
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if retry_after is not None:
            hint = f"retry after {retry_after:.0f}s"
        elif reset_at is not None:
            hint = "wait until " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(reset_at))
        else:
            hint = "no reset announced; back off"
        super().__init__(what, where=where, hint=hint)

    @classmethod
    def from_headers(cls, what: str, headers: Mapping[str, str], where: str) -> RateLimited:
        """A 429, with the wait and reset its headers announce (:mod:`fabric.retry_after`)."""
        retry_after, reset_at = parse_rate_limit(headers)
        return cls(what, retry_after=retry_after, reset_at=reset_at, headers=headers, where=where)

    @classmethod
    def if_budget_spent(cls, status: int | None, message: str, what: str, where: str) -> RateLimited | None:
        """A cool-down until the date the message names, when it says the budget is spent."""
        spent, regain_at = budget_exhausted(status, message)
        return cls(what, reset_at=regain_at, where=where) if spent else None


class ModelUnavailable(ModelError):
    """The model plane cannot be reached or is failing (refused, timed out, 5xx): park the
    queue and resume later; the task itself is not at fault."""

    def __init__(self, what: str, *, where: str = "", hint: str = "", status: int | None = None) -> None:
        self.status = status
        super().__init__(
            what, where=where, hint=hint or "the queue waits and resumes when the model plane is back"
        )


class ModelTimedOut(ModelUnavailable):
    """The request was sent and no answer came within the timeout. The provider may still
    run it and charge for it, so the call counts against quota and budget; and a prompt that
    times out every time is the task's problem after a few tries, not the plane's."""


class ModelAuthFailed(ModelUnavailable):
    """The plane refused our key (401/403): a configuration problem, not the task's."""


class BadModelResponse(ModelError):
    """The exchange for this request failed (malformed JSON, no choices): a failed attempt."""

    def __init__(self, what: str, *, where: str = "", hint: str = "", status: int | None = None) -> None:
        self.status = status
        super().__init__(what, where=where, hint=hint)


class ModelRejected(BadModelResponse):
    """The plane refused this request (400, 404, 413, 422: bad model name, prompt too long)."""


# ---------------------------------------------------------------------------------------
# The protocol


class ModelClient(Protocol):
    """Sends chat messages to a model; raises the typed errors above."""

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        metadata: dict[str, Any],
        idempotency_key: str,
        timeout: float,
    ) -> Completion: ...


# ---------------------------------------------------------------------------------------
# Tracing metadata


def trace_metadata(
    metadata: Mapping[str, Any], *, model: str = "", idempotency_key: str = ""
) -> dict[str, Any]:
    """LiteLLM per-request metadata with the Langfuse keys filled in.

    ``metadata`` may hold ``agent``, ``task_id``, ``queue`` (and anything else); explicit
    ``tags``, ``trace_name``, ``trace_id``, ``generation_name`` win over the defaults.
    The result is JSON-serialisable (values that are not are turned into strings).
    """
    md: dict[str, Any] = {k: _jsonable(v) for k, v in metadata.items()}
    agent, task, queue = md.get("agent"), md.get("task_id"), md.get("queue")
    tags = [str(t) for t in (md.get("tags") or [])]
    for name, value in (("agent", agent), ("task", task), ("queue", queue)):
        if value is not None and f"{name}:{value}" not in tags:
            tags.append(f"{name}:{value}")
    md["tags"] = tags
    if task is not None:
        md.setdefault("trace_id", f"agap-task-{task}")
        md.setdefault("trace_name", f"task #{task}" + (f" ({agent})" if agent else ""))
    elif agent is not None:
        md.setdefault("trace_name", f"agent {agent}")
    if agent is not None:
        md.setdefault("trace_user_id", str(agent))
        md.setdefault("generation_name", f"{agent}:{model}" if model else str(agent))
    if queue is not None:
        md.setdefault("session_id", f"queue:{queue}")
    if idempotency_key:
        md.setdefault("idempotency_key", idempotency_key)
    trace_md = {k: md[k] for k in ("agent", "task_id", "queue", "attempt", "epoch") if k in md}
    if trace_md:
        md.setdefault("trace_metadata", trace_md)
    return md


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


# ---------------------------------------------------------------------------------------
# Reading an OpenAI-style chat answer (the gateway and the SDK client both get one)


def parse_chat(data: Any, where: str) -> tuple[str, dict[str, Any], str | None]:
    """``(text, usage, answered model)`` of a chat completion; malformed → :class:`BadModelResponse`."""
    if not isinstance(data, dict):
        raise BadModelResponse("the answer is not a JSON object", where=where)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BadModelResponse("the answer has no choices", where=where)
    first = choices[0]
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise BadModelResponse("the first choice has no message", where=where)
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise BadModelResponse("the message content is not text", where=where)
    usage = data.get("usage")
    return content, dict(usage) if isinstance(usage, dict) else {}, text_or_none(data.get("model"))


def as_cost(value: Any) -> float:
    """A reported cost in USD; missing or unreadable counts as 0.0."""
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def text_or_none(value: Any) -> str | None:
    """``value`` as text, or None when it is missing or empty."""
    return str(value) if value not in (None, "") else None


_MALFORMED_SIGNS = (
    "jsondecodeerror",
    "expecting value",
    "invalid json",
    "unterminated string",
    "extra data:",
    "no 'choices'",
    "no choices",
)


def malformed_text(text: str) -> bool:
    """True when an error message says the provider's answer was malformed."""
    low = text.lower()
    return any(sign in low for sign in _MALFORMED_SIGNS)


# ---------------------------------------------------------------------------------------
# Gateway: a LiteLLM proxy over HTTP (no litellm import)


class GatewayClient:
    """OpenAI-compatible HTTP to a LiteLLM proxy over kept-alive connections (thread-safe)."""

    def __init__(self, base_url: str = DEFAULT_GATEWAY_URL, api_key: str = "") -> None:
        if not api_key:
            raise ConfigError(
                "no key for the LiteLLM gateway",
                where=base_url,
                hint="set LITELLM_MASTER_KEY or AGAP_LITELLM_KEY",
            )
        base = base_url.rstrip("/")
        self.base_url = base
        self.url = f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"
        self._key = api_key
        self._wire = KeptAlive(
            self.url, headers={"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}, timeout=60.0
        )

    def __repr__(self) -> str:  # never show the key
        return f"GatewayClient({self.base_url!r})"

    def close(self) -> None:
        self._wire.close()

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        metadata: dict[str, Any],
        idempotency_key: str,
        timeout: float,
    ) -> Completion:
        body = {
            "model": model,
            "messages": messages,
            "metadata": trace_metadata(metadata, model=model, idempotency_key=idempotency_key),
        }
        try:
            resp = self._wire.post(
                json.dumps(body).encode(), headers={"Idempotency-Key": idempotency_key}, timeout=timeout
            )
        except NotSent as exc:
            raise ModelUnavailable(f"cannot reach the LiteLLM gateway ({exc})", where=self.url) from None
        except Ambiguous as exc:
            if exc.timed_out:
                raise ModelTimedOut(f"no answer within {timeout:g}s", where=self.url) from None
            raise ModelUnavailable(
                f"the LiteLLM gateway's answer broke off ({exc})", where=self.url
            ) from None
        raw_headers = resp.headers
        _raise_for_status(resp.status, raw_headers, _error_text(resp), self.url)
        try:
            data = json.loads(resp.body)
        except ValueError:
            raise BadModelResponse(
                "the gateway answered with malformed JSON", where=self.url, status=resp.status
            ) from None
        text, usage, answered_model = parse_chat(data, self.url)
        cost = as_cost(raw_headers.get("x-litellm-response-cost"))
        call_id = raw_headers.get("x-litellm-call-id") or text_or_none(data.get("id"))
        return Completion(
            text=text, cost_usd=cost, model=answered_model or model, usage=usage, call_id=call_id
        )


def _error_text(resp: HttpReply) -> str:
    if resp.status < 400:
        return ""
    try:
        data = json.loads(resp.body)
    except ValueError:
        return resp.body.decode("utf-8", "replace")[:300]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err or data)[:300]


def _raise_for_status(status: int, headers: Mapping[str, str], message: str, where: str) -> None:
    if status < 400:
        return
    detail = f"HTTP {status}" + (f": {message}" if message else "")
    if status == 429:
        raise RateLimited.from_headers(f"rate limited ({detail})", headers, where)
    spent = RateLimited.if_budget_spent(status, message, f"budget exhausted ({detail})", where)
    if spent is not None:
        raise spent
    if status in (401, 403):
        raise ModelAuthFailed(
            f"the model plane refused the key ({detail})",
            where=where,
            status=status,
            hint="check LITELLM_MASTER_KEY / AGAP_LITELLM_KEY or the card's api_key_env",
        )
    if status == 400 and "no connected db" in message.lower():
        # A proxy without a database knows only its master key: any other key lands here.
        raise ModelAuthFailed(
            f"the model plane refused the key ({detail})",
            where=where,
            status=status,
            hint="this LiteLLM proxy has no database, so only "
            "its master key is accepted: set LITELLM_MASTER_KEY",
        )
    if status >= 500 and malformed_text(message):
        # The proxy turns a provider's broken answer into a 500 that says so.
        raise BadModelResponse(f"the provider's answer was malformed ({detail})", where=where, status=status)
    if status in (408, 409) or status >= 500:
        raise ModelUnavailable(f"the model plane is failing ({detail})", where=where, status=status)
    raise ModelRejected(f"the model plane refused the request ({detail})", where=where, status=status)


# ---------------------------------------------------------------------------------------
# Demo: offline and deterministic

_REF_LINE = re.compile(r"^=== ref \d+: (?P<uri>\S+) \[[0-9a-f]+\] ===$", re.MULTILINE)


class DemoClient:
    """The offline demo model. Not a model at all: every answer starts with ``[demo model]``,
    restates the request and lists the context refs it was shown. Same prompt, same answer;
    zero cost."""

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        metadata: dict[str, Any],
        idempotency_key: str,
        timeout: float,
    ) -> Completion:
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        user = "\n\n".join(m.get("content", "") for m in messages if m.get("role") == "user")
        refs = _REF_LINE.findall(user)
        first_ref = _REF_LINE.search(user)
        intent = (user[: first_ref.start()] if first_ref else user).strip()
        intent_line = " ".join(intent.split())
        if len(intent_line) > 240:
            intent_line = intent_line[:239] + "…"
        persona = next((ln.strip("# ").strip() for ln in system.splitlines() if ln.strip()), "")
        if "[ask]" in intent and "A person answered:" not in intent:
            # Demo of the input-required path: the task goes to a human's inbox.
            text = (
                f"QUESTION FOR HUMAN: {DEMO_PREFIX}I need a person to decide before I "
                f"can do this: {intent_line}"
            )
            return Completion(text=text, cost_usd=0.0, model=model or "demo", call_id="demo-ask")
        lines = [
            f"{DEMO_PREFIX}This is a canned answer from the offline demo model, not a real model.",
            f"Task: {intent_line or '(no intent given)'}",
        ]
        if refs:
            lines.append(f"Context I was given ({len(refs)} ref{'s' if len(refs) != 1 else ''}):")
            lines.extend(f"- {uri}" for uri in refs)
        else:
            lines.append("Context I was given: none.")
        if persona:
            lines.append(f"Persona: {persona[:120]}")
        lines.append("Set the card's runtime.mode to gateway or sdk (or AGAP_MODEL_MODE) for real answers.")
        text = "\n".join(lines)
        prompt_tokens = sum(len(m.get("content", "").split()) for m in messages)
        completion_tokens = len(text.split())
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        return Completion(
            text=text,
            cost_usd=0.0,
            model=model or "demo",
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            call_id=f"demo-{digest[:16]}",
        )
