"""A push subscription outlives the server: kill -9 ``agap a2a serve``, restart it, the end is pushed.

The server is a real ``agap a2a serve`` process; the board is the embedded one over HTTP;
the webhook is a loopback receiver that checks the credentials the config names; the task
is claimed and finished only after the restart, through the ledger (as an external runtime
such as `agap claim`/`agap complete` does).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric.apps.a2a.client import FabricA2AClient, push_config, text_message
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.results import AttachmentStore
from tests.conftest import ROOT
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Lines, wait_until
from tests.integration.test_a2a_interop import ALICE, Receiver, reply, run, setup_env

AGAP = [
    sys.executable,
    "-c",
    "import sys, fabric.apps.cli.a2a_cmd; from fabric.apps.cli import main; sys.argv[0] = 'agap'; main()",
]
PUSH_SECRET = "push-secret-" + "p" * 20


class Serve:
    """``agap a2a serve`` on a free loopback port, its URL read from what it logs."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*AGAP, "a2a", "serve", "--agent", "helper", "--port", "0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err = Lines(self.proc.stderr)
        line = self.err.wait_for("A2A agent helper: ")[0]
        found = re.search(r"(http://127\.0\.0\.1:\d+)/helper/", line)
        assert found, line
        self.url = found.group(1) + "/helper"
        card = f"{self.url}/.well-known/agent-card.json"
        wait_until(lambda: httpx.get(card).status_code == 200, 30, "the card", ignoring=(httpx.HTTPError,))

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class AuthReceiver(Receiver):
    """The loopback webhook; :meth:`accepted` keeps the posts that carried the right credentials."""

    def accepted(self, state: str) -> list[dict[str, Any]]:
        return [
            body
            for headers, body in list(self.posts)
            if headers.get("authorization") == f"Bearer {PUSH_SECRET}"
            and headers.get("x-a2a-notification-token") == "tok-restart"
            and body.get("task", {}).get("status", {}).get("state") == state
        ]


@pytest.fixture
def serve_env(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[tuple[dict[str, str], Fabric]]:
    with OpenAIStub(reply=reply) as stub:
        settings, _, _, fab = setup_env(embedded_board, tmp_path, stub)
        e = dict(os.environ)
        e.update(
            {
                "KANBOARD_URL": embedded_board.url,
                "KANBOARD_API_TOKEN": embedded_board.token,
                "AGAP_CARDS_DIR": str(settings.cards_dir),
                "AGAP_STATE_DIR": str(settings.state_dir),
                "XDG_CACHE_HOME": str(tmp_path / "cache"),
                "AGAP_A2A_TOKENS": f"alice:{ALICE}",
                "AGAP_A2A_PUSH_ALLOW": "127.0.0.1",
                "AGAP_MODEL_MODE": "demo",  # the server runs no model here: the worker does
                "PYTHONPATH": str(ROOT),
            }
        )
        yield e, fab


def test_a_push_config_survives_kill_9_and_the_end_is_pushed_after_the_restart(
    serve_env: tuple[dict[str, str], Fabric],
) -> None:
    e, fab = serve_env
    rx = AuthReceiver()
    first = Serve(e)
    try:

        async def submit() -> str:
            async with await FabricA2AClient.open(first.url, ALICE, timeout=30) as c:
                cfg = push_config(rx.url, token="tok-restart", scheme="Bearer", credentials=PUSH_SECRET)
                sent = await c.send(
                    text_message("Notify me after a crash"), return_immediately=True, push=cfg
                )
                return sent.id

        task_id = run(submit())
        first.kill9()  # no shutdown of any kind: what is not on disk is gone
        assert rx.accepted("TASK_STATE_COMPLETED") == []
        second = Serve(e)
        try:

            async def configs() -> list[Any]:
                async with await FabricA2AClient.open(second.url, ALICE, timeout=30) as c:
                    req = {"taskId": task_id}
                    return await _list_configs(c, req)

            listed = run(configs())
            assert [(c["url"], c["token"]) for c in listed] == [(rx.url, "tok-restart")]
            assert listed[0]["authentication"] == {"scheme": "Bearer", "credentials": PUSH_SECRET}
            board_id = int(task_id.split("-")[0])
            lease = fab.ledger.claim(fab.board.read(board_id), "loop-1", lease_seconds=60)
            wait_until(lambda: rx.accepted("TASK_STATE_WORKING"), 30, "the pushed claim")
            fab.ledger.complete(lease, AttachmentStore(fab.board).put(lease, "done after the crash"))
            done = wait_until(lambda: rx.accepted("TASK_STATE_COMPLETED"), 30, "the pushed end")
            assert done[0]["task"]["id"] == task_id
            assert "done after the crash" in str(done[0]["task"]["artifacts"])
        finally:
            second.stop()
    finally:
        first.stop()
        rx.close()


async def _list_configs(c: FabricA2AClient, params: dict[str, str]) -> list[Any]:
    """``ListTaskPushNotificationConfigs`` on the wire (the client exposes no wrapper)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "ListTaskPushNotificationConfigs", "params": params}
    url = c.card.supported_interfaces[0].url
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {ALICE}"}
    r = await c.http.post(url, json=body, headers=headers)
    out = r.json()
    assert "result" in out, out
    return list(out["result"].get("configs", []))
