"""One quota across hosts, with real worker processes: two ``agap worker`` processes, each
with its own ``AGAP_STATE_DIR`` (two hosts: neither sees the other's endpoint ledger),
drain one model whose quota is declared ``across_hosts``. The only place they meet is the
board (the slots of :mod:`fabric.kanboard.quotas`).

Runs against the embedded board over HTTP always, and against a real Kanboard when
AGAP_TEST_KANBOARD_URL and AGAP_TEST_KANBOARD_TOKEN name a scratch one (each run in its own
projects).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.quotas import QuotaStore, SlotTag
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import REAL_SKIP, ROOT, make_fabric, real_kanboard, scratch_board
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import wait_until
from tests.integration.test_worker import gateway_env, state_of

HUMAN = (ROOT / "tests" / "integration" / "cards_worker" / "alvis.yaml").read_text()

# concurrency > limit: one host alone could make every call of the quota at once, so
# without the board's count the two hosts would make 2N calls between them.
POOL = """
id: pool
kind: model
name: A quota-limited model served to two hosts
tier: medium
trust: trusted
capabilities: [chat]
availability:
  - shape: quota
    limit: {limit}
    window: 1h
    across_hosts: true
runtime:
  mode: gateway
  model: openai/pool
  concurrency: {concurrency}
  poll_seconds: 0.05
  lease_seconds: {lease}
  backoff_seconds: 0.1
  timeout_seconds: 120
"""

N = 3


@dataclass
class Target:
    url: str
    token: str
    settings: Settings
    fab: Fabric
    env: dict[str, str]  # what every worker process is given (but its state dir)


@pytest.fixture(params=["embedded", "real-kanboard"])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(url, token, run): the board, and a name for this run's projects."""
    run = secrets.token_hex(4)
    if request.param == "embedded":
        with EmbeddedBoard(tmp_path / "board.sqlite3") as b:
            yield b.url, b.token, run
        return
    real = real_kanboard()
    if real is None:
        print(f"real Kanboard skipped: {REAL_SKIP}")
        pytest.skip(REAL_SKIP)
    scratch_board(*real)
    yield real[0], real[1], run


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def target(board: tuple[str, str, str], stub: OpenAIStub, tmp: Path, *, limit: int, lease: int) -> Target:
    url, token, run = board
    cards_dir = tmp / "cards"
    cards_dir.mkdir()
    (cards_dir / "alvis.yaml").write_text(HUMAN)
    (cards_dir / "pool.yaml").write_text(POOL.format(limit=limit, concurrency=limit + 1, lease=lease))
    names = {
        "AGAP_PROJECT": f"quota-{run}",
        "AGAP_LOCKS_PROJECT": f"quota-locks-{run}",
        "AGAP_QUOTA_PROJECT": f"quota-slots-{run}",
    }
    settings = Settings(
        board_url=url,
        board_token=token,
        cards_dir=cards_dir,
        state_dir=tmp / "test-state",
        project=names["AGAP_PROJECT"],
        locks_project=names["AGAP_LOCKS_PROJECT"],
        quota_project=names["AGAP_QUOTA_PROJECT"],
    )
    cards = load_cards(cards_dir, base_dir=tmp)
    fab = make_fabric(KanboardClient(url, token), cards, settings=settings)
    env = {
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(cards_dir),
        # A host that sees the quota spent reads the board again this often: the test
        # waits for a given-back slot to be seen, never for a fixed time.
        "AGAP_QUOTA_REFRESH": "0.5s",
        **names,
        **gateway_env(stub),
    }
    return Target(url, token, settings, fab, env)


def host(t: Target, tmp: Path, name: str) -> subprocess.Popen[str]:
    """One host: a worker process with a state directory of its own."""
    env = {**os.environ, **t.env, "AGAP_STATE_DIR": str(tmp / name), "AGAP_WORKER_ID": name}
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115  (the process owns it)
    return subprocess.Popen(
        [sys.executable, "-c", "from fabric.apps.cli import main; main()", "worker", "--agent", "pool"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def says(tmp: Path, name: str, text: str) -> bool:
    path = tmp / f"{name}.log"
    return path.exists() and text in path.read_text()


def log_of(tmp: Path, *names: str) -> str:
    paths = [(n, tmp / f"{n}.log") for n in names]
    return "\n".join(f"--- {n}\n{p.read_text()}" for n, p in paths if p.exists())


def park_of(fab: Fabric) -> dict[str, Any]:
    state: dict[str, Any] = fab.board.park_states().get("pool", {})
    return state


def slots(t: Target) -> list[SlotTag]:
    return QuotaStore(t.fab.port, t.settings.quota_project).read().get("pool", [])


def busy(t: Target) -> list[SlotTag]:
    return [s for s in slots(t) if not s.returned]


def local_calls(tmp: Path, name: str) -> int:
    path = tmp / name / "endpoints" / "pool.quota0.json"
    return len(json.loads(path.read_text())["calls"]) if path.exists() else 0


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


@pytest.mark.timeout(600)
def test_two_hosts_make_exactly_the_quota_of_calls_between_them_and_park_the_rest(
    board: tuple[str, str, str], stub: OpenAIStub, tmp_path: Path
) -> None:
    gate = threading.Event()

    def held(body: dict[str, Any]) -> str:
        # Calls stay open until both hosts have parked: a host that passed a(t) without
        # the other's calls counted would start a call of its own meanwhile.
        gate.wait(120)
        return "done"

    stub.reply = held
    t = target(board, stub, tmp_path, limit=N, lease=30)
    tasks = [t.fab.submit(f"pool work {i}", target="pool").task_id for i in range(2 * N)]
    names = ["host-a", "host-b"]
    procs = [host(t, tmp_path, n) for n in names]
    try:
        wait_until(lambda: len(stub.chat_requests()) >= N, timeout=120, what=f"{N} model calls")
        wait_until(
            lambda: all(says(tmp_path, n, "parked: quota spent") for n in names),
            timeout=120,
            what="both hosts park on the spent quota",
        )
        calls_while_open = len(stub.chat_requests())
        held_slots = busy(t)
        park = wait_until(
            lambda: (p := park_of(t.fab)).get("parked") and p, timeout=30, what="the park on the board"
        )
        gate.set()
        wait_until(
            lambda: sum(state_of(t.fab, x) == State.DONE for x in tasks) >= N, timeout=120, what=f"{N} done"
        )
    finally:
        gate.set()
        stop(procs)
    logs = log_of(tmp_path, *names)
    assert calls_while_open == N, logs
    assert len(stub.chat_requests()) == N, logs
    done = [x for x in tasks if state_of(t.fab, x) == State.DONE]
    queued = [x for x in tasks if state_of(t.fab, x) == State.QUEUED]
    assert len(done) == N and len(queued) == N, "the rest wait, intact"
    assert str(park["reason"]).startswith("quota spent"), park
    assert "pool" in park.get("models", []), park
    # The board holds one reservation per call, each tied to the lease it ran under,
    # and the hosts' own ledgers (the fast path) counted N calls between them.
    assert len(held_slots) == N and {s.ref.slot for s in held_slots} == set(range(N))
    assert {s.holder.task_id for s in held_slots if s.holder} == set(done)
    assert sum(local_calls(tmp_path, n) for n in names) == N
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]


@pytest.mark.timeout(600)
def test_a_host_killed_holding_a_reservation_gives_it_back_through_the_keeper(
    board: tuple[str, str, str], stub: OpenAIStub, tmp_path: Path
) -> None:
    gate = threading.Event()

    def held(body: dict[str, Any]) -> str:
        gate.wait(120)  # host a's calls are still open when it is killed
        return "done"

    stub.reply = held
    lease = 5  # the shortest a card may have: host a's leases run out soon after it dies (nobody renews them)
    t = target(board, stub, tmp_path, limit=N, lease=lease)
    tasks = [t.fab.submit(f"pool work {i}", target="pool").task_id for i in range(2 * N)]
    a = host(t, tmp_path, "host-a")
    procs = [a]
    try:
        wait_until(lambda: len(stub.chat_requests()) >= N, timeout=120, what="host a holds the quota")
        held_by_a = wait_until(lambda: len(s := busy(t)) == N and s, timeout=30, what="N slots on the board")
        a.send_signal(signal.SIGKILL)
        a.wait(30)
        gate.set()  # the provider answers into a dead socket; every later call at once
        b = host(t, tmp_path, "host-b")
        procs.append(b)
        # Host b's own ledger is empty: only the board tells it the quota is spent.
        wait_until(
            lambda: says(tmp_path, "host-b", "parked: quota spent across hosts"),
            timeout=120,
            what="host b parks on the board's count",
        )
        assert len(stub.chat_requests()) == N
        # Host b logs its park, then publishes it: the board says so a moment later.
        wait_until(
            lambda: "across hosts" in str(park_of(t.fab).get("reason")),
            timeout=30,
            what="the board shows the queue parked on the shared quota",
        )

        # The keeper's lease sweep, as the daemon runs it: it requeues host a's dead
        # leases and gives back the slots they held (no grace: the clocks are one).
        keeper = Keeper.for_fabric(t.fab, KeeperConfig(lease_grace=0.0))
        returned: list[str] = []

        def swept() -> bool:
            keeper.job_leases()
            returned.extend(keeper.last["quotas"].returned)
            return len(returned) >= N

        wait_until(swept, timeout=60, what="the keeper gives host a's slots back")
        # Host b reads the board again within its refresh, sees the slots free, and uses them.
        wait_until(
            lambda: sum(state_of(t.fab, x) == State.DONE for x in tasks) >= N,
            timeout=120,
            what=f"host b runs {N} tasks on the given-back slots",
        )
        wait_until(
            lambda: says(tmp_path, "host-b", "parked: quota spent"), timeout=30, what="host b parks again"
        )
    finally:
        gate.set()
        stop(procs)
    logs = log_of(tmp_path, "host-a", "host-b")

    # Host a's spare slot may have died holding a claim of its own (no quota slot: it was
    # refused by its own ledger); the keeper requeues that too once its lease runs out.
    def quiet() -> bool:
        swept()
        return all(state_of(t.fab, x) != State.WORKING for x in tasks)

    wait_until(quiet, timeout=60, what="every dead lease requeued")
    keeper.job_leases()
    again = keeper.last["quotas"]
    expected = sorted(s.ref.name("pool") for s in held_by_a)
    assert sorted(returned) == expected, logs
    assert again.returned == [], "each slot is given back once"
    # Host a's N calls (the provider may have run them: they were open) and host b's N.
    assert len(stub.chat_requests()) == 2 * N, logs
    assert local_calls(tmp_path, "host-b") == N
    done = [x for x in tasks if state_of(t.fab, x) == State.DONE]
    assert len(done) == N, logs
    states = {x: state_of(t.fab, x) for x in tasks}
    assert sum(v == State.QUEUED for v in states.values()) == N, states
    # On the board: host a's reservations given back by the keeper, host b's N in use;
    # no slot holds two calls, no call holds two slots.
    now = slots(t)
    gone = [s for s in now if s.returned]
    live = [s for s in now if not s.returned]
    assert sorted(s.ref.name("pool") for s in gone) == expected
    assert len(live) == N and {s.ref.slot for s in live} == set(range(N))
    assert all(s.ref.gen == 1 for s in live), [s.ref for s in live]
    assert {s.holder.task_id for s in live if s.holder} == set(done)
    assert b.returncode == 0, logs
