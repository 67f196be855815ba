"""Asking an agent's model about a task: the one path the worker, the A2A server and the eval gate share.

resolve the task's refs and build the messages (:func:`task_messages`: persona, prompt,
the ask rule) → the card's client, chosen by the one ``AGAP_MODEL_MODE`` rule
(:func:`model_mode`, :func:`client_for`) → the call with the card's model and timeout
(:func:`complete`) → the answer read (:func:`ask`, :func:`read_reply`: a result, or a
question for a person when it starts with :data:`QUESTION_PREFIX`).

What each caller does around the call stays with it: the worker checks its lease and keeps
the side-effect receipt between building the messages and the call, and stores the result;
the A2A server keeps its local row; the eval gate sends the golden inputs as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from fabric.cards import Card
from fabric.errors import ConfigError
from fabric.plain import Plain
from fabric.settings import registry
from fabric.settings.resolve import warn_if_plaintext
from workers.llm import DEFAULT_GATEWAY_URL, Completion, DemoClient, GatewayClient, ModelClient
from workers.llm_sdk import SdkClient
from workers.prompt import build_messages
from workers.refs import RefResolver

__all__ = [
    "ASK_RULE",
    "MODEL_MODES",
    "QUESTION_PREFIX",
    "Reply",
    "ask",
    "client_for",
    "complete",
    "conversation_intent",
    "model_mode",
    "read_reply",
    "task_messages",
]

QUESTION_PREFIX = "QUESTION FOR HUMAN:"
ASK_RULE = (
    f"\n\nIf you cannot do the task without information only a person has, reply "
    f"with one line that starts with '{QUESTION_PREFIX}' and asks for it."
)

# The modes a model client serves; a card may also say "external" or "human" (no client).
MODEL_MODES = ("gateway", "sdk", "demo")


# ---------------------------------------------------------------------------------------
# Which client


def model_mode(card: Card, env: Mapping[str, str] | None = None, *, strict: bool = False) -> str:
    """The mode ``card``'s model calls run in: ``AGAP_MODEL_MODE`` when set, else the card's.

    ``strict``: an ``AGAP_MODEL_MODE`` that names no model mode is a :class:`ConfigError`
    (as building a client needs); otherwise it is returned as it is.
    """
    override = registry.get_str("AGAP_MODEL_MODE", env).strip().lower()
    if strict and override and override not in MODEL_MODES:
        raise ConfigError(
            f"AGAP_MODEL_MODE={override!r} is not a model mode", hint="one of: " + ", ".join(MODEL_MODES)
        )
    return override or card.runtime.mode


def client_for(card: Card, env: Mapping[str, str] | None = None) -> ModelClient:
    """The client for ``card``: by ``card.runtime.mode``, or ``AGAP_MODEL_MODE`` when set.

    * gateway: ``AGAP_LITELLM_URL`` (else the card's ``api_base`` when the card itself says
      gateway, else http://127.0.0.1:4000); key from ``AGAP_LITELLM_KEY``, else the card's
      ``api_key_env`` (gateway cards), else ``LITELLM_MASTER_KEY``.
    * sdk: the card's ``api_base`` (cards kept in demo mode still name their production
      endpoint); key from the variable named by ``api_key_env``.
    * demo: :class:`~workers.llm.DemoClient`.
    """
    env = registry.environ(env)
    mode = model_mode(card, env, strict=True)
    own = card.runtime.mode == mode  # the card's own settings apply to its own mode only
    if mode == "demo":
        return DemoClient()
    if mode == "gateway":
        return _gateway_client(card, env, own=own)
    if mode == "sdk":
        return _sdk_client(card, env)
    raise ConfigError(
        f"card {card.id!r} has runtime mode {mode!r}: its work is done outside "
        "the worker (a persona runtime or a person), not by a model client",
        where=f"cards/{card.id}.yaml",
    )


def _gateway_client(card: Card, env: Mapping[str, str], *, own: bool) -> GatewayClient:
    runtime = card.runtime
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
    warn_if_plaintext(base, "the LiteLLM proxy")
    return GatewayClient(base, key)


def _sdk_client(card: Card, env: Mapping[str, str]) -> SdkClient:
    runtime = card.runtime
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


# ---------------------------------------------------------------------------------------
# The prompt


_SAID = {
    "question": "You asked",
    "answer": "A person answered",
    "reopen": "Your earlier result was sent back for rework, because",
}


def conversation_intent(intent: str, conversation: Sequence[tuple[str, str]]) -> str:
    """The intent with earlier questions, answers and rework reasons appended, in order."""
    lines = [intent]
    for kind, text in conversation:
        lines.append(f"\n{_SAID.get(kind, 'A person answered')}: {text}")
    return "\n".join(lines)


def task_messages(
    refs: RefResolver,
    intent: str,
    uris: Iterable[str],
    persona: str | None,
    conversation: Sequence[tuple[str, str]] = (),
) -> list[dict[str, str]]:
    """``[system, user]`` for a task: its refs resolved, the persona, and the ask rule.

    Raises :class:`~workers.refs.UnresolvableRef` or :class:`~workers.refs.RefUnavailable`.
    """
    context = refs.resolve_all(uris)
    messages = build_messages(conversation_intent(intent, conversation), context, persona)
    messages[0]["content"] += ASK_RULE
    return messages


# ---------------------------------------------------------------------------------------
# The call and its answer


class Reply(Plain):
    """A model's answer to a task: a result (``done``), or a question for a person (``ask``)."""

    kind: Literal["done", "ask"]
    text: str  # the result as the model gave it, or the question
    completion: Completion

    @property
    def cost_usd(self) -> float:
        return self.completion.cost_usd


def complete(
    card: Card,
    client: ModelClient,
    messages: list[dict[str, str]],
    *,
    metadata: dict[str, Any],
    key: str,
    model: str | None = None,
    timeout: float | None = None,
) -> Completion:
    """One call of ``card``'s model (``model``/``timeout``: other than the card's own).

    Raises the typed errors of :mod:`workers.llm`.
    """
    return client.complete(
        messages,
        model=model if model is not None else (card.runtime.model or card.id),
        metadata=metadata,
        idempotency_key=key,
        timeout=timeout if timeout is not None else card.runtime.timeout_seconds,
    )


def read_reply(completion: Completion) -> Reply:
    """A question when the answer starts with :data:`QUESTION_PREFIX`, else the result."""
    text = completion.text.strip()
    if text.startswith(QUESTION_PREFIX):
        question = text[len(QUESTION_PREFIX) :].strip() or "(the model asked for help)"
        return Reply("ask", question, completion)
    return Reply("done", completion.text, completion)


def ask(
    card: Card, client: ModelClient, messages: list[dict[str, str]], *, metadata: dict[str, Any], key: str
) -> Reply:
    """:func:`complete` then :func:`read_reply`: what a task's model call answered."""
    return read_reply(complete(card, client, messages, metadata=metadata, key=key))
