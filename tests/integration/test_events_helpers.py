"""Shared pieces of the live-event tests (no tests here).

The shared brokers (Mosquitto on 127.0.0.1:1883, NATS with JetStream on 127.0.0.1:4222)
serve the tests that need a healthy broker; every test uses its own topic prefix, and
NATS streams are deleted afterwards. Tests that kill a broker start their own broker
process on a free port and kill that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.events.brokers import open_transport
from fabric.events.schema import SEQ_STRIDE
from fabric.events.subscriber import BoardStatus, WatchOptions, WatchResult, watch
from fabric.events.transport import token
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.taskboard import TaskBoard
from fabric.ledger import Ledger
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import Settings
from tests.conftest import make_fabric
from tests.helpers import wait_until
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig

CARDS = Path(__file__).parent / "cards_worker"
QUEUE = "tester"
SECRET = "test-fabric-secret-" + "0" * 16
SHARED = {"mqtt": ("127.0.0.1", 1883), "nats": ("127.0.0.1", 4222)}


def port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events_env(kind: str, host: str, port: int, prefix: str, **extra: str) -> dict[str, str]:
    return {
        "AGAP_EVENTS_URL": f"{kind}://{host}:{port}",
        "AGAP_EVENTS_SECRET": SECRET,
        "AGAP_EVENTS_PREFIX": prefix,
        **extra,
    }


def config_for(kind: str, host: str, port: int, prefix: str) -> EventsConfig:
    cfg = EventsConfig.from_env(events_env(kind, host, port, prefix))
    assert cfg is not None
    return cfg


def purge_nats_stream(host: str, port: int, prefix: str) -> None:
    """Empty a test's stream of kept events.

    Purged, not deleted: nats-server 2.9 (Debian's) crashes (a nil dereference in its
    message-get handler) when a stream is deleted while a client asks it for the last
    message, and a test's watcher may still be doing so. The empty streams are deleted
    at the start of the next session, when nothing can be asking (:func:`sweep_test_streams`).
    """
    import nats

    async def run() -> None:
        nc = await nats.connect(
            f"nats://{host}:{port}", connect_timeout=2, max_reconnect_attempts=1, allow_reconnect=False
        )
        try:
            with contextlib.suppress(Exception):
                await nc.jetstream(timeout=2).purge_stream(f"{token(prefix).upper()}_EVENTS")
        finally:
            await nc.close()

    with contextlib.suppress(Exception):
        asyncio.run(asyncio.wait_for(run(), 5))


_TEST_STREAM = re.compile(r"^T[0-9A-F]{8}_EVENTS$")


def sweep_test_streams(host: str, port: int) -> None:
    """Delete the streams earlier test sessions left (before any test of this one runs)."""
    import nats

    async def run() -> None:
        nc = await nats.connect(
            f"nats://{host}:{port}", connect_timeout=2, max_reconnect_attempts=1, allow_reconnect=False
        )
        try:
            js = nc.jetstream(timeout=2)
            for info in await js.streams_info():
                stream = info.config.name
                if stream is not None and _TEST_STREAM.match(stream):
                    with contextlib.suppress(Exception):
                        await js.delete_stream(stream)
        finally:
            await nc.close()

    with contextlib.suppress(Exception):
        asyncio.run(asyncio.wait_for(run(), 10))


def sweep_before_the_session() -> None:
    """Called once per run by tests/conftest.py, before any test (and any xdist worker) starts."""
    host, port = SHARED["nats"]
    if port_open(host, port):
        sweep_test_streams(host, port)


def clear_mqtt_retained(host: str, port: int, prefix: str, task_ids: list[int]) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    if not task_ids:
        return
    c = mqtt.Client(CallbackAPIVersion.VERSION2)
    with contextlib.suppress(Exception):
        c.connect(host, port)
        c.loop_start()
        for tid in task_ids:
            c.publish(f"{prefix}/jobs/{tid}/events", b"", qos=1, retain=True).wait_for_publish(2)
        c.disconnect()
        c.loop_stop()


@dataclass
class Broker:
    """One broker to test against: where it is and what it is."""

    kind: str
    host: str
    port: int
    prefix: str = field(default_factory=lambda: "t" + secrets.token_hex(4))
    retained_tasks: list[int] = field(default_factory=list)

    @property
    def config(self) -> EventsConfig:
        return config_for(self.kind, self.host, self.port, self.prefix)

    def env(self, **extra: str) -> dict[str, str]:
        return events_env(self.kind, self.host, self.port, self.prefix, **extra)

    def cleanup(self) -> None:
        if self.kind == "nats":
            purge_nats_stream(self.host, self.port, self.prefix)
        else:
            # every test has a fresh board, so its task ids are small: clear them all
            ids = sorted({*range(1, 33), *self.retained_tasks})
            clear_mqtt_retained(self.host, self.port, self.prefix, ids)


@pytest.fixture(params=["mqtt", "nats"])
def shared_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The machine's shared broker of each kind. It is required: .ci/run starts it."""
    host, port = SHARED[request.param]
    if not port_open(host, port):
        pytest.fail(f"no {request.param} broker on {host}:{port}: start it (.ci/run shows how)")
    broker = Broker(request.param, host, port)
    yield broker
    broker.cleanup()


class OwnBroker:
    """A broker process of our own, on a free loopback port, that a test may kill."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OwnBroker:
        if self.kind == "mqtt":
            exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
            conf = self.tmp / f"mosquitto-{self.port}.conf"
            conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
            cmd = [exe, "-c", str(conf)]
        else:
            exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
            store = self.tmp / f"js-{self.port}"
            store.mkdir(exist_ok=True)
            cmd = [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: port_open("127.0.0.1", self.port), 10, f"{self.kind} on {self.port}")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def broker(self) -> Broker:
        return Broker(self.kind, "127.0.0.1", self.port)


@pytest.fixture(params=["mqtt", "nats"])
def own_broker(request: pytest.FixtureRequest) -> Iterator[OwnBroker]:
    exe = "mosquitto" if request.param == "mqtt" else "nats-server"
    if not (shutil.which(exe) or Path(f"/usr/sbin/{exe}").exists()):
        pytest.skip(f"{exe} is not installed")
    with tempfile.TemporaryDirectory(prefix="agap-broker-") as tmp:
        b = OwnBroker(request.param, Path(tmp)).start()
        try:
            yield b
        finally:
            b.kill()


# -- the board and the worker ---------------------------------------------------------


@pytest.fixture
def wcards() -> CardSet:
    return load_cards(CARDS, base_dir=CARDS)


@pytest.fixture
def settings(embedded_board: EmbeddedBoard, tmp_path: Path) -> Settings:
    return Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=CARDS,
        state_dir=tmp_path / "state",
    )


@pytest.fixture
def fab(embedded_board: EmbeddedBoard, wcards: CardSet, settings: Settings) -> Fabric:
    return make_fabric(KanboardClient(embedded_board.url, embedded_board.token), wcards, settings=settings)


def another(fab: Fabric) -> Fabric:
    """A second connection to the same board (a Fabric is for one thread)."""
    port = KanboardClient(fab.settings.board_url, fab.settings.board_token, read_attempts=1)
    board = TaskBoard(port, fab.board.layout)
    return Fabric(fab.settings, fab.cards, port, board, Ledger(board))


def board_check(fab: Fabric, task_id: int) -> Callable[[], BoardStatus]:
    own = another(fab)

    def check() -> BoardStatus:
        cur = own.show(task_id).current
        assert cur is not None
        return BoardStatus(cur.state, cur.epoch, cur.result_ref, cur.reason)

    return check


class Gate:
    """An executor that reports progress, waits for the test, then finishes."""

    def __init__(self, steps: int = 2, outcome: JobOutcome | None = None, hold: bool = True) -> None:
        self.steps = steps
        self.outcome = outcome
        self.release = threading.Event()
        self.entered = threading.Event()
        if not hold:
            self.release.set()
        self.leases: list[int] = []

    def __call__(self, job: Job) -> JobOutcome:
        self.leases.append(job.lease.epoch)
        job.progress("step 1 of 2")
        self.entered.set()
        self.release.wait(20)
        for i in range(2, self.steps + 1):
            job.progress(f"step {i} of {self.steps}")
        return self.outcome or JobOutcome.done(f"kanboard://task/{job.lease.task_id}/file/r.md")


class Idling(threading.Event):
    """A worker's wake-up event that counts the waits on it.

    A slot waits on it only when its poll found nothing to claim, so ``waits >= 1`` says
    the worker is idle: a task submitted now is picked up by a wake-up or the next poll.
    """

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def make_worker(
    fab: Fabric, executor: Any, *, poll: float = 0.05, lease: float = 30.0, owner: str = "w1"
) -> Worker:
    def connect() -> Fabric:
        return another(fab)

    return Worker(
        connect,
        executor,
        WorkerConfig(queue=QUEUE, owner=owner, lease_seconds=lease, poll_seconds=poll, backoff_seconds=0.05),
    )


def epoch_of(line: dict[str, Any]) -> int:
    """The epoch a watch line reports (seq is epoch-major: fabric/events/schema.py)."""
    return (int(line["seq"]) - 1) // SEQ_STRIDE


class Watching:
    """``watch`` in a thread, collecting its lines."""

    def __init__(
        self, task_id: int, board: Callable[[], BoardStatus], cfg: EventsConfig | None, **options: float
    ) -> None:
        self.lines: list[dict[str, Any]] = []
        self.result: WatchResult | None = None
        self.live = threading.Event()
        self.lives = 0
        self.board_checks = 0  # how often the watch asked the board (it polls while the broker is away)
        self.transport = open_transport(cfg) if cfg is not None else None
        opts = WatchOptions(**{"timeout": 30.0, "idle_timeout": 30.0, **options})

        def counted() -> BoardStatus:
            self.board_checks += 1
            return board()

        def run() -> None:
            self.result = watch(
                task_id,
                board=counted,
                emit=self.lines.append,
                transport=self.transport,
                secret=cfg.secret if cfg is not None else None,
                options=opts,
                on_live=self._on_live,
            )

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def _on_live(self) -> None:
        self.lives += 1
        self.live.set()

    def wait_live(self, timeout: float = 10.0, times: int = 1) -> None:
        wait_until(lambda: self.lives >= times, timeout, f"the watch live ({times})")

    def wait_polling(self, polls: int = 2, timeout: float = 20.0) -> None:
        """Wait until the watch has asked the board ``polls`` more times (its fallback is working)."""
        start = self.board_checks
        wait_until(lambda: self.board_checks >= start + polls, timeout, f"{polls} board polls by the watch")

    def join(self, timeout: float = 30.0) -> WatchResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "watch did not return"
        if self.transport is not None:
            self.transport.close()
        assert self.result is not None
        return self.result

    def types(self) -> list[str]:
        """The fabric's kinds of the lines seen (``data.kind``), live or from the board."""
        return [line["data"]["kind"] for line in self.lines]
