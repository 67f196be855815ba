"""Where Kanboard's database backends differ, asserted per flavour.

Measured on Kanboard 1.2.53 over SQLite 3, PostgreSQL 15 (C.UTF-8) and MariaDB 10.11
(utf8mb4_unicode_ci, STRICT_ALL_TABLES as Kanboard sets it). The embedded board's
``strict`` flavour must fail wherever any of them fails. Error texts are PDO's, copied
from the real servers: PostgreSQL's for ``postgres`` and ``strict``, MariaDB's for
``mysql`` (and for ``strict`` where only MySQL fails).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from fabric.kanboard.port import RpcError
from tests.contract.conftest import Board, Project, b64, same

PG_TOO_LONG = (
    "SQL Error[22001]: SQLSTATE[22001]: String data, right truncated: 7 ERROR:  "
    "value too long for type character varying({})"
)
MY_TOO_LONG = (
    "SQL Error[22001]: SQLSTATE[22001]: String data, right truncated: 1406 "
    "Data too long for column '{}' at row 1"
)
PG_NO_COLUMN = (
    "SQL Error[22P02]: SQLSTATE[22P02]: Invalid text representation: 7 ERROR:  "
    'invalid input syntax for type integer: ""\n'
    "CONTEXT:  unnamed portal parameter $2 = ''"
)
# MariaDB names the database (whatever DB_NAME is) in this one.
MY_NO_COLUMN = re.compile(
    r"SQL Error\[22007\]: SQLSTATE\[22007\]: Invalid datetime format: "
    r"1366 Incorrect integer value: '' for column `[^`]+`\.`tasks`\."
    r"`column_id` at row 1"
)
PG_RANGE = (
    "SQL Error[22003]: SQLSTATE[22003]: Numeric value out of range: 7 ERROR:  value "
    '"{}" is out of range for type integer\nCONTEXT:  unnamed portal parameter ${} = '
    "'...'"
)
MY_RANGE = (
    "SQL Error[22003]: SQLSTATE[22003]: Numeric value out of range: 1264 Out of "
    "range value for column '{}' at row 1"
)


def sql_error(board: Board, method: str, params: Any) -> str:
    """The message of the code 0 (SQL) error ``method`` must answer."""
    with pytest.raises(RpcError) as err:
        board.call(method, params)
    assert err.value.code == 0, err.value
    return err.value.message


def too_long(board: Board, pg: int | None, my: int | None, column: str) -> str | None:
    """The error a value of this many characters gets (None: stored)."""
    if board.pg_limits and pg is not None:
        return PG_TOO_LONG.format(pg)
    if board.mysql_limits and my is not None:
        return MY_TOO_LONG.format(column)
    return None


def check_length(
    board: Board, method: str, params: Any, *, pg: int | None, my: int | None, column: str
) -> Any:
    """Call ``method``: expect the flavour's length error, or its result when it stores."""
    expected = too_long(board, pg, my, column)
    if expected is None:
        return board.call(method, params)
    assert sql_error(board, method, params) == expected
    return None


# ---------------------------------------------------------------------- metadata

META = {
    "task": ("saveTaskMetadata", "getTaskMetadata", "getTaskMetadataByName", "removeTaskMetadata"),
    "project": (
        "saveProjectMetadata",
        "getProjectMetadata",
        "getProjectMetadataByName",
        "removeProjectMetadata",
    ),
}


@pytest.fixture(params=sorted(META))
def owner(request: pytest.FixtureRequest, project: Project) -> tuple[str, int]:
    """A task or a project to hang metadata on."""
    kind = str(request.param)
    return kind, project.task() if kind == "task" else project.id


def _meta(board: Board, owner: tuple[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = board.call(META[owner[0]][1], [owner[1]])
    return result


def test_metadata_name_limit_is_50_characters(board: Board, owner: tuple[str, int]) -> None:
    save, oid = META[owner[0]][0], owner[1]
    assert board.call(save, [oid, {"n" * 50: "x", "é" * 50: "y"}]) is True  # characters
    for name in ("N" * 51, "É" * 51, "M" * 1000):
        check_length(board, save, [oid, {name: "x"}], pg=50, my=50, column="name")
    names = set(_meta(board, owner))
    assert {"n" * 50, "é" * 50} <= names
    # SQLite enforces no VARCHAR length: any name is stored (9 MB was, on a real one).
    assert ("M" * 1000 in names) is not board.sql_errors
    if not board.sql_errors:
        assert board.call(META[owner[0]][2], [oid, "M" * 1000]) == "x"


def test_metadata_value_limit_is_255_characters(board: Board, owner: tuple[str, int]) -> None:
    save, oid = META[owner[0]][0], owner[1]
    assert board.call(save, [oid, {"a": "v" * 255, "e": "é" * 255, "m": "😀" * 255}]) is True
    for value in ("v" * 256, "é" * 256, "😀" * 256, "x" * 100_000):
        check_length(board, save, [oid, {"big": value}], pg=255, my=255, column="value")
    meta = _meta(board, owner)
    assert (meta["a"], meta["e"], meta["m"]) == ("v" * 255, "é" * 255, "😀" * 255)
    assert ("big" in meta) is not board.sql_errors
    if not board.sql_errors:
        assert meta["big"] == "x" * 100_000  # the last write won


def test_a_refused_metadata_call_writes_nothing(board: Board, owner: tuple[str, int]) -> None:
    save, oid = META[owner[0]][0], owner[1]
    assert board.call(save, [oid, {"keep": "old"}]) is True
    values = {"first": "ok", "keep": "new", "bad": "x" * 256, "last": "ok"}
    check_length(board, save, [oid, values], pg=255, my=255, column="value")
    meta = _meta(board, owner)
    if board.sql_errors:
        # One transaction: the keys before the bad one are rolled back with it.
        assert meta == {"keep": "old"}
    else:
        assert meta == {"keep": "new", "first": "ok", "bad": "x" * 256, "last": "ok"}
    check_length(board, save, [oid, {"n" * 51: "v", "other": "ok"}], pg=50, my=50, column="name")
    assert ("other" in _meta(board, owner)) is not board.sql_errors


def test_metadata_excess_spaces_are_cut(board: Board, owner: tuple[str, int]) -> None:
    # Both servers cut a VARCHAR's excess characters when they are all spaces.
    save, oid = META[owner[0]][0], owner[1]
    assert board.call(save, [oid, {"v": "x" * 255 + "   ", "n" * 50 + "  ": "1"}]) is True
    meta = _meta(board, owner)
    if board.sql_errors:
        assert meta == {"v": "x" * 255, "n" * 50: "1"}
    else:
        assert meta == {"v": "x" * 255 + "   ", "n" * 50 + "  ": "1"}


def test_metadata_names_compare_like_the_backend(board: Board, owner: tuple[str, int]) -> None:
    save, get_all, by_name, remove = META[owner[0]]
    oid = owner[1]
    assert board.call(save, [oid, {"Key": "1"}]) is True
    assert board.call(save, [oid, {"key": "2"}]) is True
    if board.ci:
        # exists("key") finds "Key": its value is updated, its name kept.
        assert board.call(get_all, [oid]) == {"Key": "2"}
        assert board.call(by_name, [oid, "KEY "]) == "2"
        assert board.call(save, [oid, {"A": "x", "a": "y"}]) is True
        assert board.call(get_all, [oid]) == {"A": "y", "Key": "2"}
        assert board.call(remove, [oid, "kéy"]) is True
        assert board.call(get_all, [oid]) == {"A": "y"}
    else:
        assert board.call(get_all, [oid]) == {"Key": "1", "key": "2"}
        assert board.call(by_name, [oid, "KEY"]) == ""
        assert board.call(remove, [oid, "KEY"]) is False


# ------------------------------------------------------------------- row shapes

BOOLEAN_FIELDS = {
    "task": ("is_active",),
    "project": ("is_active", "is_public", "is_private", "per_swimlane_task_limits", "enable_global_tags"),
    "swimlane": ("is_active",),
    "column": ("hide_in_dashboard",),
    "user": (
        "is_ldap_user",
        "notifications_enabled",
        "disable_login_form",
        "twofactor_activated",
        "is_active",
    ),
    "file": ("is_image",),
}
# Dropped by later migrations on PostgreSQL and MySQL; SQLite cannot drop columns.
SQLITE_ONLY = {
    "project": ("is_everybody_allowed", "default_swimlane", "show_default_swimlane"),
    "user": ("is_admin", "is_project_admin"),
}


def _check_row(board: Board, kind: str, row: dict[str, Any], values: dict[str, int]) -> None:
    for key in BOOLEAN_FIELDS[kind]:
        assert same(row[key], board.flag(values.get(key, 0))), (kind, key, row[key])
    for key in SQLITE_ONLY.get(kind, ()):
        assert (key in row) is (board.flavour == "sqlite"), (kind, key)


def test_boolean_columns_and_row_shapes(board: Board, project: Project) -> None:
    name = board.unique("u").replace("-", "")
    user = board.call("createUser", [name, "secret12"])
    task = project.task(time_spent=1.5, time_estimated=2)
    closed = project.task()
    board.call("closeTask", [closed])
    file_id = board.call("createTaskFile", [project.id, task, "a.txt", b64(b"hi")])
    active = {"is_active": 1}
    project_flags = {"is_active": 1, "enable_global_tags": 1}
    rows: list[tuple[str, dict[str, Any], dict[str, int]]] = [
        ("task", board.call("getTask", [task]), active),
        ("task", board.call("getTask", [closed]), {"is_active": 0}),
        ("task", board.call("getAllTasks", [project.id, 1])[0], active),
        ("task", board.call("searchTasks", [project.id, f"#{task}"])[0], active),
        ("project", board.call("getProjectById", [project.id]), project_flags),
        ("project", board.call("getProjectByName", [project.name]), project_flags),
        ("swimlane", board.call("getAllSwimlanes", [project.id])[0], active),
        ("swimlane", board.call("getActiveSwimlanes", [project.id])[0], active),
        ("column", board.call("getColumns", [project.id])[0], {}),
        ("column", board.call("getColumn", [project.column("Ready")]), {}),
        ("user", board.call("getUser", [user]), active),
        ("user", board.call("getUserByName", [name]), active),
        ("user", next(u for u in board.call("getAllUsers") if u["id"] == user), active),
        ("file", board.call("getAllTaskFiles", [task])[0], {}),
        ("file", board.call("getTaskFile", [file_id]), {}),
    ]
    for kind, row, values in rows:
        _check_row(board, kind, row, values)
    got = board.call("getTask", [task])
    # pdo_pgsql answers double precision as a string.
    if board.booleans:
        assert (got["time_spent"], got["time_estimated"]) == ("1.5", "2")
    else:
        assert same(got["time_spent"], 1.5) and same(got["time_estimated"], 2)
    assert board.call("getTask", [closed])["time_spent"] is None
    # MySQL's column has no default: a new user's lock_expiration_date is null.
    expected_lock = None if board.ci else 0
    assert same(board.call("getUser", [user])["lock_expiration_date"], expected_lock)


# --------------------------------------------------------------- name comparisons


def test_tag_names_compare_like_the_backend(board: Board, project: Project) -> None:
    assert isinstance(board.call("createTag", [project.id, "abc"]), int)
    assert isinstance(board.call("createTag", [project.id, "strasse"]), int)
    assert isinstance(board.call("createTag", [project.id, "e😀"]), int)
    # utf8mb4_unicode_ci: case, accents, trailing spaces, ß/ss and emoji do not count.
    for twin in ("ABC", "abc ", "àbc", "straße", "e😃"):
        result = board.call("createTag", [project.id, twin])
        assert (result is False) if board.ci else isinstance(result, int), (twin, result)
    for other in (" abc", "abc\t", "abd"):  # a leading space or a tab does count
        assert isinstance(board.call("createTag", [project.id, other]), int), other
    x = board.call("createTag", [project.id, "x"])
    y = board.call("createTag", [project.id, "y"])
    assert isinstance(x, int) and isinstance(y, int)
    assert board.call("updateTag", [y, "X"]) is (not board.ci)


def test_names_sort_in_the_backends_collation(board: Board, project: Project) -> None:
    names = ["b", "a", "Z", "_x", "10", "9", "ab", "a b", "é"]
    for name in names:
        assert isinstance(board.call("createTag", [project.id, name]), int)
    got = [t["name"] for t in board.call("getTagsByProject", [project.id])]
    if board.ci:  # UCA: spaces, punctuation, digits, letters; case and accents ignored
        assert got == ["_x", "10", "9", "a", "a b", "ab", "b", "é", "Z"]
    elif board.flavour == "sqlite":
        assert got == sorted(names)  # BINARY
    else:
        # PostgreSQL sorts in the database's LC_COLLATE (C.UTF-8, i.e. bytes, on the
        # measured one; en_US would differ): only the set is certain.
        assert sorted(got) == sorted(names)


def test_tag_lookup_by_name_is_the_backends_ilike(board: Board, project: Project) -> None:
    task = project.task(tags=["ébène"])
    assert board.call("setTaskTags", [project.id, task, ["ÉBÈNE"]]) is True
    names = {t["name"] for t in board.call("getTagsByProject", [project.id])}
    # SQLite's LIKE folds ASCII only: "ÉBÈNE" is new there; ILIKE finds "ébène".
    assert ("ÉBÈNE" in names) is (board.flavour == "sqlite")
    assert board.call("setTaskTags", [project.id, task, ["ebene"]]) is True
    names = {t["name"] for t in board.call("getTagsByProject", [project.id])}
    assert ("ebene" in names) is not board.ci  # MySQL's LIKE ignores accents


def test_names_compare_like_the_backend(board: Board, project: Project) -> None:
    ci = board.ci
    got = board.call("getProjectByName", [project.name.upper() + " "])
    assert (got["id"] == project.id) if ci else (got is False)
    col = board.call("addColumn", [project.id, "ready"])
    assert (col is False) if ci else isinstance(col, int)
    zed = board.call("addColumn", [project.id, "Zed"])
    assert board.call("updateColumn", [zed, "BACKLOG"]) is (not ci)
    lane = board.call("addSwimlane", [project.id, "Express"])
    again = board.call("addSwimlane", [project.id, "Express "])
    assert (again is False) if ci else isinstance(again, int)
    found_lane = board.call("getSwimlaneByName", [project.id, "EXPRESS"])
    assert (found_lane["id"] == lane) if ci else (found_lane is None)
    ref = board.unique("Ref")
    task = project.task(reference=ref)
    found = board.call("getTaskByReference", [project.id, ref.lower() + " "])
    assert (found["id"] == task) if ci else (found is None)
    name = board.unique("User").replace("-", "")
    assert isinstance(board.call("createUser", [name, "secret12"]), int)
    dup = board.call("createUser", [name.upper(), "secret12"])
    assert (dup is False) if ci else isinstance(dup, int)
    user = board.call("getUserByName", [name.lower()])
    assert (user["username"] == name) if ci else (user is None)
    # Categories: SQLite's schema declares the name NOCASE; PostgreSQL compares bytes.
    assert isinstance(board.call("createCategory", [project.id, "Cat"]), int)
    cat = board.call("createCategory", [project.id, "CAT"])
    assert (cat is False) if board.flavour != "postgres" else isinstance(cat, int)


def test_search_compares_like_the_backend(board: Board, project: Project) -> None:
    task = project.task("Élan Über", reference="Ref-É")

    def hits(query: str) -> bool:
        return [t["id"] for t in board.call("searchTasks", [project.id, query])] == [task]

    assert hits("column:BACKLOG") is board.ci  # "=" on the column title
    assert hits("ÉLAN") and hits("ref:Ref-É")
    # ILIKE: SQLite folds ASCII only; PostgreSQL all case; MySQL case and accents.
    assert hits("élan") is (board.flavour != "sqlite")
    assert hits("über") is (board.flavour != "sqlite")
    assert hits("ref:ref-é") is (board.flavour != "sqlite")
    assert hits("elan") is board.ci
    assert hits("ref:REF-e") is board.ci


# ----------------------------------------------------------- createTask failures


def test_create_task_in_an_unknown_project(board: Board, project: Project) -> None:
    for params in ({}, {"swimlane_id": project.swimlane_id}, {"tags": ["x"]}):
        call = {"title": "x", "project_id": 2_000_000_000, **params}
        if not board.sql_errors:
            assert same(board.call("createTask", call), 0)
        elif board.pg_messages:
            assert sql_error(board, "createTask", call) == PG_NO_COLUMN
        else:
            assert MY_NO_COLUMN.fullmatch(sql_error(board, "createTask", call))
    # With a column given the INSERT runs and its foreign key fails: 0 everywhere.
    assert same(
        board.call(
            "createTask", {"title": "x", "project_id": 2_000_000_000, "column_id": project.column("Ready")}
        ),
        0,
    )
    for params in ({"column_id": 2_000_000_000}, {"column_id": -1}, {"swimlane_id": 2_000_000_000}):
        got = board.call("createTask", {"title": "x", "project_id": project.id, **params})
        assert same(got, 0), (params, got)
    assert board.call("getAllTasks", [project.id, 1]) == []


def test_reference_is_at_most_191_characters(board: Board, project: Project) -> None:
    for ref in ("r" * 191, "é" * 191, "😀" * 191):
        assert isinstance(
            board.call("createTask", {"title": "x", "project_id": project.id, "reference": ref}), int
        )
    assert board.call("createTask", {"title": "x", "project_id": project.id, "reference": "r" * 192}) is False
    task = project.task(reference="kept")
    assert board.call("updateTask", {"id": task, "reference": "r" * 192}) is False
    assert board.call("getTask", [task])["reference"] == "kept"
    assert board.call("updateTask", {"id": task, "reference": "é" * 191}) is True
    assert board.call("createComment", [task, 0, "c", "r" * 192]) is False
    assert board.call("createUser", ["u" * 192, "secret12"]) is False


# ---------------------------------------------------------------- other limits


def test_tag_lengths(board: Board, project: Project) -> None:
    assert isinstance(board.call("createTag", [project.id, "t" * 191]), int)
    for n in (192, 255, 256):
        tag = check_length(
            board,
            "createTag",
            [project.id, chr(ord("a") + n % 26) * n],
            pg=255 if n > 255 else None,
            my=191,
            column="name",
        )
        if tag is not None:
            assert isinstance(tag, int)
    assert isinstance(board.call("createTag", [project.id, "c50", "c" * 50]), int)
    check_length(board, "createTag", [project.id, "c51", "c" * 51], pg=50, my=50, column="color_id")


def test_column_title_lengths(board: Board, project: Project) -> None:
    assert isinstance(board.call("addColumn", [project.id, "c" * 191]), int)
    check_length(board, "addColumn", [project.id, "d" * 192], pg=None, my=191, column="title")
    check_length(board, "addColumn", [project.id, "e" * 256], pg=255, my=191, column="title")
    done = project.column("Done")
    check_length(board, "updateColumn", [done, "f" * 256], pg=255, my=191, column="title")
    check_length(board, "addSwimlane", [project.id, "s" * 192], pg=None, my=191, column="name")


def test_task_color_and_user_name_lengths(board: Board, project: Project) -> None:
    params = {"title": "x", "project_id": project.id}
    check_length(board, "createTask", {**params, "color_id": "c" * 51}, pg=None, my=50, column="color_id")
    check_length(board, "createTask", {**params, "color_id": "c" * 256}, pg=255, my=50, column="color_id")
    name = board.unique("n").replace("-", "")
    check_length(board, "createUser", [name, "secret12", "n" * 256], pg=255, my=255, column="name")


def test_text_with_a_nul_character(board: Board, project: Project) -> None:
    # pdo_pgsql binds C strings: PostgreSQL silently keeps what precedes the NUL.
    cut = board.flavour in ("postgres", "strict")
    task = project.task("c\u0000d")
    assert board.call("getTask", [task])["title"] == ("c" if cut else "c\u0000d")
    assert board.call("saveTaskMetadata", [task, {"nul": "a\u0000b"}]) is True
    assert board.call("getTaskMetadata", [task]) == {"nul": "a" if cut else "a\u0000b"}


def test_integer_params_out_of_range(board: Board, project: Project) -> None:
    big = 2**31
    pg, my = board.flavour in ("postgres", "strict"), board.flavour == "mysql"
    # Reads: PostgreSQL refuses to bind it; MySQL and SQLite find nothing.
    for method, params, position, nothing in (
        ("getTask", [big], 1, None),
        ("getTaskMetadata", [big], 1, {}),
        ("searchTasks", [big, ""], 1, []),
        ("getProjectById", [-big - 1], 1, None),
    ):
        if pg:
            value = params[0]
            assert sql_error(board, method, params) == PG_RANGE.format(value, position)
        else:
            assert board.call(method, params) == nothing
    # Writes: MySQL refuses them too.
    for method, params, column, sqlite_answer in (
        ("saveTaskMetadata", [big, {"a": "b"}], "task_id", False),
        ("createComment", [big, 0, "x"], "task_id", False),
    ):
        if pg:
            assert sql_error(board, method, params) == PG_RANGE.format(big, 1)
        elif my:
            assert sql_error(board, method, params) == MY_RANGE.format(column)
        else:
            assert board.call(method, params) is sqlite_answer
    task = {"title": "x", "project_id": project.id, "priority": big}
    if pg:
        assert sql_error(board, "createTask", task) == PG_RANGE.format(big, 18)
    elif my:
        assert sql_error(board, "createTask", task) == MY_RANGE.format("priority")
    else:
        assert isinstance(board.call("createTask", task), int)


# --------------------------------------------------------------------------- ids


def test_ids_of_deleted_rows_and_failed_inserts(board: Board, project: Project) -> None:
    # Run serially: another writer's rows would make these ids unpredictable.
    reuse = board.flavour in ("sqlite", "strict")  # strict keeps SQLite's reuse hazard
    task = project.task("newest")
    assert board.call("removeTask", [task]) is True
    again = project.task("next")
    assert again == task if reuse else again == task + 1
    tag = board.call("createTag", [project.id, "dup"])
    assert board.call("createTag", [project.id, "dup"]) is False
    following = board.call("createTag", [project.id, "after"])
    # A sequence value taken by the failed INSERT is gone on PostgreSQL and MySQL.
    assert following == (tag + 1 if reuse else tag + 2)
