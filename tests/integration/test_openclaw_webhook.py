"""OpenClaw's "run finished" webhook to the keeper's receiver, with the payload OpenClaw
2026.9.6's scheduler posts (its ``finished`` event: ``jobId``, ``action``, ``status``,
``completionStatus``, ``summary``/``error``, ``runId``, ``runAtMs``, ``job`` with its
cron ``schedule``; ``Authorization: Bearer <cron.webhookToken>``), over loopback HTTP.

The run's outcome lands on the task its slot submitted, once; a run that submitted
nothing is a missed slot on the board, once; bad input is 4xx with one line; without
the token setting there is no route."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import META_OPENCLAW_RUN, cron_key
from fabric.settings.resolve import Settings
from keeper.daemon import Keeper
from keeper.hook import HookServer
from keeper.metrics import Metrics
from tests.conftest import ROOT, make_fabric

TOKEN = "oc-webhook-secret"
NOW = float(int(time.time()) // 60 * 60 + 5)  # five seconds into a minute: on time
SLOT = "* * * * *"


@dataclass
class Receiver:
    fab: Fabric
    hook: HookServer

    def post(
        self, body: Any, *, query: str = "?key=openclaw/digest", token: str | None = TOKEN
    ) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return requests.post(f"{self.hook.url}openclaw{query}", data=data, headers=headers, timeout=30)


def finished(status: str = "ok", *, name: str = "digest", run_at: float = NOW, **more: Any) -> dict[str, Any]:
    """A finished event as OpenClaw's cron service emits it (dist/service-*.mjs)."""
    event: dict[str, Any] = {
        "jobId": "3f1c9a52-5b0e-4c55-9d1e-2a7e8f00b1aa",
        "action": "finished",
        "status": status,
        "completionStatus": "succeeded" if status == "ok" else "failed",
        "runId": f"cron:3f1c9a52:{int(run_at * 1000)}",
        "runAtMs": int(run_at * 1000),
        "durationMs": 8123,
        "nextRunAtMs": int((run_at + 55) * 1000),
        "job": {
            "id": "3f1c9a52-5b0e-4c55-9d1e-2a7e8f00b1aa",
            "name": name,
            "enabled": True,
            "schedule": {"kind": "cron", "expr": SLOT, "tz": "UTC"},
            "sessionTarget": "isolated",
            "payload": {"kind": "agentTurn", "message": "Submit the digest"},
            "delivery": {"mode": "webhook", "to": "http://127.0.0.1/openclaw"},
            "state": {"lastRunStatus": status},
        },
        **more,
    }
    if status == "ok":
        event.setdefault("summary", "Submitted: task #1")
    return event


@pytest.fixture
def receiver(embedded_board: EmbeddedBoard, cards: CardSet) -> Iterator[Receiver]:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    fab = make_fabric(
        KanboardClient(embedded_board.url, embedded_board.token), cards, clock=lambda: NOW, settings=settings
    )
    keeper = Keeper.for_fabric(fab)
    hook = HookServer(keeper.poke, token="kb-token", openclaw=keeper.openclaw_run, openclaw_token=TOKEN)
    with hook:
        yield Receiver(fab, hook)


def journal(fab: Fabric, task_id: int) -> list[str]:
    return [c.text for c in fab.board.comments(task_id) if "OpenClaw run" in c.text]


def test_a_runs_outcome_lands_once_on_the_task_its_slot_submitted(receiver: Receiver) -> None:
    fab = receiver.fab
    task = fab.submit(
        "Morning digest", target="adolf", actor="openclaw", key="openclaw/digest", slot=SLOT, timezone="UTC"
    )
    res = receiver.post(finished())
    assert res.status_code == 200 and res.text == f"task #{task.task_id}: OpenClaw run of digest (slot " + (
        time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(NOW)) + ") recorded\n"
    )
    record = json.loads(fab.show(task.task_id).meta[META_OPENCLAW_RUN])
    assert (
        record["status"] == "ok" and record["summary"] == "Submitted: task #1" and record["job"] == "digest"
    )
    assert receiver.post(finished()).status_code == 200  # the same event again: said once
    (line,) = journal(fab, task.task_id)
    assert "succeeded" in line and "digest" in line
    # The run failed after it submitted (its delivery, a later tool call): said on the task.
    res = receiver.post(finished("error", error="model timed out", runId="cron:other"))
    assert res.status_code == 200
    assert len(journal(fab, task.task_id)) == 2 and "failed: model timed out" in journal(fab, task.task_id)[1]


def test_a_run_that_submitted_nothing_is_a_missed_slot_once(receiver: Receiver) -> None:
    fab = receiver.fab
    body = finished("error", name="water", error="MCP error -32000: Connection closed")
    res = receiver.post(body, query="?key=openclaw/water")
    assert res.status_code == 200 and "has no task: recorded as missed" in res.text
    assert receiver.post(body, query="?key=openclaw/water").status_code == 200  # once per slot
    record = json.loads(fab.board.project_meta()[cron_key("openclaw-water")])
    assert record["missed"] == 1 and record["last_error"].startswith("MCP error -32000")
    metrics = Metrics()
    metrics.observe_schedules(fab.board.project_meta(), NOW)
    (schedule,) = metrics.schedules
    assert schedule["schedule"] == "openclaw-water" and schedule["missed_total"] == 1
    assert not fab.board.search("status:open")  # nothing was submitted on its behalf


@pytest.mark.parametrize(
    ("body", "query", "token", "status", "text"),
    [
        (finished(), "?key=openclaw/digest", None, 401, "unauthorized"),
        (finished(), "?key=openclaw/digest", "wrong", 401, "unauthorized"),
        (b"{not json", "", TOKEN, 400, "body: not JSON"),
        ({"action": "started", "jobId": "x"}, "", TOKEN, 400, "not an OpenClaw finished event"),
        (
            {**finished(), "job": {"name": "x", "schedule": {"kind": "every", "everyMs": 60000}}},
            "",
            TOKEN,
            400,
            "no cron slot with a time zone",
        ),
        ({**finished(), "runAtMs": "soon"}, "", TOKEN, 400, "no runAtMs"),
        (finished(), "?key=bad key!", TOKEN, 400, "is not a slot key"),
        (
            {
                **finished(),
                "job": {"name": "x", "schedule": {"kind": "cron", "expr": SLOT, "tz": "Mars/Base"}},
            },
            "",
            TOKEN,
            400,
            "is not an IANA time zone",
        ),
    ],
)
def test_bad_input_is_4xx_with_one_line_and_nothing_written(
    receiver: Receiver, body: Any, query: str, token: str | None, status: int, text: str
) -> None:
    before = receiver.fab.board.project_meta()
    res = receiver.post(body, query=query, token=token)
    assert res.status_code == status and text in res.text and len(res.text.strip().splitlines()) == 1, (
        res.text
    )
    assert receiver.fab.board.project_meta() == before


def test_without_the_token_setting_there_is_no_route(http_fabric: Fabric) -> None:
    keeper = Keeper.for_fabric(http_fabric)
    with HookServer(keeper.poke, token="kb-token", openclaw=keeper.openclaw_run) as hook:
        res = requests.post(
            f"{hook.url}openclaw", json=finished(), headers={"Authorization": "Bearer "}, timeout=30
        )
    assert res.status_code == 404 and "AGAP_KEEPER_OPENCLAW_TOKEN" in res.text
