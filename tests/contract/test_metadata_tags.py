"""Metadata, tags (and the createTag race the epoch ledger stands on), comments, files."""

from __future__ import annotations

import threading
from typing import Any

from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import RpcError
from tests.contract.conftest import Board, Project, b64, make_project


def test_metadata_round_trip(board: Board, project: Project) -> None:
    task = project.task()
    assert board.call("getTaskMetadata", [task]) == {}
    assert (
        board.call("saveTaskMetadata", [task, {"a": "1", "num": 42, "flag": True, "off": False, "flt": 1.5}])
        is True
    )
    assert board.call("getTaskMetadata", [task]) == {
        "a": "1",
        "num": "42",
        "flag": "1",
        "off": "",
        "flt": "1.5",
    }
    assert board.call("saveTaskMetadata", [task, {"a": "2", "b": "x"}]) is True  # upsert
    meta = board.call("getTaskMetadata", [task])
    assert (meta["a"], meta["b"], meta["num"]) == ("2", "x", "42")
    assert board.call("getTaskMetadataByName", [task, "b"]) == "x"
    assert board.call("saveTaskMetadata", [task, {}]) is True
    assert board.call("saveTaskMetadata", [2_000_000_000, {"a": "1"}]) is False


def test_metadata_quirks(board: Board, project: Project) -> None:
    task = project.task()
    board.call("saveTaskMetadata", [task, {"zero": "0", "lst": [1, 2], "nul": None}])
    meta = board.call("getTaskMetadata", [task])
    assert (meta["zero"], meta["lst"], meta["nul"]) == ("0", "Array", None)
    # ByName answers "" for a missing key and for a stored "0".
    assert board.call("getTaskMetadataByName", [task, "missing"]) == ""
    assert board.call("getTaskMetadataByName", [task, "zero"]) == ""
    board.call("saveTaskMetadata", [task, ["a", "b"]])  # a list stores keys "0", "1"
    meta = board.call("getTaskMetadata", [task])
    assert (meta["0"], meta["1"]) == ("a", "b")
    assert board.call("removeTaskMetadata", [task, "zero"]) is True
    assert board.call("removeTaskMetadata", [task, "zero"]) is False


def test_metadata_write_does_not_bump_modification(board: Board, project: Project) -> None:
    task = project.task()
    before = board.call("getTask", [task])["date_modification"]
    board.call("saveTaskMetadata", [task, {"k": "v"}])
    assert board.call("getTask", [task])["date_modification"] == before


def test_create_tag_is_unique_per_project(board: Board, project: Project) -> None:
    other = make_project(board)
    name = board.unique("Tag")
    first = board.call("createTag", [project.id, name])
    assert isinstance(first, int) and first > 0
    assert board.call("createTag", [project.id, name]) is False
    lower = board.call("createTag", [project.id, name.lower()])
    if board.ci:  # MySQL's collation: "Tag-x" and "tag-x" are one name
        assert lower is False
        names, ids = [name], {first}
    else:
        assert isinstance(lower, int) and lower not in (0, first)
        names, ids = sorted([name, name.lower()]), {first, lower}
    elsewhere = board.call("createTag", [other.id, name])
    assert isinstance(elsewhere, int) and elsewhere not in (0, first, lower)
    tags = board.call("getTagsByProject", [project.id])
    assert sorted(t["name"] for t in tags) == names
    assert {t["id"] for t in tags} == ids
    assert all(t["project_id"] == project.id and t["color_id"] is None for t in tags)


def test_global_tags_are_not_in_get_tags_by_project(board: Board, project: Project) -> None:
    name = board.unique("global")
    tag = board.call("createTag", [0, name])
    try:
        assert isinstance(tag, int) and tag > 0
        assert name not in [t["name"] for t in board.call("getTagsByProject", [project.id])]
        assert name in [t["name"] for t in board.call("getAllTags")]
    finally:
        board.call("removeTag", [tag])


def test_remove_and_update_tag(board: Board, project: Project) -> None:
    a = board.call("createTag", [project.id, "a"])
    b = board.call("createTag", [project.id, "b"])
    assert board.call("updateTag", [b, "a"]) is False  # clash
    assert board.call("updateTag", [b, "c", "red"]) is True
    assert [(t["name"], t["color_id"]) for t in board.call("getTagsByProject", [project.id])] == [
        ("a", None),
        ("c", "red"),
    ]
    assert board.call("removeTag", [a]) is True
    assert board.call("removeTag", [a]) is False


def test_task_tags(board: Board, project: Project) -> None:
    task = project.task(tags=["backend", "docs"])
    assert sorted(board.call("getTaskTags", [task]).values()) == ["backend", "docs"]
    assert board.call("setTaskTags", [project.id, task, ["docs", "ops"]]) is True
    tags = board.call("getTaskTags", [task])
    assert sorted(tags.values()) == ["docs", "ops"]
    ids = {t["name"]: t["id"] for t in board.call("getTagsByProject", [project.id])}
    assert tags == {str(ids["docs"]): "docs", str(ids["ops"]): "ops"}
    assert board.call("setTaskTags", [project.id, task, []]) is True
    assert board.call("getTaskTags", [task]) == {}
    assert board.call("setTaskTags", [project.id, 2_000_000_000, ["x"]]) is False
    assert board.call("getTaskTags", [2_000_000_000]) == {}


def race_create_tags(
    clients: list[KanboardClient], project_id: int, names: list[str]
) -> tuple[list[Any], list[int], list[RpcError]]:
    """Client i creates tag names[i], all released at once: (results, ids, errors)."""
    barrier = threading.Barrier(len(names))
    results: list[Any] = [None] * len(names)

    def race(i: int) -> None:
        barrier.wait()
        try:
            results[i] = clients[i].call("createTag", [project_id, names[i]])
        except RpcError as exc:
            results[i] = exc

    workers = [threading.Thread(target=race, args=(i,)) for i in range(len(names))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ids = [r for r in results if isinstance(r, int) and not isinstance(r, bool)]
    return results, ids, [r for r in results if isinstance(r, RpcError)]


def test_create_tag_race_has_one_winner(board: Board, project: Project) -> None:
    threads, trials = 8, 30
    clients = [KanboardClient(board.url, board.token, timeout=60) for _ in range(threads)]
    try:
        for trial in range(trials):
            name = f"lock-{trial}"
            results, ids, errors = race_create_tags(clients, project.id, [name] * threads)
            assert all(r is False or r in ids or r in errors for r in results), results
            # A real Kanboard on SQLite with several PHP workers may answer
            # "database is locked" (code 0) to some callers; never two winners.
            assert all(e.code == 0 for e in errors), errors
            if board.is_real:
                assert len(ids) <= 1, results
            else:
                assert len(ids) == 1 and not errors, results
            tags = [t for t in board.call("getTagsByProject", [project.id]) if t["name"] == name]
            assert len(tags) == 1, tags
            if ids:
                assert tags[0]["id"] == ids[0]
    finally:
        for c in clients:
            c.close()


def test_create_tag_race_across_case(board: Board, project: Project) -> None:
    """Racers spell one lock name differently: MySQL's collation makes it one name."""
    spellings = ["case-lock-{}", "CASE-LOCK-{}", "Case-Lock-{}", "case-lock-{} "]
    clients = [KanboardClient(board.url, board.token, timeout=60) for _ in spellings]
    try:
        for trial in range(10):
            results, ids, errors = race_create_tags(clients, project.id, [s.format(trial) for s in spellings])
            assert all(e.code == 0 for e in errors) and (board.is_real or not errors), results
            if board.ci:  # one winner (none only if SQL errors took every turn)
                assert len(ids) <= 1 and (len(ids) == 1 or errors), results
            else:  # four names, four winners: nobody is refused
                assert len(ids) + len(errors) == len(spellings), results
    finally:
        for c in clients:
            c.close()


def test_comments_in_creation_order(board: Board, project: Project) -> None:
    task = project.task()
    ids = [board.call("createComment", [task, 0, f"comment {i}"]) for i in range(5)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    comments = board.call("getAllComments", [task])
    assert [c["id"] for c in comments] == ids
    assert [c["comment"] for c in comments] == [f"comment {i}" for i in range(5)]
    assert all(c["task_id"] == task and c["user_id"] == 0 and c["username"] is None for c in comments)
    one = board.call("getComment", [ids[0]])
    assert one["comment"] == "comment 0" and one["reference"] == ""
    assert board.call("createComment", [task, 0, ""]) is False
    assert board.call("createComment", [task, 0, "x", "", "bogus"]) is False
    assert board.call("createComment", [2_000_000_000, 0, "x"]) is False
    assert isinstance(board.call("createComment", [task, 0, "x", "r", "app-manager"]), int)
    assert board.call("getAllComments", [2_000_000_000]) == []
    assert board.call("getComment", [2_000_000_000]) is None


def test_files_round_trip(board: Board, project: Project) -> None:
    task = project.task()
    payload = bytes(range(256)) * 3
    file_id = board.call("createTaskFile", [project.id, task, "data.bin", b64(payload)])
    assert isinstance(file_id, int) and file_id > 0
    assert board.call("downloadTaskFile", [file_id]) == b64(payload)
    files = board.call("getAllTaskFiles", [task])
    assert [(f["id"], f["name"], f["size"], f["task_id"]) for f in files] == [
        (file_id, "data.bin", len(payload), task)
    ]
    assert isinstance(files[0]["etag"], str)
    assert board.call("getTaskFile", [file_id])["name"] == "data.bin"
    other = make_project(board)
    assert board.call("createTaskFile", [other.id, task, "x.txt", b64(b"x")]) is False
    assert board.call("createTaskFile", [project.id, 2_000_000_000, "x.txt", b64(b"x")]) is False
    assert board.call("removeTaskFile", [file_id]) is True
    assert board.call("getAllTaskFiles", [task]) == []
    assert board.call("downloadTaskFile", [file_id]) == ""
