"""The `agap` CLI over HTTP: happy paths, and bad input giving one clear line and an exit code."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from tests.conftest import ROOT
from tests.helpers import cli_env, signed_in


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    return cli_env(
        embedded_board.url,
        embedded_board.token,
        tmp_path,
        ROOT / "cards",
        **signed_in(embedded_board, "alvis"),
    )


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_init_is_idempotent_and_submit_show_ls_work(env: dict[str, str]) -> None:
    first = run(env, "init", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["changed"]
    again = run(env, "init")
    assert again.exit_code == 0 and "nothing changed" in again.output
    sub = run(
        env,
        "submit",
        "--target",
        "kimi",
        "--intent",
        "Summarise the notes",
        "--ref",
        "file:///notes.md",
        "--priority",
        "high",
        "--deadline",
        "+2h",
        "--json",
    )
    assert sub.exit_code == 0, sub.output
    data = json.loads(sub.output)
    assert data["ref"] == f"task:{data['task_id']}" and data["created"]
    assert data["round_trips"] <= 2 + 2, "submit (2) plus at most the first layout lookup (2)"
    shown = json.loads(run(env, "show", str(data["task_id"]), "--json").output)
    assert shown["state"] == "queued" and shown["epoch"] == 0
    assert shown["spec"]["refs"] == ["file:///notes.md"]
    listing = run(env, "ls")
    assert "kimi:" in listing.output and "Summarise the notes" in listing.output


def test_a_second_submit_uses_the_cached_layout_two_round_trips(env: dict[str, str]) -> None:
    assert run(env, "init").exit_code == 0
    out = json.loads(run(env, "submit", "--target", "kimi", "--intent", "x", "--json").output)
    assert out["round_trips"] == 2


def test_a_heartbeat_without_a_length_keeps_the_claims_lease(env: dict[str, str]) -> None:
    # A loop that claimed for 900 s and heartbeats without --lease must not drop to a default
    # (it would be fenced mid-task).
    run(env, "init")
    tid = json.loads(run(env, "submit", "--target", "claude-coder", "--intent", "long job", "--json").output)[
        "task_id"
    ]
    claimed = json.loads(
        run(env, "claim", "--agent", "claude-coder", "--owner", "loop-1", "--lease", "900", "--json").output
    )
    hb = run(env, "heartbeat", str(tid), "--epoch", "1", "--owner", "loop-1", "--json")
    assert hb.exit_code == 0, hb.output
    renewed = json.loads(hb.output)["lease_until"]
    assert renewed >= claimed["lease_until"] - 5, (claimed["lease_until"], renewed)
    told = run(env, "heartbeat", str(tid), "--epoch", "1", "--owner", "loop-1", "--lease", "30", "--json")
    assert json.loads(told.output)["lease_until"] < claimed["lease_until"] - 800, "--lease still wins"
    again = json.loads(run(env, "heartbeat", str(tid), "--epoch", "1", "--owner", "loop-1", "--json").output)
    assert again["lease_until"] >= claimed["lease_until"] - 5, "the claim's length, not the last one"


def test_the_external_consumer_commands_follow_the_ledger(env: dict[str, str]) -> None:
    run(env, "init")
    tid = json.loads(
        run(env, "submit", "--target", "claude-coder", "--intent", "fix the bug", "--json").output
    )["task_id"]
    claimed = run(env, "claim", "--agent", "claude-coder", "--owner", "loop-1", "--json")
    assert claimed.exit_code == 0, claimed.output
    lease = json.loads(claimed.output)
    assert lease["task_id"] == tid and lease["epoch"] == 1
    hb = run(env, "heartbeat", str(tid), "--epoch", "1", "--owner", "loop-1")
    assert hb.exit_code == 0, hb.output
    wrong = run(env, "complete", str(tid), "--epoch", "1", "--owner", "loop-2", "--result-ref", "file:///x")
    assert wrong.exit_code == 4 and "holds no working lease" in wrong.output  # a fencing outcome
    done = run(
        env,
        "complete",
        str(tid),
        "--epoch",
        "1",
        "--owner",
        "loop-1",
        "--result-ref",
        "https://git.example/pr/7",
        "--json",
    )
    assert done.exit_code == 0 and json.loads(done.output)["state"] == "done"
    nothing = run(env, "claim", "--agent", "claude-coder")
    assert nothing.exit_code == 4 and "nothing to claim" in nothing.output
    verify = run(env, "verify", str(tid))
    assert verify.exit_code == 0 and "closed" in verify.output


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["submit", "--target", "kimi", "--intent", "   "], 2, "--intent: the intent is empty"),
        (["submit", "--target", "ghost", "--intent", "x"], 2, "unknown agent 'ghost'"),
        (["submit", "--target", "kimi", "--intent", "x", "--deadline", "soonish"], 2, "--deadline"),
        (["submit", "--target", "kimi", "--intent", "x", "--priority", "asap"], 2, "--priority"),
        (["submit", "--intent", "x"], 2, "exactly one of a target agent or constraints"),
        (["show", "999"], 2, "task #999 does not exist"),
        (["cancel", "999"], 2, "task #999 does not exist"),
        (["verify", "999"], 2, "task #999 does not exist"),
    ],
)
def test_bad_input_is_one_clear_line_and_creates_nothing(
    env: dict[str, str], args: list[str], code: int, message: str
) -> None:
    assert run(env, "init").exit_code == 0
    result = run(env, *args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert result.output.count("agap: error:") == 1
    assert "no open tasks" in run(env, "ls").output


def test_missing_settings_and_wrong_token_and_board_down(env: dict[str, str]) -> None:
    no_url = {k: v for k, v in env.items() if k != "KANBOARD_URL"} | {"KANBOARD_URL": ""}
    r = run(no_url, "init")
    assert r.exit_code == 2 and "KANBOARD_URL is not set" in r.output
    r = run(env | {"KANBOARD_API_TOKEN": "wrong"}, "init")
    assert r.exit_code == 3 and "rejected the credentials" in r.output
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = env | {"KANBOARD_URL": f"http://127.0.0.1:{s.getsockname()[1]}/jsonrpc.php"}
        r = run(down, "init")
    assert r.exit_code == 3 and "cannot reach the board" in r.output


def test_malformed_cards_name_the_file_and_field(env: dict[str, str], tmp_path: Path) -> None:
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "bad.yaml").write_text(
        "id: bad\nkind: model\nname: Bad\ntrust: trusted\ntier: huge\nruntime: {mode: demo}\n"
    )
    r = run(env | {"AGAP_CARDS_DIR": str(cards)}, "init")
    assert r.exit_code == 2
    assert "bad.yaml" in r.output and "tier" in r.output


# -- dropping a dead letter: a terminal state of its own, not canceled ----------------------


def dead_letter(env: dict[str, str]) -> str:
    assert run(env, "init").exit_code == 0
    sub = run(env, "submit", "--target", "claude-coder", "--intent", "flaky tests?", "--json")
    tid = str(json.loads(sub.output)["task_id"])
    claim = json.loads(run(env, "claim", "--agent", "claude-coder", "--owner", "l1", "--json").output)
    failed = run(
        env, "fail", tid, "--epoch", str(claim["epoch"]), "--owner", "l1", "--reason", "x", "--poison"
    )
    assert failed.exit_code == 0, failed.output
    return tid


@pytest.mark.parametrize("verb", ["drop", "cancel"])
def test_a_dead_letter_is_dropped(env: dict[str, str], verb: str) -> None:
    tid = dead_letter(env)
    out = run(env, verb, tid, "--reason", "not worth it", "--json")
    assert out.exit_code == 0, out.output
    shown = json.loads(run(env, "show", tid, "--json").output)
    assert shown["state"] == "dropped"


def test_drop_refuses_a_task_that_is_not_a_dead_letter(env: dict[str, str]) -> None:
    assert run(env, "init").exit_code == 0
    tid = str(json.loads(run(env, "submit", "--target", "kimi", "--intent", "x", "--json").output)["task_id"])
    out = CliRunner().invoke(main, ["drop", tid], env=env)
    assert out.exit_code == 1 and "cannot drop a task that is queued" in out.output
