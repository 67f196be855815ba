"""``agap a2a serve`` refuses to run unauthenticated; ``agap a2a call`` drives a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import fabric.apps.cli.a2a_cmd  # noqa: F401  (registers `agap a2a` until COMMAND_MODULES lists it)
from fabric.apps.a2a.server import ServerThread
from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from tests.fakes.openai_stub import OpenAIStub
from tests.integration.test_a2a_interop import ALICE, reply, setup_env, start_server


@pytest.fixture
def server(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[ServerThread]:
    with OpenAIStub(reply=reply) as stub:
        settings, cards, env, _ = setup_env(embedded_board, tmp_path, stub)
        srv = start_server(settings, cards, env, embedded_board)
        try:
            yield srv
        finally:
            srv.stop()


def test_serve_refuses_to_start_without_tokens(embedded_board: EmbeddedBoard) -> None:
    env = {
        "AGAP_A2A_TOKENS": "",
        "AGAP_A2A_TOKENS_FILE": "",
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
    }
    result = CliRunner().invoke(main, ["a2a", "serve", "--agent", "kimi"], env=env)
    assert result.exit_code == 2
    assert "no A2A client tokens are configured" in result.output


def test_call_sends_and_prints_the_result(server: ServerThread) -> None:
    url = f"{server.url}/helper"
    runner = CliRunner()
    result = runner.invoke(main, ["a2a", "call", url, "Say hi", "--token", ALICE])
    assert result.exit_code == 0, result.output
    assert "stub reply to: Say hi" in result.output

    result = runner.invoke(
        main, ["a2a", "call", url, "later", "--async", "--json"], env={"AGAP_A2A_TOKEN": ALICE}
    )
    assert result.exit_code == 0, result.output
    task = json.loads(result.output[result.output.index("{") :])
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"

    result = runner.invoke(main, ["a2a", "call", url, "--cancel", task["id"], "--token", ALICE])
    assert result.exit_code == 0 and "TASK_STATE_CANCELED" in result.output

    result = runner.invoke(main, ["a2a", "call", url, "[ask] pick one", "--token", ALICE])
    assert result.exit_code == 9 and "which city?" in result.output  # waits for an answer

    result = runner.invoke(main, ["a2a", "call", url, "x", "--token", "not-" + "a" * 30])
    assert result.exit_code == 3 and "refused the credentials (HTTP 401)" in result.output
    assert result.output.strip().count("\n") == 0, result.output  # one line
