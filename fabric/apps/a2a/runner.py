"""Running a sync call directly on a model agent: the workers' model path, minus the board.

The call is :mod:`workers.answer`, as the worker makes it: the same prompt (the agent's
persona and the ask rule), the same client (the LiteLLM gateway, LiteLLM in process, or
the demo model, by the same ``AGAP_MODEL_MODE`` rule), the same question convention
(``QUESTION FOR HUMAN:``). Nothing here reads or writes the board, except resolving a
``task:`` context ref the caller passed explicitly. The agent's a(t) admits and counts
every call in the ledger its worker uses (:mod:`fabric.apps.a2a.admission`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fabric.cards import Card, CardSet
from fabric.domains import Domains, ReadGuard, person_of
from fabric.errors import FabricError
from fabric.policy_file import PolicyConfig, policy_config
from fabric.refusals import PolicyRefused
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
from workers.shared_quota import Across
from workers.stores import store_readers

from .admission import Admission

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
        state_dir: Path | None = None,
        across: Across | None = None,
    ) -> None:
        self.cards = cards
        self.env = dict(registry.environ(env))
        # a(t) shared with the agent's worker (the endpoint's ledger under state_dir, and
        # with ``across`` the quotas kept on the board for every host).
        self.admission = Admission(cards, self.env, state_dir, across=across)
        self._clients: dict[str, ModelClient] = {}
        self._lock = threading.Lock()
        roots = [Path(p) for p in registry.get_list("AGAP_REF_ROOTS", self.env)]
        self.refs = RefResolver(roots=roots, resolve_task=resolve_task, schemes=store_readers(self.env))

    def _guarded(self, card: Card, caller: str) -> RefResolver:
        """The resolver with the privacy check of ``card`` working for ``caller``."""
        cfg = policy_config(self.cards.directory) if self.cards.directory else PolicyConfig()
        person = person_of(self.cards, caller)
        guard = ReadGuard(Domains(self.cards, cfg), card, (person.id,) if person else ())
        return replace(self.refs, guard=guard)

    def mode(self, card: Card) -> str:
        return model_mode(card, self.env)

    def can_sync(self, card: Card) -> bool:
        """True for agents the server can run directly (model and persona cards)."""
        return card.kind != "human" and self.mode(card) in MODEL_MODES

    def client(self, card: Card) -> ModelClient:
        # By model too: a persona's backbone is chosen per call, each with its endpoint.
        key = f"{card.id}/{card.runtime.model or ''}"
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                c = self._clients[key] = client_for(card, self.env)
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
        caller: str = "",
    ) -> Answer:
        """One model call for ``agent`` on behalf of ``caller``; errors become a failed
        :class:`Answer`. The refs pass the privacy check of ``agent`` working for the
        person ``caller`` is (if any), where they are read; with no board here, a ref
        whose domain needs the board (a task, a file under a task's folder) is refused."""
        card = self.cards.get(agent)
        try:
            messages = task_messages(
                self._guarded(card, caller), intent, refs, persona_for(card, self.cards), conversation
            )
        except (UnresolvableRef, RefUnavailable, PolicyRefused) as exc:
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
            return self.admission.call(
                card, lambda chosen: ask(chosen, self.client(chosen), messages, metadata=metadata, key=key)
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
            log.exception("sync call to %s failed", card.id)
            return Answer("failed", "internal error while calling the model (see the server log)")
