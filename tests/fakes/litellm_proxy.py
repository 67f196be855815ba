"""Starts the REAL LiteLLM proxy (not a stand-in) on loopback, for integration tests.

The proxy (``litellm --config FILE --host 127.0.0.1 --port N``, from ``litellm[proxy]``)
is put in front of loopback stand-ins: ``model_list`` entries route ``openai/<name>`` to an
:class:`~tests.fakes.openai_stub.OpenAIStub`, and ``success_callback: ["langfuse"]`` sends
traces to a :class:`~tests.fakes.langfuse_receiver.LangfuseReceiver`. It runs with a random
strong ``LITELLM_MASTER_KEY`` and ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no network), and is
waited for on ``/health/liveliness`` with a bounded timeout.

:func:`proxy_unavailable_reason` says why the proxy cannot run here (not installed), so a
test can skip with that reason instead of failing.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml


def _cli() -> str | None:
    beside = Path(sys.executable).with_name("litellm")
    return str(beside) if beside.exists() else shutil.which("litellm")


def proxy_unavailable_reason() -> str | None:
    """None when the proxy can be started here; else a one-line reason."""
    # Top-level names only: find_spec("litellm.proxy") would import litellm (~4 s) here.
    for module in ("litellm", "fastapi", "uvicorn", "backoff", "apscheduler"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'litellm[proxy]')"
    spec = importlib.util.find_spec("litellm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not any((Path(p) / "proxy" / "proxy_server.py").is_file() for p in locations):
        return "litellm has no proxy module (pip install 'litellm[proxy]')"
    if _cli() is None:
        return "the litellm command is not on PATH (pip install 'litellm[proxy]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiteLLMProxy:
    """``with LiteLLMProxy(workdir, models, env) as proxy: proxy.url, proxy.master_key``.

    ``models``: ``{public_name: litellm_params}``; ``env``: extra environment (provider keys,
    LANGFUSE_*); ``callbacks``: LiteLLM success callbacks.
    """

    workdir: Path
    models: dict[str, dict[str, object]]
    env: dict[str, str] = field(default_factory=dict)
    callbacks: list[str] = field(default_factory=list)
    start_timeout: float = 90.0
    master_key: str = field(default_factory=lambda: "sk-" + secrets.token_urlsafe(32))
    port: int = field(default_factory=free_port)
    started_in: float = 0.0

    def __post_init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "litellm-proxy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, object]:
        settings: dict[str, object] = {"num_retries": 0, "request_timeout": 30, "drop_params": True}
        if self.callbacks:
            settings["success_callback"] = list(self.callbacks)
        return {
            "model_list": [
                {"model_name": name, "litellm_params": params} for name, params in self.models.items()
            ],
            "litellm_settings": settings,
            "router_settings": {"num_retries": 0},
            "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        }

    def start(self) -> LiteLLMProxy:
        cli = _cli()
        assert cli is not None, proxy_unavailable_reason()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LANGFUSE_", "LITELLM_", "DATABASE_URL", "OPENAI_"))
        }
        env.update(
            {
                "LITELLM_MASTER_KEY": self.master_key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
            }
        )
        env.update(self.env)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [cli, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"the LiteLLM proxy exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if requests.get(f"{self.url}/health/liveliness", timeout=1).ok:
                    self.started_in = time.monotonic() - started
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the LiteLLM proxy was not live within {self.start_timeout:.0f}s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
