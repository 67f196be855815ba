"""``agap eval``: the golden set through the current and a proposed backbone, over the
model plane (gateway mode against a loopback OpenAI-compatible stand-in)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import fabric.apps.cli.eval_cmd  # noqa: F401  (registers `agap eval`)
from fabric.apps.cli import main
from fabric.apps.deploy.evalgate import JUDGE_SYSTEM
from tests.fakes.openai_stub import OpenAIStub

CURRENT = "openai/good"

# What each backbone answers to each golden input.
ANSWERS: dict[str, dict[str, str]] = {
    CURRENT: {
        "Capital of France?": "It is Paris.",
        "Say OK": "OK",
        "Is 7 prime?": "Yes, it is.",
        "Greet me": "Good morning, a pleasure to help (polite).",
        "17*23?": "381",
    },
    "openai/better": {
        "Capital of France?": "Paris",
        "Say OK": " OK ",
        "Is 7 prime?": "yes",
        "Greet me": "Hello there (polite)",
        "17*23?": "391",
    },
    "openai/worse": {
        "Capital of France?": "Lyon",
        "Say OK": "Okay!",
        "Is 7 prime?": "Yes",
        "Greet me": "what do you want",
        "17*23?": "400",
    },
    # Passes as many as the current one, but trades "Say OK" for "17*23?".
    "openai/swap": {
        "Capital of France?": "Paris",
        "Say OK": "ok sure",
        "Is 7 prime?": "Yes",
        "Greet me": "Hi (polite)",
        "17*23?": "391",
    },
}

CARD = """\
id: helper
kind: persona
name: Helper
capabilities: [chat]
trust: trusted
runtime:
  mode: demo
  model: openai/good
persona: souls/helper.md
golden: cards/golden/helper.yaml
"""
GOLDEN = """\
agent: helper
cases:
  - name: capital
    input: "Capital of France?"
    expect: {contains: [paris]}
  - name: says ok
    input: "Say OK"
    expect: {exact: "OK"}
  - name: prime
    input: "Is 7 prime?"
    expect: {regex: "(?i)^\\\\s*yes"}
  - name: polite
    input: "Greet me"
    expect: {judge: "The answer is polite."}
  - name: arithmetic
    input: "17*23?"
    expect: {contains: ["391"]}
"""


def reply(body: dict[str, Any]) -> str:
    messages = body["messages"]
    if messages[0]["content"] == JUDGE_SYSTEM:
        answer = messages[-1]["content"].split("Answer:\n", 1)[1]
        return "PASS" if "polite" in answer else "FAIL\nnot polite"
    return ANSWERS[body["model"]][messages[-1]["content"]]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "cards" / "golden").mkdir(parents=True)
    (tmp_path / "souls").mkdir()
    (tmp_path / "cards" / "helper.yaml").write_text(CARD)
    (tmp_path / "cards" / "golden" / "helper.yaml").write_text(GOLDEN)
    (tmp_path / "souls" / "helper.md").write_text("You are Helper, brief and polite.\n")
    return tmp_path


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub(reply=reply) as s:
        yield s


def run(repo: Path, stub: OpenAIStub, *args: str) -> Result:
    env = {
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": stub.url,
        "AGAP_LITELLM_KEY": stub.api_key,
        "AGAP_CARDS_DIR": str(repo / "cards"),
    }
    return CliRunner().invoke(main, ["eval", *args], env=env)


def test_the_same_backbone_is_no_regression(repo: Path, stub: OpenAIStub) -> None:
    res = run(repo, stub, "--agent", "helper", "--backbone", CURRENT)
    assert res.exit_code == 0, res.output
    assert "total" in res.output and "4/5" in res.output
    assert res.output.strip().splitlines()[-1].startswith("ok:")


def test_a_better_backbone_passes_the_gate(repo: Path, stub: OpenAIStub) -> None:
    res = run(repo, stub, "--agent", "helper", "--backbone", "openai/better")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["CASE", "CURRENT", CURRENT, "PROPOSED", "openai/better"]
    arithmetic = next(line for line in lines if line.startswith("arithmetic"))
    assert arithmetic.split()[1:] == ["FAIL", "PASS"]
    assert any(line.split()[-2:] == ["4/5", "5/5"] for line in lines)


def test_a_worse_backbone_is_refused_with_a_side_by_side_table(repo: Path, stub: OpenAIStub) -> None:
    res = run(repo, stub, "--agent", "helper", "--backbone", "openai/worse")
    assert res.exit_code == 1, res.output
    assert "REGRESSION: openai/worse fails 3 case(s)" in res.output
    polite = next(line for line in res.output.splitlines() if line.startswith("polite"))
    assert "PASS" in polite and "FAIL (not polite)" in polite and "<- regression" in polite


def test_trading_one_kept_case_for_another_is_a_regression(repo: Path, stub: OpenAIStub) -> None:
    res = run(repo, stub, "--agent", "helper", "--backbone", "openai/swap", "--json")
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert report["current"]["passed"] == report["proposed"]["passed"] == 4
    assert report["broken"] == ["says ok"] and report["regression"] is True


def test_both_runs_go_through_the_plane_and_one_judge_scores_both(repo: Path, stub: OpenAIStub) -> None:
    assert run(repo, stub, "--agent", "helper", "--backbone", "openai/better").exit_code == 0
    bodies = [r.body for r in stub.chat_requests()]
    judged = [b for b in bodies if b["messages"][0]["content"] == JUDGE_SYSTEM]
    answered = [b for b in bodies if b["messages"][0]["content"] != JUDGE_SYSTEM]
    assert len(judged) == 2 and {b["model"] for b in judged} == {CURRENT}
    assert sorted(b["model"] for b in answered) == ["openai/better"] * 5 + [CURRENT] * 5
    assert all(b["messages"][0]["content"].startswith("You are Helper") for b in answered)
    headers = stub.chat_requests()[0].headers
    assert headers["authorization"] == f"Bearer {stub.api_key}"


def test_a_judge_that_answers_neither_pass_nor_fail_fails_the_case(repo: Path, stub: OpenAIStub) -> None:
    def vague(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"] == JUDGE_SYSTEM:
            return "It depends."
        return reply(body)

    stub.reply = vague
    res = run(repo, stub, "--agent", "helper", "--backbone", CURRENT, "--json")
    report = json.loads(res.output)
    polite = next(c for c in report["current"]["cases"] if c["name"] == "polite")
    assert polite["passed"] is False and "neither PASS nor FAIL" in polite["note"]


def test_refusals(repo: Path, stub: OpenAIStub) -> None:
    (repo / "cards" / "plain.yaml").write_text(
        CARD.replace("id: helper", "id: plain").replace("golden: cards/golden/helper.yaml\n", "")
    )
    res = run(repo, stub, "--agent", "plain", "--backbone", "openai/better")
    assert res.exit_code == 2 and "has no golden set" in res.output
    res = run(repo, stub, "--agent", "nobody", "--backbone", "openai/better")
    assert res.exit_code == 2 and "unknown agent" in res.output
    env = {
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": "http://127.0.0.1:9",
        "AGAP_LITELLM_KEY": "unused",
        "AGAP_CARDS_DIR": str(repo / "cards"),
    }
    res = CliRunner().invoke(main, ["eval", "--agent", "helper", "--backbone", "openai/better"], env=env)
    assert res.exit_code == 3 and "model plane" in res.output


MODEL_CARD = """\
id: {name}
kind: model
name: {name}
tier: {tier}
trust: trusted
capabilities: [chat]
runtime:
  mode: demo
  model: openai/{name}
"""

PAL = """\
id: pal
kind: persona
name: Pal
capabilities: [chat]
trust: trusted
runtime:
  mode: demo
backbone:
  constraints:
    tier: {tier}
persona: souls/helper.md
golden: cards/golden/pal.yaml
"""


def validate(repo: Path) -> Result:
    import fabric.apps.cli.cards_cmd  # noqa: F401  (registers `agap cards`)

    return CliRunner().invoke(main, ["cards", "validate", "--dir", str(repo / "cards")])


@pytest.fixture
def gated(repo: Path) -> Path:
    for name, tier in (("good", "small"), ("better", "medium"), ("worse", "large")):
        (repo / "cards" / f"{name}.yaml").write_text(MODEL_CARD.format(name=name, tier=tier))
    (repo / "cards" / "pal.yaml").write_text(PAL.format(tier="small"))
    (repo / "cards" / "golden" / "pal.yaml").write_text(GOLDEN.replace("agent: helper", "agent: pal"))
    (repo / "cards" / "_backbones.yaml").write_text('pal: "openai/good"\n')
    return repo


def test_a_change_of_resolution_must_pass_the_gate_before_it_is_recorded(
    gated: Path, stub: OpenAIStub
) -> None:
    assert validate(gated).exit_code == 0
    (gated / "cards" / "pal.yaml").write_text(PAL.format(tier="medium"))  # the one-line edit
    res = validate(gated)
    assert res.exit_code == 2
    assert "now resolves to openai/better (was openai/good)" in res.output
    assert "agap eval --agent pal --record" in res.output
    res = run(gated, stub, "--agent", "pal", "--record")  # proposed: the new resolution
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].split()[-1] == "openai/better"
    assert validate(gated).exit_code == 0
    assert 'pal: "openai/better"' in (gated / "cards" / "_backbones.yaml").read_text()


def test_a_change_of_resolution_that_regresses_is_not_recorded(gated: Path, stub: OpenAIStub) -> None:
    (gated / "cards" / "pal.yaml").write_text(PAL.format(tier="large"))
    res = run(gated, stub, "--agent", "pal", "--record")
    assert res.exit_code == 1, res.output
    assert 'pal: "openai/good"' in (gated / "cards" / "_backbones.yaml").read_text()
    assert validate(gated).exit_code == 2


def test_until_the_gate_passes_the_persona_keeps_thinking_with_the_gated_backbone(gated: Path) -> None:
    from fabric.cards import load_cards  # here: only this test loads the cards itself

    (gated / "cards" / "pal.yaml").write_text(PAL.format(tier="medium"))
    # tier medium: better (medium) and worse (large) fit; good (small) no longer does, so
    # the gated one cannot be kept and the closest new fit runs (validate still fails).
    assert load_cards(gated / "cards", base_dir=gated).get("pal").runtime.model == "openai/better"
    (gated / "cards" / "_backbones.yaml").write_text('pal: "openai/worse"\n')
    # worse still fits: it stays the backbone until `agap eval --record` gates better.
    assert load_cards(gated / "cards", base_dir=gated).get("pal").runtime.model == "openai/worse"
