"""The key gestures on a real Kanboard, made as its UI makes them: signed in as a person.

Runs when AGAP_TEST_KANBOARD_URL and AGAP_TEST_KANBOARD_TOKEN name a scratch Kanboard (skipped otherwise).
The edits, duplicates and moves to another project are made with the API calls Kanboard's
UI makes them with (updateTask, duplicateTaskToProject, moveTaskToProject), signed in; the
keeper sees them by sweeping the project's activity (no webhook here).
Its projects and users start with ``g_``: the two people are the cards ``alvis`` and
``elizaveta`` under Kanboard usernames of their own, with a password the test knows.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import REAL_SKIP, ROOT, make_fabric, real_kanboard, scratch_board

PASSWORD = "g-real-gestures"
pytestmark = pytest.mark.skipif(
    real_kanboard() is None,
    reason=REAL_SKIP
    + " (tests/unit/test_keeper_gestures.py and test_keeper_edits.py make each on the embedded board)",
)


@dataclass
class Real:
    fab: Fabric
    keeper: Keeper
    people: dict[str, KanboardClient]  # card id -> signed in as that person
    names: dict[str, str]  # card id -> Kanboard username

    def move(self, who: str, tid: int, column: Column, queue: str | None = None) -> None:
        layout = self.fab.board.layout
        lane = layout.swimlanes[queue] if queue else int(self.row(tid)["swimlane_id"])
        assert self.people[who].call(
            "moveTaskPosition",
            {
                "project_id": layout.project_id,
                "task_id": tid,
                "column_id": layout.columns[column],
                "position": 1,
                "swimlane_id": lane,
            },
        )

    def close(self, who: str, tid: int) -> None:
        assert self.people[who].call("closeTask", {"task_id": tid})

    def row(self, tid: int) -> dict[str, Any]:
        r = self.fab.port.call("getTask", {"task_id": tid})
        assert isinstance(r, dict)
        return r

    def state(self, tid: int) -> tuple[State, str, str]:
        cur = self.fab.board.read(tid).current
        assert cur is not None
        return cur.state, cur.op, cur.by

    def column(self, tid: int) -> Column:
        cid = int(self.row(tid)["column_id"])
        return next(c for c, i in self.fab.board.layout.columns.items() if i == cid)

    def sweep(self) -> Any:
        assert self.keeper.run_job("gestures")
        return self.keeper.last["gestures"]


@pytest.fixture
def real(tmp_path: Path) -> Iterator[Real]:
    found = real_kanboard()
    assert found is not None
    url, token = found
    scratch_board(url, token)
    tag = uuid.uuid4().hex[:8]
    cards_dir = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", cards_dir)
    names = {"alvis": f"g_{tag}_alvis", "elizaveta": f"g_{tag}_eliz"}
    for card, name in names.items():
        path = cards_dir / f"{card}.yaml"
        path.write_text(re.sub(r"username: \w+", f"username: {name}", path.read_text()))
    app = KanboardClient(url, token, timeout=30)
    for name in names.values():
        assert app.call("createUser", {"username": name, "password": PASSWORD, "name": name})
    settings = Settings(
        board_url=url,
        board_token=token,
        cards_dir=cards_dir,
        project=f"g_fabric_{tag}",
        locks_project=f"g_locks_{tag}",
    )
    cards = load_cards(cards_dir, base_dir=ROOT)
    fab = make_fabric(app, cards, settings=settings)
    keeper = Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))
    people = {c: KanboardClient(url, PASSWORD, user=n, timeout=30) for c, n in names.items()}
    yield Real(fab, keeper, people, names)
    for client in (*people.values(), app):
        client.close()


def test_a_gate_is_approved_only_by_its_person_and_closing_it_verifies(real: Real) -> None:
    tid = real.fab.submit("approve the plan", target="alvis").task_id
    real.move("elizaveta", tid, Column.DONE)
    report = real.sweep()
    assert report.acted == {} and tid in report.refused
    assert real.column(tid) == Column.WAITING, "put back on real Kanboard"
    real.move("alvis", tid, Column.DONE)
    assert real.sweep().acted == {tid: "approve"}
    assert real.state(tid) == (State.DONE, "complete", "alvis")
    real.close("alvis", tid)
    assert real.sweep().acted == {tid: "verify"}
    assert real.state(tid)[0] == State.CLOSED


def test_a_dead_letter_closed_is_dropped_and_its_card_leaves_the_column(real: Real) -> None:
    fab = real.fab
    tid = fab.submit("a doomed task", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=300)
    fab.ledger.fail(lease, "poison", poison=True)
    real.close("alvis", tid)
    assert real.sweep().acted == {tid: "drop"}
    assert real.state(tid) == (State.DROPPED, "drop", "alvis")
    assert real.column(tid) == Column.DONE
    assert not int(real.row(tid)["is_active"])
    assert real.sweep().acted == {}


def test_a_queued_card_moved_to_another_lane_is_rerouted_at_once(real: Real) -> None:
    tid = real.fab.submit("summarise the news", target="kimi").task_id
    real.move("alvis", tid, Column.QUEUED, queue="qwen-remote")  # right after the submit
    assert real.sweep().acted == {tid: "reroute"}
    assert real.state(tid)[0::2] == (State.CANCELED, "alvis")


def test_a_card_made_with_plus_in_a_queued_column_becomes_a_task(real: Real) -> None:
    layout = real.fab.board.layout
    card = real.people["alvis"].call(
        "createTask",
        {
            "project_id": layout.project_id,
            "title": "Book the dentist",
            "column_id": layout.columns[Column.QUEUED],
            "swimlane_id": layout.swimlanes["kimi"],
        },
    )
    new_id = real.sweep().submitted[card]
    spec = real.fab.board.read(new_id).spec
    assert spec is not None and (spec.target, spec.actor, spec.intent) == (
        "kimi",
        "alvis",
        "Book the dentist",
    )
    assert real.column(card) == Column.DONE and not int(real.row(card)["is_active"])


# -- edits, Duplicate, Move to another project (keeper.edits, keeper.handmade) ----------------


def said(real: Real, tid: int) -> list[str]:
    return [c.text for c in real.fab.board.comments(tid) if c.user_id == 0]


def test_a_priority_set_by_its_person_is_kept_and_anyone_elses_put_back(real: Real) -> None:
    tid = real.fab.submit("tidy the garage", target="kimi", actor="alvis").task_id
    assert real.people["elizaveta"].call("updateTask", {"id": tid, "priority": 0})
    assert real.sweep().edited == {tid: ["amend"]}
    assert int(real.row(tid)["priority"]) == 1, "put back on real Kanboard"
    assert said(real, tid)[-1].startswith("Only ") and "(g_" in said(real, tid)[-1]
    assert real.people["alvis"].call("updateTask", {"id": tid, "priority": 3})
    assert real.sweep().edited == {tid: ["amend"]}
    view = real.fab.board.read(tid)
    assert view.spec is not None and view.spec.priority == 3 and view.terms is not None
    assert int(real.row(tid)["priority"]) == 3
    assert real.sweep().edited == {}, "once"


def test_a_title_edit_and_a_reassign_are_put_back_with_one_comment(real: Real) -> None:
    tid = real.fab.submit("approve the budget", target="alvis").task_id
    before = real.row(tid)
    other = real.fab.board.layout.users[real.names["elizaveta"]]
    assert real.people["alvis"].call("updateTask", {"id": tid, "title": "budget!!", "owner_id": other})
    assert real.sweep().edited == {tid: ["restore_assignee", "restore_text"]}
    after = real.row(tid)
    assert (after["title"], int(after["owner_id"])) == (before["title"], int(before["owner_id"]))
    assert len([line for line in said(real, tid) if "budget!!" in line]) == 1
    assert real.sweep().edited == {}, "the undo is no edit"


def test_an_edit_of_a_closed_card_is_put_back(real: Real) -> None:
    tid = real.fab.submit("an old chore", target="kimi", actor="alvis").task_id
    real.fab.ledger.cancel(tid, "alvis", "not needed")
    assert real.people["alvis"].call("updateTask", {"id": tid, "title": "again?"})
    assert real.sweep().edited == {tid: ["edit_closed"]}
    assert real.row(tid)["title"] == "an old chore"
    assert "**Duplicate** it" in said(real, tid)[-1]


def test_a_duplicate_is_submitted_again_by_that_person(real: Real) -> None:
    layout = real.fab.board.layout
    tid = real.fab.submit("water the plants", target="kimi", actor="alvis", key="g-dup").task_id
    copy = real.people["elizaveta"].call(
        "duplicateTaskToProject", {"task_id": tid, "project_id": layout.project_id}
    )
    assert isinstance(copy, int) and copy > tid
    new_id = real.sweep().submitted[copy]
    spec = real.fab.board.read(new_id).spec
    assert spec is not None and (spec.target, spec.actor) == ("kimi", "elizaveta")
    left = real.row(copy)
    assert not int(left["is_active"]) and left["reference"] == ""
    assert real.fab.board.find_by_reference(real.row(tid)["reference"]).id == tid  # type: ignore[union-attr]
    assert real.sweep().submitted == {}


def test_a_card_moved_to_another_project_is_brought_back(real: Real) -> None:
    fab = real.fab
    tid = fab.submit("sort the mail", target="kimi", actor="alvis").task_id
    real.sweep()  # the keeper has seen it open in its project
    app = fab.port
    own = app.call("createProject", {"name": f"g_own_{uuid.uuid4().hex[:8]}"})
    alvis = fab.board.layout.users[real.names["alvis"]]
    assert app.call("addProjectUser", {"project_id": own, "user_id": alvis, "role": "project-member"})
    assert real.people["alvis"].call("moveTaskToProject", {"task_id": tid, "project_id": own}) is True
    assert int(real.row(tid)["project_id"]) == own
    assert real.sweep().brought_back == [tid]
    assert int(real.row(tid)["project_id"]) == fab.board.layout.project_id
    assert real.column(tid) == Column.QUEUED and real.state(tid)[0] == State.QUEUED
    assert real.sweep().brought_back == []
