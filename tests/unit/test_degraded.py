"""Degraded start: a worker or keeper whose board is away waits for it (no real waiting here).

Every sleep is injected and records what it was asked to wait; the jitter's randomness is
injected too. The real processes are in tests/integration/test_degraded_start.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

import pytest

from fabric.core import Fabric
from fabric.degraded import Backoff, BoardWait, transient
from fabric.errors import ConfigError
from fabric.kanboard.port import BoardAuthError, BoardUnavailable, RpcError
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from workers.job import Job, JobOutcome
from workers.loop import Worker, WorkerConfig

URL = "http://127.0.0.1:9/jsonrpc.php"

T = TypeVar("T")


class Sleeps:
    """An injected sleep: records each wait and returns at once (True = "stopped")."""

    def __init__(self, stop_after: int | None = None, on_sleep: Callable[[], None] | None = None) -> None:
        self.waits: list[float] = []
        self.stop_after = stop_after
        self.on_sleep = on_sleep

    def __call__(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep()
        return self.stop_after is not None and len(self.waits) >= self.stop_after


class Flaky(Generic[T]):
    """An attempt that fails with ``error`` ``times`` times, then returns ``value``."""

    def __init__(self, times: int, value: T, error: Exception | None = None) -> None:
        self.times = times
        self.value = value
        self.error = error or BoardUnavailable("cannot reach the board: connection refused", where=URL)
        self.calls = 0

    def __call__(self) -> T:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return self.value


def _fixed(value: float) -> Callable[[], float]:
    return lambda: value


def _done(job: Job) -> JobOutcome:
    return JobOutcome.done(f"file:///result-{job.lease.task_id}.md")


def test_backoff_doubles_up_to_the_cap_and_jitters_within_bounds() -> None:
    low, mid, high = (Backoff(first=0.5, cap=8, jitter=0.2, random=_fixed(r)) for r in (0.0, 0.5, 1.0))
    assert [mid.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert low.delay(1) == pytest.approx(0.4) and high.delay(1) == pytest.approx(0.6)
    assert low.delay(10) == pytest.approx(6.4)
    assert all(high.delay(n) <= 8 for n in range(1, 40)), "jitter never goes past the cap"
    assert Backoff(cap=0).delay(3) > 0, "a zero cap does not spin"


def test_the_wait_says_one_line_then_retries_quietly_until_the_board_answers() -> None:
    said: list[str] = []
    sleeps = Sleeps()
    attempt = Flaky(5, "up")
    wait = BoardWait(URL, "worker tester", sleeps, Backoff(first=1, cap=4, random=lambda: 0.5), said.append)
    assert wait.until(attempt) == "up"
    assert attempt.calls == 6 and sleeps.waits == [1, 2, 4, 4, 4]
    assert len(said) == 1, said
    line = said[0]
    assert URL in line and "worker tester" in line and "until it answers" in line and "\n" not in line
    assert wait.waits == 1


def test_a_stop_during_the_wait_returns_at_once() -> None:
    sleeps = Sleeps(stop_after=2)
    attempt = Flaky(100, "up")
    assert BoardWait(URL, "keeper", sleeps, say=lambda _: None).until(attempt) is None
    assert attempt.calls == 2 and len(sleeps.waits) == 2


@pytest.mark.parametrize(
    "error",
    [
        BoardAuthError("HTTP 401: the board rejected the credentials", where=URL),
        RpcError(-32601, "Method not found", method="getProjectByName"),
        RpcError(0, "SQL Error[42P01]: SQLSTATE[42P01]: relation missing", method="getProjectByName"),
        ConfigError("project 'Agent Fabric' is not on the board", hint="run `agap init` first"),
    ],
    ids=["rejected-token", "not-kanboard", "sql-refusal", "no-project"],
)
def test_what_waiting_cannot_cure_is_raised_at_once(error: Exception) -> None:
    sleeps = Sleeps()
    with pytest.raises(type(error)):
        BoardWait(URL, "worker tester", sleeps, say=lambda _: None).until(Flaky(1, "up", error))
    assert sleeps.waits == [], "no wait for bad configuration"


def test_a_busy_board_is_waited_for_like_an_absent_one() -> None:
    busy = RpcError(0, "SQLSTATE[HY000]: General error: 5 database is locked", method="getProjectByName")
    assert transient(busy) and transient(BoardUnavailable("down"))
    assert not transient(BoardAuthError("HTTP 401"))
    assert BoardWait(URL, "w", Sleeps(), say=lambda _: None).until(Flaky(2, "up", busy)) == "up"


# -- the worker ----------------------------------------------------------------------------


def _worker(connect: Callable[[], Fabric], sleeps: Sleeps) -> Worker:
    config = WorkerConfig(queue="gemma-local", owner="w1", exit_when_idle=True, board_url=URL)
    worker = Worker(connect, _done, config)
    worker.sleep = sleeps
    worker.backoff = Backoff(first=0.5, cap=30, random=lambda: 0.5)
    return worker


def test_a_worker_started_before_its_board_waits_then_works(
    local_fabric: Fabric, caplog: pytest.LogCaptureFixture
) -> None:
    tid = local_fabric.submit("wait for the board", target="gemma-local").task_id
    board_up = Flaky(4, local_fabric)
    sleeps = Sleeps()
    worker = _worker(board_up, sleeps)
    with caplog.at_level(logging.INFO):
        worker.run()
    assert sleeps.waits == [0.5, 1.0, 2.0, 4.0]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and URL in said[0] and "until it answers" in said[0], said
    assert worker.stats.completed == 1
    cur = local_fabric.board.read(tid).current
    assert cur is not None and cur.state == State.DONE


def test_a_worker_stopped_while_waiting_returns_without_working(local_fabric: Fabric) -> None:
    local_fabric.submit("never claimed", target="gemma-local")
    holder: list[Worker] = []
    sleeps = Sleeps(on_sleep=lambda: holder[0].stop.set())  # SIGTERM arrives during the wait
    sleeps.stop_after = 1
    board_down = Flaky(1_000, local_fabric)
    worker = _worker(board_down, sleeps)
    holder.append(worker)
    worker.run()
    assert board_down.calls == 1 and worker.stats.polls == 0 and worker.stats.claimed == 0


def test_a_worker_whose_token_is_rejected_raises_at_once(local_fabric: Fabric) -> None:
    rejected = Flaky(1, local_fabric, BoardAuthError("HTTP 401: the board rejected the credentials"))
    sleeps = Sleeps()
    worker = _worker(rejected, sleeps)
    with pytest.raises(BoardAuthError) as err:
        worker.run()
    assert err.value.exit_code == 3 and sleeps.waits == []


def test_the_default_worker_sleep_is_its_stop_event(local_fabric: Fabric) -> None:
    worker = Worker(lambda: local_fabric, _done, WorkerConfig(queue="q", owner="o"))
    worker.stop.set()
    assert worker.sleep(60) is True, "SIGTERM (stop) cuts the wait short"


# -- the keeper ----------------------------------------------------------------------------


def test_the_keeper_waits_for_its_board_reporting_it_down(
    local_fabric: Fabric, caplog: pytest.LogCaptureFixture
) -> None:
    board_up = Flaky(3, local_fabric)
    backoff = Backoff(first=1, cap=2, random=lambda: 0.5)
    keeper = Keeper(KeeperConfig(), board_up, board_url=URL, start_backoff=backoff)
    seen: list[int] = []
    sleeps = Sleeps(on_sleep=lambda: seen.append(keeper.metrics.board_up))
    with caplog.at_level(logging.INFO):
        assert keeper.wait_for_board(sleeps)
    assert sleeps.waits == [1, 2, 2] and seen == [0, 0, 0], "board_up is 0 while it waits"
    assert keeper.metrics.board_errors_total == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and URL in warnings[0] and warnings[0].startswith("keeper:")
    assert keeper.run_job("leases") and keeper.metrics.board_up == 1


def test_a_keeper_stopped_while_waiting_says_so(local_fabric: Fabric) -> None:
    keeper = Keeper(KeeperConfig(), Flaky(1_000, local_fabric), board_url=URL)
    assert not keeper.wait_for_board(Sleeps(stop_after=1))
    rejected = Keeper(
        KeeperConfig(),
        Flaky(1, local_fabric, BoardAuthError("HTTP 401: the board rejected the credentials")),
        board_url=URL,
    )
    with pytest.raises(BoardAuthError):
        rejected.wait_for_board(Sleeps())
