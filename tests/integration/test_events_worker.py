"""Workers, submitters and ``agap watch`` with live events on the real brokers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.events.attach import attach_submitter
from fabric.events.subscriber import EXIT_COMPLETED, EXIT_FAILED
from fabric.task import State
from tests.helpers import Lines, Running, wait_until
from tests.integration.test_events_helpers import (
    QUEUE,
    Broker,
    Gate,
    Idling,
    Watching,
    board_check,
    epoch_of,
    make_worker,
)
from workers.attach import WebhookHint, attach_worker
from workers.job import JobOutcome

pytest_plugins = ["tests.integration.test_events_helpers"]  # the fixtures

ROOT = Path(__file__).resolve().parents[2]


def state_of(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None


def test_a_worker_publishes_its_lifecycle_in_order(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("publish my life", target=QUEUE).task_id
    shared_broker.retained_tasks.append(tid)
    gate = Gate(steps=3)
    worker = make_worker(fab, gate)
    att = attach_worker(worker, env=shared_broker.env(), wake=False)
    assert att is not None
    w = Watching(tid, board_check(fab, tid), shared_broker.config)
    w.wait_live()
    with Running(worker):
        assert gate.entered.wait(10)
        gate.release.set()
        result = w.join()
    att.close()
    assert result.code == EXIT_COMPLETED
    assert w.types() == ["started", "progress", "progress", "progress", "completed"]
    seqs = [line["seq"] for line in w.lines]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert [epoch_of(line) for line in w.lines] == [1, 1, 1, 1, 2]
    done = w.lines[-1]
    assert done["data"] == {"kind": "completed", "result_ref": f"kanboard://task/{tid}/file/r.md"}
    assert state_of(fab, tid) == State.DONE


def test_a_dead_letter_is_published_as_failed(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("fail me", target=QUEUE).task_id
    shared_broker.retained_tasks.append(tid)
    worker = make_worker(
        fab, Gate(outcome=JobOutcome.failed("it broke at /home/me/x", poison=True), hold=False)
    )
    att = attach_worker(worker, env=shared_broker.env(), wake=False)
    assert att is not None
    w = Watching(tid, board_check(fab, tid), shared_broker.config)
    w.wait_live()
    with Running(worker):
        result = w.join()
    att.close()
    assert result.code == EXIT_FAILED
    last = w.lines[-1]
    assert (last["event"], last["data"]["kind"]) == ("error", "failed") and "/home" not in last["detail"]


def test_cancel_through_the_hooked_ledger_is_published(shared_broker: Broker, fab: Fabric) -> None:
    pub = attach_submitter(fab, env=shared_broker.env())
    assert pub is not None
    tid = fab.submit("cancel me", target=QUEUE).task_id
    shared_broker.retained_tasks.append(tid)
    w = Watching(tid, board_check(fab, tid), shared_broker.config)
    w.wait_live()
    fab.ledger.cancel(tid, "tester", "changed my mind")
    result = w.join()
    assert result.code == EXIT_FAILED
    assert w.lines[-1]["source"] == "broker"
    last = w.lines[-1]
    assert (last["event"], last["data"]["kind"], epoch_of(last)) == ("error", "canceled", 1)
    assert pub.flush(2)


def test_a_submit_wakes_an_idle_worker_long_before_its_poll(shared_broker: Broker, fab: Fabric) -> None:
    gate = Gate(hold=False)
    worker = make_worker(fab, gate, poll=30.0)  # the safety net alone would take 30 s
    worker.wake = idling = Idling()
    named: list[tuple[int | None, str | None]] = []
    hinted = worker.hinted

    def recorded(tid: int | None, uid: str | None) -> None:
        named.append((tid, uid))
        hinted(tid, uid)

    worker.hinted = recorded  # type: ignore[method-assign,assignment]
    att = attach_worker(worker, env=shared_broker.env())
    assert att is not None and att.waker is not None
    waker = att.waker
    submitter = another_submitter(fab, shared_broker)
    with Running(worker):
        # Ready: the wake-up subscription is up, and the first (empty) poll is behind the worker.
        wait_until(lambda: waker._was_up, timeout=30, what="the wake-up subscription")
        wait_until(lambda: idling.waits >= 1, timeout=30, what="the worker idle after its first poll")
        t0 = time.monotonic()
        receipt = submitter.submit("wake up", target=QUEUE)
        tid = receipt.task_id
        shared_broker.retained_tasks.append(tid)
        # Done well inside the 30 s poll interval: only a wake-up can do that.
        wait_until(lambda: state_of(fab, tid) == State.DONE, timeout=20, what="done before the next poll")
        took = time.monotonic() - t0
    att.close()
    assert took < 20.0, f"the wake-up did not work: {took:.1f}s"
    assert waker.hints >= 1
    # The event named the task and its uid: the worker claimed it without a poll.
    assert (tid, receipt.uid) in named


def another_submitter(fab: Fabric, broker: Broker) -> Fabric:
    from tests.integration.test_events_helpers import another

    sub = another(fab)
    assert attach_submitter(sub, env=broker.env()) is not None
    return sub


def test_the_webhook_answers_at_once_and_only_hints(fab: Fabric) -> None:
    hinted = threading.Event()
    hook = WebhookHint("127.0.0.1", 0, hinted.set, token="s3cret-token")
    try:
        bad = urllib.request.Request(hook.url + "?token=nope", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=2)
        assert err.value.code == 403 and not hinted.is_set()
        body = json.dumps({"event_name": "task.create", "event_data": {"task_id": 1}}).encode()
        t0 = time.monotonic()
        req = urllib.request.Request(hook.url + "?token=s3cret-token", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=2) as resp:
            assert resp.status == 204
        assert time.monotonic() - t0 < 5.0, "the hook answers without waiting for the worker"
        assert hinted.wait(10) and hook.hints == 1
    finally:
        hook.close()


def test_the_webhook_wakes_a_worker(shared_broker: Broker, fab: Fabric) -> None:
    worker = make_worker(fab, Gate(hold=False), poll=30.0)
    worker.wake = idling = Idling()
    port = _free()
    att = attach_worker(worker, env=shared_broker.env(AGAP_EVENTS_WEBHOOK=f"127.0.0.1:{port}"))
    assert att is not None and att.webhook is not None
    with Running(worker):
        wait_until(lambda: idling.waits >= 1, timeout=30, what="the worker idle after its first poll")
        tid = fab.submit("no event for this one", target=QUEUE).task_id  # not hooked
        urllib.request.urlopen(
            urllib.request.Request(att.webhook.url, data=b"{}", method="POST"), timeout=10
        ).close()
        wait_until(lambda: state_of(fab, tid) == State.DONE, timeout=20, what="done before the next poll")
    att.close()


def _free() -> int:
    from tests.integration.test_events_helpers import free_port

    return free_port()


def test_events_without_a_secret_refuse_to_start(fab: Fabric) -> None:
    worker = make_worker(fab, Gate(hold=False))
    with pytest.raises(ConfigError, match="AGAP_EVENTS_SECRET"):
        attach_worker(worker, env={"AGAP_EVENTS_URL": "mqtt://127.0.0.1:1883"})
    with pytest.raises(ConfigError, match="AGAP_EVENTS_SECRET"):
        attach_submitter(fab, env={"AGAP_EVENTS_URL": "nats://127.0.0.1:4222"})
    assert attach_worker(worker, env={}) is None and worker.listeners == []
    assert attach_submitter(fab, env={}) is None


# -- the command ------------------------------------------------------------------------


def _watch_cli(
    fab: Fabric, broker: Broker, tid: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        **broker.env(),
        "KANBOARD_URL": fab.settings.board_url,
        "KANBOARD_API_TOKEN": fab.settings.board_token,
        "AGAP_CARDS_DIR": str(fab.settings.cards_dir),
        **(env or {}),
    }
    code = "import fabric.apps.cli.watch_cmd; from fabric.apps.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "watch", str(tid), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_agap_watch_prints_json_lines_and_exits_by_outcome(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("watch from the command line", target=QUEUE).task_id
    shared_broker.retained_tasks.append(tid)
    gate = Gate()
    worker = make_worker(fab, gate)
    att = attach_worker(worker, env=shared_broker.env(), wake=False)
    assert att is not None
    proc = _watch_cli(fab, shared_broker, tid, "--timeout", "60", "-v")
    stdout, stderr = Lines(proc.stdout), Lines(proc.stderr)
    try:
        with Running(worker):
            assert gate.entered.wait(10)
            # The command's readiness line: subscribed, and the board checked after that.
            # From here on every event reaches it, however slowly it started.
            stderr.wait_for("live (subscribed, board checked)", timeout=60)
            gate.release.set()
            assert proc.wait(60) == 0, stderr.text()
    finally:
        if proc.poll() is None:
            proc.kill()
        att.close()
    out, err = stdout.close(), stderr.close()
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines and lines[-1]["event"] == "completed", lines
    assert lines[-1]["source"] == "broker"
    assert "subscribed to live events" in err  # logs on stderr, never on stdout
    # a finished task: at once, from the board (waiting for events would take the 600 s
    # idle timeout; the bound below is for a slow start on a busy machine)
    again = _watch_cli(fab, shared_broker, tid)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    board_line = json.loads(out.splitlines()[0])
    assert board_line["source"] == "board" and board_line["event"] == "completed"
    assert board_line.keys() == lines[-1].keys()  # one line shape, live or from the board
    assert board_line["seq"] == lines[-1]["seq"]  # the record the live terminal event reported


def test_agap_watch_times_out_with_exit_8(shared_broker: Broker, fab: Fabric) -> None:
    tid = fab.submit("nobody works on this", target=QUEUE).task_id
    proc = _watch_cli(fab, shared_broker, tid, "--idle-timeout", "1")
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 8 and out == ""  # the wait ran out
    assert "idle timeout" in err


def test_agap_watch_reports_bad_input_apart_from_timeouts(shared_broker: Broker, fab: Fabric) -> None:
    proc = _watch_cli(fab, shared_broker, 999)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "999" in err  # bad input, not a timeout
    env_without_secret = {"AGAP_EVENTS_SECRET": ""}
    proc = _watch_cli(fab, shared_broker, 1, env=env_without_secret)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "AGAP_EVENTS_SECRET" in err
