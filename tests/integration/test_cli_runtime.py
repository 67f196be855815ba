"""The CLI contract for runtimes that drain a queue from a shell (a Claude Code loop,
OpenClaw), and the bad input every command refuses with one line and exit 2.

Real HTTP to the embedded board; the keeper that fences a lease runs on a clock a few
minutes ahead, so no test waits for a lease to run out.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import evidence_key
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.sweeps import sweep_leases_and_gaps
from tests.conftest import ROOT, make_fabric
from tests.helpers import cli_env, signed_in, wait_until


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    board = embedded_board
    return cli_env(
        board.url, board.token, tmp_path, ROOT / "cards", AGAP_WORKER_ID="", **signed_in(board, "alvis")
    )


@pytest.fixture
def fab(embedded_board: EmbeddedBoard, cards: CardSet) -> Fabric:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings)


@pytest.fixture
def ahead(embedded_board: EmbeddedBoard, cards: CardSet) -> Fabric:
    """The keeper's fabric, its clock past any lease these tests take."""
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    client = KanboardClient(embedded_board.url, embedded_board.token)
    return make_fabric(client, cards, clock=lambda: time.time() + 3600, settings=settings)


def run(env: dict[str, str], *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=stdin)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def submit(env: dict[str, str], intent: str = "Which tests are flaky?") -> int:
    ok(run(env, "init"))
    return int(
        json.loads(ok(run(env, "submit", "--target", "claude-coder", "--intent", intent, "--json")))[
            "task_id"
        ]
    )


def claim(env: dict[str, str], *extra: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(ok(run(env, "claim", "--agent", "claude-coder", "--json", *extra)))
    return out


# -- owner, result files, intents, the conversation ----------------------------------------


def test_the_default_owner_is_stable_and_printed_and_a_result_file_is_stored_like_a_workers(
    env: dict[str, str], fab: Fabric
) -> None:
    tid = submit(env)
    lease = claim(env)
    assert lease["owner"] == f"claude-coder@{socket.gethostname()}", "stable: no pid in it"
    epoch = str(lease["epoch"])
    ok(run(env, "heartbeat", str(tid), "--epoch", epoch))  # no --owner: the same default
    done = run(
        env, "complete", str(tid), "--epoch", epoch, "--result-file", "-", "--json", stdin="Two: a, b.\n"
    )
    assert json.loads(ok(done))["state"] == "done"
    view = fab.board.read(tid)
    assert view.current is not None
    assert view.current.result_ref == f"kanboard://task/{tid}/file/result-e{epoch}.md"
    (f,) = fab.board.files(tid)
    assert base64.b64decode(fab.board.download(f.id)).decode() == "Two: a, b.\n"
    assert view.current.result_ref in view.row["description"], "the description links the result"


def test_agap_worker_id_names_the_owner(env: dict[str, str], tmp_path: Path) -> None:
    tid = submit(env)
    mine = env | {"AGAP_WORKER_ID": "loop-7"}
    lease = claim(mine)
    assert lease["owner"] == "loop-7"
    result = tmp_path / "result.md"
    result.write_text("done in a file")
    ok(run(mine, "complete", str(tid), "--epoch", str(lease["epoch"]), "--result-file", str(result)))
    other = run(env, "claim", "--agent", "claude-coder")
    assert other.exit_code == 4


def test_a_long_intent_comes_from_a_file_or_stdin(env: dict[str, str], tmp_path: Path, fab: Fabric) -> None:
    ok(run(env, "init"))
    intent = "Review the plan\n\n" + "A long paragraph of context. " * 100
    path = tmp_path / "intent.md"
    path.write_text(intent)
    tid = json.loads(ok(run(env, "submit", "--target", "kimi", "--intent-file", str(path), "--json")))[
        "task_id"
    ]
    piped = run(env, "submit", "--target", "kimi", "--intent-file", "-", "--json", stdin="From stdin\nmore")
    spec = fab.board.read(tid).spec
    assert spec is not None and spec.intent == intent.strip()
    assert fab.board.read(json.loads(ok(piped))["task_id"]).task.title == "From stdin"


def test_claim_json_carries_questions_answers_and_rework_reasons_in_order(env: dict[str, str]) -> None:
    tid = submit(env)
    first = claim(env)
    ok(run(env, "ask", str(tid), "--epoch", str(first["epoch"]), "--question", "Which branch?"))
    ok(run(env, "resume", str(tid), "--answer", "main"))
    second = claim(env)
    ok(
        run(
            env,
            "complete",
            str(tid),
            "--epoch",
            str(second["epoch"]),
            "--result-ref",
            "https://git.example/pr/7",
        )
    )
    ok(run(env, "reopen", str(tid), "--reason", "the tests still fail on CI"))
    rework = claim(env)
    assert rework["conversation"] == [
        {"kind": "question", "text": "Which branch?"},
        {"kind": "answer", "text": "main"},
        {"kind": "reopen", "text": "the tests still fail on CI"},
    ]


# -- fenced output is evidence ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kept",
    [
        (["complete", "--result-file", "{file}"], "the late result itself"),
        (
            ["complete", "--result-ref", "https://git.example/pr/9", "--note", "late"],
            "https://git.example/pr/9",
        ),
        (["fail", "--reason", "the runner died"], "the runner died"),
        (["ask", "--question", "Which branch, again?"], "Which branch, again?"),
    ],
)
def test_a_fenced_cli_call_keeps_what_it_was_given_as_evidence(
    env: dict[str, str], fab: Fabric, ahead: Fabric, tmp_path: Path, args: list[str], kept: str
) -> None:
    tid = submit(env)
    lease = claim(env, "--owner", "loop-1", "--lease", "900")
    assert sweep_leases_and_gaps(ahead).requeued == [tid]  # the loop was too slow: fenced
    late = tmp_path / "late.md"
    late.write_text("the late result itself")
    given = [a.replace("{file}", str(late)) for a in args]
    result = run(env, given[0], str(tid), "--epoch", str(lease["epoch"]), "--owner", "loop-1", *given[1:])
    assert result.exit_code == 4, result.output
    assert result.output.count("agap: error:") == 1 and "fenced" in result.output
    view = fab.board.read(tid)
    assert view.current is not None and view.current.state == State.QUEUED, "never the result"
    assert kept in view.meta.get(evidence_key(int(str(lease["epoch"]))), "")
    assert fab.board.files(tid) == [], "nothing stored as a result file for a fenced epoch"
    notes = [c.text for c in fab.board.comments(tid)]
    assert any("kept as evidence, not as the result" in n for n in notes), notes


# -- bad input: one line, exit 2, no traceback, nothing written --------------------------------

LEASE_ARGS = ["--epoch", "1", "--owner", "loop-1"]


@pytest.mark.parametrize(
    "args, where",
    [
        (["submit", "--target", "kimi", "--intent", "x", "--deadline", "+99999999h"], "--deadline"),
        (
            ["submit", "--target", "kimi", "--intent", "x", "--not-before", "+3h", "--deadline", "+1h"],
            "--not-before",
        ),
        (["submit", "--constraints", "cap=", "--intent", "x"], "--constraints"),
        (["submit", "--constraints", "tier>=large,cap=tools+", "--intent", "x"], "--constraints"),
        (["submit", "--target", "kimi", "--intent", "x", "--actor", ""], "--actor"),
        (["submit", "--target", "kimi", "--intent", "x", "--ref", "file:///etc/passwd"], "--ref"),
        (["submit", "--target", "kimi", "--intent", "y" * 4001], "longer than 4000 characters"),
        (["submit", "--target", "kimi"], "exactly one of --intent or --intent-file"),
        (["submit", "--target", "kimi", "--intent-file", "/no/such/file"], "--intent-file"),
        (["claim", "--agent", "claude-coder", "--lease", "-5"], "--lease"),
        (["claim", "--agent", "claude-coder", "--lease", "0"], "--lease"),
        (["heartbeat", "{tid}", *LEASE_ARGS, "--lease", "-1"], "--lease"),
        (["complete", "{tid}", *LEASE_ARGS, "--result-ref", ""], "--result-ref"),
        (["complete", "{tid}", *LEASE_ARGS, "--result-ref", "   "], "--result-ref"),
        (["complete", "{tid}", *LEASE_ARGS], "exactly one of --result-ref"),
        (["complete", "{tid}", *LEASE_ARGS, "--result-file", "/no/such/file"], "--result-file"),
        (["fail", "{tid}", *LEASE_ARGS, "--reason", " "], "--reason"),
        (["reopen", "{tid}", "--reason", ""], "--reason"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    env: dict[str, str], fab: Fabric, tmp_path: Path, args: list[str], where: str
) -> None:
    tid = submit(env)
    claim(env, "--owner", "loop-1")
    before = fab.board.read(tid)
    result = run(env | {"AGAP_REF_ROOTS": str(tmp_path)}, *[a.replace("{tid}", str(tid)) for a in args])
    assert result.exit_code == 2, result.output
    assert result.output.count("agap: error:") == 1 and where in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert "should" not in result.output.lower(), "pydantic's words, not the fabric's"
    after = fab.board.read(tid)
    assert after.records == before.records and after.meta == before.meta
    assert [r["id"] for r in fab.listing()] == [tid], "no task was created"


def test_a_board_url_that_is_not_a_url_is_one_line(env: dict[str, str]) -> None:
    result = run(env | {"KANBOARD_URL": "not a url"}, "submit", "--target", "kimi", "--intent", "x")
    assert result.exit_code == 2 and result.output.count("agap: error:") == 1, result.output
    assert "KANBOARD_URL" in result.output and "Traceback" not in result.output


# -- a worker stopped during start-up ------------------------------------------------------------


def test_sigterm_during_worker_start_up_exits_zero(embedded_board: EmbeddedBoard, tmp_path: Path) -> None:
    # The worker's counters file is a FIFO: restoring it blocks start-up until the test
    # opens the other end, so the SIGTERM lands in start-up, whatever the machine's speed.
    cards = ROOT / "tests" / "integration" / "cards_worker"
    state = tmp_path / "state"
    state.mkdir()
    fifo = state / "availability-tester.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "worker", "--agent", "tester"],
        env={
            **os.environ,
            "KANBOARD_URL": embedded_board.url,
            "KANBOARD_API_TOKEN": embedded_board.token,
            "AGAP_CARDS_DIR": str(cards),
            "AGAP_STATE_DIR": str(state),
            "AGAP_MODEL_MODE": "demo",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        },
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = -1
    try:

        def opened() -> bool:
            nonlocal writer
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once the worker reads
            except OSError:
                return False
            return True

        wait_until(opened, timeout=60, what="the worker reading its counters (start-up)")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if writer >= 0:
            os.close(writer)
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


# -- one claim path: `agap claim` refuses what a worker refuses -----------------------------

PRIVATE = "file:///srv/agap/private/alvis/diary.md"


def _claimed_or_dead(env: dict[str, str], fab: Fabric, tid: int) -> str:
    res = run(env, "claim", "--agent", "claude-coder", "--json")
    assert res.exit_code == 4, res.output  # nothing it may claim
    cur = fab.board.read(tid).current
    assert cur is not None and cur.state == State.DEAD, cur
    return cur.reason or ""


def test_agap_claim_refuses_a_ref_in_a_domain_the_agent_may_not_see(env: dict[str, str], fab: Fabric) -> None:
    # Written past the submit policy (the card changed since it was submitted, say): only
    # the claim-time check stands between the task and claude-coder, which sees "shared".
    fab.policies = []
    tid = fab.submit("compare with the diary", target="claude-coder", refs=[PRIVATE]).task_id
    reason = _claimed_or_dead(env, fab, tid)
    assert reason.startswith("refused at claim:") and "private:alvis" in reason


def test_agap_claim_refuses_untrusted_output_without_a_gate(env: dict[str, str], fab: Fabric) -> None:
    found = fab.submit("find the datasheet", target="researcher").task_id
    home = fab.home_fabric(fab.cards.get("researcher"))  # untrusted work runs in its home
    lease = home.ledger.claim(home.board.read(found), "research-1", lease_seconds=60)
    home.ledger.complete(lease, "https://example.org/datasheet")
    fab.policies = []  # past the submit policy's taint gate
    tid = fab.submit("use what the researcher found", target="claude-coder", refs=[f"task:{found}"]).task_id
    reason = _claimed_or_dead(env, fab, tid)
    assert reason.startswith("refused at claim:") and "untrusted work by researcher" in reason
