"""`agap route --explain` and policy refusals on the command line, over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import fabric.apps.cli.route_cmd  # noqa: F401 - registers `agap route` until the CLI lists it
from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from tests.conftest import ROOT
from tests.helpers import signed_in


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    e = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        **signed_in(embedded_board, "alvis"),
    }
    assert run(e, "init").exit_code == 0
    return e


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_route_explain_prints_candidates_reasons_and_the_pick(env: dict[str, str]) -> None:
    res = run(
        env, "route", "--explain", "--constraints", "cap=code,trust>=trusted", "--intent", "fix the parser"
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "constraints: cap=code,trust>=trusted"
    assert lines[1].startswith("rule: available first, then the cheapest cost class")
    assert "  * qwen-remote   chosen: available, free, tier medium" in lines
    assert any(ln.startswith("  + kimi") and "costs more (standard > free)" in ln for ln in lines)
    assert "  - torgash       no: lacks code; trust sandboxed < trusted" in lines
    assert lines[-1] == "pick: qwen-remote (queue qwen-remote)"
    short = run(env, "route", "--target", "auto", "--intent", "reflect on the week")
    assert short.exit_code == 0 and short.output.startswith("kimi\tauto rule 'reflect'")
    data = json.loads(run(env, "route", "--target", "auto", "--intent", "hi", "--json").output)
    assert data["mode"] == "auto" and data["pick"] == "gemma-local" and data["size"] == "small"
    assert {c["id"] for c in data["candidates"]} >= {"kimi", "alvis", "torgash"}
    direct = run(env, "route", "--explain", "--target", "kimi")
    assert "direct target kimi: never re-routed" in direct.output
    # Nothing was submitted.
    assert "kimi:" not in run(env, "ls").output


def test_route_errors_are_one_line(env: dict[str, str]) -> None:
    res = run(env, "route", "--constraints", "cap=teleport")
    assert res.exit_code == 2 and "no agent satisfies the constraints" in res.output


def test_policy_refusals_name_the_rule_and_limit(env: dict[str, str]) -> None:
    res = run(
        env,
        "submit",
        "--target",
        "torgash",
        "--intent",
        "price this",
        "--ref",
        "file:///srv/agap/private/alvis/x.md",
    )
    assert res.exit_code == 6
    assert "PRIVACY [privacy.sandboxed, limit: shared domains only]" in res.output
    label = "file:///srv/agap/private/alvis/x.md#domain=shared"
    res = run(env, "submit", "--target", "torgash", "--intent", "price this", "--ref", label)
    assert res.exit_code == 6 and "PRIVACY [privacy.label" in res.output
    research = json.loads(
        run(env, "submit", "--target", "researcher", "--intent", "read the web", "--json").output
    )
    gated = run(env, "submit", "--target", "adolf", "--intent", "remember it", "--ref", research["ref"])
    assert gated.exit_code == 6 and "TAINT_GATED [taint.promotion" in gated.output
    assert "waits on alvis" in gated.output


def test_route_explain_shows_the_persona_backbone_and_why(env: dict[str, str]) -> None:
    out = run(env, "route", "--target", "adolf", "--explain").output
    assert "backbone of adolf: openai/kimi-k2" in out
    assert "* kimi" in out and "- qwen-remote  tier medium < large" in out
