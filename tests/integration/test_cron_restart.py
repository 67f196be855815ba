"""Missed schedules across real process starts, and a cron submitter started before its board.

Each ``agap cron --tick --now TIME`` is a new OS process with the time given (no sleeps:
the gap between two starts is the difference of their ``--now``). The later start has a
state directory of its own, so what it knows of the earlier one comes from the board.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest

from fabric.apps.cron import load_schedules
from fabric.cards import CardSet
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from keeper.daemon import Keeper
from tests.conftest import ROOT, FakeClock, make_fabric
from tests.helpers import wait_until
from tests.unit.test_cron import MINUTELY

AGAP = [sys.executable, "-m", "fabric.apps.cli"]
SCHEDULES = MINUTELY  # one schedule, every minute, that must not be missed


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 3, 2, 8, minute, second, tzinfo=UTC)


def base_env(tmp_path: Path, url: str, token: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_", "LITELLM_"))}
    (tmp_path / "s.yaml").write_text(SCHEDULES)
    return {
        **keep,
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_SCHEDULES": str(tmp_path / "s.yaml"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }


def tick(env: dict[str, str], state: Path, when: datetime) -> list[dict[str, object]]:
    """One ``agap cron --tick`` process at ``when``; the firings it printed."""
    out = subprocess.run(
        [*AGAP, "cron", "--tick", "--now", when.isoformat(), "--json"],
        env={**env, "AGAP_STATE_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_two_starts_across_a_gap_record_the_missed_runs_on_the_board(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    clock = FakeClock(at(0).timestamp())
    client = KanboardClient(embedded_board.url, embedded_board.token)
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    fab = make_fabric(client, cards, clock, settings)  # bootstraps the board, as `agap init`
    env = base_env(tmp_path, embedded_board.url, embedded_board.token)

    # The first process: first seen at 08:00:00, fires 08:00; runs again at 08:01:03.
    assert [f["planned"] for f in tick(env, tmp_path / "one", at(0))] == [at(0).isoformat()]
    assert [f["planned"] for f in tick(env, tmp_path / "one", at(1, 3))] == [at(1).isoformat()]
    # It stops. Another process, on another state directory, starts 4.6 minutes later.
    fired = tick(env, tmp_path / "two", at(5, 40))
    assert [f["planned"] for f in fired] == [at(5).isoformat()] and fired[0]["created"] is True

    rec = fab.board.schedule_states()["minutely"]
    assert rec["missed"] == 3 and rec["missed_capped"] is False
    assert rec["missed_runs"] == [[at(2).timestamp(), at(4).timestamp(), 3, False]]
    assert rec["last_planned"] == at(5).timestamp() and rec["since"] == at(0).timestamp()
    [schedule] = load_schedules(tmp_path / "s.yaml")
    made = fab.board.tasks_by_keys([(schedule.actor, schedule.key(at(m))) for m in range(6)])
    assert [m for m, task in enumerate(made) if task is None] == [2, 3, 4], "a missed run is never fired"
    # A third start at the same moment counts nothing twice, and fires nothing.
    assert tick(env, tmp_path / "three", at(5, 50)) == []
    assert fab.board.schedule_states()["minutely"]["missed"] == 3

    # The keeper, reading the board after the restart, reports the three runs to Zabbix.
    clock.now = at(5, 55).timestamp()
    keeper = Keeper.for_fabric(fab, KeeperConfig())
    assert keeper.run_job("leases")
    [row] = keeper.metrics.to_json()["schedules"]
    assert row["missed"] == 3 and row["missed_runs"][0]["count"] == 3
    assert 'keeper_cron_missed{schedule="minutely"} 3' in keeper.metrics.to_prometheus()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lines:
    """A process's stderr, line by line, read in a thread (waited on with a bound)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._q: queue.Queue[str] = queue.Queue()
        assert proc.stderr is not None
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._q.put(line)

    def has(self, text: str) -> bool:
        while not self._q.empty():
            self.seen.append(self._q.get())
        return any(text in x for x in self.seen)


def test_cron_started_while_the_board_is_away_waits_and_starts_when_it_returns(
    cards: CardSet, tmp_path: Path
) -> None:
    db, token, port = tmp_path / "board.sqlite3", "t" * 32, free_port()
    with EmbeddedBoard(db, port=port, token=token) as board:  # bootstrapped, then gone
        settings = Settings(board_url=board.url, board_token=token, cards_dir=ROOT / "cards")
        make_fabric(KanboardClient(board.url, token), cards, settings=settings)
        url = board.url
    env = {**base_env(tmp_path, url, token), "AGAP_STATE_DIR": str(tmp_path / "state")}
    env["AGAP_BOARD_WAIT_CAP"] = "0.5s"  # retries come quickly; the bound is the test's wait
    proc = subprocess.Popen([*AGAP, "cron"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        err = Lines(proc)
        wait_until(lambda: err.has("unreachable"), timeout=60, what="agap cron to say the board is away")
        assert proc.poll() is None, "a board that is away is waited for, not an exit"
        with EmbeddedBoard(db, port=port, token=token) as back:
            client = KanboardClient(back.url, token)
            project = client.call("getProjectByName", {"name": "Agent Fabric"})

            def published() -> bool:
                meta = client.call("getProjectMetadata", {"project_id": int(project["id"])})
                return any(k.startswith("fabric.cron.") for k in meta or {})

            wait_until(
                published, timeout=90, what="agap cron to publish its schedules once the board is back"
            )
            wait_until(lambda: err.has("schedule(s) from"), timeout=30, what="agap cron to start")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err.has("")
    assert sum("unreachable" in x for x in err.seen) == 1, err.seen
    assert not any("Traceback" in x for x in err.seen), err.seen


@pytest.mark.parametrize(
    "args, message",
    [
        (["--file", "missing.yaml"], "no such schedule file"),
        (["--tick", "--now", "yesterday"], "is not a time"),
        (["--now", "2026-03-02T08:00:00Z"], "only goes with --tick or --list"),
    ],
)
def test_bad_configuration_exits_2_with_one_line_even_with_the_board_away(
    tmp_path: Path, args: list[str], message: str
) -> None:
    env = {**base_env(tmp_path, f"http://127.0.0.1:{free_port()}/jsonrpc.php", "t" * 32)}
    out = subprocess.run([*AGAP, "cron", *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
