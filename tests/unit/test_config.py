"""One resolution order for settings: environment, then AGAP_ENV_FILE, else .agap.env, else
~/.config/agap/env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.errors import ConfigError
from fabric.settings import resolve as resolve_module
from fabric.settings.events import EventsConfig
from fabric.settings.resolve import apply_config_files, resolve, warn_if_plaintext

ROOT = Path(__file__).resolve().parents[2]


def test_environment_beats_the_env_file_and_a_named_file_is_the_only_file(tmp_path: Path) -> None:
    project = tmp_path / "repo"
    deep = project / "a" / "b"
    deep.mkdir(parents=True)
    (project / ".agap.env").write_text(
        "AGAP_ACTOR=from-project\nAGAP_PROJECT=P\nKANBOARD_URL=http://127.0.0.1:1/jsonrpc.php\n"
    )
    named = tmp_path / "prod.env"
    named.write_text("# comment\nexport AGAP_ACTOR='from-file'\nAGAP_STATE_DIR=\"/srv/agap\"\n")
    env = {"AGAP_ENV_FILE": str(named), "AGAP_STATE_DIR": "/from/env"}
    r = resolve(env, cwd=deep)
    assert r.values["AGAP_STATE_DIR"] == "/from/env" and r.sources["AGAP_STATE_DIR"] == "environment"
    assert r.values["AGAP_ACTOR"] == "from-file" and r.sources["AGAP_ACTOR"] == str(named)
    # the project file is not read at all: nothing of it fills in what the named file lacks
    assert "AGAP_PROJECT" not in r.values and "KANBOARD_URL" not in r.values
    assert set(r.sources.values()) == {"environment", str(named)}
    target = dict(env)
    apply_config_files(target, cwd=deep)
    assert target["AGAP_ACTOR"] == "from-file" and target["AGAP_STATE_DIR"] == "/from/env"
    assert "AGAP_PROJECT" not in target


def test_without_a_named_file_the_project_file_is_found_walking_up(tmp_path: Path) -> None:
    project = tmp_path / "repo"
    deep = project / "a" / "b"
    deep.mkdir(parents=True)
    (project / ".agap.env").write_text("AGAP_ACTOR=from-project\nAGAP_PROJECT=P\n")
    r = resolve({"AGAP_ACTOR": "from-env", "AGAP_ENV_FILE": ""}, cwd=deep)
    assert r.values["AGAP_ACTOR"] == "from-env"
    assert r.values["AGAP_PROJECT"] == "P" and r.sources["AGAP_PROJECT"] == str(project / ".agap.env")


def test_a_named_env_file_that_is_missing_fails_closed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as err:
        resolve({"AGAP_ENV_FILE": str(tmp_path / "nope.env")}, cwd=tmp_path)
    assert "nope.env" in err.value.line()


def test_a_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("GOOD=1\nthis is not a setting\n")
    with pytest.raises(ConfigError) as err:
        resolve({"AGAP_ENV_FILE": str(bad)}, cwd=tmp_path)
    assert f"{bad}:2" in err.value.line()


def test_config_show_masks_secrets_and_names_sources(tmp_path: Path) -> None:
    (tmp_path / ".agap.env").write_text("KANBOARD_API_TOKEN=supersecret-token-value\n")
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as fs:
        (Path(fs) / ".agap.env").write_text("KANBOARD_API_TOKEN=supersecret-token-value\nAGAP_ACTOR=alvis\n")
        result = runner.invoke(
            main,
            ["config", "show", "--json"],
            env={
                "KANBOARD_URL": "http://127.0.0.1:9/jsonrpc.php",
                "KANBOARD_API_TOKEN": None,
                "AGAP_ACTOR": None,
                "AGAP_ENV_FILE": None,
            },
        )
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert "supersecret" not in result.output
    assert rows["KANBOARD_API_TOKEN"]["value"] == "**** (23 chars)"
    assert rows["KANBOARD_API_TOKEN"]["source"].endswith(".agap.env")
    assert rows["AGAP_ACTOR"]["value"] == "alvis"
    assert rows["KANBOARD_URL"]["source"] == "environment"
    # `agap up`'s own port is not the board this shell talks to: listed only when set.
    assert "AGAP_BOARD_PORT" not in rows


def test_config_show_lists_agap_ups_port_when_it_is_set() -> None:
    env = {"AGAP_BOARD_PORT": "8801"}
    shown = CliRunner().invoke(main, ["config", "show", "--json"], env=env)
    rows = {r["name"]: r for r in json.loads(shown.output)}
    assert rows["AGAP_BOARD_PORT"] == {**rows["AGAP_BOARD_PORT"], "value": "8801", "source": "environment"}
    every = CliRunner().invoke(main, ["config", "show", "--all", "--json"])
    assert {r["name"]: r for r in json.loads(every.output)}["AGAP_BOARD_PORT"]["source"] == "default"


def test_the_users_file_is_read_when_no_other_applies(tmp_path: Path) -> None:
    """A bare environment and a foreign working directory (how OpenClaw starts a stdio MCP
    server) still find the settings: ~/.config/agap/env, or $XDG_CONFIG_HOME/agap/env."""
    home, elsewhere = tmp_path / "home", tmp_path / "workspace"
    elsewhere.mkdir()
    (home / ".config" / "agap").mkdir(parents=True)
    (home / ".config" / "agap" / "env").write_text("AGAP_ACTOR=from-home\nAGAP_PROJECT=H\n")
    r = resolve({"HOME": str(home), "AGAP_PROJECT": "from-env"}, cwd=elsewhere)
    assert r.values["AGAP_ACTOR"] == "from-home"
    assert r.sources["AGAP_ACTOR"] == str(home / ".config" / "agap" / "env")
    assert r.values["AGAP_PROJECT"] == "from-env"  # the environment still wins
    xdg = tmp_path / "xdg"
    (xdg / "agap").mkdir(parents=True)
    (xdg / "agap" / "env").write_text("AGAP_ACTOR=from-xdg\n")
    assert resolve({"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)}, cwd=elsewhere).values["AGAP_ACTOR"] == (
        "from-xdg"
    )
    # A project file found walking up is the only file: the user's fills in nothing beside it.
    (elsewhere / ".agap.env").write_text("AGAP_STATE_DIR=/p\n")
    r = resolve({"HOME": str(home)}, cwd=elsewhere)
    assert r.values["AGAP_STATE_DIR"] == "/p" and "AGAP_ACTOR" not in r.values
    # No HOME, no XDG_CONFIG_HOME: no user file (and no error).
    assert "AGAP_ACTOR" not in resolve({}, cwd=tmp_path).values


def test_env_file_option_names_the_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp_path / "fabric.env"
    named.write_text("AGAP_ACTOR=from-option\n")
    # The option beats AGAP_ENV_FILE; both are restored after (the CLI writes os.environ).
    monkeypatch.setenv("AGAP_ENV_FILE", str(tmp_path / "other.env"))
    monkeypatch.delenv("AGAP_ACTOR", raising=False)
    env: dict[str, str] = {}
    result = CliRunner().invoke(main, ["--env-file", str(named), "config", "show", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["AGAP_ACTOR"]["value"] == "from-option" and rows["AGAP_ACTOR"]["source"] == str(named)
    monkeypatch.delenv("AGAP_ACTOR")
    gone = CliRunner().invoke(main, ["--env-file", str(tmp_path / "gone.env"), "config", "show"], env=env)
    assert gone.exit_code == 2 and "AGAP_ENV_FILE names a file that does not exist" in gone.output


def test_the_cli_fails_closed_on_a_missing_env_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["config", "show"], env={"AGAP_ENV_FILE": str(tmp_path / "gone.env")})
    assert result.exit_code == 2
    assert "AGAP_ENV_FILE names a file that does not exist" in result.output


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing warned yet (a process warns once per target)."""
    monkeypatch.setattr(resolve_module, "_warned_at", set())


def test_plaintext_to_a_remote_host_warns_once_loopback_does_not(
    capsys: pytest.CaptureFixture[str], fresh_warnings: None
) -> None:
    assert not warn_if_plaintext("http://127.0.0.1:8765/jsonrpc.php", "the board")
    assert not warn_if_plaintext("http://localhost:8765/jsonrpc.php", "the board")
    assert not warn_if_plaintext("https://kanboard.lan/jsonrpc.php", "the board")
    assert not warn_if_plaintext("mqtts://broker.lan:8883", "the broker")
    assert not warn_if_plaintext("mqtt://broker.lan:1883", "the broker", tls=True)  # AGAP_EVENTS_TLS
    assert warn_if_plaintext("http://kanboard.lan/jsonrpc.php", "the board")
    assert not warn_if_plaintext("http://kanboard.lan/other.php", "the board")  # once per target
    assert warn_if_plaintext("mqtt://user:pw@10.0.0.5:1883", "the events broker")
    assert warn_if_plaintext("nats://10.0.0.6", "the events broker")
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "agap: warning: the board at http://kanboard.lan is reached without TLS, so tokens and"
        " tasks cross the network in clear text; use an https:// URL",
        "agap: warning: the events broker at mqtt://10.0.0.5:1883 is reached without TLS, so tokens"
        " and tasks cross the network in clear text; use mqtts:// (or set AGAP_EVENTS_TLS=1)",
        "agap: warning: the events broker at nats://10.0.0.6 is reached without TLS, so tokens and"
        " tasks cross the network in clear text; use tls:// (or set AGAP_EVENTS_TLS=1)",
    ]  # one line each: what, where, what to do; never the credentials


def test_the_commands_that_connect_warn_before_connecting(
    capsys: pytest.CaptureFixture[str], fresh_warnings: None
) -> None:
    """The broker and the proxy warn where they are opened; nothing here connects.

    192.0.2.0/24 is TEST-NET-1: no connection to it is attempted (a transport connects
    on first use, a model client on its first call). The board's check, in
    ``Settings.require_board``, is exercised through real commands in
    tests/integration/test_plaintext_warnings.py.
    """
    from fabric.events.brokers import open_transport  # heavy (nats, paho): only this test
    from workers.answer import client_for  # the one model-call path (a2a, workers, eval)

    cfg = EventsConfig.from_env({"AGAP_EVENTS_URL": "mqtt://192.0.2.10:1883", "AGAP_EVENTS_SECRET": "s" * 16})
    assert cfg is not None
    open_transport(cfg).close()
    tls = EventsConfig.from_env(
        {"AGAP_EVENTS_URL": "nats://192.0.2.11", "AGAP_EVENTS_SECRET": "s" * 16, "AGAP_EVENTS_TLS": "1"}
    )
    assert tls is not None
    open_transport(tls).close()  # TLS by AGAP_EVENTS_TLS: no warning
    card = load_cards(ROOT / "cards").get("kimi")
    env = {
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": "http://192.0.2.12:4000",
        "AGAP_LITELLM_KEY": "k",
    }
    client_for(card, env)
    err = capsys.readouterr().err
    assert err.count("agap: warning:") == 2, err
    assert "the events broker at mqtt://192.0.2.10:1883" in err and "192.0.2.11" not in err
    assert "the LiteLLM proxy at http://192.0.2.12:4000" in err and "use an https:// URL" in err


def test_config_show_takes_agap_events_tls_into_account(fresh_warnings: None) -> None:
    env = {"AGAP_EVENTS_URL": "mqtt://192.0.2.20:1883", "AGAP_ENV_FILE": None}
    with_tls = CliRunner().invoke(main, ["config", "show"], env={**env, "AGAP_EVENTS_TLS": "1"})
    assert with_tls.exit_code == 0 and "warning" not in with_tls.stderr
    plain = CliRunner().invoke(main, ["config", "show"], env={**env, "AGAP_EVENTS_TLS": "0"})
    assert plain.exit_code == 0 and "events broker at mqtt://192.0.2.20:1883" in plain.stderr
