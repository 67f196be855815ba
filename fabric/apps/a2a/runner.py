"""Running a sync call directly on a model agent: the workers' model path, minus the board.

Same prompt (:func:`workers.prompt.build_messages` with the agent's persona and the
ask rule), same client (:func:`workers.llm.client_for`: the LiteLLM gateway, LiteLLM
in process, or the demo model), same question convention (``QUESTION FOR HUMAN:``).
Nothing here reads or writes the board, except resolving a ``task:`` context ref the
caller passed explicitly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fabric.cards import Card, CardSet
from fabric.errors import FabricError
from fabric.settings import registry
from workers.executor import ASK_RULE, QUESTION_PREFIX
from workers.llm import (
    BadModelResponse,
    ModelClient,
    ModelRejected,
    ModelUnavailable,
    RateLimited,
    client_for,
)
from workers.prompt import build_messages, persona_text
from workers.refs import RefResolver, RefUnavailable, UnresolvableRef

log = logging.getLogger("agap.a2a.runner")

SYNC_MODES = frozenset({"gateway", "sdk", "demo"})


@dataclass(frozen=True)
class Answer:
    """What a sync call produced: a result, a question for the caller, or a failure."""

    kind: str  # "done" | "ask" | "failed"
    text: str
    cost_usd: float = 0.0


def conversation_intent(intent: str, conversation: Sequence[tuple[str, str]]) -> str:
    """The intent with earlier questions and answers appended (as the worker does it)."""
    lines = [intent]
    for kind, text in conversation:
        lines.append(f"\n{'You asked' if kind == 'question' else 'A person answered'}: {text}")
    return "\n".join(lines)


class Runner:
    """Model clients and personas per agent, built once; :meth:`run` is thread-safe."""

    def __init__(
        self,
        cards: CardSet,
        env: Mapping[str, str] | None = None,
        *,
        resolve_task: Callable[[int], str] | None = None,
    ) -> None:
        self.cards = cards
        self.env = dict(registry.environ(env))
        self._clients: dict[str, ModelClient] = {}
        self._lock = threading.Lock()
        roots = [Path(p) for p in registry.get_list("AGAP_REF_ROOTS", self.env)]
        self.refs = RefResolver(roots=roots, resolve_task=resolve_task)

    def mode(self, card: Card) -> str:
        return registry.get_str("AGAP_MODEL_MODE", self.env).strip().lower() or card.runtime.mode

    def can_sync(self, card: Card) -> bool:
        """True for agents the server can run directly (model and persona cards)."""
        return card.kind != "human" and self.mode(card) in SYNC_MODES

    def client(self, card: Card) -> ModelClient:
        with self._lock:
            c = self._clients.get(card.id)
            if c is None:
                c = self._clients[card.id] = client_for(card, self.env)
            return c

    def prepare(self, agent: str) -> None:
        """Build the agent's client now (a configuration error shows at start, not per call)."""
        card = self.cards.get(agent)
        if self.can_sync(card):
            self.client(card)

    def run(
        self,
        agent: str,
        intent: str,
        refs: Sequence[str],
        *,
        key: str,
        conversation: Sequence[tuple[str, str]] = (),
        metadata: Mapping[str, object] = ({}),
    ) -> Answer:
        """One model call for ``agent``; errors become a failed :class:`Answer`."""
        card = self.cards.get(agent)
        try:
            context = self.refs.resolve_all(refs)
        except (UnresolvableRef, RefUnavailable) as exc:
            return Answer("failed", exc.line())
        persona = persona_text(card.persona, self.cards.base_dir or Path.cwd()) if card.persona else None
        messages = build_messages(conversation_intent(intent, conversation), context, persona)
        messages[0]["content"] += ASK_RULE
        md = {"agent": card.id, "queue": card.queue_name, "tags": ["a2a:sync"], **dict(metadata)}
        try:
            answer = self.client(card).complete(
                messages,
                model=card.runtime.model or card.id,
                metadata=md,
                idempotency_key=key,
                timeout=card.runtime.timeout_seconds,
            )
        except RateLimited as exc:
            return Answer("failed", f"rate limited by the model provider ({exc.hint})")
        except ModelUnavailable as exc:
            return Answer("failed", f"model plane unavailable: {exc.what}")
        except ModelRejected as exc:
            return Answer("failed", f"the model plane refused the request: {exc.what}")
        except BadModelResponse as exc:
            return Answer("failed", f"bad model response: {exc.what}")
        except FabricError as exc:
            return Answer("failed", exc.line())
        except Exception:  # never hand a raw exception text to the caller
            log.exception("sync call to %s failed", agent)
            return Answer("failed", "internal error while calling the model (see the server log)")
        text = answer.text.strip()
        if text.startswith(QUESTION_PREFIX):
            question = text[len(QUESTION_PREFIX) :].strip() or "(the model asked for help)"
            return Answer("ask", question, answer.cost_usd)
        return Answer("done", answer.text, answer.cost_usd)
