"""The compose stack, run as written, without a container engine.

Every service of ``compose/docker-compose.yml`` + the generated workers file runs as a
host process with exactly the environment the file gives it (plus the fabric image's own
``ENV`` lines, ``PATH`` and ``HOME``): values interpolated from a ``.env`` made from
``.env.example`` the way the install page says (every secret filled in), service names
mapped to loopback ports, container paths to folders, ``0.0.0.0`` to 127.0.0.1. What
cannot run here stands in on loopback: Kanboard is the embedded board in its PostgreSQL
flavour (with the stack's API token, as Kanboard takes ``API_AUTHENTICATION_TOKEN``), a
model provider is an OpenAI-compatible stub behind the REAL LiteLLM proxy, Mosquitto is
the machine's broker. Then it drives the stack the way the operations page does: the
one-shot ``init`` first, the daemons after it, ``agap doctor`` (one task end to end), a
submit → done → verify, a question a person answers, and a keeper restart.

A variable a service reads but was not given, a ``:?`` secret ``.env.example`` does not
list, or a command that does not start, fails here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fabric.embedded.server import EmbeddedBoard
from tests.conftest import REAL_SKIP, ROOT, real_kanboard, scratch_board
from tests.fakes.litellm_proxy import free_port, proxy_unavailable_reason
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import wait_until
from tests.unit.test_deploy_compose import merged_stack

COMPOSE = ROOT / "compose"
BIN = Path(sys.executable).parent
MQTT = ("127.0.0.1", 1883)

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class Undefined(Exception):
    """A ``${VAR:?…}`` the .env leaves empty: compose would refuse the file."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``,
    ``${VAR:?err}``, ``${VAR?err}``, ``${VAR:+r}``, ``${VAR+r}``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        unset = not value if op in (":-", ":?", ":+") else value is None
        if op in (":?", "?") and unset:
            raise Undefined(f"{name}: {arg}")
        if op in (":-", "-") and unset:
            return interpolate(arg, env)
        if op in (":+", "+"):
            return "" if unset else interpolate(arg, env)
        return value or ""

    return _VAR.sub(one, text)


def dotenv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def image_env() -> dict[str, str]:
    """The fabric image's ENV lines (the Dockerfile's), as a container would have them."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                k, _, v = pair.partition("=")
                env[k] = interpolate(v, env)
    return env


def required_secrets(stack_text: str) -> set[str]:
    return set(re.findall(r"\$\{([A-Z0-9_]+):\?", stack_text))


@dataclass
class Stack:
    """The rendered stack mapped onto this host."""

    tmp: Path
    env_file: dict[str, str]
    services: dict[str, Any]
    ports: dict[tuple[str, int], int]  # (service, container port) -> loopback port
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def host(self, text: str) -> str:
        """Service names -> loopback ports; container paths -> this host's folders."""

        def addr(m: re.Match[str]) -> str:
            name, port = m.group(1), int(m.group(3) or 80)
            return f"//127.0.0.1:{self.ports.get((name, port), DEAD_PORT)}"

        names = "|".join(sorted((re.escape(n) for n in self.services), key=len, reverse=True))
        text = re.sub(rf"//({names})(:(\d+))?(?=[/\s]|$)", addr, text)
        for inside, outside in self.paths():
            text = text.replace(inside, outside)
        return text

    def paths(self) -> list[tuple[str, str]]:
        pairs = [("/app/cards", str(ROOT / "cards")), ("/app/souls", str(ROOT / "souls"))]
        for svc in self.services.values():
            for vol in svc.get("volumes", []):
                src, _, rest = vol.partition(":")
                dst = rest.split(":")[0]
                if src.startswith("./"):
                    pairs.append((dst, str(COMPOSE / src[2:])))
                else:
                    pairs.append((dst, str(self.tmp / "volumes" / src)))
        return sorted(set(pairs), key=lambda p: len(p[0]), reverse=True)

    def environment(self, name: str) -> dict[str, str]:
        svc = self.services[name]
        env = image_env() if svc.get("image", "").find("agap-fabric") >= 0 else {}
        for k, v in (svc.get("environment") or {}).items():
            env[k] = self.host(interpolate(str(v), self.env_file))
        env = {k: self.host(v) for k, v in env.items()}
        for k, v in env.items():
            if v == "0.0.0.0":
                env[k] = "127.0.0.1"
        home = self.tmp / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        for path in (env.get("AGAP_STATE_DIR"), env.get("XDG_CACHE_HOME")):
            if path:
                Path(path).mkdir(parents=True, exist_ok=True)
        return {**env, "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home)}

    def command(self, name: str, argv: list[str] | None = None) -> list[str]:
        given = argv if argv is not None else self.services[name]["command"]
        argv = [interpolate(a, self.env_file) for a in given]
        out: list[str] = []
        for i, arg in enumerate(argv):
            prev = argv[i - 1] if i else ""
            own = (name, int(arg)) if arg.isdigit() else None
            if prev in ("--port", "--metrics-port", "127.0.0.1") and own in self.ports:
                arg = str(self.ports[own])  # a listener, or its healthcheck's `tcp 127.0.0.1 N`
            elif arg == "0.0.0.0":
                arg = "127.0.0.1"
            # a healthcheck's URL names the container's own port on loopback
            arg = re.sub(
                r"//127\.0\.0\.1:(\d+)",
                lambda m: f"//127.0.0.1:{self.ports.get((name, int(m.group(1))), int(m.group(1)))}",
                arg,
            )
            out.append(self.host(arg))
        if out[0] in ("agap", "litellm"):
            out[0] = str(BIN / out[0])
        elif out[0] == "python":
            out[0] = sys.executable
        return out

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            self.command(name), env=self.environment(name), cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs[name] = proc
        return proc

    def run(self, name: str, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``docker compose run --rm NAME ARGV…``: the service's environment, another command."""
        return subprocess.run(
            self.command(name, list(argv)),
            env=self.environment(name),
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def healthy(self, name: str, timeout: float) -> None:
        """The service's own healthcheck, run with its environment, until it passes."""
        test = self.services[name]["healthcheck"]["test"]
        assert test[0] == "CMD", (name, test)
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs.get(name)
            assert proc is None or proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"
            r = self.run(name, *test[1:], timeout=30)
            if r.returncode == 0:
                return
            assert time.monotonic() < deadline, f"{name} not healthy: {r.stdout}{r.stderr}\n{self.log(name)}"
            time.sleep(0.5)  # a bounded poll of the service's own check, not a synchronisation guess

    def stop(self, name: str, timeout: float = 15.0) -> int:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{name} did not stop within {timeout} s of SIGTERM") from None


DEAD_PORT = free_port()  # nothing listens here: a service that is not running


def _agap(stack: Stack, *argv: str) -> Any:
    r = stack.run("keeper", "agap", *argv, "--json")
    assert r.returncode == 0, (argv, r.stdout, r.stderr)
    return json.loads(r.stdout)


def _until(stack: Stack, task: int, states: set[str], timeout: float = 90.0) -> dict[str, Any]:
    shown: dict[str, Any] = {}

    def there() -> bool:
        shown.update(_agap(stack, "show", str(task)))
        return shown["state"] in states

    with contextlib.suppress(AssertionError):
        wait_until(there, timeout, f"task {task} to be one of {sorted(states)}")
    assert shown["state"] in states, (shown, {n: stack.log(n)[-800:] for n in stack.procs})
    return shown


def filled_env(example: dict[str, str], required: set[str], provider: OpenAIStub) -> dict[str, str]:
    """The install page's .env: every secret filled in (openssl rand -hex 32), each
    provider's endpoint and key in the generated block."""
    env_file = dict(example)
    for name in required | {k for k in example if "PASSWORD" in k}:
        if not env_file.get(name):
            env_file[name] = secrets.token_hex(32)
    env_file["AGAP_A2A_TOKENS"] = f"alice:{secrets.token_hex(16)}"
    for k in list(env_file):
        if k.endswith("_API_BASE"):
            env_file[k] = provider.base_url
        if k.endswith("_API_KEY"):
            env_file[k] = provider.api_key
    return env_file


@pytest.fixture(params=["embedded-postgres", "real-kanboard"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The stack on the embedded board (PostgreSQL flavour), or on the real Kanboard the
    explicit test variables name (its API token in .env, as an operator would set it)."""
    real = real_kanboard() if request.param == "real-kanboard" else None
    if request.param == "real-kanboard" and real is None:
        pytest.skip(REAL_SKIP)
    reason = proxy_unavailable_reason()
    if reason:
        pytest.skip(f"the real LiteLLM proxy cannot run here: {reason}")
    text = (COMPOSE / "docker-compose.yml").read_text() + (COMPOSE / "docker-compose.workers.yml").read_text()
    example = dotenv(COMPOSE / ".env.example")
    missing = required_secrets(text) - set(example)
    assert not missing, f".env.example does not list {sorted(missing)}"
    with OpenAIStub() as provider:
        env_file = filled_env(example, required_secrets(text), provider)
        if real is not None:
            scratch_board(*real)
            env_file["KANBOARD_API_TOKEN"] = real[1]
            run = secrets.token_hex(3)  # projects of this run's own: the board is shared
            env_file["AGAP_PROJECT"] = f"Agent Fabric {run}"
            env_file["AGAP_LOCKS_PROJECT"] = f"Agent Fabric Locks {run}"
        services = {
            n: s for n, s in merged_stack()["services"].items() if not s.get("profiles")
        }  # COMPOSE_PROFILES is empty
        board_port = (urlsplit(real[0]).port or 80) if real is not None else free_port()
        ports = {("kanboard", 80): board_port, ("mosquitto", 1883): MQTT[1]}
        for name, svc in services.items():
            argv = svc.get("command") or []
            for i, arg in enumerate(argv[:-1]):
                if arg in ("--port", "--metrics-port") and argv[i + 1].isdigit():
                    ports[(name, int(argv[i + 1]))] = free_port()
        st = Stack(tmp_path, env_file, services, ports)
        board_env = st.environment("kanboard")
        with contextlib.ExitStack() as board:
            if real is None:
                board.enter_context(
                    EmbeddedBoard(
                        tmp_path / "kanboard.sqlite3",
                        port=board_port,
                        token=board_env["API_AUTHENTICATION_TOKEN"],
                        flavour="postgres",
                    )
                )
            try:
                yield st
            finally:
                for name in list(st.procs):
                    st.procs[name].kill()
                    st.procs[name].wait()


@pytest.mark.timeout(900)  # a bound for a loaded machine: ~150 s of LiteLLM and ten daemons
def test_the_stack_starts_as_written_and_does_its_work(stack: Stack) -> None:
    services = stack.services
    fabric_daemons = sorted(
        n for n, s in services.items() if "agap-fabric" in s.get("image", "") and n not in ("init", "litellm")
    )
    assert {"keeper", "a2a", "worker-kimi", "worker-adolf", "keeper-torgash"} <= set(fabric_daemons)
    # Nothing stands in for the fabric's own services: only for images that are not ours.
    assert {n for n in services if n not in fabric_daemons} == {
        "kanboard-db",
        "kanboard",
        "litellm",
        "init",
        "mosquitto",
    }

    # 1. the model plane, with its own healthcheck
    stack.start("litellm")
    stack.healthy("litellm", timeout=120)

    # 2. init, once the board is healthy; it must succeed before any daemon starts
    init = stack.start("init")
    assert init.wait(timeout=120) == 0, stack.log("init")
    assert "agap init" in stack.log("init") or stack.log("init").strip(), stack.log("init")

    # 3. every daemon, with exactly its own environment, each healthy by its own check
    for name in fabric_daemons:
        stack.start(name)
    stack.healthy("keeper", timeout=60)
    stack.healthy("a2a", timeout=60)
    for name in fabric_daemons:
        assert stack.procs[name].poll() is None, f"{name} exited:\n{stack.log(name)}"

    # 4. the smoke test of the operations page, run in the keeper's container
    keeper_url = f"http://keeper:{9464}/metrics.json"
    doctor = stack.run("keeper", "agap", "doctor", "--agent", "kimi", "--keeper", keeper_url)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert [ln.split()[1] for ln in lines] == ["board", "layout", "keeper", "models", "events", "task"], lines
    # the keeper is not given the model plane (it never calls a model): the task went
    # through it, and the A2A gateway's container, which has it, checks the proxy itself
    assert all(ln.startswith("ok") or ln.startswith("skip models") for ln in lines), "\n".join(lines)
    gateway = stack.run("a2a", "agap", "doctor", "--no-keeper")
    assert gateway.returncode == 0, gateway.stdout + gateway.stderr
    assert re.search(
        r"^ok +models +http://127\.0\.0\.1:\d+: the LiteLLM proxy is alive", gateway.stdout, re.M
    )

    # 5. submit -> done -> verify, through the proxy to the provider
    task = _agap(stack, "submit", "--target", "kimi", "--intent", "Summarise the week")["task_id"]
    assert _until(stack, task, {"done", "dead"})["state"] == "done", stack.log("worker-kimi")
    verified = stack.run("keeper", "agap", "verify", str(task), "--note", "fine")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert _agap(stack, "show", str(task))["state"] == "closed"

    # 6. a question a person answers (an external runtime's task: claim, ask, resume)
    asked = _agap(stack, "submit", "--target", "claude-coder", "--intent", "Which tests are flaky?")[
        "task_id"
    ]
    epoch = _agap(stack, "claim", "--agent", "claude-coder", "--owner", "loop-1")["epoch"]
    q = stack.run(
        "keeper",
        "agap",
        "ask",
        str(asked),
        "--epoch",
        str(epoch),
        "--owner",
        "loop-1",
        "--question",
        "Which branch?",
    )
    assert q.returncode == 0, q.stdout + q.stderr
    assert _agap(stack, "show", str(asked))["state"] == "input_required"
    r = stack.run("keeper", "agap", "resume", str(asked), "--answer", "main")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _agap(stack, "show", str(asked))["state"] == "queued"

    # 7. a keeper restart: it stops within the bound on SIGTERM and comes back healthy
    assert stack.stop("keeper", timeout=15) == 0, stack.log("keeper")
    stack.start("keeper")
    stack.healthy("keeper", timeout=60)
    again = stack.run("keeper", "agap", "doctor", "--keeper", keeper_url)
    assert again.returncode == 0, again.stdout + again.stderr

    # 8. every daemon stops on SIGTERM, as `docker compose stop` asks: dependents first, each
    # within its grace period (10 s unless the service sets one), then a kill
    for name in reversed(list(stack.procs)):
        grace = float(str(services[name].get("stop_grace_period", "10s")).removesuffix("s"))
        assert stack.stop(name, timeout=grace) in (0, -signal.SIGTERM), f"{name}:\n{stack.log(name)}"
    # Langfuse's keys are empty in .env.example: the proxy sends no traces (with the
    # callbacks on, each export is retried and its stop waits ~9 s to flush them).
    assert "Langfuse export" not in (stack.tmp / "litellm.log").read_text(errors="replace")


def test_a_secret_left_empty_stops_compose_before_anything_runs(tmp_path: Path) -> None:
    text = (COMPOSE / "docker-compose.yml").read_text()
    with pytest.raises(Undefined, match="KANBOARD_API_TOKEN"):
        interpolate(text, dotenv(COMPOSE / ".env.example"))
    assert interpolate("${A:-x} ${B-y} $$HOME ${C}", {"B": ""}) == "x  $HOME "


def test_the_proxy_traces_to_langfuse_only_once_its_keys_are_set() -> None:
    """`.env.example` leaves Langfuse's keys empty: the proxy reads the config without the
    callbacks. Set, it reads the rendered config that has them."""
    argv = merged_stack()["services"]["litellm"]["command"]
    example = dotenv(COMPOSE / ".env.example")
    cases = (("", "config.yaml", None), ("pk-lf-1", "config.langfuse.yaml", ["langfuse"]))
    for key, name, callbacks in cases:
        config = [interpolate(a, {**example, "LANGFUSE_PUBLIC_KEY": key}) for a in argv][2]
        assert config == f"/etc/litellm/{name}"
        settings = yaml.safe_load((COMPOSE / "litellm" / name).read_text())["litellm_settings"]
        assert settings.get("success_callback") == callbacks and settings.get("failure_callback") == callbacks


def test_no_service_reads_a_setting_it_was_not_given() -> None:
    """Every AGAP_* variable a daemon reads (the settings registry says which component
    reads which) that has no safe default on a container is in that service's environment."""
    from fabric.settings import registry

    services = merged_stack()["services"]
    needs = {
        "worker": ("AGAP_HINDSIGHT_URL", "AGAP_LITELLM_URL", "AGAP_EVENTS_URL", "AGAP_PROJECT"),
        "a2a": ("AGAP_HINDSIGHT_URL",),
    }
    for component, names in needs.items():
        for name in names:
            assert registry.var(name), name
            targets = [n for n in services if n.startswith("worker-")] if component == "worker" else ["a2a"]
            for svc in targets:
                assert name in services[svc]["environment"], f"{svc} reads {name} but is not given it"
    assert os.sep == "/"
