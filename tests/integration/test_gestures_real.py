"""The key gestures on a real Kanboard, made as its UI makes them: signed in as a person.

Runs when AGAP_TEST_KANBOARD_URL and AGAP_TEST_KANBOARD_TOKEN name a scratch Kanboard (skipped otherwise).
The edits, duplicates and moves to another project are made with the API calls Kanboard's
UI makes them with (updateTask, duplicateTaskToProject, moveTaskToProject), signed in; the
keeper sees them by sweeping the project's activity (no webhook here).
Its projects and users start with ``g_``: the two people are the cards ``alvis`` and
``elizaveta`` under Kanboard usernames of their own, with a password the test knows.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests

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
    url: str

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
    yield Real(fab, keeper, people, names, url)
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


# -- the same, through Kanboard's web pages ------------------------------------------------------

_TAG = re.compile(r"<(input|select|script)\b([^>]*)>(?:(.*?)</\1>)?", re.S)
_ATTR = re.compile(r'([a-z_-]+)="([^"]*)"')


class Browser:
    """Kanboard's web UI as a person's browser uses it, signed in through its login form:
    the pages and forms its buttons lead to. No JavaScript runs, so what its scripts would
    send is sent: the description editor's text, with the CRLF line ends a browser sends."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.base = url.rsplit("jsonrpc.php", 1)[0]
        self.http = requests.Session()
        token = _fields(self.page("AuthController", "login"))["csrf_token"]
        done = self.http.post(
            self.base,
            params={"controller": "AuthController", "action": "check"},
            data={"csrf_token": token, "username": username, "password": password},
            timeout=30,
        )
        assert "action=logout" in done.text, f"{username} is not signed in"

    def page(self, controller: str, action: str, **params: Any) -> str:
        got = self.http.get(
            self.base, params={"controller": controller, "action": action, **params}, timeout=30
        )
        got.raise_for_status()
        return got.text

    def edit(self, task_id: int, **changes: str) -> None:
        """Open "Edit the task", change ``changes``, save."""
        form = _fields(self.page("TaskModificationController", "edit", task_id=task_id))
        form.update(changes)
        form["description"] = form["description"].replace("\r\n", "\n").replace("\n", "\r\n")
        saved = self.http.post(
            self.base,
            params={"controller": "TaskModificationController", "action": "update", "task_id": str(task_id)},
            data=form,
            timeout=30,
        )
        assert saved.ok and "TaskViewController" in saved.url, "saved"

    def duplicate(self, task_id: int) -> int:
        """ "Duplicate" in the card's menu, then "Yes": the copy's id (its page opens)."""
        page = self.page("TaskDuplicationController", "duplicate", task_id=task_id)
        # The Yes button is a script's: it GETs the URL its data-params name.
        found = re.search(r"class=\"js-confirm-buttons\" data-params='([^']*)'", page)
        assert found is not None, "the confirmation's Yes"
        url = html.unescape(json.loads(found.group(1))["url"])
        done = self.http.get(urljoin(self.base, url), timeout=30)
        return int(parse_qs(urlsplit(done.url).query)["task_id"][0])


def _fields(page: str) -> dict[str, str]:
    """A form's fields as a browser sends them (a select's chosen option, the description
    editor's text); a multiple select (tags) is left out, as none is chosen here."""
    out: dict[str, str] = {}
    for tag, attrs, inner in _TAG.findall(page):
        a = dict(_ATTR.findall(attrs))
        if tag == "input" and "name" in a and a.get("type", "text") not in ("checkbox", "submit"):
            out[a["name"]] = html.unescape(a.get("value", ""))
        elif tag == "select" and "name" in a and "multiple" not in attrs:
            option = re.search(r'<option value="([^"]*)"[^>]*selected', inner or "") or re.search(
                r'<option value="([^"]*)"', inner or ""
            )
            out[a["name"]] = html.unescape(option.group(1)) if option is not None else ""
        elif tag == "script" and 'type="text/template"' in attrs:
            out["description"] = html.unescape(inner or "")
    return out


def test_the_web_uis_edit_form_and_duplicate_are_handled(real: Real) -> None:
    """The real pages: saving "Edit the task" sends every field (the description back with
    CRLF), and "Duplicate" makes a "[DUPLICATE]" copy linked to the original."""
    fab = real.fab
    tid = fab.submit("plan the holiday", target="kimi", actor="alvis").task_id
    alvis = Browser(real.url, real.names["alvis"], PASSWORD)
    alvis.edit(tid, title="plan the holiday in May", priority="3")
    assert real.sweep().edited == {tid: ["amend", "restore_text"]}
    row = real.row(tid)
    assert (row["title"], int(row["priority"])) == ("plan the holiday", 3)
    line = said(real, tid)[-1]
    assert "plan the holiday in May" in line and "description" not in line, "CRLF is no edit"
    copy = Browser(real.url, real.names["elizaveta"], PASSWORD).duplicate(tid)
    assert real.row(copy)["title"] == "[DUPLICATE] plan the holiday"
    new_id = real.sweep().submitted[copy]
    spec = fab.board.read(new_id).spec
    assert spec is not None and (spec.intent, spec.actor, spec.priority) == (
        "plan the holiday",
        "elizaveta",
        3,
    )
    assert not int(real.row(copy)["is_active"])


def test_a_reassign_to_a_non_member_through_the_edit_form_is_put_back(real: Real) -> None:
    """Kanboard's API refuses an assignee who is no member of the project, but its edit
    form (and an admin's "Assign to me") does not check: the card is put back."""
    fab = real.fab
    tid = fab.submit("book the dentist", target="alvis").task_id
    stranger = fab.port.call("createUser", {"username": f"g_{uuid.uuid4().hex[:8]}", "password": PASSWORD})
    assert real.people["alvis"].call("updateTask", {"id": tid, "owner_id": stranger}) is False, "the API"
    Browser(real.url, real.names["alvis"], PASSWORD).edit(tid, owner_id=str(stranger))
    assert int(real.row(tid)["owner_id"]) == stranger, "the form took it"
    assert real.sweep().edited == {tid: ["restore_assignee"]}
    assert int(real.row(tid)["owner_id"]) == fab.board.layout.users[real.names["alvis"]]
    assert said(real, tid)[-1].startswith(
        f"{real.names['alvis']} gave this card to someone who is not a member of the project; it is back"
    )
