"""A confined agent works its home with its own board user, and reaches nothing else.

Real HTTP to the embedded board (which refuses a user what Kanboard refuses it), the
project's own cards: torgash is sandboxed, so its queue lives in its home and its worker
signs in as ``agap-torgash`` with only that home's rights.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import ConfigError
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.kanboard.port import BoardAuthError
from fabric.kanboard.principals import home_settings, worker_settings
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import ROOT, FakeClock
from tests.helpers import Running, wait_until
from workers.assembly import build_worker

PASSWORD = "torgash-board-password-0123456789"


@pytest.fixture
def app(embedded_board: EmbeddedBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("AGAP_BOARD_PASSWORD_TORGASH", PASSWORD)
    monkeypatch.setenv("AGAP_BOARD_PASSWORD_RESEARCHER", "researcher-board-password-0123")
    return Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=ROOT / "cards",
        state_dir=tmp_path / "state",
    )


def torgash(app: Settings, password: str = PASSWORD) -> Settings:
    """What torgash's worker is given: the board, its user, never the app token."""
    return dataclasses.replace(app, board_token="", board_user="agap-torgash", board_password=password)


def init(app: Settings, cards: CardSet) -> list[str]:
    client = KanboardClient(app.board_url, app.board_token)
    try:
        return init_board(client, app, cards).created
    finally:
        client.close()


def project_of(fab: Fabric, task_id: int) -> str:
    pid = int(fab.board.read(task_id).row["project_id"])
    return str(fab.port.call("getProjectById", {"project_id": pid})["name"])


def test_init_makes_the_homes_and_users_once(app: Settings, cards: CardSet) -> None:
    created = init(app, cards)
    assert "project 'Agent Fabric: torgash'" in created
    assert "project 'Agent Fabric Locks: researcher'" in created
    assert "user 'agap-torgash'" in created
    assert "member 'agap-torgash' to 'Agent Fabric Locks: torgash'" in created
    assert init(app, cards) == []  # idempotent: nothing left to do
    fab = Fabric.connect(app, cards=cards)
    users = fab.port.call("getAllUsers")
    agents = sorted(u["username"] for u in users if u["username"].startswith("agap-"))
    assert agents == ["agap-researcher", "agap-torgash"]  # the confined cards, and only them
    main = fab.board.layout.project_id
    tid = next(int(u["id"]) for u in users if u["username"] == "agap-torgash")
    assert fab.port.call("getProjectUserRole", {"project_id": main, "user_id": tid}) == ""


def test_a_rotated_password_recreates_the_user(
    app: Settings, cards: CardSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    init(app, cards)
    monkeypatch.setenv("AGAP_BOARD_PASSWORD_TORGASH", "a-new-password-for-torgash-42")
    assert "user 'agap-torgash' recreated: its password changed" in init(app, cards)
    with pytest.raises(BoardAuthError):
        KanboardClient(app.board_url, PASSWORD, user="agap-torgash").call("getMe")
    client = KanboardClient(app.board_url, "a-new-password-for-torgash-42", user="agap-torgash")
    assert client.call("getMe")["username"] == "agap-torgash"
    assert init(app, cards) == []


def test_a_short_password_stops_init_before_it_writes(
    app: Settings, cards: CardSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGAP_BOARD_PASSWORD_TORGASH", "short")
    with pytest.raises(ConfigError, match="AGAP_BOARD_PASSWORD_TORGASH"):
        init(app, cards)
    client = KanboardClient(app.board_url, app.board_token)
    assert client.call("getAllProjects") == []


def test_the_worker_needs_its_own_user(app: Settings, cards: CardSet) -> None:
    init(app, cards)
    with pytest.raises(ConfigError, match="never with the application token"):
        build_worker("torgash", app, cards, env={"AGAP_MODEL_MODE": "demo"})
    wrong = dataclasses.replace(torgash(app), board_user="agap-researcher")
    with pytest.raises(ConfigError, match="signs in as 'agap-torgash'"):
        build_worker("torgash", wrong, cards, env={"AGAP_MODEL_MODE": "demo"})


def test_a_confined_worker_works_its_home_and_nothing_else(app: Settings, cards: CardSet) -> None:
    init(app, cards)
    fab = Fabric.connect(app, cards=cards)
    secret = fab.submit("alvis's private errand", target="kimi").task_id
    tid = fab.submit("price a heat pump", target="torgash").task_id
    assert project_of(fab, tid) == "Agent Fabric: torgash"
    assert project_of(fab, secret) == "Agent Fabric"

    env = {"AGAP_MODEL_MODE": "demo", "AGAP_POLL_SECONDS": "0.2"}
    with Running(build_worker("torgash", torgash(app), cards, env=env)):
        wait_until(lambda: fab.board.read(tid).current.state == State.DONE, what="torgash's task done")  # type: ignore[union-attr]
    view = fab.board.read(tid)
    assert view.current is not None and view.current.result_ref == f"kanboard://task/{tid}/file/result-e1.md"
    (result,) = fab.board.files(tid)
    assert base64.b64decode(fab.board.download(result.id)).decode().startswith("[demo model]")

    # The same credential, used directly: its home answers, everything else is refused.
    # Whatever runs as agap-torgash (its worker, `agap claim`, an MCP server) is at home.
    own = Fabric.connect(torgash(app), cards=cards)
    assert own.board.layout.project_name == "Agent Fabric: torgash" and own.board.layout.me > 0
    own.board.comment(tid, "a note from torgash")
    assert [c.user_id for c in own.board.comments(tid)][-1] == own.board.layout.me
    raw = KanboardClient(app.board_url, PASSWORD, user="agap-torgash")
    refused: list[tuple[str, dict[str, Any] | None]] = [
        ("getTask", {"task_id": secret}),
        ("searchTasks", {"project_id": fab.board.layout.project_id, "query": ""}),
        ("getTagsByProject", {"project_id": fab.board.layout.locks_project_id}),
        ("getAllUsers", None),
    ]
    for method, params in refused:
        with pytest.raises(BoardAuthError, match="HTTP 403"):
            raw.call(method, params)


def test_the_work_project_never_moves_a_home_task(app: Settings, cards: CardSet) -> None:
    """Its epoch locks live in the home's locks project: taken anywhere else, an epoch could
    be won twice. Acting on it through its home (the app token, the home's projects) works."""
    init(app, cards)
    fab = Fabric.connect(app, cards=cards)
    tid = fab.submit("price a heat pump", target="torgash").task_id
    uid = fab.show(tid).uid
    with pytest.raises(ConfigError, match="is in 'Agent Fabric: torgash'"):
        fab.ledger.cancel(tid, "alvis", "not from here")
    tags = fab.port.call("getTagsByProject", {"project_id": fab.board.layout.locks_project_id})
    assert not [t for t in tags if str(uid) in t["name"]], "no lock taken in the wrong project"
    home = Fabric.connect(home_settings(app, cards.get("torgash")), cards=cards)
    home.ledger.cancel(tid, "alvis", "from its home")
    assert fab.show(tid).current.state == State.CANCELED  # type: ignore[union-attr]


def test_policy_finds_a_home_task_by_its_uid(app: Settings, cards: CardSet) -> None:
    """Searches for policy span the homes, in one round trip: a confined agent's task is
    found wherever a ref names it."""
    init(app, cards)
    fab = Fabric.connect(app, cards=cards)
    tid = fab.submit("find reviews", target="researcher").task_id
    uid = fab.show(tid).uid
    reader = fab.policy_context().board
    fab.port.stats.reset()
    (hits,) = reader.search_many([f"desc:{uid}"])
    assert [r.id for r in hits] == [tid] and fab.port.stats.trips == 1
    assert fab.board.search(f"desc:{uid}") == []  # the work project alone does not hold it


def test_a_home_has_a_keeper_of_its_own(app: Settings, cards: CardSet) -> None:
    """The work project's keeper never looks into a home; the home's keeper (`agap keeper`
    with the home's projects, as `agap up` and the compose stack run it) requeues a lease
    its confined worker let expire."""
    init(app, cards)
    clock = FakeClock(time.time())
    card = cards.get("torgash")
    tid = Fabric.connect(app, cards=cards).submit("price a kettle", target="torgash").task_id
    own = Fabric.connect(worker_settings(torgash(app), card), cards=cards, clock=clock)
    own.ledger.claim(own.board.read(tid), "torgash@crashed", lease_seconds=5)
    clock.advance(3600)
    main = Keeper.for_fabric(Fabric.connect(app, cards=cards, clock=clock))
    assert main.run_job("leases") and main.last["leases"].requeued == []
    home = Keeper.for_fabric(Fabric.connect(home_settings(app, card), cards=cards, clock=clock))
    assert home.run_job("leases") and home.last["leases"].requeued == [tid]


def test_the_listing_shows_the_homes_in_one_round_trip(app: Settings, cards: CardSet) -> None:
    init(app, cards)
    fab = Fabric.connect(app, cards=cards)
    mine = fab.submit("price a kettle", target="torgash").task_id
    other = fab.submit("plan the trip", target="kimi").task_id
    fab.port.stats.reset()
    listed = {t["id"]: (t["queue"], t["column"]) for t in fab.listing()}
    assert listed == {mine: ("torgash", "Queued"), other: ("kimi", "Queued")}
    assert fab.port.stats.trips == 1


def test_a_card_made_with_plus_in_a_home_is_taken_by_the_home_keeper(app: Settings, cards: CardSet) -> None:
    """A person's "+" card in the researcher's Queued, in its home: the home's keeper (as
    `agap keeper` with the home's projects runs it) submits it there for the researcher."""
    init(app, cards)
    card = cards.get("researcher")
    home = Fabric.connect(home_settings(app, card), cards=cards)
    assert home.home_of == "researcher" and home.main is not None
    layout = home.board.layout
    alvis = KanboardClient(app.board_url, app.board_token)
    try:
        tid = alvis.call(
            "createTask",
            {
                "title": "Compare heat pump prices",
                "project_id": layout.project_id,
                "column_id": layout.columns[Column.QUEUED],
                "swimlane_id": layout.swimlanes["researcher"],
                "creator_id": layout.users["alvis"],
            },
        )
    finally:
        alvis.close()
    keeper = Keeper.for_fabric(home)
    assert keeper.run_job("gestures")
    report = keeper.last["gestures"]
    assert tid in report.submitted, (report, [c.text for c in home.board.comments(tid)])
    new = home.board.read(report.submitted[tid])
    assert new.spec is not None and new.spec.target == "researcher" and new.spec.actor == "alvis"
