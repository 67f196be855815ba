"""``agap mcp serve`` end to end: the official MCP SDK's client against the real server process.

The server runs as ``python -m fabric.apps.cli mcp serve`` (stdio, or streamable HTTP on
loopback) on the embedded board over HTTP. A person's answer goes through ``agap resume``,
and the keeper's requeue of an expired lease through the ledger on a clock moved past the
lease: nothing here waits for time to pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
from click.testing import CliRunner
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT
from tests.helpers import signed_in, wait_until
from tests.mcp_wire import TOKEN, Server

T = TypeVar("T")
OWNER = "mcp-loop-1"
TOOLS = {
    "list_targets",
    "submit_task",
    "get_task",
    "claim_task",
    "heartbeat_task",
    "complete_task",
    "fail_task",
    "ask_human",
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 90))


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_WORKER_ID": OWNER,
        # alvis at this shell (`agap resume` below), signed in: also what AGAP_MCP_USER needs.
        **signed_in(embedded_board, "alvis"),
        "AGAP_MCP_TOKEN": "",
        "AGAP_EVENTS_URL": "",
    }
    init = CliRunner().invoke(main, ["init"], env=env)
    assert init.exit_code == 0, init.output
    return env


@pytest.fixture
def fab(embedded_board: EmbeddedBoard) -> Fabric:
    """The test's own connection (a person's or the keeper's view of the board)."""
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return Fabric.connect(settings, cards=load_cards(ROOT / "cards", base_dir=ROOT))


def agap(env: dict[str, str], *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def serve_args(agent: str, *extra: str) -> list[str]:
    return ["-m", "fabric.apps.cli", "mcp", "serve", "--agent", agent, *extra]


@asynccontextmanager
async def stdio(
    env: dict[str, str], agent: str = "claude-coder", mode: str = "auto"
) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=serve_args(agent), env=env, cwd=str(ROOT))
    async with Client(params, mode=mode) as client:
        yield client


async def call(client: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, name: str, **args: Any) -> str:
    result = await client.call_tool(name, args)
    assert result.is_error, _text(result)
    return _text(result)


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def current(fab: Fabric, task_id: int) -> tuple[State, int, str]:
    view = fab.show(task_id)
    assert view.current is not None
    return view.current.state, view.epoch, view.current.op


# -- stdio -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 discover probe, and the handshake
def test_stdio_lists_the_tools_and_resources(env: dict[str, str], mode: str) -> None:
    async def go() -> tuple[set[str], list[str], list[str]]:
        async with stdio(env, mode=mode) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            return tools, resources, templates

    tools, resources, templates = run(go())
    assert tools == TOOLS
    assert sorted(resources) == ["agap://queue", "agap://targets"] and templates == ["agap://task/{task_id}"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_an_unknown_prompt_is_invalid_params_on_both_wires(env: dict[str, str], mode: str) -> None:
    """The server has no prompts: prompts/get names one that does not exist, which is bad
    input (-32602, as the spec says), not the SDK's ValueError (code 0 on the handshake
    wire, -32603 "Internal server error" with a traceback on the 2026-07-28 one)."""

    async def go() -> MCPError:
        async with stdio(env, mode=mode) as client:
            assert (await client.list_prompts()).prompts == []
            with pytest.raises(MCPError) as info:
                await client.get_prompt("test_simple_prompt")
            return info.value

    error = run(go())
    assert error.error.code == -32602, error.error
    assert error.error.message == "Unknown prompt: test_simple_prompt"


def test_stdio_submit_claim_heartbeat_complete(env: dict[str, str], fab: Fabric) -> None:
    async def go() -> dict[str, Any]:
        async with stdio(env) as client:
            sub = await call(client, "submit_task", intent="Fix the flaky parser test", target="claude-coder")
            tid = sub["task_id"]
            lease = await call(client, "claim_task")
            assert lease["claimed"] and lease["task_id"] == tid
            assert (lease["epoch"], lease["owner"], lease["intent"]) == (
                1,
                OWNER,
                "Fix the flaky parser test",
            )
            assert current(fab, tid) == (State.WORKING, 1, "claim")
            beat = await call(client, "heartbeat_task", task_id=tid, epoch=1)
            assert beat["lease_until"] >= lease["lease_until"]
            queue = json.loads(getattr((await client.read_resource("agap://queue")).contents[0], "text", ""))
            assert [h["task_id"] for h in queue["held"]] == [tid]
            done = await call(client, "complete_task", task_id=tid, result="Fixed: the parser handles tabs.")
            assert done["state"] == "done" and done["epoch"] == 2
            shown = await call(client, "get_task", task_id=tid)
            resource = await client.read_resource(f"agap://task/{tid}")
            assert json.loads(getattr(resource.contents[0], "text", ""))["state"] == "done"
            assert (await call(client, "claim_task"))["claimed"] is False
            return shown

    shown = run(go())
    assert shown["result"] == "Fixed: the parser handles tabs." and shown["state"] == "done"
    tid = shown["task_id"]
    assert current(fab, tid) == (State.DONE, 2, "complete")
    assert agap(env, "show", str(tid))["result_ref"] == f"kanboard://task/{tid}/file/result-e1.md"


def test_stdio_a_fenced_complete_is_refused(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard
) -> None:
    tid = agap(env, "submit", "--target", "claude-coder", "--intent", "Refactor the router")["task_id"]
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    # The keeper, on a clock past the lease (the card's 900 s): it requeues the task.
    keeper = Fabric.connect(settings, cards=fab.cards, clock=lambda: time.time() + 3600)

    async def go() -> tuple[str, dict[str, Any]]:
        async with stdio(env) as client:
            assert (await call(client, "claim_task"))["task_id"] == tid
            keeper.ledger.requeue_expired(keeper.show(tid), by="keeper")
            error = await refused(client, "complete_task", task_id=tid, result="late work")
            again = await call(client, "claim_task")  # the requeued task, under a new epoch
            return error, again

    error, again = run(go())
    assert error.startswith("Error executing tool complete_task: FENCED (exit 4): task #")
    assert "lease on epoch 1 is fenced (the task is at epoch 2)" in error and "Stop working on task" in error
    assert again["task_id"] == tid and again["epoch"] == 3
    view = fab.show(tid)
    assert view.records[2].op == "requeue" and all(r.op != "complete" for r in view.records.values())
    assert any("kept as evidence" in c.text for c in fab.board.comments(tid))


def test_stdio_a_question_answered_by_a_person_resumes_the_task(env: dict[str, str], fab: Fabric) -> None:
    tid = agap(env, "submit", "--target", "claude-coder", "--intent", "Deploy the fix")["task_id"]

    async def ask() -> dict[str, Any]:
        async with stdio(env) as client:
            await call(client, "claim_task")
            return await call(client, "ask_human", task_id=tid, question="Which branch?")

    asked = run(ask())
    assert asked["state"] == "input_required" and asked["asked"] == "alvis"  # the submitter
    assert current(fab, tid)[0] == State.INPUT_REQUIRED
    answered = agap(env, "resume", str(tid), "--answer", "release-2.3")  # alvis, from the shell
    assert answered["state"] == "queued"

    async def resume() -> tuple[dict[str, Any], dict[str, Any]]:
        async with stdio(env) as client:
            lease = await call(client, "claim_task")
            done = await call(client, "complete_task", task_id=tid, result_ref="https://git.example/pr/7")
            return lease, done

    lease, done = run(resume())
    assert lease["task_id"] == tid
    assert lease["conversation"] == [
        {"kind": "question", "text": "Which branch?"},
        {"kind": "answer", "text": "release-2.3"},
    ]
    assert done["result_ref"] == "https://git.example/pr/7"
    assert current(fab, tid)[0] == State.DONE


def test_stdio_the_server_is_scoped_to_its_card(env: dict[str, str], fab: Fabric) -> None:
    other = agap(env, "submit", "--target", "claude-coder", "--intent", "Review the PR")["task_id"]

    async def go() -> tuple[str, str, dict[str, Any]]:
        async with stdio(env, agent="torgash") as client:
            read = await refused(client, "get_task", task_id=other)
            private = await refused(
                client,
                "submit_task",
                intent="Summarise my diary",
                target="kimi",
                refs=["file:///srv/agap/private/alvis/diary.md"],
            )
            nothing = await call(client, "claim_task")
            return read, private, nothing

    read, private, nothing = run(go())
    assert "OUT_OF_SCOPE [mcp.read" in read and "(exit 6" in read
    assert "PRIVACY [privacy.sandboxed" in private
    assert nothing == {"claimed": False, "message": "nothing to claim in queue 'torgash'"}
    assert current(fab, other) == (State.QUEUED, 0, "submit")


def test_stdio_leaving_releases_the_lease(env: dict[str, str], fab: Fabric) -> None:
    tid = agap(env, "submit", "--target", "claude-coder", "--intent", "Write the changelog")["task_id"]

    async def go() -> None:
        async with stdio(env) as client:
            await call(client, "claim_task")

    run(go())
    # The client closed stdin; the server released the lease on its way out.
    assert wait_until(lambda: current(fab, tid) == (State.QUEUED, 2, "release"), 20, "the release")


# -- streamable HTTP -----------------------------------------------------------------------------


class HttpServer(Server):
    """``agap mcp serve --transport http --port 0`` for claude-coder (handles keyed by the token)."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env, "claude-coder", key=None)


@asynccontextmanager
async def bearer_client(url: str, token: str = TOKEN) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, sending ``Authorization: Bearer <token>``."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


@pytest.fixture
def http_server(env: dict[str, str]) -> Iterator[HttpServer]:
    server = HttpServer(env)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def test_http_refuses_requests_without_the_token(http_server: HttpServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    async def go() -> list[httpx2.Response]:
        async with httpx2.AsyncClient(timeout=10) as http:
            return [
                await http.post(http_server.url, json=body, headers=headers),
                await http.post(
                    http_server.url, json=body, headers={**headers, "Authorization": "Bearer wrong"}
                ),
                await http.post(http_server.url, json=body, headers={**headers, "Authorization": TOKEN}),
            ]

    for response in run(go()):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "tools" not in response.text


def test_http_submit_claim_heartbeat_complete(http_server: HttpServer, fab: Fabric) -> None:
    async def go() -> tuple[set[str], int]:
        async with bearer_client(http_server.url) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            tid = (await call(client, "submit_task", intent="Bump the version", target="claude-coder"))[
                "task_id"
            ]
            lease = await call(client, "claim_task", lease_seconds=120)
            assert lease["task_id"] == tid and lease["lease_seconds"] == 120
            await call(client, "heartbeat_task", task_id=tid)
            await call(client, "complete_task", task_id=tid, result="Bumped to 0.2.0")
            return tools, tid

    tools, tid = run(go())
    assert tools == TOOLS
    assert current(fab, tid) == (State.DONE, 2, "complete")
    assert http_server.stop() == 0


def test_http_releases_held_leases_on_sigterm(
    http_server: HttpServer, fab: Fabric, env: dict[str, str]
) -> None:
    tid = agap(env, "submit", "--target", "claude-coder", "--intent", "Tag the release")["task_id"]

    async def go() -> None:
        async with bearer_client(http_server.url) as client:
            await call(client, "claim_task")

    run(go())
    assert http_server.stop() == 0
    assert current(fab, tid) == (State.QUEUED, 2, "release")


@pytest.mark.parametrize(
    "extra, token, message",
    [
        (["--transport", "http"], "", "AGAP_MCP_TOKEN: no bearer token"),
        (["--transport", "http"], "short", "AGAP_MCP_TOKEN: the token is shorter than 16 characters"),
        (["--transport", "http", "--host", "0.0.0.0"], TOKEN, "--host: 0.0.0.0 is not a loopback address"),
        (["--renew-for", "soon"], TOKEN, "--renew-for: bad duration 'soon'"),
        ([], TOKEN, "unknown agent 'ghost'"),
    ],
)
def test_serve_refuses_to_start_with_one_line(
    env: dict[str, str], extra: list[str], token: str, message: str
) -> None:
    agent = "ghost" if not extra else "claude-coder"
    result = CliRunner().invoke(
        main, ["mcp", "serve", "--agent", agent, *extra], env={**env, "AGAP_MCP_TOKEN": token}
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("agap: error: ") and message in result.output
    assert result.output.count("\n") == 1


def test_stdio_lists_the_targets_and_names_them_on_a_wrong_one(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard
) -> None:
    park = {"queue": "kimi", "parked": True, "reason": "quota: 40/40 in 5h", "until": 4e9}
    fab.board.publish_park("kimi", park)
    before = len(fab.listing())

    async def go() -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]:
        async with stdio(env, agent="adolf") as client:
            listed = await call(client, "list_targets")
            resource = await client.read_resource("agap://targets")
            wrong = await refused(client, "submit_task", intent="Summarise the week", target="kimmi")
            async with stdio(env, agent="researcher") as untrusted:
                narrow = await call(untrusted, "list_targets")
            return listed, json.loads(getattr(resource.contents[0], "text", "")), wrong, narrow

    listed, resource, wrong, narrow = run(go())
    rows = {r["id"]: r for r in listed["targets"]}
    assert listed["you"] == "adolf" and listed["targets"][0]["id"] == "auto"
    assert set(rows) == {c.id for c in fab.cards if c.kind != "router"} | {"auto"}
    assert rows["kimi"]["available"] is False and rows["kimi"]["reason"] == "parked: quota: 40/40 in 5h"
    assert rows["kimi"]["until"] == "2096-10-02T07:06:40Z"
    assert rows["alvis"]["kind"] == "human" and rows["alvis"]["description"]
    assert rows["adolf"]["trust"] == "trusted" and "shared" in rows["adolf"]["shared_privacy_domains"]
    assert {r["id"] for r in resource["targets"]} == set(rows)
    # One line: what, where, the ids to use and where to look; nothing was written.
    assert wrong.startswith("Error executing tool submit_task: INVALID (exit 2: ")
    assert "target: unknown target 'kimmi' — you may target: auto, " in wrong and "kimi" in wrong
    assert "list_targets (or the agap://targets resource)" in wrong and "\n" not in wrong
    assert len(fab.listing()) == before
    # An untrusted card reaches only itself and the people (the submit scope's rule).
    assert {r["id"] for r in narrow["targets"]} == {"researcher"} | {c.id for c in fab.cards if c.is_human}


# -- launched as OpenClaw launches a stdio server --------------------------------------------

# OpenClaw gives a stdio MCP server only these, and a working directory of its own.
OPENCLAW_ENV = ("HOME", "PATH", "PWD", "SHELL", "TERM")


def bare_env(home: Path, workspace: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PWD": str(workspace),
        "SHELL": "/bin/sh",
        "TERM": "dumb",
    }


def test_stdio_finds_its_settings_in_the_users_env_file(env: dict[str, str], tmp_path: Path) -> None:
    home, workspace = tmp_path / "home", tmp_path / "workspace"
    workspace.mkdir()
    (home / ".config" / "agap").mkdir(parents=True)
    keep = ("KANBOARD_URL", "KANBOARD_API_TOKEN", "AGAP_CARDS_DIR", "AGAP_STATE_DIR", "XDG_CACHE_HOME")
    (home / ".config" / "agap" / "env").write_text("".join(f"{k}={env[k]}\n" for k in keep))
    launch = bare_env(home, workspace)
    assert set(launch) == set(OPENCLAW_ENV)
    params = StdioServerParameters(
        command=sys.executable, args=serve_args("adolf"), env=launch, cwd=str(workspace)
    )

    async def go() -> dict[str, Any]:
        async with Client(params) as client:
            return await call(client, "submit_task", intent="Water the plants", target="adolf", key="k-1")

    assert run(go())["created"] is True


def test_stdio_without_settings_says_which_and_where_in_one_line(tmp_path: Path) -> None:
    home, workspace = tmp_path / "home", tmp_path / "workspace"
    workspace.mkdir()
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, *serve_args("adolf")],
        env=bare_env(home, workspace),
        cwd=workspace,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    line = proc.stderr
    assert line.count("\n") == 1 and line.startswith("agap: error: agap mcp serve: cannot start: missing ")
    for what in ("KANBOARD_URL", "KANBOARD_API_TOKEN", f"AGAP_CARDS_DIR (cards (relative to {workspace})"):
        assert what in line
    assert "~/.config/agap/env" in line and "--env-file" in line


def test_stdio_takes_an_env_file_option(env: dict[str, str], tmp_path: Path) -> None:
    home, workspace = tmp_path / "home", tmp_path / "workspace"
    workspace.mkdir()
    home.mkdir()
    named = tmp_path / "fabric.env"
    keep = ("KANBOARD_URL", "KANBOARD_API_TOKEN", "AGAP_CARDS_DIR", "AGAP_STATE_DIR", "XDG_CACHE_HOME")
    named.write_text("".join(f"{k}={env[k]}\n" for k in keep))
    args = ["-m", "fabric.apps.cli", "--env-file", str(named), *serve_args("adolf")[2:]]
    params = StdioServerParameters(
        command=sys.executable, args=args, env=bare_env(home, workspace), cwd=str(workspace)
    )

    async def go() -> set[str]:
        async with Client(params) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert "submit_task" in run(go())
