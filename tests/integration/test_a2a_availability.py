"""Sync A2A calls check and count the agent's a(t), in the ledger its worker uses.

A helper card with a quota of 2 calls per hour: two sync calls spend it, the third is
refused at once with what parks the agent and when it frees (no model call, no task, no
wait), the worker built for that card sees the same spent quota, and an async message is
still taken as a queued task for when the agent frees. A 429 met by a sync call parks the
worker too, and gives the call's quota slot back. A quota declared ``across_hosts`` is
counted on the board too: a worker on another host and the server meet one limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import load_cards
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.quotas import QuotaStore
from fabric.task import State
from tests.fakes.openai_stub import OpenAIStub
from tests.integration.test_a2a_interop import HELPER, Env, reply, setup_env, start_server
from tests.integration.test_a2a_interop import rpc as call
from tests.integration.test_a2a_interop import wire_message as msg
from workers.assembly import build_worker

QUOTA = "availability:\n  - shape: quota\n    limit: 2\n    window: 1h\n"


@pytest.fixture
def quota_env(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[Env]:
    with OpenAIStub(reply=reply) as stub:
        settings, _, env, fab = setup_env(embedded_board, tmp_path, stub)
        (settings.cards_dir / "helper.yaml").write_text(HELPER + QUOTA)
        cards = load_cards(settings.cards_dir, base_dir=settings.cards_dir)
        assert cards.get("helper").availability, "the card carries its quota"
        server = start_server(settings, cards, env, embedded_board)
        try:
            yield Env(server, fab, stub, settings, cards, env)
        finally:
            server.stop()


def test_a_parked_agent_refuses_a_sync_call_at_once_saying_when_it_frees(quota_env: Env) -> None:
    e = quota_env
    for i in range(2):
        done = call(e, "SendMessage", {"message": msg(f"call {i}")})["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    before = time.time()
    refused = call(e, "SendMessage", {"message": msg("one too many")})
    err = refused["error"]
    assert err["code"] == -32004, refused
    assert "helper is parked (quota spent: 2 of 2 per 1h)" in err["message"]
    assert "it frees at" in err["message"] and "returnImmediately" in err["message"]
    info: dict[str, Any] = err["data"][0]["metadata"]
    assert 3500 <= int(info["retryAfterSeconds"]) <= 3601 and info["availableAt"].endswith("UTC")
    assert len(e.stub.chat_requests()) == 2, "a parked agent is not called"
    assert time.time() - before < 5, "refused at once, not after a wait"
    assert call(e, "ListTasks", {})["result"].get("totalSize") == 2, "no task for the refused call"

    # The worker of this card reads the same ledger: its quota is spent too.
    worker = build_worker("helper", e.settings, e.cards, env=e.env)
    assert worker.availability is not None
    verdict = worker.availability.check(time.time())
    assert not verdict.available and verdict.reason.startswith("quota spent: 2 of 2")

    # An async message is still taken: a queued task for when the agent frees.
    queued = call(
        e, "SendMessage", {"message": msg("later, please"), "configuration": {"returnImmediately": True}}
    )
    task = queued["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert e.board_state(task["id"]) == State.QUEUED


def test_a_sync_answer_to_a_parked_agent_is_refused_too(quota_env: Env) -> None:
    e = quota_env
    asked = call(e, "SendMessage", {"message": msg("[ask] book a table")})["result"]["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert call(e, "SendMessage", {"message": msg("spend the last call")})["result"]["task"]
    paris = msg("Paris", taskId=asked["id"])
    answer = call(e, "SendMessage", {"message": paris})
    assert answer["error"]["code"] == -32004 and "parked" in answer["error"]["message"]
    still = call(e, "GetTask", {"id": asked["id"]})["result"]
    assert still["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", "the question still waits"
    retry = call(e, "SendMessage", {"message": paris})  # the same message id again
    assert retry["error"]["code"] == -32004, "the refused answer's id was not used up"


def test_a_429_met_by_a_sync_call_parks_the_worker_too(quota_env: Env) -> None:
    e = quota_env
    e.stub.fail_next("429", count=5, retry_after="600", reset_requests=None)
    failed = call(e, "SendMessage", {"message": msg("meets a 429")})["result"]["task"]
    assert failed["status"]["state"] == "TASK_STATE_FAILED"
    assert "rate limited" in str(failed["status"]["message"])
    worker = build_worker("helper", e.settings, e.cards, env=e.env)
    assert worker.availability is not None
    verdict = worker.availability.check(time.time())
    assert not verdict.available and verdict.reason.startswith("rate limited")
    assert verdict.until is not None and verdict.until - time.time() > 500
    refused = call(e, "SendMessage", {"message": msg("and after it")})["error"]
    assert refused["code"] == -32004 and "rate limited" in refused["message"]
    # The provider refused the call, so its quota slot was given back: the ledger holds no call.
    (ledger,) = (e.settings.state_dir / "endpoints").glob("helper.quota*.json")
    assert json.loads(ledger.read_text())["calls"] == []


SHARED = "availability:\n  - shape: quota\n    limit: 2\n    window: 1h\n    across_hosts: true\n"


@pytest.fixture
def shared_env(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[Env]:
    with OpenAIStub(reply=reply) as stub:
        settings, _, env, fab = setup_env(embedded_board, tmp_path, stub)
        (settings.cards_dir / "helper.yaml").write_text(HELPER + SHARED)
        cards = load_cards(settings.cards_dir, base_dir=settings.cards_dir)
        init_board(fab.port, settings, cards)  # the quota project, now that a card shares one
        server = start_server(settings, cards, env, embedded_board)
        try:
            yield Env(server, fab, stub, settings, cards, env)
        finally:
            server.stop()


def test_sync_calls_count_against_a_quota_kept_across_hosts(shared_env: Env, tmp_path: Path) -> None:
    e = shared_env
    # A worker of the same model on another host (its own state dir: it shares no ledger
    # file with the A2A server) takes one of the two calls.
    elsewhere = replace(e.settings, state_dir=tmp_path / "other-host")
    worker = build_worker("helper", elsewhere, e.cards, env=e.env)
    assert worker.availability is not None
    assert worker.availability.admit(time.time()).available
    done = call(e, "SendMessage", {"message": msg("the last call")})["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    refused = call(e, "SendMessage", {"message": msg("one too many")})["error"]
    assert refused["code"] == -32004, refused
    assert "helper is parked (quota spent across hosts: 2 of 2 per 1h)" in refused["message"]
    assert len(e.stub.chat_requests()) == 1, "the refused call never reached the model"
    # The server's own ledger holds its one call; the board holds both hosts' calls.
    (ledger,) = (e.settings.state_dir / "endpoints").glob("helper.quota*.json")
    assert len(json.loads(ledger.read_text())["calls"]) == 1
    tags = QuotaStore(e.fab.port, e.settings.quota_project).read()["helper"]
    assert sorted(t.ref.slot for t in tags if not t.returned) == [0, 1]
    # A sync call runs under no lease: its slot is tied to none, so the keeper leaves it.
    assert all(t.holder is None for t in tags)
    # And the worker on the other host meets the server's call: its view (fresh, from
    # before that call) offers a slot, the board's test-and-set refuses it, a read says why.
    verdict = worker.availability.admit(time.time())
    assert not verdict.available and verdict.reason.startswith("quota spent across hosts: 2 of 2")


def test_a_sync_call_the_provider_refused_gives_its_board_slot_back(shared_env: Env) -> None:
    e = shared_env
    e.stub.fail_next("429", count=5, retry_after="1", reset_requests=None)
    failed = call(e, "SendMessage", {"message": msg("meets a 429")})["result"]["task"]
    assert failed["status"]["state"] == "TASK_STATE_FAILED"
    (tag,) = QuotaStore(e.fab.port, e.settings.quota_project).read()["helper"]
    assert tag.returned, "the provider never ran the call: its slot is free for every host"
