"""Database flavours: how a real Kanboard's backend shows through its API.

Kanboard runs on SQLite, PostgreSQL or MySQL/MariaDB, and the API is not the same on
the three (measured on Kanboard 1.2.53 with SQLite 3, PostgreSQL 15 and MariaDB 10.11;
see ``tests/contract/test_flavours.py``). The embedded board always stores in SQLite and
applies the chosen flavour's rules in the API layer:

* ``sqlite``, ``postgres``, ``mysql`` reproduce that backend;
* ``strict`` (the default) fails wherever any of them fails: PostgreSQL's booleans and
  strings, the VARCHAR limits of both schemas, SQL errors where PostgreSQL or MySQL give
  them, MySQL's case- and accent-insensitive name comparisons, and an order of
  ``searchTasks`` results that is not the id order (Kanboard does not sort them). Of the
  two id hazards it keeps SQLite's (a deleted newest row's id is handed out again), the
  one that makes a stale id point at a new row.

Not modelled: PostgreSQL's lost position updates under concurrent ``moveTaskPosition``
(the embedded board serialises writes), and the id order differing from commit order.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

FLAVOURS = ("strict", "sqlite", "postgres", "mysql")
DEFAULT_FLAVOUR = "strict"

Like = Literal["sqlite", "postgres", "mysql"]


class SqlError(Exception):
    """A statement the backend refuses: Kanboard answers a JSON-RPC error with code 0."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Flavour:
    """The rules of one backend (see the module docstring)."""

    name: str
    booleans: bool  # BOOLEAN columns answer true/false (PostgreSQL)
    float_text: bool  # double precision columns answer strings (pdo_pgsql)
    pg_limits: bool  # VARCHAR(n) of Kanboard's PostgreSQL schema
    mysql_limits: bool  # VARCHAR(n) of Kanboard's MySQL schema
    ci: bool  # names compare as utf8mb4_unicode_ci (case, accents, trailing spaces)
    like: Like  # what Kanboard's ILIKE does on this backend
    sql_errors: bool  # createTask in an unknown project: an SQL error, not 0
    message: Literal["postgres", "mysql"]  # whose SQL error text to give
    cut_nul: bool  # pdo_pgsql binds C strings: text ends at the first NUL
    int32: Literal["none", "postgres", "mysql"]  # out-of-range integer params
    reuse_ids: bool  # SQLite gives a deleted newest row's id again; sequences do not
    sqlite_columns: bool  # rows keep the columns only SQLite's schema still has
    null_lock_expiration: bool  # a new user's lock_expiration_date is NULL (MySQL)
    mysql_key_order: bool  # task rows come in the MySQL table's column order
    search_reversed: bool  # searchTasks not in id order (strict: no order to rely on)


_FLAVOURS = {
    "strict": Flavour(
        "strict",
        booleans=True,
        float_text=True,
        pg_limits=True,
        mysql_limits=True,
        ci=True,
        like="mysql",
        sql_errors=True,
        message="postgres",
        cut_nul=True,
        int32="postgres",
        reuse_ids=True,
        sqlite_columns=False,
        null_lock_expiration=True,
        mysql_key_order=False,
        search_reversed=True,
    ),
    "sqlite": Flavour(
        "sqlite",
        booleans=False,
        float_text=False,
        pg_limits=False,
        mysql_limits=False,
        ci=False,
        like="sqlite",
        sql_errors=False,
        message="postgres",
        cut_nul=False,
        int32="none",
        reuse_ids=True,
        sqlite_columns=True,
        null_lock_expiration=False,
        mysql_key_order=False,
        search_reversed=False,
    ),
    "postgres": Flavour(
        "postgres",
        booleans=True,
        float_text=True,
        pg_limits=True,
        mysql_limits=False,
        ci=False,
        like="postgres",
        sql_errors=True,
        message="postgres",
        cut_nul=True,
        int32="postgres",
        reuse_ids=False,
        sqlite_columns=False,
        null_lock_expiration=False,
        mysql_key_order=False,
        search_reversed=False,
    ),
    "mysql": Flavour(
        "mysql",
        booleans=False,
        float_text=False,
        pg_limits=False,
        mysql_limits=True,
        ci=True,
        like="mysql",
        sql_errors=True,
        message="mysql",
        cut_nul=False,
        int32="mysql",
        reuse_ids=False,
        sqlite_columns=False,
        null_lock_expiration=True,
        mysql_key_order=True,
        search_reversed=False,
    ),
}


def get_flavour(name: str | Flavour) -> Flavour:
    """The flavour called ``name`` (one of :data:`FLAVOURS`)."""
    if isinstance(name, Flavour):
        return name
    try:
        return _FLAVOURS[name]
    except KeyError:
        raise ValueError(f"unknown board flavour {name!r}: one of {', '.join(FLAVOURS)}") from None


# ------------------------------------------------------------------- SQL error texts

_TRUNCATED = "SQL Error[22001]: SQLSTATE[22001]: String data, right truncated: "
_RANGE = "SQL Error[22003]: SQLSTATE[22003]: Numeric value out of range: "
MYSQL_DB_NAME = "kanboard"  # Kanboard's default DB_NAME; MariaDB names it in some errors

# createTask in an unknown project without a column_id: the first-column lookup finds
# nothing and '' is bound where an integer goes (PostgreSQL fails on the position count,
# MySQL on the INSERT). Both happen before anything is written.
PG_NO_COLUMN = (
    "SQL Error[22P02]: SQLSTATE[22P02]: Invalid text representation: 7 ERROR:  "
    'invalid input syntax for type integer: ""\n'
    "CONTEXT:  unnamed portal parameter $2 = ''"
)
MYSQL_NO_COLUMN = (
    "SQL Error[22007]: SQLSTATE[22007]: Invalid datetime format: 1366 Incorrect"
    f" integer value: '' for column `{MYSQL_DB_NAME}`.`tasks`.`column_id` at row 1"
)


def pg_too_long(limit: int) -> str:
    return f"{_TRUNCATED}7 ERROR:  value too long for type character varying({limit})"


def mysql_too_long(column: str) -> str:
    return f"{_TRUNCATED}1406 Data too long for column '{column}' at row 1"


def pg_out_of_range(value: int, position: int) -> str:
    return (
        f'{_RANGE}7 ERROR:  value "{value}" is out of range for type integer\n'
        f"CONTEXT:  unnamed portal parameter ${position} = '...'"
    )


def mysql_out_of_range(column: str) -> str:
    return f"{_RANGE}1264 Out of range value for column '{column}' at row 1"


def no_column_error(flavour: Flavour) -> str:
    return MYSQL_NO_COLUMN if flavour.message == "mysql" else PG_NO_COLUMN


# --------------------------------------------------------------------- column limits

# (table, column) -> (PostgreSQL VARCHAR length, MySQL VARCHAR length), None for TEXT.
# From the schemas of the measured instances (information_schema); SQLite has none.
LIMITS: dict[tuple[str, str], tuple[int | None, int | None]] = {
    ("task_has_metadata", "name"): (50, 50),
    ("task_has_metadata", "value"): (255, 255),
    ("project_has_metadata", "name"): (50, 50),
    ("project_has_metadata", "value"): (255, 255),
    ("tags", "name"): (255, 191),
    ("tags", "color_id"): (50, 50),
    ("columns", "title"): (255, 191),
    ("swimlanes", "name"): (None, 191),
    ("categories", "name"): (255, 191),
    ("categories", "color_id"): (50, 50),
    ("tasks", "color_id"): (255, 50),
    ("users", "name"): (255, 255),
    ("users", "email"): (255, 255),
}


def fit_varchar(flavour: Flavour, table: str, column: str, value: Any) -> Any:
    """``value`` as the backend stores it in ``table.column``, or :class:`SqlError`.

    Lengths count characters, not bytes. Both servers cut excess characters that are all
    spaces instead of failing. Strict checks PostgreSQL's limit first (its message), then
    MySQL's.
    """
    if not isinstance(value, str):
        return value
    pg, my = LIMITS.get((table, column), (None, None))
    checks = []
    if flavour.pg_limits and pg is not None:
        checks.append((pg, pg_too_long(pg)))
    if flavour.mysql_limits and my is not None:
        checks.append((my, mysql_too_long(column)))
    for limit, message in checks:
        if len(value) > limit:
            if value[limit:].strip(" "):
                raise SqlError(message)
            value = value[:limit]
    return value


# ------------------------------------------------------------ integer param ranges

# procedure -> {param: (PostgreSQL parameter number, MySQL column)}: where an integer
# outside -2**31..2**31-1 makes the backend fail. PostgreSQL fails on any statement that
# binds it to an INTEGER column; MySQL only when it is written (a read just finds
# nothing). None: that backend does not fail (Kanboard checks it in PHP first).
INT32_PARAMS: dict[str, dict[str, tuple[int | None, str | None]]] = {
    "getTask": {"task_id": (1, None)},
    "getTaskByReference": {"project_id": (1, None)},
    "getAllTasks": {"project_id": (1, None)},
    "searchTasks": {"project_id": (1, None)},
    "getProjectById": {"project_id": (1, None)},
    "removeProject": {"project_id": (1, None)},
    "openTask": {"task_id": (1, None)},
    "closeTask": {"task_id": (2, None)},
    "removeTask": {"task_id": (1, None)},
    "createComment": {"task_id": (1, "task_id"), "user_id": (2, "user_id")},
    "getAllComments": {"task_id": (1, None)},
    "getTaskMetadata": {"task_id": (1, None)},
    "getTaskMetadataByName": {"task_id": (1, None)},
    "removeTaskMetadata": {"task_id": (1, None)},
    "saveTaskMetadata": {"task_id": (1, "task_id")},
    "getProjectMetadata": {"project_id": (1, None)},
    "getProjectMetadataByName": {"project_id": (1, None)},
    "removeProjectMetadata": {"project_id": (1, None)},
    "saveProjectMetadata": {"project_id": (1, "project_id")},
    "createTag": {"project_id": (1, "project_id")},
    "getTagsByProject": {"project_id": (1, None)},
    "removeTag": {"tag_id": (1, None)},
    "setTaskTags": {"task_id": (1, "task_id"), "project_id": (2, "project_id")},
    "getTaskTags": {"task_id": (1, None)},
    "moveTaskPosition": {
        "task_id": (1, None),
        "swimlane_id": (2, "swimlane_id"),
        "column_id": (4, "column_id"),
    },
    "createTask": {
        "project_id": (1, "project_id"),
        "column_id": (2, "column_id"),
        "swimlane_id": (3, "swimlane_id"),
        "category_id": (9, "category_id"),
        "priority": (18, "priority"),
    },
    "updateTask": {"id": (1, None), "category_id": (1, "category_id"), "priority": (1, "priority")},
    "getColumns": {"project_id": (1, None)},
    "addColumn": {"project_id": (1, "project_id")},
    "updateColumn": {"column_id": (5, None)},
    "getAllSwimlanes": {"project_id": (1, None)},
    "getActiveSwimlanes": {"project_id": (1, None)},
    "addSwimlane": {"project_id": (1, None)},
    "createTaskFile": {"task_id": (1, None)},
    "getAllTaskFiles": {"task_id": (1, None)},
    "downloadTaskFile": {"file_id": (1, None)},
    "getUser": {"user_id": (1, None)},
    "addProjectUser": {"user_id": (1, "user_id"), "project_id": (2, "project_id")},
    "getProjectUsers": {"project_id": (1, None)},
}

# Each procedure's integer params in PostgreSQL's parameter order (its first error wins).
_INT32_ORDERED = {
    method: sorted(params.items(), key=lambda p: p[1][0] or 0) for method, params in INT32_PARAMS.items()
}
_INT = re.compile(r"^-?\d+$")


def _out_of_range(value: Any) -> int | None:
    """The integer PHP would bind, when it does not fit an INTEGER column."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, str) and not _INT.match(value):
        return None
    number = int(value)
    return number if not -(2**31) <= number < 2**31 and abs(number) < 2**63 else None


def check_int32(flavour: Flavour, method: str, args: dict[str, Any]) -> None:
    """Raise :class:`SqlError` where the backend rejects an out-of-range integer param."""
    if flavour.int32 == "none":
        return
    for name, (pg_position, my_column) in _INT32_ORDERED.get(method, ()):
        number = _out_of_range(args.get(name))
        if number is None:
            continue
        if flavour.int32 == "postgres" and pg_position is not None:
            raise SqlError(pg_out_of_range(number, pg_position))
        if flavour.int32 == "mysql" and my_column is not None:
            raise SqlError(mysql_out_of_range(my_column))


def cut_nul(value: Any) -> Any:
    """Strings (keys included) cut at their first NUL, as pdo_pgsql binds them."""
    if isinstance(value, str):
        return value.split("\0", 1)[0]
    if isinstance(value, list):
        return [cut_nul(v) for v in value]
    if isinstance(value, dict):
        return {cut_nul(k): cut_nul(v) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------- row shapes

# Columns Kanboard's PostgreSQL schema declares BOOLEAN (pdo_pgsql answers true/false).
BOOLEANS: dict[str, tuple[str, ...]] = {
    "tasks": ("is_active",),
    "projects": ("is_active", "is_public", "is_private", "per_swimlane_task_limits", "enable_global_tags"),
    "swimlanes": ("is_active",),
    "columns": ("hide_in_dashboard",),
    "users": (
        "is_ldap_user",
        "notifications_enabled",
        "disable_login_form",
        "twofactor_activated",
        "is_active",
    ),
    "task_has_files": ("is_image",),
}
# Columns later migrations dropped; SQLite cannot drop a column, so they stay there.
SQLITE_ONLY: dict[str, tuple[str, ...]] = {
    "projects": ("is_everybody_allowed", "default_swimlane", "show_default_swimlane"),
    "users": ("is_admin", "is_project_admin"),
}
FLOATS: dict[str, tuple[str, ...]] = {"tasks": ("time_spent", "time_estimated")}
MYSQL_TASK_ORDER = (
    "id",
    "title",
    "description",
    "date_creation",
    "date_completed",
    "date_due",
    "color_id",
    "project_id",
    "column_id",
    "owner_id",
    "position",
    "score",
    "is_active",
    "category_id",
    "creator_id",
    "date_modification",
    "reference",
    "date_started",
    "time_spent",
    "time_estimated",
    "swimlane_id",
    "date_moved",
    "recurrence_status",
    "recurrence_trigger",
    "recurrence_factor",
    "recurrence_timeframe",
    "recurrence_basedate",
    "recurrence_parent",
    "recurrence_child",
    "priority",
    "external_provider",
    "external_uri",
)


def _float_text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    number = float(v)
    return str(int(number)) if number.is_integer() and abs(number) < 1e15 else repr(number)


def shape(flavour: Flavour, table: str, row: dict[str, Any], *, reorder: bool = True) -> dict[str, Any]:
    """A stored row as this backend's API answers it (types, columns, key order)."""
    if not flavour.sqlite_columns:
        for key in SQLITE_ONLY.get(table, ()):
            row.pop(key, None)
    if flavour.booleans:
        for key in BOOLEANS.get(table, ()):
            if row.get(key) is not None:
                row[key] = bool(row[key])
    if flavour.float_text:
        for key in FLOATS.get(table, ()):
            if key in row:
                row[key] = _float_text(row[key])
    if reorder and flavour.mysql_key_order and table == "tasks":
        ordered = {k: row[k] for k in MYSQL_TASK_ORDER if k in row}
        ordered.update((k, v) for k, v in row.items() if k not in ordered)
        return ordered
    return row


# -------------------------------------------------------- MySQL's collation, roughly

_SUPPLEMENTARY = "\U0010ffff"


def _fold(ch: str) -> str:
    if ord(ch) > 0xFFFF:
        return _SUPPLEMENTARY  # utf8mb4_unicode_ci weighs every non-BMP character alike
    decomposed = unicodedata.normalize("NFKD", ch)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


@functools.lru_cache(maxsize=65536)
def ci_key(text: str) -> str:
    """Equal keys for strings utf8mb4_unicode_ci holds equal.

    An approximation of UCA 4.0.0 that covers what was measured on MariaDB: case and
    accents are ignored (``àbc`` = ``ABC``, ``İ`` = ``i``), ``ß`` = ``ss``, ligatures
    expand (``ﬁ`` = ``fi``), all emoji are equal, and trailing spaces do not count (PAD
    SPACE; a trailing tab does). ``Æ``/``ae``, ``ø``/``o`` and dotless/dotted i stay distinct.
    """
    text = text.rstrip(" ")
    if text.isascii():
        return text.lower()  # the common case, and the collation runs per compared row
    return "".join(_fold(c) for c in text)


class _Weights(dict[int, str]):
    """Character -> its rank digit and itself, for :meth:`str.translate`: UCA orders spaces,
    then punctuation, symbols, digits, letters. Filled as characters are met."""

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        rank = {"Z": 0, "P": 1, "S": 2, "N": 3}.get(unicodedata.category(ch)[0], 4)
        self[code] = weighed = f"{rank}{ch}"
        return weighed


_WEIGHTS = _Weights()


@functools.lru_cache(maxsize=65536)
def _sort_key(text: str) -> str:
    # Each character of the folded text becomes its rank then itself, so comparing two keys
    # compares (rank, character) pairs in order, in one str.translate (the collation runs
    # for every row an index search or a sort compares).
    return ci_key(text).translate(_WEIGHTS)


def _collate(a: str, b: str) -> int:
    if a == b:
        return 0
    ka, kb = _sort_key(a), _sort_key(b)
    return (ka > kb) - (ka < kb)


@functools.lru_cache(maxsize=512)
def _like_regex(pattern: str, fold: bool) -> re.Pattern[str]:
    """A LIKE pattern (``%``, ``_``, backslash escapes) as a regex over folded text."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            i += 1
            ch = pattern[i]
            out.append(re.escape(_fold(ch) if fold else ch.lower()))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(_fold(ch) if fold else ch.lower()))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _pg_ilike(value: Any, pattern: Any) -> int | None:
    """PostgreSQL's ILIKE: Unicode case-insensitive, accents significant."""
    if value is None or pattern is None:
        return None
    return int(_like_regex(str(pattern), False).fullmatch(str(value).lower()) is not None)


def _mysql_like(value: Any, pattern: Any) -> int | None:
    """MySQL's LIKE under utf8mb4_unicode_ci: case and accents ignored, char by char."""
    if value is None or pattern is None:
        return None
    folded = "".join(_fold(c) for c in str(value))
    return int(_like_regex(str(pattern), True).fullmatch(folded) is not None)


def install(db: sqlite3.Connection) -> None:
    """Register the collation and LIKE functions the flavours' SQL uses."""
    db.create_collation("kb_ci", _collate)
    db.create_function("kb_ilike", 2, _pg_ilike, deterministic=True)
    db.create_function("kb_cilike", 2, _mysql_like, deterministic=True)


def like_sql(flavour: Flavour, column: str) -> str:
    """SQL for Kanboard's ``ilike(column, ?)`` on this backend."""
    if flavour.like == "postgres":
        return f"kb_ilike({column}, ?)"
    if flavour.like == "mysql":
        return f"kb_cilike({column}, ?)"
    return f"{column} LIKE ?"  # SQLite: ASCII-only case folding


def eq_sql(flavour: Flavour, column: str, *, nocase: bool = False) -> str:
    """SQL for ``column = ?``; ``nocase`` for the columns SQLite's schema declares NOCASE."""
    if flavour.ci:
        return f"{column} = ? COLLATE kb_ci"
    if nocase and flavour.name == "sqlite":
        return f"{column} = ? COLLATE NOCASE"
    return f"{column} = ?"


def order_sql(flavour: Flavour, column: str, *, nocase: bool = False) -> str:
    """SQL for ``ORDER BY column`` (PostgreSQL as measured: C collation, binary)."""
    if flavour.ci:
        return f"{column} COLLATE kb_ci"
    if nocase and flavour.name == "sqlite":
        return f"{column} COLLATE NOCASE"
    return column
