"""Running a sync call directly on a model agent: the workers' model path, minus the board.

The call is :mod:`workers.answer`, as the worker makes it: the same prompt (the agent's
persona and the ask rule), the same client (the LiteLLM gateway, LiteLLM in process, or
the demo model, by the same ``AGAP_MODEL_MODE`` rule), the same question convention
(``QUESTION FOR HUMAN:``). Nothing here reads or writes the board, except resolving a
``task:`` context ref the caller passed explicitly.
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
from workers.answer import MODEL_MODES, Reply, ask, client_for, model_mode, task_messages
from workers.llm import (
    BadModelResponse,
    ModelClient,
    ModelRejected,
    ModelUnavailable,
    RateLimited,
)
from workers.prompt import persona_for
from workers.refs import RefResolver, RefUnavailable, UnresolvableRef

log = logging.getLogger("agap.a2a.runner")


@dataclass(frozen=True)
class Answer:
    """What a sync call produced: a result, a question for the caller, or a failure."""

    kind: str  # "done" | "ask" | "failed"
    text: str
    cost_usd: float = 0.0


class Runner:
    """Model clients per agent, built once; :meth:`run` is thread-safe."""

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
        return model_mode(card, self.env)

    def can_sync(self, card: Card) -> bool:
        """True for agents the server can run directly (model and persona cards)."""
        return card.kind != "human" and self.mode(card) in MODEL_MODES

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
            messages = task_messages(self.refs, intent, refs, persona_for(card, self.cards), conversation)
        except (UnresolvableRef, RefUnavailable) as exc:
            return Answer("failed", exc.line())
        md = {"agent": card.id, "queue": card.queue_name, "tags": ["a2a:sync"], **dict(metadata)}
        reply = self._ask(card, messages, md, key)
        if isinstance(reply, Answer):
            return reply
        return Answer(reply.kind, reply.text, reply.cost_usd)

    def _ask(
        self, card: Card, messages: list[dict[str, str]], metadata: dict[str, object], key: str
    ) -> Reply | Answer:
        """The model call; every failure is a failed :class:`Answer` with a line for the caller."""
        try:
            return ask(card, self.client(card), messages, metadata=metadata, key=key)
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
            log.exception("sync call to %s failed", card.id)
            return Answer("failed", "internal error while calling the model (see the server log)")
