"""One resolution order for settings: environment, then AGAP_ENV_FILE, then .agap.env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.errors import ConfigError
from fabric.settings.resolve import apply_config_files, resolve, warn_if_plaintext


def test_environment_beats_the_env_file_beats_the_project_file(tmp_path: Path) -> None:
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
    assert r.values["AGAP_PROJECT"] == "P" and r.sources["AGAP_PROJECT"] == str(project / ".agap.env")
    target = dict(env)
    apply_config_files(target, cwd=deep)
    assert target["AGAP_ACTOR"] == "from-file" and target["AGAP_STATE_DIR"] == "/from/env"


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


def test_the_cli_fails_closed_on_a_missing_env_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["config", "show"], env={"AGAP_ENV_FILE": str(tmp_path / "gone.env")})
    assert result.exit_code == 2
    assert "AGAP_ENV_FILE names a file that does not exist" in result.output


def test_plaintext_to_a_remote_host_warns_loopback_does_not(capsys: pytest.CaptureFixture[str]) -> None:
    assert not warn_if_plaintext("http://127.0.0.1:8765/jsonrpc.php", "the board")
    assert not warn_if_plaintext("https://kanboard.lan/jsonrpc.php", "the board")
    assert not warn_if_plaintext("mqtts://broker.lan:8883", "the broker")
    assert warn_if_plaintext("http://kanboard.lan/jsonrpc.php", "the board")
    assert warn_if_plaintext("mqtt://10.0.0.5:1883", "the events broker")
    err = capsys.readouterr().err
    assert "kanboard.lan" in err and "without TLS" in err and "10.0.0.5" in err
