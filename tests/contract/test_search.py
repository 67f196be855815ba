"""searchTasks: the filters and combination rules the fabric's queries use."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.conftest import Board, Project


@pytest.fixture
def searchable(board: Board, project: Project) -> dict[str, Any]:
    name = board.unique("alice").replace("-", "")
    user = board.call("createUser", {"username": name, "password": "secret12", "name": "Alice Example"})
    board.call("addProjectUser", [project.id, user])
    lane = board.call("addSwimlane", [project.id, "Lane_B"])
    ids = {
        "login": project.task(
            "Fix login bug",
            reference="GH-101",
            owner_id=user,
            tags=["backend", "docs"],
            priority=2,
            description="the login form",
        ),
        "docs": project.task(
            "Write docs", reference="gh-102", tags=["docs"], column_id=project.column("Ready")
        ),
        "lane": project.task("In lane B", reference="A_B", swimlane_id=lane, priority=1),
        "closed": project.task("Old thing", column_id=project.column("Work in progress")),
    }
    board.call("closeTask", [ids["closed"]])
    return {"ids": ids, "user": name}


def _search(board: Board, project: Project, ids: dict[str, int], query: str) -> list[str]:
    names = {v: k for k, v in ids.items()}
    result = board.call("searchTasks", [project.id, query])
    assert isinstance(result, list)
    return sorted(names[t["id"]] for t in result)


CASES = [
    ("status:open", ["docs", "lane", "login"]),
    ("status:closed", ["closed"]),
    ("STATUS:open", ["docs", "lane", "login"]),
    ("status:Open", ["closed", "docs", "lane", "login"]),  # value case-sensitive: no filter
    ("status: open", []),  # the value must be adjacent; "open" becomes a title word
    ("column:Ready", ["docs"]),
    ("column:ready", []),  # exact and case-sensitive (not on MySQL: see CI_CASES)
    ('column:"Work in progress"', ["closed"]),
    ("column:Ready column:Backlog", ["docs", "lane", "login"]),  # same attribute: OR
    ("swimlane:lane_b", ["lane"]),  # LIKE without %: exact, case-insensitive
    ("swimlane:Lane", []),
    ('swimlane:"Default swimlane"', ["closed", "docs", "login"]),
    ("assignee:nobody", ["closed", "docs", "lane"]),
    ("assignee:anybody", ["login"]),
    ("assignee:me", ["closed", "docs", "lane"]),  # app token: no current user
    ('assignee:"Alice Example"', ["login"]),
    ("tag:back", ["login"]),  # substring
    ("tag:DOCS", ["docs", "login"]),
    ("tag:none", ["closed", "lane"]),
    ("tag:backend tag:docs", ["docs", "login"]),
    ("tag:docs status:open column:Ready", ["docs"]),  # different attributes: AND
    ("priority:2", ["login"]),
    ("priority:>=1", ["lane", "login"]),
    ("priority:<2", ["closed", "docs", "lane"]),
    ("ref:gh-101", ["login"]),  # case-insensitive LIKE
    ("ref:GH-*", ["docs", "login"]),
    ("ref:GH", []),  # no implicit wildcard
    ("ref:A%", ["lane"]),
    ("ref:none", ["closed"]),
    ("reference:*-102", ["docs"]),
    ("login bug", ["login"]),  # bare words: one phrase
    ("bug login", []),
    ("login status:open", ["login"]),
    ("status:open login", ["login"]),
    ("description:LOGIN", ["login"]),
    ("title:docs", ["docs"]),
    ("foo:bar", []),  # unknown attribute: title text
]


# What MySQL's collation (utf8mb4_unicode_ci) answers differently: `=` ignores case.
CI_CASES = {"column:ready": ["docs"]}


@pytest.mark.parametrize(("query", "expected"), CASES, ids=[c[0] for c in CASES])
def test_search(
    board: Board, project: Project, searchable: dict[str, Any], query: str, expected: list[str]
) -> None:
    if board.ci:
        expected = CI_CASES.get(query, expected)
    assert _search(board, project, searchable["ids"], query) == expected


def test_search_by_assignee_username_substring(
    board: Board, project: Project, searchable: dict[str, Any]
) -> None:
    ids = searchable["ids"]
    assert _search(board, project, ids, "assignee:" + searchable["user"][2:-2].upper()) == ["login"]
    assert _search(board, project, ids, "assignee:nobody assignee:" + searchable["user"]) == [
        "closed",
        "docs",
        "lane",
        "login",
    ]


def test_search_by_id(board: Board, project: Project, searchable: dict[str, Any]) -> None:
    ids = searchable["ids"]
    for query in (f"#{ids['docs']}", str(ids["docs"])):
        assert "docs" in _search(board, project, ids, query)


def test_search_item_fields(board: Board, project: Project, searchable: dict[str, Any]) -> None:
    [item] = board.call("searchTasks", [project.id, "ref:GH-101"])
    assert "url" not in item and "color" not in item
    assert item["id"] == searchable["ids"]["login"]
    assert item["assignee_username"] == searchable["user"]
    assert item["assignee_name"] == "Alice Example"
    assert item["column_name"] == "Backlog" and item["swimlane_name"] == "Default swimlane"
    assert item["project_name"] == project.name
    assert item["nb_comments"] == 0 and item["nb_files"] == 0
    [other] = board.call("searchTasks", [project.id, "ref:gh-102"])
    assert other["assignee_username"] is None and other["column_name"] == "Ready"


def test_search_missing_project_is_empty(board: Board) -> None:
    assert board.call("searchTasks", [2_000_000_000, "status:open"]) == []
