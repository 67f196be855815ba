"""The compose stack, rendered from the example cards and validated without Docker:
structure, healthchecks and restart policies, real `agap` commands, the private network,
every variable documented, no secret in the repository."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from fabric.apps.cli import main
from fabric.apps.deploy.render import (
    ENV_BEGIN,
    LITELLM_FILE,
    LITELLM_TRACED_FILE,
    WORKERS_FILE,
    render,
    rendered,
    stale,
    worker_cards,
)
from fabric.cards import load_cards
from tests.conftest import ROOT

COMPOSE = ROOT / "compose"
FABRIC_IMAGE = "${AGAP_IMAGE:-agap-fabric:local}"


def _register_all_commands() -> None:
    for path in sorted((ROOT / "fabric" / "apps" / "cli").glob("*_cmd.py")):
        try:
            importlib.import_module(f"fabric.apps.cli.{path.stem}")
        except ImportError:
            continue


def merged_stack(compose_dir: Path = COMPOSE) -> dict[str, Any]:
    """docker-compose.yml with docker-compose.workers.yml merged in (mappings merge)."""
    base = yaml.safe_load((compose_dir / "docker-compose.yml").read_text())
    extra = yaml.safe_load((compose_dir / WORKERS_FILE).read_text())

    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            return {**a, **{k: merge(a.get(k), v) if k in a else v for k, v in b.items()}}
        return b

    out: dict[str, Any] = merge(base, extra)
    return out


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return merged_stack()


def resolve(argv: list[str]) -> click.Command:
    """The click command ``argv`` (``agap …``) names; its options are parsed for real."""
    assert argv[0] == "agap", argv
    _register_all_commands()
    cmd: click.Command = main
    ctx = click.Context(main, info_name="agap")
    rest = argv[1:]
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(ctx, rest[0])
        if sub is None:
            raise LookupError(rest[0])
        cmd, rest = sub, rest[1:]
        ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
    cmd.make_context(cmd.name, list(rest), parent=ctx.parent)  # raises on a bad option
    return cmd


def test_the_generated_files_match_the_cards() -> None:
    assert stale(load_cards(ROOT / "cards", base_dir=ROOT), COMPOSE) == [], (
        "run `agap compose render` and commit the result"
    )


def test_every_service_has_a_healthcheck_and_a_restart_policy(stack: dict[str, Any]) -> None:
    for name, svc in stack["services"].items():
        if name == "init":  # the one one-shot: it runs to completion, and the rest wait for it
            assert svc["restart"] == "no" and svc["command"] == ["agap", "init"]
            continue
        assert svc.get("restart") in ("unless-stopped", "always"), name
        test = svc.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), name


def test_every_fabric_service_runs_a_real_agap_command(stack: dict[str, Any]) -> None:
    fabric = {n: s for n, s in stack["services"].items() if s.get("image") == FABRIC_IMAGE}
    assert {"keeper", "a2a", "litellm"} <= set(fabric)
    for name, svc in fabric.items():
        argv = svc["command"]
        if name == "litellm":  # the one non-agap process in the fabric image: the proxy
            config = "/etc/litellm/config${LANGFUSE_PUBLIC_KEY:+.langfuse}.yaml"
            assert argv[:3] == ["litellm", "--config", config]
            continue
        assert argv[0] == "agap", name
        try:
            resolve(argv)
        except LookupError as exc:
            raise AssertionError(f"{name}: `agap {exc}` is not a command") from None
    assert stack["services"]["a2a"]["command"] == [
        "agap",
        "a2a",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8700",
    ]
    assert stack["services"]["keeper"]["command"][:2] == ["agap", "keeper"]


def test_the_first_start_needs_no_step_by_hand(stack: dict[str, Any]) -> None:
    """Kanboard takes the operator's API token from the environment, `init` makes the
    layout and users once it is healthy, and every fabric daemon waits for `init`."""
    services = stack["services"]
    assert services["kanboard"]["environment"]["API_AUTHENTICATION_TOKEN"].startswith(
        "${KANBOARD_API_TOKEN:?"
    )
    assert services["init"]["depends_on"] == {"kanboard": {"condition": "service_healthy"}}
    daemons = [
        n for n, s in services.items() if s.get("image") == FABRIC_IMAGE and n not in ("init", "litellm")
    ]
    assert {"keeper", "a2a", "worker-kimi", "keeper-torgash"} <= set(daemons)
    for name in daemons:
        assert services[name]["depends_on"]["init"] == {"condition": "service_completed_successfully"}, name
    # the passwords go to `init` alone; a confined worker gets its own and no token
    init_env = services["init"]["environment"]
    assert {"AGAP_PASSWORD_ALVIS", "AGAP_BOARD_PASSWORD_TORGASH", "AGAP_BOARD_PASSWORD_RESEARCHER"} <= set(
        init_env
    )
    assert not any(
        k.startswith(("AGAP_PASSWORD_", "AGAP_BOARD_PASSWORD_")) for k in services["keeper"]["environment"]
    )
    torgash = services["worker-torgash"]["environment"]
    assert "KANBOARD_API_TOKEN" not in torgash and torgash["AGAP_BOARD_PASSWORD"].startswith(
        "${AGAP_BOARD_PASSWORD_TORGASH:?"
    )


def test_an_image_nobody_can_pull_or_build_is_behind_a_profile(stack: dict[str, Any]) -> None:
    for name, svc in stack["services"].items():
        image = svc.get("image", "")
        local = image.endswith(":local") or image.endswith(":local}")
        if local and "build" not in svc:
            assert svc.get("profiles"), f"{name}: {image} has no build and no profile"
    assert stack["services"]["runtime-claude-coder"]["profiles"] == ["claude-coder"]


def test_the_command_check_catches_a_typo() -> None:
    with pytest.raises(LookupError):
        resolve(["agap", "wroker", "--agent", "kimi"])
    with pytest.raises(click.UsageError):
        resolve(["agap", "worker", "--agnet", "kimi"])


def test_one_worker_per_queue_from_the_cards(stack: dict[str, Any]) -> None:
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    workers = {n for n in stack["services"] if n.startswith("worker-")}
    assert workers == {f"worker-{c.queue_name}" for c in worker_cards(cards)}
    assert "worker-alvis" not in workers and "worker-claude-coder" not in workers
    for card in worker_cards(cards):
        svc = stack["services"][f"worker-{card.queue_name}"]
        assert svc["command"] == ["agap", "worker", "--agent", card.id]
        assert svc["environment"]["AGAP_LITELLM_URL"] == "http://litellm:4000"
    assert stack["services"]["worker-gemma-local"]["profiles"] == ["gpu"]


def test_only_the_a2a_gateway_and_kanboards_ui_are_published(stack: dict[str, Any]) -> None:
    published = {n for n, s in stack["services"].items() if s.get("ports")}
    assert published == {"kanboard", "a2a"}
    for name in published:
        for port in stack["services"][name]["ports"]:
            assert port.startswith("${AGAP_PUBLISH_ADDR:-127.0.0.1}:"), (name, port)
    assert stack["networks"]["fabric"]["internal"] is True
    for name in ("kanboard-db", "mosquitto"):
        assert stack["services"][name]["networks"] == ["fabric"], name
    for name, svc in stack["services"].items():
        sandbox = [n for n in svc["networks"] if n.startswith("sandbox-")]
        if name.startswith("egress-"):
            # The door: on the sandbox network and on the networks of the allowed hosts.
            assert sandbox and "fabric" in svc["networks"] and not svc.get("ports"), name
            continue
        if sandbox:
            # A sandboxed agent sits only on its internal network: its one way out is its
            # egress proxy, which allows exactly the hosts in cards/_sandbox.yaml.
            assert svc["networks"] == sandbox and stack["networks"][sandbox[0]]["internal"]
            assert svc["environment"]["HTTP_PROXY"].startswith("http://egress-")
            assert svc["cap_drop"] == ["ALL"] and svc["read_only"] is True, name
            assert not any(k.startswith(("VAULT_", "BAO_")) for k in svc["environment"])
            continue
        assert "fabric" in svc["networks"], name
        if name.startswith("langfuse"):
            assert svc["networks"] == ["fabric"] and svc["profiles"] == ["langfuse"]


def test_kanboard_runs_the_official_image_on_postgres_with_persistent_volumes(stack: dict[str, Any]) -> None:
    kb = stack["services"]["kanboard"]
    assert kb["image"].startswith("kanboard/kanboard:")
    assert kb["environment"]["DATABASE_URL"].startswith("postgres://kanboard:${KANBOARD_DB_PASSWORD")
    assert "kanboard-data:/var/www/app/data" in kb["volumes"]
    assert kb["depends_on"]["kanboard-db"]["condition"] == "service_healthy"
    db = stack["services"]["kanboard-db"]
    assert db["image"].startswith("postgres:") and "kanboard-db:/var/lib/postgresql/data" in db["volumes"]
    assert {"kanboard-db", "kanboard-data"} <= set(stack["volumes"])


def test_the_proxy_config_is_generated_from_the_cards_with_langfuse_wired(stack: dict[str, Any]) -> None:
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    config = yaml.safe_load((COMPOSE / LITELLM_FILE).read_text())
    names = {m["model_name"] for m in config["model_list"]}
    assert names == {c.runtime.model for c in worker_cards(cards) if c.runtime.model}
    for entry in config["model_list"]:
        params = entry["litellm_params"]
        assert params["api_key"].startswith("os.environ/")
        assert params["api_base"].startswith("os.environ/")
    assert config["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert "success_callback" not in config["litellm_settings"]
    traced = yaml.safe_load((COMPOSE / LITELLM_TRACED_FILE).read_text())
    assert traced["litellm_settings"].pop("success_callback") == ["langfuse"]
    assert traced["litellm_settings"].pop("failure_callback") == ["langfuse"]
    assert traced == config  # the same proxy, with traces
    env = stack["services"]["litellm"]["environment"]
    assert {"LANGFUSE_HOST", "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"} <= set(env)
    assert "./litellm:/etc/litellm:ro" in stack["services"]["litellm"]["volumes"]
    for entry in config["model_list"]:  # every provider variable reaches the proxy
        for value in entry["litellm_params"].values():
            if value.startswith("os.environ/"):
                assert value.removeprefix("os.environ/") in env


def _documented() -> set[str]:
    text = (COMPOSE / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, re.M))


def test_every_variable_the_stack_reads_is_documented_in_env_example() -> None:
    referenced: set[str] = set()
    for path in (COMPOSE / "docker-compose.yml", COMPOSE / WORKERS_FILE):
        referenced |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", path.read_text()))
    referenced |= set(re.findall(r"os\.environ/([A-Z][A-Z0-9_]*)", (COMPOSE / LITELLM_FILE).read_text()))
    missing = sorted(referenced - _documented())
    assert not missing, f"add to compose/.env.example: {missing}"
    assert {"COMPOSE_FILE", "KANBOARD_API_TOKEN", "LITELLM_MASTER_KEY"} <= _documented()


def test_env_example_holds_no_value_for_any_secret() -> None:
    for line in (COMPOSE / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m and re.search(r"PASSWORD|TOKEN|SECRET|_KEY$|_KEY_|SALT", m.group(1)):
            assert m.group(2) == "", f"{m.group(1)} must be empty in the example"


# -- no secret in the repository ---------------------------------------------------------

SECRET_PATTERNS = {
    "API key (sk-…)": re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}"),
    "GitHub token": re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "GitLab token": re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    "AWS access key id": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "Langfuse key": re.compile(r"\b[sp]k-lf-[A-Za-z0-9-]{16,}"),
    "secret assigned a value": re.compile(
        r"(?i)\b[A-Z0-9_]*(?:PASSWORD|TOKEN|SECRET|API_KEY|MASTER_KEY)[A-Z0-9_]*[ \t]*[=:][ \t]*"
        r"[\"']?([A-Za-z0-9+/_\-]{24,})"
    ),
}
# The tests' own throwaway values (fixtures, stand-ins, refusal examples) say what they are.
TEST_THROWAWAY = re.compile(r"(?i)0123|abcd|stub|test|fake|dummy|token|example|4f9a8b7c")


def repo_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def find_secrets(files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary or unreadable: not text
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        for what, rx in SECRET_PATTERNS.items():
            for m in rx.finditer(text):
                if rel.startswith("tests/") and TEST_THROWAWAY.search(m.group(0)):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{rel}:{line}: {what}")
    return hits


def test_no_secret_in_the_repository() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert find_secrets(repo_text_files()) == []


def test_the_secret_scan_finds_real_looking_secrets(tmp_path: Path) -> None:
    leaked = tmp_path / "leak.env"
    key = "sk-" + "Zq7Rw2Lp9Xv4Nt6Ks1Hd8Jm3"
    token = "a9F3kQ7wZ2mX8pL4" + "vR6tY1bN5cH0jD"  # split: the repository scan must not see it
    leaked.write_text(f"LITELLM_MASTER_KEY={key}\nKANBOARD_API_TOKEN={token}\n")
    hits = find_secrets([leaked])
    assert any("API key" in h for h in hits) and sum("assigned" in h for h in hits) == 2


# -- rendering -----------------------------------------------------------------------------


def test_adding_a_card_adds_a_worker_and_a_model_by_rendering(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "cards", tmp_path / "cards")
    shutil.copytree(ROOT / "souls", tmp_path / "souls")
    shutil.copytree(COMPOSE, tmp_path / "compose", ignore=shutil.ignore_patterns("zabbix"))
    (tmp_path / "cards" / "mistral.yaml").write_text(
        "id: mistral\nkind: model\nname: Mistral\ntier: medium\ntrust: trusted\n"
        "runtime: {mode: gateway, model: openai/mistral-small}\n"
    )
    cards = load_cards(tmp_path / "cards", base_dir=tmp_path)
    out = tmp_path / "compose"
    assert sorted(p.name for p in stale(cards, out)) == [
        ".env.example",
        "config.langfuse.yaml",
        "config.yaml",
        WORKERS_FILE,
    ]
    render(cards, out)
    assert stale(cards, out) == []
    stack = merged_stack(out)
    assert stack["services"]["worker-mistral"]["command"] == ["agap", "worker", "--agent", "mistral"]
    env = (out / ".env.example").read_text()
    assert env.count(ENV_BEGIN) == 1 and "MISTRAL_API_KEY=" in env
    assert "MISTRAL_API_BASE" in stack["services"]["litellm"]["environment"]
    assert set(rendered(cards, out)) == {
        out / WORKERS_FILE,
        out / LITELLM_FILE,
        out / LITELLM_TRACED_FILE,
        out / ".env.example",
        out / "egress" / "claude-coder.conf",
    }


def test_agap_compose_render_check_fails_on_drift(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import fabric.apps.cli.compose_cmd  # noqa: F401

    shutil.copytree(COMPOSE, tmp_path / "compose", ignore=shutil.ignore_patterns("zabbix"))
    args = ["compose", "render", "--out", str(tmp_path / "compose"), "--cards", str(ROOT / "cards")]
    res = CliRunner().invoke(main, [*args, "--check"])
    assert res.exit_code == 0, res.output
    (tmp_path / "compose" / WORKERS_FILE).write_text("services: {}\n")
    res = CliRunner().invoke(main, [*args, "--check"])
    assert res.exit_code == 1 and "differs from the cards" in res.output
    assert CliRunner().invoke(main, args).exit_code == 0
    assert CliRunner().invoke(main, [*args, "--check"]).exit_code == 0


def _docker_compose_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        first = (probe.stderr or probe.stdout).strip().splitlines()[:1]
        return f"`docker compose` is not available ({first[0][:100] if first else probe.returncode})"
    return None


def test_docker_compose_config_accepts_the_stack(tmp_path: Path) -> None:
    reason = _docker_compose_reason()
    if reason:
        print(f"skipping docker compose config: {reason}")
        pytest.skip(reason)
    env_file = tmp_path / ".env"
    lines = []
    for line in (COMPOSE / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m and not m.group(2):
            lines.append(f"{m.group(1)}=placeholder-for-config-check")
        else:
            lines.append(line)
    env_file.write_text("\n".join(lines) + "\n")
    res = subprocess.run(
        [
            "docker",
            "compose",
            "--env-file",
            str(env_file),
            "-f",
            "docker-compose.yml",
            "-f",
            WORKERS_FILE,
            "--profile",
            "langfuse",
            "--profile",
            "gpu",
            "config",
            "-q",
        ],
        cwd=COMPOSE,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


def test_a_sandbox_egress_proxy_allows_exactly_the_listed_hosts() -> None:
    from fabric.apps.deploy.render import egress_config

    conf = egress_config(["gitea.home.arpa:443", "kanboard:80", "pypi-mirror.lan"])
    assert "acl allow1_host dstdomain gitea.home.arpa" in conf
    assert "http_access allow allow1_host allow1_port" in conf and "acl allow1_port port 443" in conf
    assert "http_access allow allow3_host\n" in conf  # no port: any port on that host
    assert conf.rstrip().splitlines()[-3] == "http_access deny all"
