"""People sign in as themselves on the CLI and the MCP server, over real HTTP to the board.

A person's gesture counts only signed in (AGAP_USER, AGAP_USER_PASSWORD: a password or a
personal API token, checked by the board); AGAP_ACTOR naming a person is refused with one
line; an approval needs the person the gate waits on or their deputy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.embedded.store import new_api_token
from fabric.errors import EXIT_INVALID, EXIT_OK, EXIT_POLICY, EXIT_UNREACHABLE
from fabric.kanboard.port import BoardAuthError
from fabric.kanboard.principals import sign_in
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT
from tests.helpers import cli_env, signed_in


@pytest.fixture
def cards_dir(tmp_path: Path) -> Path:
    """The project's cards, with elizaveta as alvis's deputy."""
    out = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", out)
    shutil.copytree(ROOT / "souls", tmp_path / "souls")  # personas are read beside the cards
    alvis = out / "alvis.yaml"
    alvis.write_text(
        alvis.read_text().replace(
            "  display_name: Alvis\n", "  display_name: Alvis\n  deputies: [elizaveta]\n"
        )
    )
    return out


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path, cards_dir: Path) -> dict[str, str]:
    env = cli_env(embedded_board.url, embedded_board.token, tmp_path, cards_dir, AGAP_ACTOR="", AGAP_USER="")
    for person in ("alvis", "elizaveta"):
        signed_in(embedded_board, person, cards_dir)  # their users, with a password the test knows
    assert run(env, "init").exit_code == 0
    return env


@pytest.fixture
def fab(embedded_board: EmbeddedBoard, cards_dir: Path) -> Fabric:
    settings = Settings(board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=cards_dir)
    return Fabric.connect(settings, cards=load_cards(cards_dir, base_dir=ROOT))


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def one_line(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def gate(fab: Fabric, person: str = "alvis") -> int:
    """A card waiting in ``person``'s column (an approval)."""
    tid = fab.submit("approve the new backup plan", target=person).task_id
    cur = fab.show(tid).current
    assert cur is not None and cur.state == State.QUEUED and cur.assignee == person
    return tid


def test_a_person_signed_in_approves_their_gate(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard, cards_dir: Path
) -> None:
    tid = gate(fab)
    done = run({**env, **signed_in(embedded_board, "alvis", cards_dir)}, "approve", str(tid))
    assert done.exit_code == EXIT_OK, done.output
    cur = fab.show(tid).current
    assert cur is not None and (cur.state, cur.by) == (State.DONE, "alvis")


def test_agap_actor_naming_a_person_is_refused_with_one_line(env: dict[str, str], fab: Fabric) -> None:
    tid = gate(fab)
    as_alvis = {**env, "AGAP_ACTOR": "alvis"}
    for args in (
        ("approve", str(tid)),
        ("resume", str(tid), "--answer", "yes"),
        ("cancel", str(tid), "--reason", "no"),
        ("reopen", str(tid), "--reason", "again"),
        ("submit", "--target", "kimi", "--intent", "read my diary"),
    ):
        result = run(as_alvis, *args)
        assert result.exit_code == EXIT_INVALID, (args, result.output)
        line = one_line(result)
        assert "AGAP_ACTOR" in line and "AGAP_USER=alvis" in line and "AGAP_USER_PASSWORD" in line, line
    refused = run(env, "submit", "--target", "kimi", "--intent", "read my diary", "--actor", "a2a:alvis")
    assert refused.exit_code == EXIT_INVALID and "--actor" in one_line(refused)
    cur = fab.show(tid).current
    assert cur is not None and cur.state == State.QUEUED, "nothing was written"


def test_a_wrong_password_exits_3_and_a_personal_token_signs_in(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard
) -> None:
    tid = gate(fab)
    wrong = run({**env, "AGAP_USER": "alvis", "AGAP_USER_PASSWORD": "not-his-password"}, "approve", str(tid))
    assert wrong.exit_code == EXIT_UNREACHABLE, wrong.output
    line = one_line(wrong)
    assert "refused the sign-in of 'alvis'" in line and "AGAP_USER_PASSWORD" in line, line
    unset = run({**env, "AGAP_USER": "alvis"}, "approve", str(tid))
    assert unset.exit_code == EXIT_INVALID and "AGAP_USER_PASSWORD is not set" in one_line(unset)
    token = new_api_token(embedded_board.store, "alvis")
    assert token is not None
    done = run({**env, "AGAP_USER": "alvis", "AGAP_USER_PASSWORD": token}, "approve", str(tid), "--json")
    assert done.exit_code == EXIT_OK, done.output
    cur = fab.show(tid).current
    assert cur is not None and (cur.state, cur.by) == (State.DONE, "alvis")


def test_someone_else_cannot_approve_a_gate_waiting_on_another_and_a_deputy_can(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard, cards_dir: Path
) -> None:
    for_eliz = gate(fab, "elizaveta")
    as_alvis = {**env, **signed_in(embedded_board, "alvis", cards_dir)}
    refused = run(as_alvis, "approve", str(for_eliz))
    assert refused.exit_code == EXIT_POLICY, refused.output
    line = one_line(refused)
    assert f"task #{for_eliz} waits on elizaveta: only elizaveta may approve it (alvis tried)" in line, line
    not_signed = run(env, "approve", str(for_eliz))  # the operator's shell: `cli`, no person
    assert not_signed.exit_code == EXIT_POLICY and "sign in as elizaveta" in one_line(not_signed)
    cur = fab.show(for_eliz).current
    assert cur is not None and cur.state == State.QUEUED, "nothing was written"
    # elizaveta deputises for alvis (his card says so): she approves his gate.
    for_alvis = gate(fab, "alvis")
    done = run({**env, **signed_in(embedded_board, "elizaveta", cards_dir)}, "approve", str(for_alvis))
    assert done.exit_code == EXIT_OK, done.output
    cur = fab.show(for_alvis).current
    assert cur is not None and (cur.state, cur.by) == (State.DONE, "elizaveta")


def test_answers_and_refusals_by_a_person_follow_the_same_rule(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard, cards_dir: Path
) -> None:
    tid = fab.submit("pick a date", target="kimi").task_id
    lease = fab.ledger.claim(fab.show(tid), "w1", lease_seconds=300)
    fab.ledger.ask(lease, "Tuesday or Thursday?", "elizaveta")
    as_alvis = {**env, **signed_in(embedded_board, "alvis", cards_dir)}
    refused = run(as_alvis, "resume", str(tid), "--answer", "Tuesday")
    assert refused.exit_code == EXIT_POLICY and "only elizaveta may answer it" in one_line(refused)
    refused = run(as_alvis, "cancel", str(tid), "--reason", "never mind")
    assert refused.exit_code == EXIT_POLICY and "only elizaveta may refuse it" in one_line(refused)
    as_eliz = {**env, **signed_in(embedded_board, "elizaveta", cards_dir)}
    answered = run(as_eliz, "resume", str(tid), "--answer", "Thursday")
    assert answered.exit_code == EXIT_OK, answered.output
    cur = fab.show(tid).current
    assert cur is not None and (cur.state, cur.by) == (State.QUEUED, "elizaveta")


def test_a_signed_in_person_submits_as_themselves_and_an_agent_keeps_its_card(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard, cards_dir: Path
) -> None:
    as_alvis = {**env, **signed_in(embedded_board, "alvis", cards_dir), "AGAP_ACTOR": "cron"}
    mine = run(as_alvis, "submit", "--target", "kimi", "--intent", "summarise my week", "--json")
    assert mine.exit_code == EXIT_OK, mine.output
    agent = run(
        env | {"AGAP_ACTOR": "openclaw"}, "submit", "--target", "kimi", "--intent", "the news", "--json"
    )
    assert agent.exit_code == EXIT_OK, agent.output
    specs = [fab.show(json.loads(r.output)["task_id"]).spec for r in (mine, agent)]
    assert [s.actor if s else None for s in specs] == ["alvis", "openclaw"]
    other = run(as_alvis, "submit", "--target", "kimi", "--intent", "x", "--actor", "elizaveta")
    assert other.exit_code == EXIT_INVALID and "AGAP_USER signs in alvis" in one_line(other)


def test_the_mcp_server_takes_its_person_only_signed_in(
    env: dict[str, str], embedded_board: EmbeddedBoard, cards_dir: Path
) -> None:
    args = ("mcp", "serve", "--agent", "claude-coder")
    alone = run({**env, "AGAP_MCP_USER": "alvis"}, *args)
    assert alone.exit_code == EXIT_INVALID, alone.output
    line = one_line(alone)
    assert "AGAP_MCP_USER names alvis, but nobody is signed in" in line and "AGAP_USER" in line, line
    other = run({**env, "AGAP_MCP_USER": "alvis", **signed_in(embedded_board, "elizaveta", cards_dir)}, *args)
    assert other.exit_code == EXIT_INVALID and "AGAP_USER signs in elizaveta" in one_line(other)
    wrong = run({**env, "AGAP_MCP_USER": "alvis", "AGAP_USER": "alvis", "AGAP_USER_PASSWORD": "nope"}, *args)
    assert wrong.exit_code == EXIT_UNREACHABLE and "refused the sign-in" in one_line(wrong)


def test_agap_board_user_token_prints_a_token_that_signs_in(
    env: dict[str, str], fab: Fabric, embedded_board: EmbeddedBoard, tmp_path: Path
) -> None:
    db = str(tmp_path / "board.sqlite3")  # the embedded_board fixture's file
    made = run(env, "board", "user-token", "alvis", "--db", db)
    assert made.exit_code == EXIT_OK, made.output
    token = made.output.strip()
    assert len(token) == 60
    tid = gate(fab)
    done = run({**env, "AGAP_USER": "alvis", "AGAP_USER_PASSWORD": token}, "approve", str(tid))
    assert done.exit_code == EXIT_OK, done.output
    again = run(env, "board", "user-token", "alvis", "--db", db)
    assert again.exit_code == EXIT_OK and again.output.strip() != token, "a new token replaces the old"
    # This test process signed in with the old token once and keeps that (once per
    # process); the board itself no longer takes it.
    with pytest.raises(BoardAuthError):
        sign_in(embedded_board.url, "alvis", token)
    nobody = run(env, "board", "user-token", "nobody", "--db", db)
    assert nobody.exit_code == EXIT_INVALID and "no user 'nobody'" in one_line(nobody)
    missing = run(env, "board", "user-token", "alvis", "--db", str(tmp_path / "none.sqlite3"))
    assert missing.exit_code == EXIT_INVALID and not (tmp_path / "none.sqlite3").exists()
