"""MCP task handles: unguessable, bound to the caller, and refused whole when malformed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.apps.mcp.handles import (
    HandleNotFound,
    TaskHandles,
    answer_key,
    checked_answer,
    make_handle,
    parse_handle,
    verify,
)
from fabric.core import Fabric
from fabric.errors import InvalidInput
from fabric.kanboard.views import TaskView
from tests.unit.test_mcp_units import submit, tools_for

KEY = b"k" * 32


def view(task_id: int = 7, uid: str = "u-1") -> TaskView:
    return cast(TaskView, SimpleNamespace(id=task_id, uid=uid))


def test_a_handle_verifies_for_its_caller_only() -> None:
    v = view()
    text = make_handle(KEY, "claude-coder|stdio", v)
    handle = parse_handle(text)
    verify(KEY, "claude-coder|stdio", handle, v, text)
    for identity, key, other in (
        ("researcher|stdio", KEY, v),  # another caller
        ("claude-coder|stdio", b"x" * 32, v),  # another server's key
        ("claude-coder|stdio", KEY, view(uid="u-2")),  # the id reused by another task
    ):
        with pytest.raises(HandleNotFound):
            verify(key, identity, handle, other, text)


def test_the_question_handle_names_its_epoch() -> None:
    text = make_handle(KEY, "a|b", view(), "a", 3)
    assert parse_handle(text).kind == "a" and parse_handle(text).epoch == 3
    assert text != make_handle(KEY, "a|b", view(), "a", 4)


@given(st.text(max_size=90))
def test_anything_else_is_not_found(text: str) -> None:
    if text.startswith("agap-"):
        return  # a well-formed one is refused by verify, above
    with pytest.raises(HandleNotFound):
        parse_handle(text)


@pytest.mark.parametrize(
    "response",
    [
        None,
        "yes",
        {"action": "maybe"},
        {"action": "accept"},
        {"action": "accept", "content": {"answer": "  "}},
        {"action": "accept", "content": {"answer": 3}},
        {"action": "accept", "content": "blue"},
    ],
)
def test_a_malformed_answer_is_refused(response: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        checked_answer(response, answer_key(2))
    assert info.value.where == "inputResponses.answer-2"


def test_an_answer_or_a_decline() -> None:
    assert checked_answer({"action": "accept", "content": {"answer": " blue "}}, "k") == "blue"
    assert checked_answer({"action": "decline"}, "k") is None
    assert checked_answer({"action": "cancel"}, "k") is None


def test_poll_interval_follows_the_workers_wake_up_path(local_fabric: Fabric) -> None:
    """The target worker's poll_seconds; a second while live events wake it; the deadline
    is the ttl, from the submit."""
    tools = tools_for(local_fabric, "claude-coder")
    tid = submit(local_fabric, deadline="+2h")
    polled = TaskHandles(tools, KEY).issue("c|stdio", tid)
    live = TaskHandles(tools, KEY, live=True).issue("c|stdio", tid)
    assert polled["pollIntervalMs"] == local_fabric.cards.get("claude-coder").runtime.poll_seconds * 1000
    assert live["pollIntervalMs"] == 1000
    assert polled["status"] == live["status"] == "working"
    assert polled["ttlMs"] == 2 * 3600 * 1000
    assert polled["taskId"] != TaskHandles(tools, KEY).issue("other|stdio", tid)["taskId"]
