"""What a Matrix reply says, read as a gesture (keeper.replies.parse), without a homeserver."""

from __future__ import annotations

import pytest

from fabric.kanboard.gestures import Trigger
from keeper.replies import APPROVAL, QUESTION, RESULT, TASK, parse, strip_fallback


@pytest.mark.parametrize(
    ("kind", "text", "trigger", "said"),
    [
        (QUESTION, "the homelab one", Trigger.TO_QUEUED, "the homelab one"),
        (QUESTION, "Answer: main", Trigger.TO_QUEUED, "main"),
        (APPROVAL, "Approve, the sources are fine", Trigger.TO_DONE, "the sources are fine"),
        (APPROVAL, "yes", Trigger.TO_DONE, ""),
        (APPROVAL, "refuse: the notes are private", Trigger.CLOSE, "the notes are private"),
        (APPROVAL, "no", Trigger.CLOSE, ""),
        (TASK, "done: bought it", Trigger.CLOSE, "bought it"),
        (TASK, "done", Trigger.TO_DONE, ""),
        (TASK, "dismiss", Trigger.CLOSE, ""),
        (RESULT, "accept", Trigger.CLOSE, ""),
        (RESULT, "send back: the NAS is missing", Trigger.TO_QUEUED, "the NAS is missing"),
        (RESULT, "reopen the totals are wrong", Trigger.TO_QUEUED, "the totals are wrong"),
    ],
)
def test_a_reply_reads_as_one_gesture(kind: str, text: str, trigger: Trigger, said: str) -> None:
    intent = parse(kind, text)
    assert intent is not None and (intent.trigger, intent.text) == (trigger, said)


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (APPROVAL, "maybe after lunch"),
        (APPROVAL, "noted"),  # not "no"
        (RESULT, "send back"),  # a reason is due
        (RESULT, "sendbacks"),
        (TASK, ""),
        (QUESTION, "   "),
        ("", "approve"),  # a task that takes no answer
    ],
)
def test_a_reply_that_does_not_say_is_none(kind: str, text: str) -> None:
    assert parse(kind, text) is None


def test_the_quoted_fallback_is_not_the_reply() -> None:
    body = "> <@agap-bot:localhost> Waiting on you: #3 publish\n> more\n\nrefuse: private"
    assert strip_fallback(body) == "refuse: private"
    assert strip_fallback("approve") == "approve"
