"""A person's edits of a card in Kanboard's UI: each means something, or says why not.

Every edit is made as Kanboard's UI makes it: signed in as that person (the embedded
board's user-auth equivalent), which fires Kanboard's events and writes its activity rows
(task.update with the fields that changed, task.assignee_change, task.move.project, the
copy's task.create). The fabric's own calls use the application token and write none.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.dates import format_input_date
from fabric.kanboard.layout import Column
from fabric.settings.keeper import KeeperConfig
from fabric.settings.resolve import Settings
from fabric.task import GATE_ACTOR, KEEPER_ACTOR, State
from keeper import snapshot
from keeper.daemon import Keeper
from tests.conftest import ROOT, FakeClock, make_fabric
from tests.helpers import card_column as col
from tests.helpers import card_row as row
from tests.unit.test_keeper_gestures import as_person, claim, gestures, rec

DAY = 86400.0


def submit(fab: Fabric, target: str = "kimi", **kw: Any) -> tuple[int, Keeper]:
    """A task alvis submitted (so it is done for him), and a keeper."""
    kw.setdefault("actor", "alvis")
    tid = fab.submit("Summarise the week's notes", target=target, **kw).task_id
    return tid, Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))


def edit(fab: Fabric, tid: int, user: str = "alvis", **fields: Any) -> None:
    """What saving Kanboard's "Edit the task" form does, signed in as ``user``."""
    assert as_person(fab, user).call("updateTask", {"id": tid, **fields}) is True


def said(fab: Fabric, tid: int) -> list[str]:
    """The keeper's lines on the card (the application token's comments)."""
    return [c.text for c in fab.board.comments(tid) if c.user_id == 0]


def edited(k: Keeper) -> dict[int, list[str]]:
    report: dict[int, list[str]] = gestures(k).edited
    return report


# -- priority and due date ---------------------------------------------------------------


def test_a_priority_raised_by_the_person_it_is_for_is_the_tasks_own(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    before = said(fab, tid)
    edit(fab, tid, priority=3)
    assert edited(k) == {tid: ["amend"]}
    view = fab.board.read(tid)
    assert view.spec is not None and view.submitted is not None and view.terms is not None
    assert (view.spec.priority, view.submitted.priority, view.terms.by) == (3, 1, "alvis")
    assert view.task.priority == 3, "the card keeps what alvis set"
    assert "priority urgent" in view.task.description, "the card says so"
    assert said(fab, tid)[len(before) :] == ["alvis set its priority to urgent (was normal)."]
    assert edited(k) == {}, "handled once"
    assert len(said(fab, tid)) == len(before) + 1


def test_a_due_date_becomes_the_deadline_and_a_cleared_one_none(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    due = clock.now + 2 * DAY
    edit(fab, tid, date_due=format_input_date(due))
    assert edited(k) == {tid: ["amend"]}
    spec = fab.board.read(tid).spec
    assert spec is not None and spec.deadline is not None and abs(spec.deadline - due) < 60
    assert said(fab, tid)[-1].startswith("alvis gave its deadline to ")
    edit(fab, tid, date_due="")
    assert edited(k) == {tid: ["amend"]}
    spec = fab.board.read(tid).spec
    assert spec is not None and spec.deadline is None
    assert said(fab, tid)[-1].startswith("alvis gave it no deadline (was ")


def test_a_missed_deadline_set_on_the_card_is_escalated_once_more(
    local_fabric: Fabric, clock: FakeClock
) -> None:
    """Escalated once for the deadline it was submitted with; a person gives it a new due
    date on the card, which it misses too: escalated again, once."""
    fab = local_fabric
    tid, k = submit(fab, deadline=clock.now + 60)
    clock.advance(120)
    assert k.run_job("deadlines") and tid in k.last["deadlines"].escalated
    edit(fab, tid, date_due=format_input_date(clock.now + 3600))
    assert edited(k) == {tid: ["amend"]}
    assert k.run_job("deadlines") and k.last["deadlines"].escalated == {}, "not due yet"
    clock.advance(7200)
    assert k.run_job("deadlines") and tid in k.last["deadlines"].escalated
    assert k.run_job("deadlines") and k.last["deadlines"].escalated == {}


def test_someone_elses_priority_change_is_put_back_naming_who_may(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    edit(fab, tid, user="elizaveta", priority=0)
    assert edited(k) == {tid: ["amend"]}
    view = fab.board.read(tid)
    assert view.terms is None and view.task.priority == 1, "changes nothing"
    assert (
        said(fab, tid)[-1] == "Only alvis may change this task's priority (elizaveta tried): it stays normal."
    )


def test_a_due_date_that_has_passed_is_put_back(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    edit(fab, tid, date_due=format_input_date(clock.now - DAY))
    assert edited(k) == {tid: ["amend"]}
    view = fab.board.read(tid)
    assert view.terms is None and view.task.due_at == 0
    assert "is no deadline: it stays none. Set one after now." in said(fab, tid)[-1]


def test_a_deputy_may_change_the_priority(local_fabric: Fabric) -> None:
    human = local_fabric.cards.get("alvis").human
    assert human is not None
    human.deputies.append("elizaveta")  # the session's card set: taken out again below
    try:
        tid, k = submit(local_fabric)
        edit(local_fabric, tid, user="elizaveta", priority=2)
        assert edited(k) == {tid: ["amend"]}
        terms = local_fabric.board.read(tid).terms
        assert terms is not None and (terms.priority, terms.by) == (2, "elizaveta")
    finally:
        human.deputies.remove("elizaveta")


def test_a_gates_priority_is_its_persons_to_change(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, target="alvis", actor=GATE_ACTOR)
    edit(fab, tid, user="elizaveta", priority=3)
    assert edited(k) == {tid: ["amend"]}
    assert fab.board.read(tid).task.priority == 1
    assert said(fab, tid)[-1].startswith("Only alvis may change this task's priority (elizaveta tried)")
    edit(fab, tid, priority=3)
    assert edited(k) == {tid: ["amend"]}
    spec = fab.board.read(tid).spec
    assert spec is not None and spec.priority == 3


def test_a_retried_submit_still_finds_a_task_whose_priority_a_person_changed(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, key="weekly-1")
    edit(fab, tid, priority=3)
    assert edited(k) == {tid: ["amend"]}
    again = fab.submit("Summarise the week's notes", target="kimi", actor="alvis", key="weekly-1")
    assert (again.task_id, again.created) == (tid, False)


# -- title, description, assignee ----------------------------------------------------------


def test_a_title_and_description_edit_is_put_back_quoting_the_person(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    drawn = fab.board.read(tid).task
    edit(fab, tid, title="Summarise and email it", description=drawn.description + "\nand email it to Mira")
    assert edited(k) == {tid: ["restore_text"]}
    now = fab.board.read(tid).task
    assert (now.title, now.description) == (drawn.title, drawn.description), "back as the task draws it"
    line = said(fab, tid)[-1]
    assert line.startswith(
        'alvis changed its title to "Summarise and email it"; alvis edited its description:'
    )
    assert "> and email it to Mira" in line
    assert "does not read the card" in line and 'a new card with "+"' in line
    assert edited(k) == {}, "the undo is no edit"


def test_a_reference_edit_is_put_back_so_a_retried_submit_finds_the_task(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, key="weekly-9")
    ref = fab.board.read(tid).task.reference
    edit(fab, tid, reference="mine")
    assert edited(k) == {tid: ["restore_text"]}
    assert fab.board.read(tid).task.reference == ref
    assert said(fab, tid)[-1].startswith(
        "alvis changed its reference (the key a repeated submit finds it by)."
    )
    again = fab.submit("Summarise the week's notes", target="kimi", actor="alvis", key="weekly-9")
    assert (again.task_id, again.created) == (tid, False)


def test_a_question_edited_says_how_to_answer_it(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    fab.ledger.ask(claim(fab, tid), "Which week?", "alvis")
    edit(fab, tid, title="this week")
    assert edited(k) == {tid: ["restore_text"]}
    assert "To answer: write the answer as a comment" in said(fab, tid)[-1]
    assert rec(fab, tid)[0] == State.INPUT_REQUIRED, "an edit is no answer"


def test_a_description_sent_back_with_crlf_is_no_edit(local_fabric: Fabric) -> None:
    """A browser sends a textarea back with CRLF line ends: saving the form to change the
    priority sends the description too."""
    fab = local_fabric
    tid, k = submit(fab)
    text = fab.board.read(tid).task.description
    edit(fab, tid, priority=2, description=text.replace("\n", "\r\n"))
    assert edited(k) == {tid: ["amend"]}
    assert said(fab, tid)[-1] == "alvis set its priority to high (was normal)."


def test_a_reassign_is_put_back_saying_who_may_answer(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, target="alvis")
    users = fab.board.layout.users
    assert fab.board.read(tid).task.owner_id == users["alvis"]
    edit(fab, tid, owner_id=users["elizaveta"])
    assert edited(k) == {tid: ["restore_assignee"]}
    assert fab.board.read(tid).task.owner_id == users["alvis"], "it stays in alvis's My tasks"
    assert said(fab, tid)[-1] == (
        "alvis gave this card to elizaveta; it is back with alvis, whom it waits on. Only alvis may "
        "answer it; to let someone else answer it, alvis names them among the `deputies` of their "
        "human card."
    )
    assert edited(k) == {}


def test_assigning_an_agents_task_to_oneself_is_put_back(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    edit(fab, tid, user="elizaveta", owner_id=fab.board.layout.users["elizaveta"])
    assert edited(k) == {tid: ["restore_assignee"]}
    assert fab.board.read(tid).task.owner_id == 0
    assert said(fab, tid)[-1].endswith("drag the card to their lane in **Queued**.")


def test_a_reassign_to_a_non_member_changes_nothing(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, target="alvis")
    stranger = fab.port.call("createUser", {"username": "g_stranger", "password": "g-pass-1"})
    assert as_person(fab, "alvis").call("updateTask", {"id": tid, "owner_id": stranger}) is False
    assert edited(k) == {}
    assert fab.board.read(tid).task.owner_id == fab.board.layout.users["alvis"]


def test_several_edits_at_once_get_one_comment(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    before = len(said(fab, tid))
    edit(fab, tid, title="renamed", priority=2, owner_id=fab.board.layout.users["alvis"])
    assert edited(k) == {tid: ["amend", "restore_assignee", "restore_text"]}
    assert len(said(fab, tid)) == before + 1
    view = fab.board.read(tid)
    assert (view.task.title, view.task.priority, view.task.owner_id) == ("Summarise the week's notes", 2, 0)


# -- closed cards ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cancel", "verify"])
def test_an_edit_of_a_closed_card_is_put_back(local_fabric: Fabric, how: str) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    if how == "cancel":
        fab.ledger.cancel(tid, "alvis", "not needed")
        state = "canceled"
    else:
        fab.ledger.complete(claim(fab, tid), "file:///r.md")
        fab.ledger.verify(tid, "alvis", "fine")
        state = "verified and closed"
    gestures(k)
    edit(fab, tid, title="again, please", priority=3)
    assert edited(k) == {tid: ["edit_closed"]}
    view = fab.board.read(tid)
    assert (view.task.title, view.task.priority, view.terms) == ("Summarise the week's notes", 1, None)
    assert said(fab, tid)[-1] == (
        f"This task is {state}: its card does not change, so alvis's change of its title and priority "
        "was put back. To do it again, **Duplicate** it: a new task, as you."
    )
    assert not view.is_open


# -- who made the change ---------------------------------------------------------------------


def test_an_agents_own_board_user_makes_no_edit(local_fabric: Fabric) -> None:
    """A confined agent's worker signs in as its own user and writes its card's assignee
    (a question for a person) as that user: Kanboard records it, the keeper reads no edit."""
    fab = local_fabric
    tid, k = submit(fab)
    uid = fab.port.call("getUserByName", {"username": "agap-torgash"})["id"]  # made by `agap init`
    assert fab.port.call("addProjectUser", {"project_id": fab.board.layout.project_id, "user_id": uid})
    agent = LocalPort(as_person(fab, "alvis").api, user_id=int(uid))
    assert agent.call("updateTask", {"id": tid, "owner_id": fab.board.layout.users["alvis"]})
    activity = fab.port.call("getProjectActivity", {"project_id": fab.board.layout.project_id})
    assert activity[0]["event_name"] == "task.assignee_change"
    assert edited(k) == {}


def test_an_edit_is_handled_once_across_a_keeper_restart(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, first = submit(fab)
    edit(fab, tid, title="renamed")  # the webhook is lost: no keeper is listening
    restarted = Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))
    assert edited(restarted) == {tid: ["restore_text"]}
    assert edited(first) == {}, "the other keeper sees it handled"
    assert len([line for line in said(fab, tid) if "renamed" in line]) == 1


# -- Duplicate ---------------------------------------------------------------------------------


def duplicate(fab: Fabric, tid: int, user: str = "elizaveta") -> int:
    """Kanboard's "Duplicate", signed in as ``user``: a copy in the same project."""
    copy = as_person(fab, user).call(
        "duplicateTaskToProject", {"task_id": tid, "project_id": fab.board.layout.project_id}
    )
    assert isinstance(copy, int) and copy > 0
    return copy


def test_a_duplicate_is_the_same_work_submitted_again_by_that_person(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, refs=("https://example.org/notes",), key="weekly-7")
    original = fab.board.read(tid)
    copy = duplicate(fab, tid)
    report = gestures(k)
    new = fab.board.read(report.submitted[copy])
    assert new.spec is not None and original.spec is not None and new.current is not None
    assert (new.spec.intent, new.spec.target, new.spec.refs) == (
        original.spec.intent,
        "kimi",
        ("https://example.org/notes",),
    )
    assert new.spec.actor == "elizaveta" and new.current.state == State.QUEUED
    left = fab.board.read(copy)
    assert not left.is_open and col(fab, copy) == Column.DONE and left.current is None
    assert left.task.reference == "" and fab.board.sealed(left.task.description) is None, "no second original"
    assert said(fab, copy) == [
        f"elizaveta copied task #{tid}: the same work is submitted again as elizaveta, as task "
        f"#{new.id} for kimi. This copy is closed."
    ]
    assert fab.board.find_by_reference(original.task.reference).id == tid  # type: ignore[union-attr]
    assert fab.board.read(tid).current == original.current, "the original is untouched"
    assert gestures(k).submitted == {}, "once"


def test_a_duplicate_drops_a_deadline_that_has_passed(local_fabric: Fabric, clock: FakeClock) -> None:
    fab = local_fabric
    tid, k = submit(fab, deadline=clock.now + 60)
    clock.advance(3600)
    copy = duplicate(fab, tid, user="alvis")
    new = fab.board.read(gestures(k).submitted[copy])
    assert new.spec is not None and new.spec.deadline is None
    assert "its deadline had passed" in said(fab, copy)[0]


@pytest.mark.parametrize("actor", [GATE_ACTOR, KEEPER_ACTOR])
def test_a_duplicate_of_the_fabrics_own_card_is_closed_with_one_comment(
    local_fabric: Fabric, actor: str
) -> None:
    fab = local_fabric
    tid, k = submit(fab, target="alvis", actor=actor)
    copy = duplicate(fab, tid, user="alvis")
    report = gestures(k)
    assert report.submitted == {}
    assert not fab.board.read(copy).is_open
    [line] = said(fab, copy)
    assert (
        line.startswith(f"alvis copied task #{tid}, which is the fabric's own")
        and "nothing is submitted" in line
    )


def test_a_duplicate_of_a_dead_letter_is_seen_in_its_column(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    fab.ledger.fail(claim(fab, tid), "poison", poison=True)
    copy = duplicate(fab, tid, user="alvis")
    assert col(fab, copy) == Column.DEAD
    assert copy in gestures(k).submitted


# -- Move to another project -------------------------------------------------------------------


def elsewhere(fab: Fabric, user: str = "alvis") -> int:
    """A project of the person's own, outside the fabric."""
    pid = fab.port.call("createProject", {"name": "alvis's own"})
    assert fab.port.call(
        "addProjectUser",
        {"project_id": pid, "user_id": fab.board.layout.users[user], "role": "project-member"},
    )
    return int(pid)


def test_a_card_moved_to_another_project_is_brought_back(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab)
    gestures(k)  # the keeper has seen it in the project
    pid = elsewhere(fab)
    assert as_person(fab, "alvis").call("moveTaskToProject", {"task_id": tid, "project_id": pid}) is True
    report = gestures(k)
    assert report.brought_back == [tid]
    now = fab.board.read(tid)
    assert now.task.project_id == fab.board.layout.project_id and col(fab, tid) == Column.QUEUED
    assert now.task.swimlane_id == fab.board.layout.swimlanes["kimi"] and now.is_open
    assert rec(fab, tid)[:2] == (State.QUEUED, "submit"), "its records went and came back untouched"
    assert "To give the work to someone else, drag the card to their lane" in said(fab, tid)[-1]
    assert gestures(k).brought_back == []


def test_a_closed_card_moved_away_comes_back_closed(local_fabric: Fabric) -> None:
    """A closed card is in no search and not watched: the webhook names it."""
    fab = local_fabric
    tid, k = submit(fab)
    gestures(k)
    fab.ledger.cancel(tid, "alvis", "not needed")
    gestures(k)
    pid = elsewhere(fab)
    assert as_person(fab, "alvis").call("moveTaskToProject", {"task_id": tid, "project_id": pid})
    assert fab.board.read(tid).is_open, "Kanboard reopens a card it moves"
    k.note_moved(tid)  # what the keeper's webhook receiver does with task.move.project
    assert gestures(k).brought_back == [tid]
    assert not fab.board.read(tid).is_open and col(fab, tid) == Column.DONE


def another_project(fab: Fabric, cards: CardSet, clock: FakeClock, name: str) -> tuple[Fabric, Keeper]:
    """The fabric on a second project of the same board (as a confined agent's home is),
    with its own locks project, and that project's keeper."""
    port = getattr(fab.port, "inner", fab.port)
    assert isinstance(port, LocalPort)
    settings = Settings(
        cards_dir=ROOT / "cards",
        board_url="local://",
        board_token="x",
        project=name,
        locks_project=f"{name}_locks",
    )
    other = make_fabric(LocalPort(port.api), cards, clock, settings=settings)
    return other, Keeper.for_fabric(other, KeeperConfig(move_tolerance=5.0))


def test_a_card_of_another_fabric_project_moved_here_is_left_to_its_keeper(
    local_fabric: Fabric, cards: CardSet, clock: FakeClock
) -> None:
    """A card moved into a project the fabric also works in (a home) is the keeper's of the
    project it came from: the other keeper neither acts on it nor watches it."""
    fab = local_fabric
    other, theirs = another_project(fab, cards, clock, "g_other")
    tid, k = submit(fab)
    fab.ledger.ask(claim(fab, tid), "Which week?", "alvis")
    gestures(k)
    assert as_person(fab, "alvis").call(
        "moveTaskToProject", {"task_id": tid, "project_id": other.board.layout.project_id}
    )
    report = gestures(theirs)
    assert report.foreign == [tid] and report.acted == {} and report.repaired == [] and report.explained == []
    assert tid not in snapshot.take(other, with_done=True).watched()
    assert gestures(k).brought_back == [tid]
    assert col(fab, tid) == Column.WAITING and rec(fab, tid)[0] == State.INPUT_REQUIRED


def test_a_card_the_webhook_names_is_brought_back_only_by_its_own_projects_keeper(
    local_fabric: Fabric, cards: CardSet, clock: FakeClock
) -> None:
    fab = local_fabric
    home, theirs = another_project(fab, cards, clock, "g_home")
    tid = home.submit("water the plants", target="kimi", actor="alvis").task_id
    gestures(theirs)
    assert as_person(fab, "alvis").call("moveTaskToProject", {"task_id": tid, "project_id": elsewhere(fab)})
    k = Keeper.for_fabric(fab, KeeperConfig(move_tolerance=5.0))
    k.note_moved(tid)  # the main keeper's receiver hears of every move to another project
    assert gestures(k).brought_back == [], "not a task of the work project"
    assert gestures(theirs).brought_back == [tid]
    assert row(fab, tid)["project_id"] == home.board.layout.project_id


def test_a_new_card_moved_away_and_back_before_any_sweep_is_still_this_projects(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid, k = submit(fab, target="alvis")
    pid = elsewhere(fab)
    me = as_person(fab, "alvis")
    assert me.call("moveTaskToProject", {"task_id": tid, "project_id": pid})
    layout = fab.board.layout
    back = {"column_id": layout.columns[Column.WAITING], "swimlane_id": layout.swimlanes["alvis"]}
    assert me.call("moveTaskToProject", {"task_id": tid, "project_id": layout.project_id, **back})
    report = gestures(k)
    assert report.foreign == [], "its uid is bound in this project's locks"
    assert tid in snapshot.take(fab, with_done=True).watched()
    assert col(fab, tid) == Column.WAITING, "its column, back where its record says"
