"""Model clients: how a worker sends a prompt to a model and gets text, cost and a call id back.

Three implementations of one :class:`ModelClient` protocol:

* :class:`GatewayClient` — OpenAI-compatible HTTP to a LiteLLM proxy (production). It never
  imports the ``litellm`` package (~4-6 s and ~200 MB at import), only ``requests``.
* :class:`SdkClient` — ``litellm.completion`` in process (the embedded default with a real
  model); ``litellm`` is imported lazily, on the first call.
* :class:`DemoClient` — an offline, deterministic stand-in that answers every prompt with a
  labelled, canned summary ("[demo model] ..."), so ``make run`` works with no API key.

:func:`client_for` picks one from a card's ``runtime.mode`` (overridable by ``AGAP_MODEL_MODE``).

Errors are typed so the worker can react without parsing messages:

* :class:`RateLimited` (HTTP 429): park the queue until ``reset_at`` (from Retry-After and the
  rate-limit reset headers, all kept in ``headers``);
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

import email.utils
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import requests

from fabric.errors import ConfigError, FabricError
from fabric.settings import registry

if TYPE_CHECKING:
    from fabric.cards import Card

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
    "SdkClient",
    "client_for",
    "parse_rate_limit",
    "trace_metadata",
]

DEFAULT_GATEWAY_URL = "http://127.0.0.1:4000"
DEMO_PREFIX = "[demo model] "
USER_AGENT = "agap-fabric-worker"


# ---------------------------------------------------------------------------------------
# Result and errors


@dataclass(frozen=True)
class Completion:
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
        hint = (
            f"retry after {retry_after:.0f}s" if retry_after is not None else "no reset announced; back off"
        )
        super().__init__(what, where=where, hint=hint)


class ModelUnavailable(ModelError):
    """The model plane cannot be reached or is failing (refused, timed out, 5xx): park the
    queue and resume later; the task itself is not at fault."""

    def __init__(self, what: str, *, where: str = "", hint: str = "", status: int | None = None) -> None:
        self.status = status
        super().__init__(
            what, where=where, hint=hint or "the queue waits and resumes when the model plane is back"
        )


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
# Rate-limit headers

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


def parse_rate_limit(
    headers: Mapping[str, str], now: float | None = None
) -> tuple[float | None, float | None]:
    """``(retry_after_seconds, reset_at_epoch)`` from a 429's headers.

    Reads ``Retry-After`` (seconds or an HTTP date), ``retry-after-ms``, and the
    ``x-ratelimit-reset*`` family (durations like ``6m0s``, or epoch seconds); the latest
    announced reset wins, since the caller must wait for all of them.
    """
    now = time.time() if now is None else now
    h = {k.lower(): v for k, v in headers.items()}
    # The LiteLLM proxy relays the provider's headers with an ``llm_provider-`` prefix;
    # its own (unprefixed) headers win.
    for name, value in list(h.items()):
        if name.startswith(_PROVIDER_PREFIX):
            h.setdefault(name[len(_PROVIDER_PREFIX) :], value)
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
    retry_after = max(waits) if waits else None
    resets: list[float] = []
    for name, raw in h.items():
        if not name.startswith(("x-ratelimit-reset", "ratelimit-reset")):
            continue
        seconds = _duration(raw)
        if seconds is None:
            continue
        # A huge number is an epoch timestamp; a small one a delay.
        resets.append(seconds if seconds > 1_000_000_000 else now + seconds)
    if retry_after is not None:
        resets.append(now + retry_after)
    reset_at = max(resets) if resets else None
    if retry_after is None and reset_at is not None:
        retry_after = max(0.0, reset_at - now)
    return retry_after, reset_at


# ---------------------------------------------------------------------------------------
# Gateway: a LiteLLM proxy over HTTP (no litellm import)


class GatewayClient:
    """OpenAI-compatible HTTP to a LiteLLM proxy, one kept-alive session per thread."""

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
        self._local = threading.local()

    def __repr__(self) -> str:  # never show the key
        return f"GatewayClient({self.base_url!r})"

    @property
    def session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def close(self) -> None:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is not None:
            session.close()
            self._local.session = None

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
        headers = {
            "Authorization": f"Bearer {self._key}",
            "Idempotency-Key": idempotency_key,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        try:
            resp = self.session.post(self.url, data=json.dumps(body), headers=headers, timeout=timeout)
        except requests.Timeout as exc:
            raise ModelUnavailable(
                f"no answer within {timeout:g}s ({type(exc).__name__})", where=self.url
            ) from None
        except requests.RequestException as exc:
            raise ModelUnavailable(
                f"cannot reach the LiteLLM gateway ({type(exc).__name__})", where=self.url
            ) from None
        raw_headers = {k.lower(): v for k, v in resp.headers.items()}
        _raise_for_status(resp.status_code, raw_headers, _error_text(resp), self.url)
        try:
            data = resp.json()
        except ValueError:
            raise BadModelResponse(
                "the gateway answered with malformed JSON", where=self.url, status=resp.status_code
            ) from None
        text, usage, answered_model = _parse_chat(data, self.url)
        cost = _float(raw_headers.get("x-litellm-response-cost"))
        call_id = raw_headers.get("x-litellm-call-id") or _str(data.get("id"))
        return Completion(
            text=text, cost_usd=cost, model=answered_model or model, usage=usage, call_id=call_id
        )


def _error_text(resp: requests.Response) -> str:
    if resp.status_code < 400:
        return ""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:300]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err or data)[:300]


def _raise_for_status(status: int, headers: Mapping[str, str], message: str, where: str) -> None:
    if status < 400:
        return
    detail = f"HTTP {status}" + (f": {message}" if message else "")
    if status == 429:
        retry_after, reset_at = parse_rate_limit(headers)
        raise RateLimited(
            f"rate limited ({detail})",
            retry_after=retry_after,
            reset_at=reset_at,
            headers=headers,
            where=where,
        )
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
    if status >= 500 and _malformed_text(message):
        # The proxy turns a provider's broken answer into a 500 that says so.
        raise BadModelResponse(f"the provider's answer was malformed ({detail})", where=where, status=status)
    if status in (408, 409) or status >= 500:
        raise ModelUnavailable(f"the model plane is failing ({detail})", where=where, status=status)
    raise ModelRejected(f"the model plane refused the request ({detail})", where=where, status=status)


def _parse_chat(data: Any, where: str) -> tuple[str, dict[str, Any], str | None]:
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
    return content, dict(usage) if isinstance(usage, dict) else {}, _str(data.get("model"))


def _float(value: Any) -> float:
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


# ---------------------------------------------------------------------------------------
# SDK: litellm in process


class SdkClient:
    """``litellm.completion`` in process. ``litellm`` is imported on the first call only.

    ``api_base``/``api_key`` go to every call (the card's values); ``extra`` holds further
    ``litellm.completion`` keyword arguments. LiteLLM's own retries are off: the worker's
    retry policy and a(t) decide when to try again.
    """

    def __init__(
        self,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.api_base = api_base
        self._key = api_key
        self.extra = dict(extra or {})

    def __repr__(self) -> str:
        return f"SdkClient(api_base={self.api_base!r})"

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        metadata: dict[str, Any],
        idempotency_key: str,
        timeout: float,
    ) -> Completion:
        litellm = _import_litellm()
        where = self.api_base or model
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "timeout": timeout,
            "metadata": trace_metadata(metadata, model=model, idempotency_key=idempotency_key),
            "extra_headers": {"Idempotency-Key": idempotency_key},
            "num_retries": 0,
            "max_retries": 0,
        }
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self._key:
            kwargs["api_key"] = self._key
        kwargs.update(self.extra)
        try:
            resp = litellm.completion(**kwargs)
        except Exception as exc:
            raise _map_litellm_error(litellm, exc, where) from None
        try:
            data = resp.model_dump() if hasattr(resp, "model_dump") else dict(resp)
        except Exception:
            raise BadModelResponse("litellm returned an unreadable response", where=where) from None
        text, usage, answered = _parse_chat(data, where)
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = _float(hidden.get("response_cost")) if isinstance(hidden, dict) else 0.0
        if cost == 0.0:
            try:
                cost = _float(litellm.completion_cost(completion_response=resp))
            except Exception:  # an unknown model has no price: report 0
                cost = 0.0
        call_id = (hidden.get("litellm_call_id") if isinstance(hidden, dict) else None) or _str(
            data.get("id")
        )
        return Completion(text=text, cost_usd=cost, model=answered or model, usage=usage, call_id=call_id)


def _import_litellm() -> Any:
    # litellm reads this at import: the bundled price list, no download from the worker.
    os.environ.setdefault(
        "LITELLM_LOCAL_MODEL_COST_MAP", registry.var("LITELLM_LOCAL_MODEL_COST_MAP").default
    )
    try:
        import litellm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ConfigError(
            "runtime mode sdk needs the litellm package",
            hint="pip install 'agap-fabric[litellm]', or use mode gateway",
        ) from None
    litellm.suppress_debug_info = True  # no "Provider List" banners in the worker's log
    return litellm


def _litellm_headers(exc: BaseException) -> dict[str, str]:
    headers: dict[str, str] = {}
    raw = getattr(exc, "litellm_response_headers", None)
    response = getattr(exc, "response", None)
    for source in (getattr(response, "headers", None), raw):
        if source is None:
            continue
        try:
            headers.update({str(k).lower(): str(v) for k, v in dict(source).items()})
        except (TypeError, ValueError):
            continue
    return headers


def _map_litellm_error(litellm: Any, exc: Exception, where: str) -> ModelError:
    """litellm's exception family → the typed errors. Unknown exceptions → failed attempt."""
    message = str(getattr(exc, "message", "") or exc)[:300]
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None

    def is_a(*names: str) -> bool:
        return any(isinstance(exc, cls) for n in names if isinstance(cls := getattr(litellm, n, None), type))

    if is_a("RateLimitError") or status == 429:
        headers = _litellm_headers(exc)
        retry_after, reset_at = parse_rate_limit(headers)
        return RateLimited(
            f"rate limited: {message}",
            retry_after=retry_after,
            reset_at=reset_at,
            headers=headers,
            where=where,
        )
    if is_a("AuthenticationError", "PermissionDeniedError") or status in (401, 403):
        return ModelAuthFailed(
            f"the provider refused the key: {message}",
            where=where,
            status=status,
            hint="check the variable named by the card's runtime.api_key_env",
        )
    if _looks_malformed(exc):
        return BadModelResponse(f"malformed answer from the provider: {message}", where=where, status=status)
    if is_a(
        "Timeout", "APIConnectionError", "ServiceUnavailableError", "InternalServerError", "BadGatewayError"
    ) or (status is not None and status >= 500):
        return ModelUnavailable(f"{type(exc).__name__}: {message}", where=where, status=status)
    if is_a(
        "BadRequestError",
        "NotFoundError",
        "UnprocessableEntityError",
        "ContextWindowExceededError",
        "ContentPolicyViolationError",
    ) or (status is not None and 400 <= status < 500):
        return ModelRejected(f"{type(exc).__name__}: {message}", where=where, status=status)
    return BadModelResponse(f"{type(exc).__name__}: {message}", where=where, status=status)


def _looks_malformed(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, json.JSONDecodeError):
            return True
        if _malformed_text(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


_MALFORMED_SIGNS = (
    "jsondecodeerror",
    "expecting value",
    "invalid json",
    "unterminated string",
    "extra data:",
    "no 'choices'",
    "no choices",
)


def _malformed_text(text: str) -> bool:
    low = text.lower()
    return any(sign in low for sign in _MALFORMED_SIGNS)


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


# ---------------------------------------------------------------------------------------
# Selection

_MODES = ("gateway", "sdk", "demo")


def client_for(card: Card, env: Mapping[str, str] | None = None) -> ModelClient:
    """The client for ``card``: by ``card.runtime.mode``, or ``AGAP_MODEL_MODE`` when set.

    * gateway: ``AGAP_LITELLM_URL`` (else the card's ``api_base`` when the card itself says
      gateway, else http://127.0.0.1:4000); key from ``AGAP_LITELLM_KEY``, else the card's
      ``api_key_env`` (gateway cards), else ``LITELLM_MASTER_KEY``.
    * sdk: the card's ``api_base`` (cards kept in demo mode still name their production
      endpoint); key from the variable named by ``api_key_env``.
    * demo: :class:`DemoClient`.
    """
    env = registry.environ(env)
    runtime = card.runtime
    override = registry.get_str("AGAP_MODEL_MODE", env).strip().lower()
    if override and override not in _MODES:
        raise ConfigError(
            f"AGAP_MODEL_MODE={override!r} is not a model mode", hint="one of: " + ", ".join(_MODES)
        )
    mode = override or runtime.mode
    own = runtime.mode == mode  # the card's own settings apply to its own mode only
    if mode == "demo":
        return DemoClient()
    if mode == "gateway":
        # Unset means the card's own endpoint first: not the registered default at once.
        base = (
            registry.get_str("AGAP_LITELLM_URL", env, fallback="")
            or (runtime.api_base if own else None)
            or DEFAULT_GATEWAY_URL
        )
        key = (
            registry.get_str("AGAP_LITELLM_KEY", env)
            or (registry.named(runtime.api_key_env, env) if own and runtime.api_key_env else None)
            or registry.get_str("LITELLM_MASTER_KEY", env)
        )
        if not key:
            raise ConfigError(
                f"card {card.id!r} runs through the LiteLLM gateway at {base} but no gateway key is set",
                where=f"cards/{card.id}.yaml",
                hint="set LITELLM_MASTER_KEY or AGAP_LITELLM_KEY (or AGAP_MODEL_MODE=demo to run offline)",
            )
        return GatewayClient(base, key)
    if mode == "sdk":
        sdk_key: str | None = None
        if runtime.api_key_env:
            sdk_key = registry.named(runtime.api_key_env, env)
            if not sdk_key:
                raise ConfigError(
                    f"card {card.id!r} calls its model in process but {runtime.api_key_env} is not set",
                    where=f"cards/{card.id}.yaml",
                    hint=f"put the key in {runtime.api_key_env} (environment or "
                    ".env), or AGAP_MODEL_MODE=demo to run offline",
                )
        return SdkClient(api_base=runtime.api_base, api_key=sdk_key)
    raise ConfigError(
        f"card {card.id!r} has runtime mode {mode!r}: its work is done outside "
        "the worker (a persona runtime or a person), not by a model client",
        where=f"cards/{card.id}.yaml",
    )
