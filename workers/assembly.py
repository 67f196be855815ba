"""Assembling one queue's worker daemon from its card and the environment.

``agap worker --agent ID`` calls :func:`build_worker` then :func:`run_until_signalled`.
The availability counters (quota window, spend, parks) are saved on exit and restored
on start: they are a local, rebuildable cache, and losing them costs at most a 429.

Building never touches the board: a worker started while its board is away waits for it
in :meth:`~workers.loop.Worker.run`, and SIGTERM during that wait exits 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from fabric.availability import Availability
from fabric.cards import Card, CardSet
from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.kanboard.principals import board_client, worker_settings
from fabric.kanboard.quotas import QuotaStore
from fabric.ledger import Lease
from fabric.policy import read_guard
from fabric.results import ResultStore, store_for
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import set_on_signal
from workers.admission import backbones_of
from workers.answer import client_for, model_mode
from workers.attach import attach_worker
from workers.endpoint import endpoint_card
from workers.executor import ModelExecutor, Outage
from workers.job import Executor, Job
from workers.llm import ModelClient
from workers.loop import Worker, WorkerConfig, WorkerHooks, card_policy
from workers.probes import card_availability
from workers.prompt import persona_for
from workers.queue import ClaimCheck
from workers.refs import RefResolver
from workers.shared_quota import Across
from workers.stores import store_readers

log = logging.getLogger("agap.worker")

# Shapes that probe the real endpoint; a demo-mode worker never touches that endpoint.
PROBING_SHAPES = frozenset({"gpu", "on_demand"})


def effective_mode(card: Card, env: Mapping[str, str]) -> str:
    """The model mode this worker runs in: AGAP_MODEL_MODE overrides the card."""
    return model_mode(card, env)


def availability_for(
    card: Card,
    env: Mapping[str, str],
    cards: CardSet | None = None,
    state_dir: Path | None = None,
    across: Across | None = None,
) -> Availability:
    """The card's a(t), its model endpoint's counters shared under ``state_dir`` (see
    :mod:`workers.endpoint`) and, with ``across``, its quotas declared ``across_hosts`` on
    the board (:mod:`workers.shared_quota`), without the endpoint probes when the demo
    model stands in."""
    skip: frozenset[str] = frozenset()
    if effective_mode(card, env) == "demo":
        skip = PROBING_SHAPES
        dropped = {s.shape for s in card.availability} & PROBING_SHAPES
        if dropped:
            log.info("%s: demo model: skipping the endpoint probes (%s)", card.id, ", ".join(sorted(dropped)))
    ledger = state_dir / "endpoints" if state_dir is not None else None
    return card_availability(card, cards=cards, ledger_dir=ledger, skip=skip, across=across)


def _state_file(settings: Settings, card: Card) -> Path:
    return settings.state_dir / f"availability-{card.queue_name}.json"


def restore_counters(av: Availability, path: Path) -> None:
    """Restore saved counters; a missing or corrupted file means starting fresh."""
    with contextlib.suppress(OSError, ValueError):
        av.restore(json.loads(path.read_text()))


def save_counters(av: Availability, path: Path) -> None:
    """Save the counters for the next start (best effort)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(av.snapshot()))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not save availability counters: %s", exc)


class _Connection:
    """The executor's own board connection, made on first use (after the worker reached the board)."""

    def __init__(self, connect: Callable[[], Fabric]) -> None:
        self._connect = connect
        self._fab: Fabric | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Fabric:
        with self._lock:
            if self._fab is None:
                self._fab = self._connect()
            return self._fab


class _LazyResults:
    """A result store built on the first result: building it needs the board."""

    def __init__(self, make: Callable[[], ResultStore]) -> None:
        self._make = make
        self._store: ResultStore | None = None

    def _get(self) -> ResultStore:
        if self._store is None:
            self._store = self._make()
        return self._store

    def put(self, lease: Lease, text: str) -> str:
        return self._get().put(lease, text)

    def get(self, ref: str) -> str:
        return self._get().get(ref)


def _models_parked(card: Card, cards: CardSet, availability: Availability) -> Callable[[], list[str]]:
    """Which model endpoints a park of ``card``'s queue stands for: a persona with
    backbones parks for every one it found parked, any other queue for its model's card."""
    backbones = backbones_of(availability)
    if backbones is not None:
        return lambda: list(backbones.parked)
    endpoint = endpoint_card(card, cards)
    if endpoint.kind == "model":
        return lambda: [endpoint.id]
    return list


def _clients(env: Mapping[str, str]) -> Callable[[Card], ModelClient]:
    """One client per backbone a persona calls (in sdk mode each has its own endpoint)."""
    made: dict[str, ModelClient] = {}
    lock = threading.Lock()

    def client_of(card: Card) -> ModelClient:
        key = card.runtime.model or card.id
        with lock:
            if key not in made:
                made[key] = client_for(card, env)
            return made[key]

    return client_of


def owner_id(card: Card) -> str:
    """This process's worker identity."""
    return registry.get_str("AGAP_WORKER_ID") or f"{card.id}@{socket.gethostname()}:{os.getpid()}"


def build_worker(
    card_id: str,
    settings: Settings,
    cards: CardSet,
    *,
    env: Mapping[str, str] | None = None,
    concurrency: int | None = None,
    executor: Executor | None = None,
    drain: bool = False,
    claim_policy: Callable[[Fabric, str], ClaimCheck] = card_policy,
) -> Worker:
    """A ready-to-run worker for ``card_id``'s queue (model cards run the model executor)."""
    env = registry.environ(env)
    card = cards.get(card_id)
    if card.kind == "human" or card.runtime.mode in ("human", "external"):
        raise ConfigError(
            f"{card_id!r} is worked outside the fabric ({card.runtime.mode}): it has no worker daemon",
            where=f"cards/{card_id}.yaml",
            hint="external runtimes use `agap claim`/`agap complete`",
        )
    # A confined agent works in its home, signed in as its own board user (principals).
    settings = worker_settings(settings, card)
    url, _ = settings.require_board()

    def connect() -> Fabric:
        return Fabric.connect(settings, cards=cards, port=board_client(settings))

    fab = _Connection(connect)
    across = Across(
        lambda: QuotaStore(fab().port, settings.quota_project),
        refresh=registry.get_duration("AGAP_QUOTA_REFRESH", env),
    )
    availability = availability_for(card, env, cards, settings.state_dir, across)
    if executor is None:
        outage = Outage()
        availability.shapes.append(outage)
        humans = [c.human.username for c in cards.humans() if c.human is not None]

        def human_for(job: Job) -> str | None:
            actor = job.lease.spec.actor
            return actor if actor in humans else (humans[0] if humans else None)

        def resolve_task(task_id: int) -> str:
            view = fab().board.read(task_id)
            cur = view.current
            result = f"\nResult: {cur.result_ref}" if cur and cur.result_ref else ""
            return f"{view.task.title}\n\n{view.task.description}{result}"

        executor = ModelExecutor(
            card=card,
            client=client_for(card, env),
            results=_LazyResults(
                lambda: store_for(
                    registry.get_str("AGAP_RESULT_STORE", env),
                    fab().board,
                    registry.get_str("AGAP_RESULT_DIR", env) or None,
                )
            ),
            refs=RefResolver(
                roots=[Path(p) for p in registry.get_list("AGAP_REF_ROOTS", env)],
                resolve_task=resolve_task,
                schemes=store_readers(env),
            ),
            availability=availability,
            outage=outage,
            persona=persona_for(card, cards),
            human_for=human_for,
            guard_for=lambda job: read_guard(fab().policy_context(), card, job.lease.spec),
            client_of=_clients(env),
        )
    config = WorkerConfig(
        queue=card.queue_name,
        owner=owner_id(card),
        lease_seconds=float(card.runtime.lease_seconds),
        poll_seconds=registry.get_duration(
            "AGAP_POLL_SECONDS", env, fallback=float(card.runtime.poll_seconds)
        ),
        concurrency=concurrency or card.runtime.concurrency,
        backoff_seconds=card.runtime.backoff_seconds,
        exit_when_idle=drain,
        interactive=card.runtime.interactive,
        outage_grace=registry.get_duration("AGAP_OUTAGE_GRACE", env, fallback=None),
        board_url=url,
        board_wait_cap=registry.get_duration("AGAP_BOARD_WAIT_CAP", env),
    )
    hooks = WorkerHooks(
        availability=availability,
        claim_policy=claim_policy,
        models_parked=_models_parked(card, cards, availability),
    )
    worker = Worker(connect, executor, config, hooks)
    # Live events (signed, over MQTT or NATS) when AGAP_EVENTS_URL is set: published
    # after each transition, and submit events wake this worker before its next poll.
    attach_worker(worker, env=env)
    return worker


def run_until_signalled(worker: Worker, settings: Settings, card: Card) -> None:
    """Run; SIGTERM or SIGINT finish (or release) the current task, then return."""
    path = _state_file(settings, card)
    if worker.availability is not None:
        restore_counters(worker.availability, path)

    def _note(signum: int) -> None:
        log.info("signal %s: finishing the current task, then exiting", signum)

    set_on_signal(worker.stop, note=_note)
    try:
        worker.run()
    finally:
        if worker.availability is not None:
            save_counters(worker.availability, path)
