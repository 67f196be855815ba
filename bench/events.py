"""Live events: submit → start latency and idle board load, with and without wake-ups.

Modes, all on the embedded board with an instant executor:

* ``polling``: the worker polls every 2 s (the default) and nothing else;
* ``wake``: the same 2 s poll, plus wake-ups from submit events on the broker;
* ``wake_poll30``: wake-ups with a 30 s safety poll (what wake-ups make affordable).

Latency is measured from just before ``Fabric.submit`` to the worker's claim (its
``started`` listener call), one task at a time with a random gap so submits land
anywhere in the poll cycle. The idle load is the board round trips the worker's
connections make in a window with nothing to do, per minute. Every wait is bounded.
Brokers: the shared Mosquitto (127.0.0.1:1883) and NATS (127.0.0.1:4222), whichever
answers; override with AGAP_BENCH_MQTT / AGAP_BENCH_NATS (``host:port``, or ``off``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.events.attach import attach_submitter
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.taskboard import BoardLayout, TaskBoard
from fabric.ledger import Lease, Ledger
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import Settings
from workers.attach import attach_worker
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
AGENT = "gemma-local"
POLL = 2.0
SAFETY_POLL = 30.0
FULL: dict[str, Any] = {"tasks": 20, "idle_seconds": 30.0}
QUICK: dict[str, Any] = {"tasks": 6, "idle_seconds": 4.0}
WAKE_GAP = 0.3  # with wake-ups the poll phase does not matter: a short random gap will do
SECRET = "bench-events-" + secrets.token_hex(16)


def _open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def brokers() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    for kind, default in (("mqtt", "127.0.0.1:1883"), ("nats", "127.0.0.1:4222")):
        spec = os.environ.get(f"AGAP_BENCH_{kind.upper()}", default)
        if spec == "off":
            continue
        host, _, port = spec.rpartition(":")
        if _open(host, int(port)):
            found[kind] = (host, int(port))
    return found


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return round(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))], 4)


def _summary(xs: list[float]) -> dict[str, Any]:
    return {
        "p50_s": _pct(xs, 0.5),
        "p95_s": _pct(xs, 0.95),
        "mean_s": round(statistics.fmean(xs), 4) if xs else float("nan"),
        "max_s": round(max(xs), 4) if xs else float("nan"),
        "samples": len(xs),
    }


class _Rig:
    """An embedded board, one worker on the drill queue, and the counters around it."""

    def __init__(self, tmp: Path, poll: float, env: dict[str, str] | None) -> None:
        self.board_srv = EmbeddedBoard(tmp / f"board-{secrets.token_hex(3)}.sqlite3").start()
        cards = load_cards(ROOT / "cards", base_dir=ROOT)
        self.settings = Settings(
            board_url=self.board_srv.url, board_token=self.board_srv.token, cards_dir=ROOT / "cards"
        )
        report = init_board(self._client(), self.settings, cards)
        assert report.layout is not None
        self.layout: BoardLayout = report.layout
        self.cards = cards
        self.queue = cards.get(AGENT).queue_name
        self.clients: list[KanboardClient] = []
        self.started: dict[int, float] = {}
        self.claimed = threading.Condition()
        self.worker = Worker(
            self._worker_connect,
            self._execute,
            WorkerConfig(queue=self.queue, owner="bench", lease_seconds=60, poll_seconds=poll),
        )
        self.worker.add_listener(self._on_event)
        self.attachment = attach_worker(self.worker, env=env) if env else None
        self.submitter = self._fabric(self._client())
        if env:
            attach_submitter(self.submitter, env=env)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def _client(self) -> KanboardClient:
        return KanboardClient(self.board_srv.url, self.board_srv.token)

    def _fabric(self, client: KanboardClient) -> Fabric:
        board = TaskBoard(client, self.layout)
        return Fabric(self.settings, self.cards, client, board, Ledger(board))

    def _worker_connect(self) -> Fabric:
        client = self._client()
        self.clients.append(client)
        return self._fabric(client)

    @staticmethod
    def _execute(job: Job) -> JobOutcome:
        return JobOutcome.done(f"bench://{job.lease.uid}")

    def _on_event(self, event: str, lease: Lease, detail: str) -> None:
        if event == "started":
            with self.claimed:
                self.started.setdefault(lease.task_id, time.monotonic())
                self.claimed.notify_all()

    def trips(self) -> int:
        return sum(c.stats.trips for c in self.clients)

    def __enter__(self) -> _Rig:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop.set()
        self.thread.join(15)
        if self.attachment is not None:
            self.attachment.close(timeout=2)
        self.board_srv.stop()


def _latencies(rig: _Rig, n: int, gap: float, rng: random.Random) -> tuple[list[float], int]:
    out: list[float] = []
    missed = 0
    time.sleep(0.5)  # the worker's first poll is behind it
    for i in range(n):
        time.sleep(rng.uniform(0, gap))  # land anywhere in the poll cycle
        t0 = time.monotonic()
        tid = rig.submitter.submit(f"bench event {i}", target=AGENT).task_id
        deadline = t0 + max(10.0, 3 * rig.worker.config.poll_seconds)
        with rig.claimed:
            while tid not in rig.started and time.monotonic() < deadline:
                rig.claimed.wait(max(0.0, deadline - time.monotonic()))
        if tid in rig.started:
            out.append(rig.started[tid] - t0)
        else:
            missed += 1
    return out, missed


def _idle_trips_per_minute(rig: _Rig, seconds: float) -> dict[str, Any]:
    time.sleep(0.5)  # let the last task's completion settle
    before = rig.trips()
    time.sleep(seconds)
    trips = rig.trips() - before
    return {"window_s": seconds, "trips": trips, "per_minute": round(trips * 60.0 / seconds, 1)}


def _cleanup(kind: str, host: str, port: int, prefix: str, task_ids: list[int]) -> None:
    """Drop what the run left on a shared broker (its retained events / its stream)."""
    if kind == "nats":
        import nats

        async def drop() -> None:
            nc = await nats.connect(
                f"nats://{host}:{port}", connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1
            )
            try:
                with contextlib.suppress(Exception):
                    await nc.jetstream(timeout=2).delete_stream(f"{prefix.upper()}_EVENTS")
            finally:
                await nc.close()

        with contextlib.suppress(Exception):
            asyncio.run(asyncio.wait_for(drop(), 5))
        return
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2)
    with contextlib.suppress(Exception):
        c.connect(host, port)
        c.loop_start()
        for tid in task_ids:
            c.publish(f"{prefix}/task/{tid}/events", b"", qos=1, retain=True).wait_for_publish(2)
        c.disconnect()
        c.loop_stop()


def _mode(
    tmp: Path, poll: float, env: dict[str, str] | None, cfg: dict[str, Any], seed: int
) -> dict[str, Any]:
    with _Rig(tmp, poll, env) as rig:
        gap = poll if env is None else WAKE_GAP
        lat, missed = _latencies(rig, cfg["tasks"], gap, random.Random(seed))
        idle = _idle_trips_per_minute(rig, cfg["idle_seconds"])
        hints = rig.attachment.waker.hints if rig.attachment and rig.attachment.waker else 0
        return {
            "poll_s": poll,
            "latency": _summary(lat),
            "missed": missed,
            "idle_board_trips": idle,
            "wake_hints": hints,
        }


def run(quick: bool) -> dict[str, Any]:
    """Measure every mode on every broker that answers; returns plain data."""
    cfg = QUICK if quick else FULL
    started = time.monotonic()
    out: dict[str, Any] = {"config": {**cfg, "poll_s": POLL, "safety_poll_s": SAFETY_POLL}, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="agap-bench-events-") as d:
        tmp = Path(d)
        out["modes"]["polling"] = _mode(tmp, POLL, None, cfg, seed=1)
        found = brokers()
        out["brokers"] = {k: f"{h}:{p}" for k, (h, p) in found.items()}
        for kind, (host, port) in found.items():
            for name, poll in (("wake", POLL), ("wake_poll30", SAFETY_POLL)):
                prefix = "bench" + secrets.token_hex(4)
                env = {
                    "AGAP_EVENTS_URL": f"{kind}://{host}:{port}",
                    "AGAP_EVENTS_SECRET": SECRET,
                    "AGAP_EVENTS_PREFIX": prefix,
                }
                assert EventsConfig.from_env(env) is not None
                try:
                    out["modes"][f"{name}_{kind}"] = _mode(tmp, poll, env, cfg, seed=1)
                finally:
                    # each run has a fresh board: its task ids are 1..tasks
                    _cleanup(kind, host, port, prefix, list(range(1, int(cfg["tasks"]) + 1)))
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def table(res: dict[str, Any]) -> str:
    """A Markdown table of the results."""
    lines = ["| mode | poll | submit→start p50 | p95 | idle board trips/min |", "|---|---|---|---|---|"]
    for name, m in res["modes"].items():
        lat = m["latency"]
        lines.append(
            f"| {name} | {m['poll_s']:g} s | {lat['p50_s'] * 1000:.0f} ms | "
            f"{lat['p95_s'] * 1000:.0f} ms | {m['idle_board_trips']['per_minute']:g} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    result = run(quick="--quick" in sys.argv)
    print(json.dumps(result, indent=2))
    print(table(result))
