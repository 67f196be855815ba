"""Unit tests of the embedded board's pieces that the contract suite cannot reach."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from fabric.embedded import store as store_module
from fabric.embedded.php import Fatal, base64_decode
from fabric.embedded.procedures import base as registry
from fabric.embedded.rpc import BoardApi
from fabric.embedded.search import tokenize
from fabric.embedded.store import Store, StoreError, as_dict
from fabric.kanboard.dates import BadDate, parse_input_date


@pytest.fixture
def api(tmp_path: Path) -> BoardApi:
    return BoardApi(Store(tmp_path / "b.sqlite3"), "tok", clock=lambda: 1_800_000_000.0)


def rpc(api: BoardApi, method: str, params: Any = None) -> Any:
    reply = api.handle({"jsonrpc": "2.0", "method": method, "id": 1, "params": params})
    return reply.get("result", reply.get("error"))


def test_new_board_has_admin_user_1(api: BoardApi) -> None:
    admin = rpc(api, "getUser", [1])
    assert (admin["username"], admin["role"], admin["name"], admin["email"]) == (
        "admin",
        "app-admin",
        None,
        None,
    )


def test_ids_are_reused_like_kanboard(api: BoardApi) -> None:
    pid = rpc(api, "createProject", ["p"])
    t1 = rpc(api, "createTask", ["a", pid])
    assert rpc(api, "removeTask", [t1]) is True
    assert rpc(api, "createTask", ["b", pid]) == t1
    assert rpc(api, "removeProject", [pid]) is True
    assert rpc(api, "createProject", ["q"]) == pid


def test_sql_error_is_a_code_0_error(api: BoardApi, monkeypatch: pytest.MonkeyPatch) -> None:
    def locked(*_: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    spec = registry.REGISTRY["getTimezone"]
    monkeypatch.setitem(
        registry.REGISTRY,
        "getTimezone",
        registry.ProcedureSpec(locked, spec.names, spec.defaults, spec.required),
    )
    err = rpc(api, "getTimezone")
    assert err["code"] == 0 and err["message"].endswith("database is locked")


def test_type_errors_are_fatal(api: BoardApi) -> None:
    pid = rpc(api, "createProject", ["p"])
    with pytest.raises(Fatal):
        rpc(api, "createTask", {"title": "x", "project_id": pid, "tags": "a"})
    with pytest.raises(Fatal):
        rpc(api, "createTask", {"title": "x", "project_id": pid, "tags": None})


def test_old_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreError):
        Store(path)


def test_reopening_a_board_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    first = BoardApi(Store(path), "tok")
    pid = rpc(first, "createProject", ["kept"])
    first.store.close()
    again = BoardApi(Store(path), "tok")
    assert rpc(again, "getProjectById", [pid])["name"] == "kept"


@pytest.mark.parametrize(
    ("query", "groups"),
    [
        ("status:open", {"status": ["open"]}),
        ("STATUS:open", {"status": ["open"]}),
        ("status: open", {"title": ["open"]}),
        ("login tag:backend style", {"tag": ["backend"], "title": ["login  style"]}),
        ('column:"Work in progress" x', {"column": ["Work in progress"], "title": ["x"]}),
        ("column:Work in progress", {"column": ["Work"], "title": ["in progress"]}),
        ("ref:a reference:b", {"ref": ["a"], "reference": ["b"]}),
        ("priority:>=2 priority:<1", {"priority": [">=2", "<1"]}),
        ("foo:bar", {"title": ["foo:bar"]}),
        ("title:a b", {"title": ["b"]}),  # the free text replaces title: values
    ],
)
def test_search_lexer(query: str, groups: dict[str, list[str]]) -> None:
    assert tokenize(query) == groups


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01 10:00", 1796119200),
        ("12/01/2026 10:00", 1796119200),
        ("2026_12_01 10:00", 1796119200),
        ("2026-12-1 9:05", 1796115900),
        ("", 0),
        (None, 0),
    ],
)
def test_dates(text: object, expected: int) -> None:
    assert parse_input_date(text, now=0) == expected


def test_date_only_keeps_the_time_of_day() -> None:
    assert parse_input_date("2026-12-01", now=3600 * 5 + 7) == 1796083200 + 3600 * 5 + 7


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T10:00",
        "2026-12-01 10:00:00",
        "1764583200",
        1764583200,
        0,
        "0",
        "2026-02-30",
        "1970-01-01 00:00",
        "2026-12-01 24:00",
    ],
)
def test_bad_dates(text: object) -> None:
    with pytest.raises(BadDate):
        parse_input_date(text, now=0)


@pytest.mark.parametrize(
    ("text", "data"),
    [
        ("aGVsbG8=", b"hello"),
        ("aGVsbG8", b"hello"),
        ("!!bm90YmFzZTY0", b"notbase64"),
        ("", b""),
        ("a", b""),
    ],
)
def test_php_base64_decode(text: str, data: bytes) -> None:
    assert base64_decode(text) == data


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        ("SELECT 1 FROM tags WHERE project_id = ? AND id != ? AND name = ? COLLATE kb_ci", "tags_name_ci"),
        (
            "SELECT value FROM task_has_metadata WHERE task_id = ? AND name = ? COLLATE kb_ci",
            "task_has_metadata_name_ci",
        ),
        ("SELECT * FROM tasks WHERE project_id = ? AND reference = ? COLLATE kb_ci", "tasks_reference_ci"),
    ],
)
def test_mysql_like_name_lookups_search_an_index(api: BoardApi, sql: str, index: str) -> None:
    # The strict flavour's case-insensitive lookups (a createTag's unique check among every
    # lock tag) must not scan: a scan calls the Python collation once per row.
    db = api.store.connection()
    plan = " ".join(
        str(row[3]) for row in db.execute("EXPLAIN QUERY PLAN " + sql, (1, 2, 3)[: sql.count("?")])
    )
    assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, plan


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM users WHERE id = 1",
        "SELECT 1 AS a, 2 AS b, 3 AS c",
        "SELECT 1 AS a, 2 AS A, 3 AS b",  # names that differ only in case: the first wins
        "SELECT 1 AS a, 2 AS a",
    ],
)
def test_as_dict_is_dict_of_the_row(api: BoardApi, sql: str) -> None:
    row = api.store.connection().execute(sql).fetchone()
    assert list(as_dict(row).items()) == list(dict(row).items())


def test_a_move_counts_its_column_in_an_index(api: BoardApi) -> None:
    # moveTaskToProject's position counts the open cards of the destination column; on a
    # project with a long backlog, reading every open task for it made each move slower.
    db = api.store.connection()
    sql = "SELECT COUNT(*) FROM tasks WHERE project_id = ? AND column_id = ? AND is_active = 1"
    plan = " ".join(str(row[3]) for row in db.execute("EXPLAIN QUERY PLAN " + sql, (1, 2)))
    assert "USING COVERING INDEX tasks_project_active_column" in plan, plan


def test_a_nested_write_fails_as_sqlite_does(api: BoardApi) -> None:
    # The writers' lock is reentrant: a write inside a write is SQLite's error, not a hang.
    nested = pytest.raises(sqlite3.OperationalError, match="within a transaction")
    with api.store.write(), nested, api.store.write():
        pass
    with api.store.write() as db:  # and the lock was let go
        db.execute("SELECT 1")


def test_a_write_waits_for_another_threads_write_no_longer_than_the_busy_timeout(
    api: BoardApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "BUSY_SECONDS", 0.01)
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            with api.store.write():
                pass
        except sqlite3.OperationalError as exc:
            errors.append(exc)
        finally:
            api.store.release()

    with api.store.write():
        thread = threading.Thread(target=other_writer)
        thread.start()
        thread.join()
    assert [str(e) for e in errors] == ["database is locked"]
    thread = threading.Thread(target=other_writer)  # once the write is over, it gets in
    thread.start()
    thread.join()
    assert len(errors) == 1
