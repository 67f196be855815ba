"""One registry of the environment variables the fabric reads, and one way to read them."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import CardSet
from fabric.errors import ConfigError
from fabric.settings import registry
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import KNOWN, Settings
from workers.job import Job, JobOutcome

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("fabric", "workers", "keeper")
ENV_NAME = re.compile(r"^(AGAP|KANBOARD|LITELLM|LANGFUSE|MATRIX)_[A-Z0-9_]+$")
REGISTRY_MODULE = "fabric/settings/registry.py"

# String literals that look like variable names but are not variables the code reads.
NOT_VARIABLES: dict[str, str] = {
    "AGAP_VAULT_": "a prefix: the sandbox renderer drops variables starting with it",
}

# os.environ outside the registry: (file, the line's code, why it is not a setting's read).
ENVIRON_ALLOWED: tuple[tuple[str, str, str], ...] = (
    (
        "fabric/settings/resolve.py",
        "env = dict(os.environ if environ is None else environ)",
        "the resolution order itself starts from the process environment",
    ),
    (
        "fabric/settings/resolve.py",
        "target = os.environ if environ is None else environ",
        "the resolution order writes the env files' settings into the process environment",
    ),
    (
        "fabric/apps/cli/up_cmd.py",
        "**os.environ,",
        "agap up passes its whole environment to the workers and keeper it starts",
    ),
    (
        "fabric/apps/workspace.py",
        "self.env = dict(os.environ if env is None else env)",
        "the environment git runs in (a child process), not a setting",
    ),
    (
        "workers/gitref.py",
        "env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}",
        "the few variables the git a ref is read with keeps (PATH, LANG, TMPDIR), not a setting",
    ),
    (
        "workers/llm_sdk.py",
        "os.environ.setdefault(",
        "sets a variable litellm reads at import; the value is the registry's default",
    ),
)


def _sources() -> list[tuple[str, ast.Module, list[str]]]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            out.append((path.relative_to(ROOT).as_posix(), ast.parse(text), text.splitlines()))
    return out


def _exported(tree: ast.Module) -> set[int]:
    """ids of the string nodes listed in ``__all__`` (names of Python objects)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            ids |= {id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
    return ids


def test_every_variable_name_in_the_code_is_registered() -> None:
    unregistered = []
    for rel, tree, _ in _sources():
        skip = _exported(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and ENV_NAME.match(node.value)
                and node.value not in NOT_VARIABLES
                and registry.find(node.value) is None
            ):
                unregistered.append(f"{rel}:{node.lineno}: {node.value}")
    assert not unregistered, "declare these in fabric/settings/registry.py REGISTRY:\n" + "\n".join(
        unregistered
    )


_OS_ENV = ("environ", "environb", "getenv", "putenv", "unsetenv")


def _touches_environment(node: ast.Attribute | ast.ImportFrom) -> bool:
    """``os.environ``, ``os.getenv(…)`` and friends, or ``from os import environ``."""
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr in _OS_ENV
    return node.module == "os" and any(a.name in _OS_ENV for a in node.names)


def _environ_uses(tree: ast.Module) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.ImportFrom) and _touches_environment(node)
    ]


def test_only_the_registry_reads_the_environment() -> None:
    stray, used = [], set()
    for rel, tree, lines in _sources():
        if rel == REGISTRY_MODULE:
            continue
        for lineno in _environ_uses(tree):
            code = lines[lineno - 1].strip()
            allowed = [a for a in ENVIRON_ALLOWED if a[0] == rel and code.startswith(a[1])]
            if allowed:
                used.add(allowed[0])
            else:
                stray.append(f"{rel}:{lineno}: {code}")
    assert not stray, (
        "read settings through fabric.settings.registry (or allow-list the "
        "line here, with a reason):\n" + "\n".join(stray)
    )
    assert used == set(ENVIRON_ALLOWED), f"stale allow-list entries: {set(ENVIRON_ALLOWED) - used}"


def test_the_registry_is_well_formed() -> None:
    names = [v.name for v in registry.REGISTRY]
    assert len(names) == len(set(names))
    for v in registry.REGISTRY:
        assert v.meaning and v.readers, v.name
        assert set(v.readers) <= set(registry.COMPONENTS), v.name
        assert not (v.default and v.note), f"{v.name}: a fixed default or a note, not both"
        if v.default:
            registry.get(v.name, {})  # every default parses as its own type
        assert "|" not in v.name


def test_config_show_lists_what_it_always_has() -> None:
    # `agap config show` without --all: this list, in this order, unchanged.
    assert [(k.name, k.default) for k in KNOWN] == [
        ("KANBOARD_URL", ""),
        ("KANBOARD_API_TOKEN", ""),
        ("AGAP_CARDS_DIR", "cards"),
        ("AGAP_STATE_DIR", "var"),
        ("AGAP_PROJECT", "Agent Fabric"),
        ("AGAP_LOCKS_PROJECT", "Agent Fabric Locks"),
        ("AGAP_ACTOR", "cli"),
        ("AGAP_MODEL_MODE", ""),
        ("AGAP_LITELLM_URL", "http://127.0.0.1:4000"),
        ("LITELLM_MASTER_KEY", ""),
        ("AGAP_LITELLM_KEY", ""),
        ("AGAP_RESULT_STORE", "attachment"),
        ("AGAP_RESULT_DIR", ""),
        ("AGAP_REF_ROOTS", "."),
        ("AGAP_POLL_SECONDS", ""),
        ("AGAP_OUTAGE_GRACE", ""),
        ("AGAP_BOARD_PORT", "8765"),
        ("AGAP_BOARD_TOKEN", ""),
        ("AGAP_EVENTS_URL", ""),
        ("AGAP_EVENTS_SECRET", ""),
        ("AGAP_KEEPER_METRICS_PORT", "0"),
        ("AGAP_KEEPER_METRICS_TOKEN", ""),
        ("AGAP_A2A_TOKENS", ""),
        ("AGAP_A2A_TOKENS_FILE", ""),
        ("AGAP_ENV_FILE", ""),
    ]


# -- reading -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2", 2.0),
        ("2s", 2.0),
        ("1.5", 1.5),
        ("90", 90.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        (" 4H ", 14400.0),
        ("5 m", 300.0),
    ],
)
def test_one_duration_grammar_with_bare_seconds(text: str, seconds: float) -> None:
    assert registry.parse_duration(text) == seconds
    assert registry.get_duration("AGAP_POLL_SECONDS", {"AGAP_POLL_SECONDS": text}) == seconds
    assert KeeperConfig.from_env({"AGAP_KEEPER_LEASES_EVERY": text}).interval("leases") == seconds


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("AGAP_POLL_SECONDS", "2x", "30s, 5m, 1h, 2d"),
        ("AGAP_KEEPER_RETENTION", "-5d", "30s, 5m, 1h, 2d"),
        ("AGAP_BOARD_PORT", "80a", "a whole number"),
        ("AGAP_KEEPER_METRICS_PORT", "-1", "a whole number"),
        ("AGAP_EVENTS_TLS", "maybe", "1, true, yes or on"),
        ("KANBOARD_URL", "kanboard.lan/jsonrpc.php", "scheme://host"),
        ("KANBOARD_URL", "http://[::1/jsonrpc.php", "scheme://host"),
    ],
)
def test_a_bad_value_is_one_line_naming_variable_value_and_grammar(
    name: str, text: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        registry.get(name, {name: text})
    line = err.value.line()
    assert "\n" not in line and line.startswith(f"{name}: ")
    assert repr(text) in line and expected in line
    assert err.value.exit_code == 2


def test_a_password_in_a_bad_url_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        registry.get_str("AGAP_EVENTS_URL", {"AGAP_EVENTS_URL": "mqtt:agap:hunter2@broker"})
    assert "hunter2" not in err.value.line()


def test_unset_empty_defaults_and_fallbacks() -> None:
    assert registry.get("AGAP_POLL_SECONDS", {}) is None
    assert registry.get_duration("AGAP_POLL_SECONDS", {}, fallback=None) is None
    assert registry.get_duration("AGAP_OUTAGE_GRACE", {"AGAP_OUTAGE_GRACE": ""}, fallback=7.0) == 7.0
    with pytest.raises(ConfigError, match="AGAP_POLL_SECONDS is not set"):
        registry.get_duration("AGAP_POLL_SECONDS", {})
    assert registry.get_str("AGAP_ACTOR", {"AGAP_ACTOR": ""}) == "cli"  # empty is unset
    assert registry.get_int("AGAP_BOARD_PORT", {}) == 8765
    assert registry.get_bool("AGAP_EVENTS_JETSTREAM", {}) is True
    assert registry.get_bool("AGAP_EVENTS_JETSTREAM", {"AGAP_EVENTS_JETSTREAM": "off"}) is False
    assert registry.get_list("AGAP_KEEPER_NOTIFY_ALLOW", {"AGAP_KEEPER_NOTIFY_ALLOW": " a, ,b "}) == (
        "a",
        "b",
    )
    # Where an empty value means something, it is not the default.
    assert registry.get_list("AGAP_REF_ROOTS", {}) == (".",)
    assert registry.get_list("AGAP_REF_ROOTS", {"AGAP_REF_ROOTS": ""}) == ()
    assert registry.get_str("AGAP_MODEL_MODE", {"AGAP_MODEL_MODE": ""}, fallback="demo") == ""
    assert registry.get_str("AGAP_MODEL_MODE", {}, fallback="demo") == "demo"
    with pytest.raises(KeyError):
        registry.get("AGAP_NO_SUCH_THING", {})
    with pytest.raises(TypeError):
        registry.get_int("AGAP_PROJECT", {})


def _never(job: Job) -> JobOutcome:
    raise AssertionError("the worker is built, never run")


def test_the_worker_reads_poll_and_grace_as_durations(cards: CardSet) -> None:
    from workers.assembly import build_worker

    settings = Settings(cards_dir=ROOT / "cards", board_url="http://127.0.0.1:9/jsonrpc.php", board_token="x")
    env = {"AGAP_POLL_SECONDS": "2s", "AGAP_OUTAGE_GRACE": "1m", "AGAP_MODEL_MODE": "demo"}
    worker = build_worker("kimi", settings, cards, env=env, executor=_never)
    assert (worker.config.poll_seconds, worker.config.outage_grace) == (2.0, 60.0)
    # Before the registry, float("2s") was a traceback here.
    with pytest.raises(ConfigError, match="AGAP_POLL_SECONDS: cannot read '2x' as a duration"):
        build_worker("kimi", settings, cards, env={**env, "AGAP_POLL_SECONDS": "2x"}, executor=_never)


def test_keeper_defaults_are_the_registry_defaults() -> None:
    assert KeeperConfig.from_env({}) == KeeperConfig()
    assert KeeperConfig().interval("gc") == 86400.0 and KeeperConfig().backoff_cap == 300.0


def test_the_gateway_default_is_the_registered_one() -> None:
    from workers.llm import DEFAULT_GATEWAY_URL

    assert registry.var("AGAP_LITELLM_URL").default == DEFAULT_GATEWAY_URL


# -- agap config show --all [--markdown] ----------------------------------------------


def test_config_show_all_lists_every_variable_with_its_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no .agap.env above
    blank: dict[str, str | None] = {v.name: None for v in registry.REGISTRY}
    result = CliRunner().invoke(
        main,
        ["config", "show", "--all", "--json"],
        env={**blank, "AGAP_EVENTS_SECRET": "a-long-events-secret", "AGAP_KEEPER_GC_EVERY": "12h"},
    )
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert list(rows) == [v.name for v in registry.REGISTRY]
    assert rows["AGAP_EVENTS_SECRET"]["value"] == "**** (20 chars)"
    assert "a-long-events-secret" not in result.output
    assert rows["AGAP_KEEPER_GC_EVERY"] | {"meaning": ""} == {
        "name": "AGAP_KEEPER_GC_EVERY",
        "value": "12h",
        "source": "environment",
        "meaning": "",
        "component": "keeper",
        "type": "duration",
    }
    assert rows["AGAP_WORKER_ID"]["source"] == "unset"
    assert rows["AGAP_SCHEDULES"]["source"] == "default"


def _readme_table() -> str:
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    start, end = text.find(registry.MARKDOWN_BEGIN), text.find(registry.MARKDOWN_END)
    assert 0 <= start < end, "docs/CONFIGURATION.md has lost the generated configuration table's markers"
    return text[start : end + len(registry.MARKDOWN_END)] + "\n"


def test_the_readme_table_is_the_generated_one() -> None:
    result = CliRunner().invoke(main, ["config", "show", "--all", "--markdown"])
    assert result.exit_code == 0, result.output
    assert result.output == registry.markdown()
    assert _readme_table() == result.output, (
        "docs/CONFIGURATION.md's configuration table is stale: paste the output of "
        "`agap config show --all --markdown` over it"
    )


def test_markdown_needs_all() -> None:
    result = CliRunner().invoke(main, ["config", "show", "--markdown"])
    assert result.exit_code == 2 and "--all" in result.output
