"""Cards read well in Kanboard: no HTML, what is asked and how to answer, links that open.

Over real HTTP against the embedded board. Kanboard escapes HTML in descriptions (Parsedown
in safe mode), so a description may hold none; the sealed spec is the last line, a Markdown
reference definition, which renders as nothing. Each card that waits on a person names the
gestures that answer it; a done card links its attachment in Kanboard's file viewer and is
assigned to the person who verifies it; the embedded board serves the links it writes.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from pathlib import Path

import pytest
import requests

from fabric.apps.web import WebView
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.card import SPEC_LINE
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.principals import home_settings
from fabric.settings.resolve import Settings
from fabric.task import GATE_ACTOR, State
from keeper.daemon import Keeper
from keeper.decisions import escalate_dead_letter
from tests.conftest import ROOT, make_fabric
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from workers.assembly import build_worker

CARDS = Path(__file__).parent / "cards_worker"
TAG = re.compile(r"</?[a-zA-Z][^>]*>")
PASSWORD = "torgash-board-password-0123456789"


def description(fab: Fabric, tid: int) -> str:
    return str(fab.board.read(tid).row["description"])


def readable(fab: Fabric, tid: int) -> str:
    """The description as a person sees it: no HTML, and the sealed spec out of sight."""
    text = description(fab, tid)
    assert not TAG.search(text), f"HTML in the description of #{tid}:\n{text}"
    *shown, last = text.splitlines()
    assert last.startswith(SPEC_LINE) and last.endswith(")")
    assert fab.board.sealed(text) is not None
    assert "fabric-spec" not in "\n".join(shown)
    return "\n".join(shown)


@pytest.fixture
def fab(http_fabric: Fabric) -> Fabric:
    return http_fabric  # sealed, as a deployed fabric is (tests/conftest.make_fabric)


def base(board: EmbeddedBoard) -> str:
    return f"http://{board.host}:{board.port}/"


def test_refs_are_links_and_nothing_is_html(fab: Fabric, embedded_board: EmbeddedBoard) -> None:
    other = fab.submit("Collect the receipts", target="kimi").task_id
    tid = fab.submit(
        "Summarise the week",
        target="kimi",
        refs=("https://example.org/notes", f"task:{other}", "file:///srv/notes/week.md"),
    ).task_id
    text = readable(fab, tid)
    page = f"{base(embedded_board)}?controller=TaskViewController&action=show&task_id={other}"
    assert "- [https://example.org/notes](https://example.org/notes)" in text
    assert f"- [task:{other}]({page})" in text
    assert "- `file:///srv/notes/week.md`" in text  # a browser does not open file:// from a page
    assert "Waiting on" not in text, "an agent's queued task asks nothing of a person"


def test_a_task_for_a_person_says_how_to_answer(fab: Fabric) -> None:
    tid = fab.submit("Buy a new router", target="alvis").task_id
    text = readable(fab, tid)
    assert text.startswith("**Waiting on @alvis.**")
    assert "drag this card to **Done**" in text and "**Close this task**" in text


def test_a_gate_a_decision_and_a_digest_each_say_what_they_ask(fab: Fabric) -> None:
    gate = fab.submit("Approve tainted input for kimi?", target="alvis", actor=GATE_ACTOR).task_id
    text = readable(fab, gate)
    assert "approve or refuse" in text and "Approve: drag this card to **Done**" in text
    assert "Refuse: close this card (**Close this task** in its menu) (a comment before it says why" in text
    assert "Approve: drag this card to **Done**." in text
    digest = fab.submit("Daily digest for alvis", target="alvis", actor="keeper").task_id
    assert "**For @alvis to read.**" in readable(fab, digest)
    # A dead letter says how to retry or drop it; its decision card how to decide.
    dead = fab.submit("Parse the scans", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(dead), "w1", lease_seconds=60)
    fab.ledger.fail(lease, "the scanner is offline", poison=True)
    text = readable(fab, dead)
    assert "**Dead letter:** poison: the scanner is offline." in text
    assert "Retry it as it is: drag this card to **Queued**" in text and "Drop it: close this card" in text
    receipt = escalate_dead_letter(fab, fab.board.read(dead))
    assert receipt is not None
    decision = readable(fab, receipt.task_id)
    assert "a decision.** The options are below" in decision and "**Close this task**" in decision
    assert "write what you decided as a comment" in decision


def test_a_question_shows_on_the_card_until_it_is_answered(fab: Fabric) -> None:
    tid = fab.submit("Plan the trip", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.ask(lease, "Which weekend?", "alvis")
    text = readable(fab, tid)
    assert text.startswith("**Question for @alvis:** Which weekend?")
    assert "write the answer as a comment, then drag this card back to **Queued**" in text
    fab.ledger.resume(tid, "alvis", "the first one")
    assert "Question for" not in readable(fab, tid)


@pytest.fixture
def wfab(embedded_board: EmbeddedBoard, tmp_path: Path) -> tuple[Fabric, Settings, CardSet]:
    cards = load_cards(CARDS, base_dir=CARDS)
    settings = Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=CARDS,
        state_dir=tmp_path / "state",
    )
    client = KanboardClient(embedded_board.url, embedded_board.token)
    return make_fabric(client, cards, settings=settings), settings, cards


def test_a_done_card_links_its_attachment_and_waits_on_its_verifier(
    wfab: tuple[Fabric, Settings, CardSet], embedded_board: EmbeddedBoard
) -> None:
    """A real worker's result: the card links the file in Kanboard's viewer, is assigned
    to the person who verifies it, and the embedded board opens that link."""
    fab, settings, cards = wfab
    embedded_board.set_view(WebView(embedded_board.api, settings))
    tid = fab.submit("Say hello", target="tester").task_id
    with OpenAIStub() as stub:
        env = {"AGAP_MODEL_MODE": "gateway", "AGAP_LITELLM_URL": stub.url, "AGAP_LITELLM_KEY": stub.api_key}
        with Running(build_worker("tester", settings, cards, env=env)):
            wait_until(lambda: _state(fab, tid) == State.DONE, what="task done")
    (file,) = fab.board.files(tid)
    url = (
        f"{base(embedded_board)}?controller=FileViewerController&action=show&task_id={tid}&file_id={file.id}"
    )
    text = readable(fab, tid)
    assert f"**Result:** [result-e1.md]({url}) (`kanboard://task/{tid}/file/result-e1.md`)" in text
    assert text.startswith("**Done: please verify, @alvis.**")
    assert "Accept the result: close this card (**Close this task**" in text
    row = fab.board.read(tid).task
    assert row.owner_id == fab.board.layout.users["alvis"], "in the verifier's My tasks"
    assert fab.board.read(tid).current.assignee == "alvis"  # type: ignore[union-attr]
    # The same link on the embedded board opens the attachment, escaped.
    auth = ("jsonrpc", embedded_board.token)
    shown = requests.get(url, auth=auth, timeout=10)
    assert shown.status_code == 200 and shown.headers["Content-Type"].startswith("text/html")
    result = base64.b64decode(fab.board.download(file.id)).decode()
    assert result.split("\n")[0][:30] in shown.text and "<script" not in shown.text
    page = requests.get(
        f"{base(embedded_board)}?controller=TaskViewController&action=show&task_id={tid}",
        auth=auth,
        timeout=10,
    )
    assert page.status_code == 200 and f'href="{url.replace("&", "&amp;")}"' in page.text
    wrong = url.replace(f"task_id={tid}", f"task_id={tid + 100}")
    assert requests.get(wrong, auth=auth, timeout=10).status_code == 404
    assert requests.get(url, timeout=10).status_code == 401
    # Verified: nothing is asked any more, and the result keeps its link.
    fab.ledger.verify(tid, "alvis")
    after = readable(fab, tid)
    assert "please verify" not in after
    assert f"**Result:** [result-e1.md]({url}) (`kanboard://task/{tid}/file/result-e1.md`)" in after


def _state(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None


def test_cards_made_before_keep_working(fab: Fabric) -> None:
    """A description written by the old layout (<details> around a fenced block) still
    parses: the fabric reads both, and `agap migrate --force` rewrites it."""
    tid = fab.submit("Old card", target="kimi").task_id
    assert ROOT.exists()
    text = description(fab, tid)
    line = text.splitlines()[-1]
    old = text.replace(
        line,
        "<details><summary>fabric spec (machine-readable)</summary>\n\n```json fabric-spec\n"
        + line[len(SPEC_LINE) : -1]
        + "\n```\n</details>",
    )
    assert fab.board.sealed(old) == fab.board.sealed(text)


def test_a_confined_agents_done_card_is_drawn_by_its_homes_keeper(
    embedded_board: EmbeddedBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torgash (sandboxed) works its home as its own board user, without the seal key: its
    done card keeps the text it was submitted with. The home's keeper (the app token, the
    home's projects, as `agap up` runs it) draws it as any done card reads: what is asked,
    the result linked in the file viewer, the sealed spec; once, then it is left alone."""
    monkeypatch.setenv("AGAP_BOARD_PASSWORD_TORGASH", PASSWORD)
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    app = Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=ROOT / "cards",
        state_dir=tmp_path / "state",
    )
    client = KanboardClient(app.board_url, app.board_token)
    init_board(client, app, cards)
    fab = Fabric.connect(app, cards=cards)
    tid = fab.submit("Price a heat pump", target="torgash").task_id
    submitted = description(fab, tid)
    own = dataclasses.replace(app, board_token="", board_user="agap-torgash", board_password=PASSWORD)
    env = {"AGAP_MODEL_MODE": "demo", "AGAP_POLL_SECONDS": "0.2"}
    with Running(build_worker("torgash", own, cards, env=env)):
        wait_until(lambda: _state(fab, tid) == State.DONE, what="torgash's task done")
    assert description(fab, tid) == submitted, "the confined worker could not draw it"
    assert "please verify" not in submitted

    home = Keeper.for_fabric(Fabric.connect(home_settings(app, cards.get("torgash")), cards=cards))
    assert home.run_job("gestures") and home.last["gestures"].redrawn == [tid]
    (file,) = fab.board.files(tid)
    url = (
        f"{base(embedded_board)}?controller=FileViewerController&action=show&task_id={tid}&file_id={file.id}"
    )
    text = readable(fab, tid)
    assert text.startswith("**Done: please verify, @alvis.**")
    assert "Accept the result: close this card (**Close this task**" in text
    assert f"**Result:** [result-e1.md]({url}) (`kanboard://task/{tid}/file/result-e1.md`)" in text
    sealed = fab.board.sealed(description(fab, tid))
    assert sealed is not None and sealed.uid == fab.board.read(tid).uid
    # Drawn once: the next sweep finds nothing to draw, and the main keeper none of it.
    assert home.run_job("gestures") and home.last["gestures"].redrawn == []
    main = Keeper.for_fabric(fab)
    assert main.run_job("gestures") and main.last["gestures"].redrawn == []
    # Verified from its home: the card asks nothing any more and keeps its result's link.
    Fabric.connect(home_settings(app, cards.get("torgash")), cards=cards).ledger.verify(tid, "alvis")
    after = readable(fab, tid)
    assert "please verify" not in after and f"({url})" in after
