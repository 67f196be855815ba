"""A newcomer reads an answer: `agap show` and `agap result`, and the board view's task page.

Real HTTP to the embedded board; the result is stored as the built-in workers store theirs
(an attachment), the task page is the one the board view serves at Kanboard's own URL.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.apps.web import WebView
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.results import AttachmentStore, result_url
from fabric.settings.resolve import Settings
from fabric.task import GATE_ACTOR
from tests.conftest import ROOT, make_fabric
from tests.helpers import cli_env, signed_in

ANSWER = "**Monday**: dentist.\n\nWednesday: the train to Berlin."


@pytest.fixture
def fab(embedded_board: EmbeddedBoard, cards: CardSet) -> Fabric:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    embedded_board.set_view(WebView(embedded_board.api, settings, refresh_seconds=30))
    return make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings)


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
    return CliRunner().invoke(main, list(args), env=env)


def _done(fab: Fabric) -> int:
    tid = fab.submit("Summarise my week", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    ref = AttachmentStore(fab.board).put(lease, ANSWER)
    fab.ledger.complete(lease, ref, result_url=result_url(fab.board, ref))
    return tid


def test_show_prints_the_result_and_takes_the_ref_submit_printed(env: dict[str, str], fab: Fabric) -> None:
    tid = _done(fab)
    shown = run(env, "show", f"task:{tid}")
    assert shown.exit_code == 0, shown.output
    assert "Result:" in shown.output and "Wednesday: the train to Berlin." in shown.output
    data = json.loads(run(env, "show", f"#{tid}", "--json").output)
    assert data["result"] == ANSWER and data["id"] == tid


def test_agap_result_prints_the_answer_and_says_when_there_is_none(env: dict[str, str], fab: Fabric) -> None:
    tid = _done(fab)
    res = run(env, "result", f"kanboard://task/{tid}")
    assert res.exit_code == 0 and res.output == ANSWER + "\n", res.output
    waiting = fab.submit("Not yet", target="kimi").task_id
    res = run(env, "result", str(waiting))
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"task #{waiting} has no result yet (queued)" in res.output and "agap watch" in res.output


def test_a_task_id_that_names_no_task_is_one_line_exit_2(env: dict[str, str]) -> None:
    res = run(env, "show", "tasks:1")
    assert res.exit_code == 2 and "is not a task" in res.output and "Traceback" not in res.output


def _task_page(board: EmbeddedBoard, tid: int) -> str:
    auth = base64.b64encode(f"jsonrpc:{board.token}".encode()).decode()
    url = f"http://{board.host}:{board.port}/?controller=TaskViewController&action=show&task_id={tid}"
    reply = requests.get(url, headers={"Authorization": f"Basic {auth}"}, timeout=10)
    assert reply.status_code == 200
    return reply.text


def test_the_task_page_reads_as_kanboard_shows_it_and_offers_only_what_works_here(
    embedded_board: EmbeddedBoard, fab: Fabric
) -> None:
    gate = fab.submit("Approve tainted input for kimi?", target="alvis", actor=GATE_ACTOR).task_id
    page = _task_page(embedded_board, gate)
    assert "fabric-spec" not in page and "&quot;seal&quot;" not in page  # no sealed spec
    assert "Close this task" not in page and "drag this card" not in page  # no Kanboard gesture
    assert "waiting on @alvis" in page
    assert f"agap approve {gate}" in page and f"agap cancel {gate}" in page
    assert "<strong>Constraints:</strong>" in page  # Markdown rendered, as Kanboard does
    done = _task_page(embedded_board, _done(fab))
    assert "done: waiting for" in done and f"agap verify {_done_id(done)}" in done


def _done_id(page: str) -> int:
    return int(page.split("<h1>#", 1)[1].split(" ", 1)[0])


def test_the_board_view_links_every_card_to_its_page(embedded_board: EmbeddedBoard, fab: Fabric) -> None:
    tid = fab.submit("Summarise my week", target="kimi").task_id
    auth = base64.b64encode(f"jsonrpc:{embedded_board.token}".encode()).decode()
    page = requests.get(
        f"http://{embedded_board.host}:{embedded_board.port}/",
        headers={"Authorization": f"Basic {auth}"},
        timeout=10,
    ).text
    assert f"?controller=TaskViewController&amp;action=show&amp;task_id={tid}" in page
