"""``agap cards``: validate and ls, their output and their exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabric.apps.cli import main

REPO = Path(__file__).resolve().parents[2]
IDS = (
    "adolf, alvis, claude-coder, elizaveta, gemma-local, kimi, ops, qwen-remote, researcher, router, torgash"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "cards", tmp_path / "cards")
    shutil.copytree(REPO / "souls", tmp_path / "souls")
    return tmp_path


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_validate_ok(repo: Path) -> None:
    code, out, err = run("cards", "validate", "--dir", str(repo / "cards"))
    assert code == 0, err
    assert out == f"ok: 11 cards ({IDS})\n"
    assert err == ""


def test_validate_reads_the_dir_from_the_environment(repo: Path) -> None:
    code, out, _ = run("cards", "validate", env={"AGAP_CARDS_DIR": str(repo / "cards")})
    assert code == 0
    assert out.startswith("ok: 11 cards")


def test_validate_prints_every_problem_and_exits_2(repo: Path) -> None:
    kimi = repo / "cards" / "kimi.yaml"
    kimi.write_text(kimi.read_text().replace("limit: 60", "limit: 0"))
    torgash = repo / "cards" / "torgash.yaml"
    torgash.write_text(torgash.read_text().replace("[shared]", "[shared, private:alvis]"))
    code, out, err = run("cards", "validate", "--dir", str(repo / "cards"))
    assert code == 2
    assert out == ""
    assert err.splitlines() == [
        "cards/kimi.yaml: availability.0.limit: must be greater than 0",
        "cards/torgash.yaml: privacy_domains.1: a sandboxed agent may not read private:alvis; "
        "it sees only shared domains",
    ]


def test_validate_reports_yaml_syntax_with_a_line(repo: Path) -> None:
    (repo / "cards" / "kimi.yaml").write_text("id: kimi\nkind: [model\n")
    code, _, err = run("cards", "validate", "--dir", str(repo / "cards"))
    assert code == 2
    assert err.startswith("cards/kimi.yaml:3: YAML error")


def test_validate_missing_directory(tmp_path: Path) -> None:
    code, out, err = run("cards", "validate", "--dir", str(tmp_path / "none"))
    assert code == 2
    assert out == ""
    assert "no such directory" in err


def test_ls_table(repo: Path) -> None:
    code, out, _ = run("cards", "ls", "--dir", str(repo / "cards"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "KIND", "TIER", "TRUST", "QUEUE", "AVAILABILITY", "RUNTIME"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert len(rows) == 11
    assert rows["kimi"] == ["kimi", "model", "large", "trusted", "kimi", "quota", "demo"]
    assert rows["alvis"] == ["alvis", "human", "-", "human", "alvis", "hours", "human"]
    assert rows["claude-coder"][-1] == "external"


def test_ls_json(repo: Path) -> None:
    code, out, _ = run("cards", "ls", "--dir", str(repo / "cards"), "--json")
    assert code == 0
    cards = json.loads(out)
    assert [c["id"] for c in cards] == IDS.split(", ")
    kimi = next(c for c in cards if c["id"] == "kimi")
    assert kimi["queue"] == "kimi"
    assert kimi["availability"][0]["shape"] == "quota"
    assert kimi["runtime"]["model"] == "openai/kimi-k2"


def test_ls_on_broken_cards_fails_with_one_error_block(repo: Path) -> None:
    (repo / "cards" / "kimi.yaml").write_text("id: kimi\n")
    code, out, err = run("cards", "ls", "--dir", str(repo / "cards"))
    assert code == 2
    assert out == ""
    assert err.startswith("agap: error: ")
    assert "cards/kimi.yaml: kind: required" in err


def test_show_one_card(repo: Path) -> None:
    code, out, _ = run("cards", "show", "--dir", str(repo / "cards"), "torgash")
    assert code == 0
    card = json.loads(out)
    assert card["trust"] == "sandboxed"
    assert card["privacy_domains"] == ["shared"]


def test_show_unknown_card(repo: Path) -> None:
    code, _, err = run("cards", "show", "--dir", str(repo / "cards"), "nobody")
    assert code == 2
    assert err.startswith("agap: error: unknown agent 'nobody' — known: adolf, alvis")
