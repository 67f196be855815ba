"""The keeper draws the cards a writer without the seal key left as they were submitted
(a confined agent's worker: :meth:`TaskBoard.redraw`), and never leaves one drawn for a
state its task has already left."""

from __future__ import annotations

from fabric.core import Fabric
from fabric.kanboard.card import readable
from fabric.kanboard.cardtext import shows
from fabric.kanboard.taskboard import TaskBoard
from fabric.ledger import Ledger
from fabric.task import State


def unsealed(fab: Fabric) -> Ledger:
    """A ledger on the same board that cannot draw cards (as a confined worker's)."""
    return Ledger(TaskBoard(fab.port, fab.board.layout, clock=fab.clock), clock=fab.clock)


def test_a_card_left_as_submitted_is_drawn_once(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("Price a kettle", target="kimi").task_id
    submitted = fab.board.read(tid).task.description
    worker = unsealed(fab)
    lease = worker.claim(fab.board.read(tid), "w1", lease_seconds=60)
    worker.ask(lease, "Which brand?", "alvis")
    view = fab.board.read(tid)
    assert view.task.description == submitted
    assert view.current is not None and view.spec is not None
    assert not shows(view.spec, view.current, view.task.description)
    # A board without the key draws nothing: it could not seal what it wrote.
    assert TaskBoard(fab.port, fab.board.layout).redraw([view]) == []
    assert fab.board.redraw([view]) == [tid]
    text = readable(fab.board.read(tid).task.description)
    assert text.startswith("**Question for @alvis:** Which brand?")
    assert fab.board.sealed(fab.board.read(tid).task.description) is not None
    assert fab.board.redraw([fab.board.read(tid)]) == [], "drawn once"
    fab.port.stats.reset()
    assert fab.board.redraw([fab.board.read(tid)]) == [] and fab.port.stats.trips == 1  # the read only


def test_a_transition_that_lands_meanwhile_is_drawn_at_once(local_fabric: Fabric) -> None:
    """The keeper's view says done; the task was verified since (by a writer that could
    not draw it): the redraw of the done card is replaced by the closed one at once."""
    fab = local_fabric
    tid = fab.submit("Price a kettle", target="kimi").task_id
    worker = unsealed(fab)
    lease = worker.claim(fab.board.read(tid), "w1", lease_seconds=60)
    worker.complete(lease, "https://example.org/kettles")
    stale = fab.board.read(tid)
    assert stale.current is not None and stale.current.state == State.DONE
    worker.verify(tid, "alvis")
    assert fab.board.redraw([stale]) == [tid]
    text = readable(fab.board.read(tid).task.description)
    assert "please verify" not in text and "**Result:** [https://example.org/kettles]" in text


def test_a_sealed_writers_cards_are_never_redrawn(local_fabric: Fabric) -> None:
    fab = local_fabric
    tid = fab.submit("Price a kettle", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=60)
    fab.ledger.complete(lease, "https://example.org/kettles")
    assert fab.board.redraw([fab.board.read(tid)]) == []
