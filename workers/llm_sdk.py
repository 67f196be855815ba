"""The in-process model client: ``litellm.completion`` (the embedded default with a real model).

Only this module touches the optional ``litellm`` package, and only on the first call
(:func:`_import_litellm`): the gateway path and ``agap --help`` never pay its import.
litellm's exception family is mapped onto the typed errors of :mod:`workers.llm`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from fabric.errors import ConfigError
from fabric.settings import registry
from workers.llm import (
    BadModelResponse,
    Completion,
    ModelAuthFailed,
    ModelError,
    ModelRejected,
    ModelTimedOut,
    ModelUnavailable,
    RateLimited,
    as_cost,
    malformed_text,
    parse_chat,
    text_or_none,
    trace_metadata,
)

__all__ = ["SdkClient"]


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
        text, usage, answered = parse_chat(data, where)
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = as_cost(hidden.get("response_cost")) if isinstance(hidden, dict) else 0.0
        if cost == 0.0:
            try:
                cost = as_cost(litellm.completion_cost(completion_response=resp))
            except Exception:  # an unknown model has no price: report 0
                cost = 0.0
        call_id = (hidden.get("litellm_call_id") if isinstance(hidden, dict) else None) or text_or_none(
            data.get("id")
        )
        return Completion(text=text, cost_usd=cost, model=answered or model, usage=usage, call_id=call_id)


def _import_litellm() -> Any:
    # litellm reads this at import: the bundled price list, no download from the worker.
    os.environ.setdefault(
        "LITELLM_LOCAL_MODEL_COST_MAP", registry.var("LITELLM_LOCAL_MODEL_COST_MAP").default
    )
    try:
        # Optional extra, and ~4-6 s to import: only a card in sdk mode pays for it, on its first call.
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
        return RateLimited.from_headers(f"rate limited: {message}", _litellm_headers(exc), where)
    spent = RateLimited.if_budget_spent(status, message, f"budget exhausted: {message}", where)
    if spent is not None:
        return spent
    if is_a("AuthenticationError", "PermissionDeniedError") or status in (401, 403):
        return ModelAuthFailed(
            f"the provider refused the key: {message}",
            where=where,
            status=status,
            hint="check the variable named by the card's runtime.api_key_env",
        )
    if _looks_malformed(exc):
        return BadModelResponse(f"malformed answer from the provider: {message}", where=where, status=status)
    if is_a("Timeout"):
        return ModelTimedOut(f"{type(exc).__name__}: {message}", where=where, status=status)
    if is_a("APIConnectionError", "ServiceUnavailableError", "InternalServerError", "BadGatewayError") or (
        status is not None and status >= 500
    ):
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
        if malformed_text(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False
