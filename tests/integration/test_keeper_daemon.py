"""The keeper daemon over HTTP against the embedded board: off the critical path, the CLI,
the scheduler, SIGTERM-style shutdown, the board going away and coming back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.kanboard.moves import REPAIR_AGE
from fabric.settings.keeper import JOBS, KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import ROOT, make_fabric
from workers.queue import QueueReader


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    return {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_ACTOR": "cron",
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_with_no_keeper_running_submit_claim_complete_still_works(http_fabric: Fabric) -> None:
    """Off the critical path: nothing here starts a keeper; only hygiene would wait."""
    receipt = http_fabric.submit("no janitor today", target="gemma-local")
    reader = QueueReader.for_agent(http_fabric, http_fabric.cards.get("gemma-local"))
    lease = reader.claim_next("w1", lease_seconds=30)
    assert lease is not None and lease.task_id == receipt.task_id
    http_fabric.ledger.complete(lease, "file:///out.md")
    view = http_fabric.board.read(receipt.task_id)
    assert view.current is not None and view.current.state == State.DONE
    http_fabric.ledger.verify(receipt.task_id, "alvis")
    assert http_fabric.board.read(receipt.task_id).current.state == State.CLOSED  # type: ignore[union-attr]


def test_agap_keeper_once_runs_every_job(
    env: dict[str, str], embedded_board: EmbeddedBoard, cards: CardSet
) -> None:
    assert run(env, "init").exit_code == 0
    # Claimed ten minutes ago with a one-minute lease: expired now, without waiting for it.
    fab = make_fabric(
        KanboardClient(embedded_board.url, embedded_board.token), cards, clock=lambda: time.time() - 600
    )
    tid = fab.submit("expire me", target="gemma-local").task_id
    fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    res = run({**env, "AGAP_KEEPER_LEASE_GRACE": "0"}, "keeper", "--once")
    out = json.loads(res.output)
    assert res.exit_code == 0 and set(out["jobs"]) == set(JOBS) and all(out["jobs"].values())
    assert out["metrics"]["lease_expiries_total"] == 1
    assert fab.board.read(tid).current.state == State.QUEUED  # type: ignore[union-attr]


def test_agap_keeper_once_with_the_board_down_exits_non_zero(env: dict[str, str]) -> None:
    res = CliRunner().invoke(
        main, ["keeper", "--once"], env={**env, "KANBOARD_URL": "http://127.0.0.1:9/jsonrpc.php"}
    )
    assert res.exit_code == 3
    out = json.loads(res.output)
    assert not any(out["jobs"].values()) and out["metrics"]["board_up"] == 0
    assert out["metrics"]["board_errors_total"] == len(JOBS)


def test_the_metrics_endpoint_refuses_to_start_without_a_token(env: dict[str, str]) -> None:
    assert run(env, "init").exit_code == 0
    res = CliRunner().invoke(main, ["keeper", "--once", "--metrics-port", "0"], env=env)
    assert res.exit_code == 0  # port 0: no endpoint, nothing to protect
    res = CliRunner().invoke(
        main, ["keeper", "--once", "--metrics-port", "19464"], env={**env, "AGAP_KEEPER_METRICS_TOKEN": ""}
    )
    assert res.exit_code == 2 and "token" in res.output


def test_the_keeper_never_imports_litellm() -> None:
    code = (
        "import sys, keeper.daemon, keeper.gc, fabric.apps.cli.keeper_cmd; "
        "from fabric.apps.cli import main; "
        "sys.exit(1 if 'litellm' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0


def test_the_scheduler_has_one_job_per_duty_with_its_own_interval(http_fabric: Fabric) -> None:
    cfg = KeeperConfig.from_env({"AGAP_KEEPER_LEASES_EVERY": "7s", "AGAP_KEEPER_GC_EVERY": "12h"})
    sched = Keeper.for_fabric(http_fabric, cfg).scheduler()
    sched.start(paused=True)
    try:
        jobs = {j.id: j for j in sched.get_jobs()}
    finally:
        sched.shutdown(wait=False)
    assert set(jobs) == set(JOBS)
    assert jobs["leases"].trigger.interval.total_seconds() == 7
    assert jobs["gc"].trigger.interval.total_seconds() == 12 * 3600
    assert "cron" in str(jobs["digest"].trigger)
    assert all(j.max_instances == 1 and j.coalesce for j in jobs.values())


def test_serve_sweeps_on_its_own_and_stops_cleanly(embedded_board: EmbeddedBoard, cards: CardSet) -> None:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings)
    tid = fab.submit("expire under the daemon", target="gemma-local").task_id
    # A lease that outlives REPAIR_AGE: until then the card is its writer's to move (a
    # worker's claim moves it late), and the keeper leaves it be.
    fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=REPAIR_AGE + 1)
    fab.port.call(
        "moveTaskPosition",
        {  # a lagging projection for the gesture job
            "project_id": fab.board.layout.project_id,
            "task_id": tid,
            "position": 1,
            "column_id": fab.board.layout.columns[Column.QUEUED],
            "swimlane_id": 0,
        },
    )
    cfg = KeeperConfig(intervals={name: 0.3 for name in KeeperConfig().intervals}, lease_grace=0)
    keeper = Keeper(
        cfg,
        lambda: make_fabric(
            KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings
        ),
    )
    stop = threading.Event()
    t = threading.Thread(target=keeper.serve, args=(stop,))
    t.start()
    try:
        deadline = time.monotonic() + 60
        # Two jobs of their own: the repair of the lagging card, then the lease sweep.
        while keeper.metrics.lease_expiries_total == 0 or keeper.metrics.repairs_total == 0:
            assert time.monotonic() < deadline, keeper.metrics.to_json()
            time.sleep(0.2)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive(), "shutdown is clean and prompt"
    assert fab.board.read(tid).current.state == State.QUEUED  # type: ignore[union-attr]
    assert keeper.metrics.repairs_total >= 1


def test_the_keeper_recovers_when_the_board_comes_back(tmp_path: Path, cards: CardSet) -> None:
    db = tmp_path / "board.sqlite3"
    with EmbeddedBoard(db) as board:
        url, token = board.url, board.token
        settings = Settings(board_url=url, board_token=token, cards_dir=ROOT / "cards")
        fab = make_fabric(KanboardClient(url, token), cards, settings=settings)
        fab.submit("survive an outage", target="gemma-local")
        mono = [0.0]
        keeper = Keeper.for_fabric(fab, KeeperConfig(backoff_base=1), monotonic=lambda: mono[0])
        assert keeper.run_job("leases")
    # The board is down: the keeper logs, counts, backs off, never raises.
    fab.port.close()  # type: ignore[attr-defined]  # drop the kept-alive connection
    assert not keeper.run_job("leases")
    assert keeper.metrics.board_up == 0 and keeper.metrics.board_errors_total == 1
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with EmbeddedBoard(db, port=port, token=token) as again:
        assert again.url == url
        mono[0] += 2
        assert keeper.run_job("leases"), keeper.metrics.jobs["leases"].last_error
        assert keeper.metrics.board_up == 1
        assert keeper.metrics.queues["gemma-local"].depth == 1


def test_sigterm_stops_the_daemon_cleanly(env: dict[str, str]) -> None:
    import os
    import signal

    assert run(env, "init").exit_code == 0
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fabric.apps.cli import main; main()", "keeper"],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        running = threading.Event()

        def drain(stream: IO[str]) -> None:  # a full stderr pipe would block the keeper
            for line in stream:
                if "keeper running" in line:
                    running.set()

        threading.Thread(target=drain, args=(proc.stderr,), daemon=True).start()
        assert running.wait(60), "the keeper never said it was running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_homes_keeper_publishes_its_receiver_beside_the_main_ones(
    env: dict[str, str], embedded_board: EmbeddedBoard, tmp_path: Path
) -> None:
    """`agap keeper` on torgash's home (as `agap up` runs it) with a hook token listens on a
    free port (never the main keeper's, which the same environment names) and publishes it
    in the home's metadata, token-checked; the main keeper's receiver takes a home's event.
    The forward itself: tests/integration/test_gesture_webhook.py."""
    import os
    import signal
    import socket

    import requests

    from fabric.kanboard.layout import META_HOOK
    from tests.helpers import wait_until

    token = "daemon-hook-token"
    env = {**env, "AGAP_BOARD_PASSWORD_TORGASH": "torgash-board-password-0123456789"}
    assert run(env, "init").exit_code == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        main_port = s.getsockname()[1]
    common = {**os.environ, **env, "AGAP_KEEPER_HOOK_TOKEN": token, "AGAP_KEEPER_HOOK_PORT": str(main_port)}
    home_env = {
        **common,
        "AGAP_PROJECT": "Agent Fabric: torgash",
        "AGAP_LOCKS_PROJECT": "Agent Fabric Locks: torgash",
    }
    cmd = [sys.executable, "-c", "from fabric.apps.cli import main; main()", "keeper"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=e, stderr=subprocess.DEVNULL) for e in (home_env, common)]
    try:
        client = KanboardClient(embedded_board.url, embedded_board.token)
        home = client.call("getProjectByName", {"name": "Agent Fabric: torgash"})

        def published() -> str:
            return str(
                (client.call("getProjectMetadata", {"project_id": int(home["id"])}) or {}).get(META_HOOK, "")
            )

        wait_until(published, timeout=60, what="the home's keeper to publish its receiver")
        assert published().startswith("http://127.0.0.1:") and f":{main_port}/" not in published()
        body = {
            "event_name": "task.move.column",
            "event_data": {"task": {"project_id": int(home["id"])}},
            "event_author": "alvis",
        }

        def main_up() -> bool:
            try:
                return requests.post(f"http://127.0.0.1:{main_port}/?token={token}", json=body, timeout=5).ok
            except requests.RequestException:
                return False

        wait_until(main_up, timeout=60, what="the main keeper's receiver")
        assert requests.post(published() + "?token=wrong", json=body, timeout=5).status_code == 401
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                assert p.wait(30) == 0
            finally:
                if p.poll() is None:
                    p.kill()
