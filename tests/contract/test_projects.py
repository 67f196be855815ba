"""Projects, columns and swimlanes."""

from __future__ import annotations

from tests.contract.conftest import Board, Project, same


def test_new_project_layout(board: Board, project: Project) -> None:
    assert list(project.columns) == ["Backlog", "Ready", "Work in progress", "Done"]
    lanes = board.call("getActiveSwimlanes", [project.id])
    assert [lane["name"] for lane in lanes] == ["Default swimlane"]
    got = board.call("getProjectById", [project.id])
    assert got["name"] == project.name and same(got["is_active"], board.flag(1))
    assert (got["priority_default"], got["priority_start"], got["priority_end"]) == (0, 0, 3)
    assert got["identifier"] == "" and got["description"] is None
    assert (got["start_date"], got["end_date"]) == ("", "")
    assert set(got["url"]) == {"board", "list"}


def test_project_lookups(board: Board) -> None:
    ident = board.unique("P").replace("-", "").upper()
    name = board.unique("named")
    pid = board.call("createProject", {"name": name, "identifier": ident.lower()})
    assert isinstance(pid, int) and pid > 0
    assert board.call("getProjectById", [pid])["identifier"] == ident
    assert board.call("getProjectByName", [name])["id"] == pid
    upper = board.call("getProjectByName", [name.upper()])
    assert (upper["id"] == pid) if board.ci else (upper is False)
    assert board.call("getProjectByName", [board.unique("none")]) is False
    assert board.call("getProjectByIdentifier", [ident.lower()])["id"] == pid
    assert board.call("getProjectByIdentifier", [ident + "X"]) is False
    assert board.call("createProject", {"name": "x", "identifier": ident}) is False
    assert board.call("createProject", {"name": "x", "identifier": "bad-id"}) is False
    assert board.call("createProject", {"name": ""}) is False
    assert board.call("createProject", {"name": "n" * 65536}) is False  # at most 65535
    dup = board.call("createProject", {"name": name})  # names are not unique
    assert isinstance(dup, int) and dup not in (0, pid)
    assert board.call("getProjectById", [2_000_000_000]) is None


def test_remove_project(board: Board) -> None:
    pid = board.call("createProject", {"name": board.unique()})
    assert board.call("removeProject", [pid]) is True
    assert board.call("removeProject", [pid]) is False
    assert board.call("getProjectById", [pid]) is None


def test_add_column_and_swimlane_duplicates(board: Board, project: Project) -> None:
    col = board.call("addColumn", [project.id, "Review"])
    assert isinstance(col, int) and col > 0
    assert board.call("addColumn", [project.id, "Review"]) is False
    assert board.call("addColumn", [project.id, "Ready"]) is False
    assert board.call("getColumn", [col])["position"] == 5
    lane = board.call("addSwimlane", [project.id, "Express"])
    assert isinstance(lane, int) and lane > 0
    assert board.call("addSwimlane", [project.id, "Express"]) is False
    assert board.call("getSwimlaneByName", [project.id, "Express"])["id"] == lane
    lower = board.call("getSwimlaneByName", [project.id, "express"])
    assert (lower["id"] == lane) if board.ci else (lower is None)
    second = board.call("addSwimlane", [project.id, "express"])
    assert (second is False) if board.ci else (isinstance(second, int) and second not in (0, lane))
    task = project.task(column_id=col, swimlane_id=lane)
    got = board.call("getTask", [task])
    assert (got["column_id"], got["swimlane_id"]) == (col, lane)
    assert board.call("removeColumn", [col]) is False  # it holds a task


def test_project_metadata(board: Board, project: Project) -> None:
    # Workers publish their queue's park state here; it must behave like task metadata.
    assert board.call("getProjectMetadata", [project.id]) == {}
    assert (
        board.call("saveProjectMetadata", {"project_id": project.id, "values": {"a": "1", "b": 2, "z": None}})
        is True
    )
    assert board.call("getProjectMetadata", [project.id]) == {"a": "1", "b": "2", "z": None}
    assert board.call("getProjectMetadataByName", [project.id, "a"]) == "1"
    assert board.call("getProjectMetadataByName", [project.id, "nope"]) == ""
    assert board.call("saveProjectMetadata", {"project_id": 987654, "values": {"a": "1"}}) is False
    assert board.call("removeProjectMetadata", [project.id, "a"]) is True
    assert board.call("removeProjectMetadata", [project.id, "a"]) is False
    assert board.call("getProjectMetadata", [987654]) == {}


def _lanes(board: Board, project: Project, method: str = "getAllSwimlanes") -> list[tuple[str, int, bool]]:
    return [
        (s["name"], int(s["position"]), bool(int(s["is_active"]))) for s in board.call(method, [project.id])
    ]


def test_disable_and_enable_a_swimlane(board: Board, project: Project) -> None:
    """`agap init` hides lanes nobody uses (Kanboard's "Default swimlane"): a disabled lane
    drops to position 0 and out of the active ones, the rest renumber from 1, and a task
    created without a lane lands in the first active one."""
    default = board.call("getSwimlaneByName", [project.id, "Default swimlane"])["id"]
    first = board.call("addSwimlane", [project.id, "first"])
    board.call("addSwimlane", [project.id, "second"])
    assert board.call("disableSwimlane", [project.id, default]) is True
    assert board.call("disableSwimlane", [project.id, default]) is True  # already disabled
    assert _lanes(board, project) == [
        ("Default swimlane", 0, False),
        ("first", 1, True),
        ("second", 2, True),
    ]
    assert [n for n, _, _ in _lanes(board, project, "getActiveSwimlanes")] == ["first", "second"]
    assert board.call("getTask", [project.task()])["swimlane_id"] == first
    # True whatever matched: a missing lane, another project's lane.
    assert board.call("disableSwimlane", [project.id, 2_000_000]) is True
    assert board.call("disableSwimlane", [project.id + 100_000, first]) is True
    assert _lanes(board, project)[1] == ("first", 1, True)
    assert board.call("enableSwimlane", [project.id, default]) is True
    assert _lanes(board, project)[-1] == ("Default swimlane", 3, True)
    assert board.call("enableSwimlane", [project.id, 2_000_000]) is True
