"""Round trips per operation (counted by the client, and by a proxy for the CLI)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.env import CARDS_DIR, QUEUE_AGENT, ROOT, CountingClient, CountingProxy, Target
from bench.events import SECRET, brokers
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.events.attach import submitted_event
from fabric.events.brokers import open_transport
from fabric.events.publisher import Publisher
from fabric.events.subscriber import QueueWaker
from fabric.events.transport import queue_topic
from fabric.kanboard.port import BoardError
from fabric.ledger import Lease, LedgerError
from fabric.settings.events import EventsConfig
from workers.queue import QueueReader, WakeHints

T = TypeVar("T")


def _mean(xs: list[int]) -> float:
    return round(statistics.fmean(xs), 2) if xs else float("nan")


def _spread(xs: list[int]) -> dict[str, float]:
    if not xs:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan"), "samples": 0}
    return {"mean": _mean(xs), "min": min(xs), "max": max(xs), "samples": len(xs)}


def agap_command() -> list[str]:
    script = Path(sys.executable).parent / "agap"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from fabric.apps.cli import main; main()"]


def _side_effect(fab: Fabric, lease: Lease) -> None:
    """What an executor does around one external side effect."""
    effect = fab.ledger.effect(lease, "notify")
    fab.ledger.effect_done(lease, effect, "bench-receipt")


class _Sampler:
    """Counts the round trips of one operation; samples that hit a board error are set apart.

    A real Kanboard on SQLite can answer "database is locked" even to a lone client when
    something else writes; such a sample is not a clean count of the protocol's trips.
    """

    def __init__(self, client: CountingClient) -> None:
        self.client = client
        self.spoiled: Counter[str] = Counter()

    def __call__(self, what: str, fn: Callable[..., T], *args: Any, **kw: Any) -> tuple[int | None, T | None]:
        before = sum(self.client.errors.values())
        self.client.stats.reset()
        try:
            value: T | None = fn(*args, **kw)
        except (BoardError, LedgerError):
            value = None
        trips = self.client.stats.trips
        if sum(self.client.errors.values()) != before:
            self.spoiled[what] += 1
            return None, value
        return trips, value


def _clean(xs: list[int | None]) -> list[int]:
    return [x for x in xs if x is not None]


def measure_trips(target: Target, cards: CardSet, *, n: int, cli_runs: int, tmp: Path) -> dict[str, Any]:
    settings, _ = target.fresh("trips", cards)
    client = target.client()
    fab = Fabric.connect(settings, cards=cards, port=client)  # as a worker connects
    # As the worker daemon claims (workers.loop, show_after > 0): the lock only, the
    # claim's record written with the outcome's for work done within a moment.
    reader = QueueReader.for_agent(fab, cards.get(QUEUE_AGENT), record_later=True)
    sample = _Sampler(client)

    out: dict[str, Any] = {}
    out["submit"] = _spread(
        _clean([sample("submit", fab.submit, f"plain {i}", target=QUEUE_AGENT)[0] for i in range(n)])
    )
    out["submit_key_new"] = _spread(
        _clean(
            [
                sample("submit_key_new", fab.submit, f"keyed {i}", target=QUEUE_AGENT, key=f"bench-key-{i}")[
                    0
                ]
                for i in range(n)
            ]
        )
    )
    repeats: list[int | None] = []
    created_again = 0
    for i in range(min(n, 5)):
        t, receipt = sample(
            "submit_key_repeat", fab.submit, f"keyed {i}", target=QUEUE_AGENT, key=f"bench-key-{i}"
        )
        repeats.append(t)
        created_again += int(bool(receipt and receipt.created))
    out["submit_key_repeat"] = {**_spread(_clean(repeats)), "created_again": created_again}

    # Drain the queue: every claim and complete is measured.
    claims: list[int | None] = []
    completes: list[int | None] = []
    first: Lease | None = None
    for _ in range(4 * n + 10):
        t, lease = sample("claim", reader.claim_next, "bench", lease_seconds=60.0)
        if lease is None:
            if t is not None:
                out["claim_next_empty"] = t
                break
            continue
        claims.append(t)
        if first is None:
            first = lease
            t, renewed = sample("renew", fab.ledger.renew, lease, lease_seconds=60.0)
            out["renew"] = t
            lease = renewed or lease
            out["side_effect"] = sample("side_effect", _side_effect, fab, lease)[0]
        completes.append(sample("complete", fab.ledger.complete, lease, "bench://result")[0])
    out["claim"] = _spread(_clean(claims))
    out["complete"] = _spread(_clean(completes))
    out["idle_poll"] = sample("idle_poll", reader.poll)[0]
    out["claim_at_once"] = _claims_at_once(fab, cards, sample, min(n, 5))

    # Latency baseline: one getTask round trip, then full lifecycles in the same run.
    some_id = first.task_id if first else 1
    base: list[float] = []
    for _ in range(30):
        s = time.perf_counter()
        client.call("getTask", {"task_id": some_id})
        base.append(time.perf_counter() - s)
    life_trips: list[int] = []
    life_secs: list[float] = []
    for i in range(max(5, n // 2)):
        s = time.perf_counter()
        t, lease_done = sample("lifecycle", _lifecycle, fab, reader, f"lifecycle {i}")
        if t is not None and lease_done:
            life_secs.append(time.perf_counter() - s)
            life_trips.append(t)
    get_ms = statistics.median(base) * 1000
    out["lifecycle"] = _spread(life_trips)
    out["getTask_ms"] = round(get_ms, 2)
    if life_secs:
        life_ms = statistics.median(life_secs) * 1000
        out["lifecycle_ms"] = round(life_ms, 2)
        out["lifecycle_x_getTask"] = round(life_ms / get_ms, 1)
    out["lifecycle_woken"] = _woken_lifecycles(fab, cards, sample, max(5, n // 2))
    out["spoiled_samples"] = dict(sample.spoiled)
    out["errors"] = dict(client.errors)
    out["cli"] = measure_cli(target, settings.project, settings.locks_project, runs=cli_runs, tmp=tmp)
    client.close()
    return out


def _claims_at_once(fab: Fabric, cards: CardSet, sample: _Sampler, n: int) -> dict[str, float]:
    """Claims that write their record at once (`agap claim`, MCP, A2A, a worker with
    show_after 0), of one fresh task each, so each claim pays its poll."""
    reader = QueueReader.for_agent(fab, cards.get(QUEUE_AGENT))
    counts: list[int | None] = []
    for i in range(n):
        fab.submit(f"claimed at once {i}", target=QUEUE_AGENT)
        t, lease = sample("claim_at_once", reader.claim_next, "bench", lease_seconds=60.0)
        if lease is not None:
            counts.append(t)
            fab.ledger.complete(lease, "bench://result")
    return _spread(_clean(counts))


def _woken_lifecycles(fab: Fabric, cards: CardSet, sample: _Sampler, n: int) -> dict[str, Any] | None:
    """submit → claim → complete where the worker is woken by the submit's live event, as
    a fabric with a broker runs (the submitter publishes it signed over the machine's
    Mosquitto; the worker's QueueWaker turns it into a hint): the claim needs no poll.
    None when no MQTT broker answers (AGAP_BENCH_MQTT)."""
    found = brokers().get("mqtt")
    if found is None:
        return None
    config = EventsConfig(
        scheme="mqtt", host=found[0], port=found[1], secret=SECRET.encode(), prefix="bench-trips"
    )
    hints = WakeHints()
    arrived = threading.Event()

    def hinted(task_id: int | None, uid: str | None) -> None:
        if task_id is not None and uid:
            hints.add(task_id, uid)
            arrived.set()

    card = cards.get(QUEUE_AGENT)
    reader = QueueReader.for_agent(fab, card, hints=hints, record_later=True)
    publisher = Publisher(open_transport(config), config.secret)
    waker = QueueWaker(open_transport(config), card.queue_name, config.secret, hinted)
    fab.submit_listeners.append(
        lambda receipt, spec: publisher.publish(submitted_event(receipt), also=(queue_topic(receipt.queue),))
    )
    counts: list[int] = []
    try:
        for i in range(n):
            arrived.clear()
            sub, receipt = sample("lifecycle_woken_submit", fab.submit, f"woken {i}", target=QUEUE_AGENT)
            if receipt is None or sub is None or not arrived.wait(10):  # the broker's delivery, bounded
                continue
            t, lease = sample("lifecycle_woken_claim", reader.claim_next, "bench", lease_seconds=60.0)
            if lease is None or lease.task_id != receipt.task_id or t is None:
                continue
            done = sample("lifecycle_woken_complete", fab.ledger.complete, lease, "bench://result")[0]
            if done is not None:
                counts.append(sub + t + done)
    finally:
        fab.submit_listeners.pop()
        waker.close()
        publisher.close(1.0)
    return _spread(counts) if counts else None


def _lifecycle(fab: Fabric, reader: QueueReader, intent: str) -> bool:
    """submit → claim → complete; True when the claim took the task just submitted."""
    receipt = fab.submit(intent, target=QUEUE_AGENT)
    lease = reader.claim_next("bench", lease_seconds=60.0)
    if lease is None:
        return False
    fab.ledger.complete(lease, "bench://result")
    return lease.task_id == receipt.task_id


def measure_cli(target: Target, project: str, locks_project: str, *, runs: int, tmp: Path) -> dict[str, Any]:
    """``agap submit --json`` end to end in a subprocess; trips counted by a proxy."""
    cache = tmp / f"cli-cache-{target.name}"
    cache.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    cold_failed = False
    with CountingProxy(target.url) as proxy:
        env = {
            **os.environ,
            "KANBOARD_URL": proxy.url,
            "KANBOARD_API_TOKEN": target.token,
            "AGAP_CARDS_DIR": str(CARDS_DIR),
            "AGAP_PROJECT": project,
            "AGAP_LOCKS_PROJECT": locks_project,
            "XDG_CACHE_HOME": str(cache),
        }
        for i in range(runs + 1):  # the first run has a cold layout cache
            proxy.reset()
            s = time.perf_counter()
            proc = subprocess.run(
                [*agap_command(), "submit", "--target", QUEUE_AGENT, "--intent", f"cli {i}", "--json"],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            secs = time.perf_counter() - s
            if proc.returncode != 0:
                failures.append(f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
                if i == 0:
                    cold_failed = True
                continue
            data = json.loads(proc.stdout)
            results.append(
                {
                    "proxy_posts": proxy.posts,
                    "proxy_calls": proxy.calls,
                    "reported": data.get("round_trips"),
                    "seconds": round(secs, 3),
                }
            )
    warm = results if cold_failed else results[1:]
    return {
        "cold": None if cold_failed or not results else results[0],
        "warm_posts": _spread([r["proxy_posts"] for r in warm]),
        "warm_reported": _spread([int(r["reported"]) for r in warm]),
        "warm_seconds_median": round(statistics.median(r["seconds"] for r in warm), 3) if warm else None,
        "failures": failures,
    }
