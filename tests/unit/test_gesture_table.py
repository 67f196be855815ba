"""One gesture table drives the keeper, the cards, the put-back comment and the docs."""

from __future__ import annotations

from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.kanboard import gestures as table
from fabric.kanboard.cardtext import asked
from fabric.task import GATE_ACTOR, Record, State, TaskSpec
from keeper import edits
from keeper.gestures import HANDLERS
from tests.conftest import ROOT

# Handlers the gesture sweep does not look up: "+" cards and copies (keeper.handmade), the
# put-backs, and a card brought back from another project (keeper.gestures does both).
ELSEWHERE = {"handmade", "duplicate", "put_back", "bring_back"}


def test_every_rule_has_its_handler_and_every_handler_a_rule() -> None:
    named = {r.handler for r in table.GESTURES}
    assert named - ELSEWHERE == set(HANDLERS) | set(edits.HANDLERS)
    assert not set(HANDLERS) & set(edits.HANDLERS)


def test_the_design_and_policy_tables_are_the_generated_one() -> None:
    text = CliRunner().invoke(main, ["config", "gestures"]).output
    assert text == table.markdown()
    for doc in ("docs/DESIGN.md", "docs/POLICY.md"):
        assert text in (ROOT / doc).read_text(encoding="utf-8"), (
            f"{doc}'s gesture table is stale: paste the output of `agap config gestures` over it"
        )


def test_the_put_back_comment_lists_every_gesture_that_means_something() -> None:
    comment = table.help_text("Queued")
    assert all(r.help in comment for r in table.GESTURES if r.help)
    assert "(Queued)" in comment


def _spec(actor: str = "cli") -> TaskSpec:
    return TaskSpec(intent="do it", target="alvis", queue="alvis", actor=actor)


def _record(state: State, assignee: str | None = "alvis") -> Record:
    return Record(epoch=1, state=state, op="x", by="y", at=0.0, assignee=assignee, reason="why")


def test_a_card_offers_the_rules_that_answer_it() -> None:
    gate = "\n".join(asked(_spec(GATE_ACTOR), _record(State.QUEUED)))
    assert "Approve: drag this card to **Done**." in gate and "Refuse:" in gate and "Not doing it" not in gate
    task = "\n".join(asked(_spec(), _record(State.QUEUED)))
    assert "Done: drag this card to **Done**." in task and "Not doing it" in task and "Refuse:" not in task
    done = "\n".join(asked(_spec(), _record(State.DONE)))
    assert "Accept the result" in done and "Send it back" in done
    dead = "\n".join(asked(_spec(), _record(State.DEAD, None)))
    assert "Retry it as it is" in dead and "Drop it" in dead
    question = "\n".join(asked(_spec(), _record(State.INPUT_REQUIRED)))
    assert "To answer: write the answer as a comment" in question
