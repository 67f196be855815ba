"""The embedded board's JSON-RPC procedures, with Kanboard's semantics.

Each procedure keeps Kanboard's name, parameter names and order, and its way of
failing: ``false`` for validation errors and duplicates, ``0`` for a failed insert,
``null`` for a getter that finds nothing. Each call commits on its own, so a batch is
ordered but not atomic, exactly as in Kanboard. The behaviours reproduced here were
measured against a real Kanboard 1.2.53 (see ``tests/contract``); PHP's loose typing is
imitated where the API exposes it (an int param may arrive as ``"2"``, a named ``null``
is passed as ``null``, a non-array where PHP types ``array`` is an HTTP 500). What
depends on Kanboard's database backend follows the API's flavour
(:mod:`fabric.embedded.flavour`; ``strict`` unless told otherwise).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabric.embedded import flavour as fl
from fabric.embedded.flavour import Flavour, SqlError, get_flavour
from fabric.embedded.search import build_where
from fabric.embedded.store import Store, hash_password
from fabric.kanboard.dates import BadDate, parse_input_date

API_VERSION = "1.2.53-agap-embedded"  # real Kanboard says "1.2.53"; this tells them apart
DEFAULT_COLUMNS = ("Backlog", "Ready", "Work in progress", "Done")
DEFAULT_SWIMLANE = "Default swimlane"
APP_ROLES = ("app-user", "app-manager", "app-admin")
PROJECT_ROLES = ("project-manager", "project-member", "project-viewer")

Procedure = Callable[..., Any]


class _Absent:
    """Default of a parameter PHP types as ``array``: tells "not given" from ``null``."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class _Spec:
    fn: Procedure
    names: tuple[str, ...]
    defaults: tuple[Any, ...]  # inspect.Parameter.empty for a required parameter
    required: int


_REGISTRY: dict[str, _Spec] = {}


class Fatal(Exception):
    """What PHP would turn into an HTTP 500 with an empty body (e.g. a type error)."""


class InvalidParams(Exception):
    """Kanboard's -32602: a missing argument or the wrong number of them."""


def procedure(fn: Procedure) -> Procedure:
    """Register ``fn`` under its own name as a JSON-RPC procedure."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop the `api` argument
    _REGISTRY[fn.__name__] = _Spec(
        fn,
        tuple(p.name for p in params),
        tuple(p.default for p in params),
        sum(1 for p in params if p.default is inspect.Parameter.empty),
    )
    return fn


# ----------------------------------------------------------- PHP value semantics


def _empty(v: Any) -> bool:
    """PHP's ``empty()``."""
    return v is None or v is False or v == 0 or v == "" or v == "0" or v == [] or v == {}


def _given(v: Any) -> bool:
    """SimpleValidator's "field not empty": set and not the empty string."""
    return v is not None and v is not ABSENT and v != ""


def _int(v: Any) -> int:
    """PHP's ``(int)`` cast, for lookups."""
    if v is None or isinstance(v, list | dict):
        return 0
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else 0
    m = re.match(r"\s*([+-]?\d+)", str(v))
    return int(m.group(1)) if m else 0


def _is_integer(v: Any) -> bool:
    """SimpleValidator's Integer rule (empty passes)."""
    if not _given(v):
        return True
    if isinstance(v, str):
        digits = v[1:] if v.startswith("-") else v
        return digits.isascii() and digits.isdigit()
    return isinstance(v, int) and not isinstance(v, bool)


_NUMERIC = re.compile(r"^[ \t\n\r\v\f]*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?[ \t\n\r\v\f]*$")


def _is_numeric(v: Any) -> bool:
    """PHP's ``is_numeric`` (empty passes, as in the Numeric rule)."""
    if not _given(v):
        return True
    if isinstance(v, bool):
        return False
    if isinstance(v, int | float):
        return True
    return isinstance(v, str) and bool(_NUMERIC.match(v))


def _as_text(v: Any) -> str:
    """PHP's string conversion of a scalar (what Kanboard stores in a text column)."""
    if v is None or v is False or v is ABSENT:
        return ""
    if v is True:
        return "1"
    if isinstance(v, list | dict):
        return "Array"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return repr(v)
    return str(v)


def _stored(v: Any) -> Any:
    """A value as PDO binds it: scalars as they are, booleans as 1/"", arrays fatal."""
    if isinstance(v, list | dict):
        raise Fatal("array to scalar conversion")
    if v is True:
        return 1
    if v is False:
        return ""
    return v


def _same(a: Any, b: Any) -> bool:
    """PHP 8's loose ``==`` between ids: ``"2" == 2``, but ``"" != 0`` and ``"x" != 0``."""
    if a is None or b is None:
        return _empty(a) and _empty(b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------- the API


class BoardApi:
    """Dispatches decoded JSON-RPC payloads to the procedures over one :class:`Store`.

    ``flavour`` is the backend imitated (default: the store's, itself ``strict`` unless
    told otherwise).
    """

    def __init__(
        self,
        store: Store,
        token: str,
        *,
        clock: Callable[[], float] = time.time,
        flavour: str | Flavour | None = None,
    ):
        self.store = store
        self.token = token
        self.clock = clock
        self.flavour = get_flavour(store.flavour if flavour is None else flavour)
        self.base_url = "http://localhost/"

    # -- auth and dispatch ----------------------------------------------------------

    def check_basic_auth(self, header: str | None) -> bool:
        """True when ``Authorization: Basic`` carries ``jsonrpc:<token>``."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return False
        return user == "jsonrpc" and hmac.compare_digest(password.encode(), self.token.encode())

    def handle(self, payload: Any) -> Any:
        """Answer one request or a batch (a list), in order. ``None`` means no reply.

        Raises :class:`Fatal` where PHP would die with an HTTP 500 (the whole reply is
        lost, but earlier batch items stay committed).
        """
        if isinstance(payload, list) and payload:
            replies = [
                self._one(item) if isinstance(item, dict) else _error(None, -32700, "Parse error")
                for item in payload
            ]
            kept = [r for r in replies if r is not None]
            return kept or None
        if isinstance(payload, dict | list):
            return self._one(payload)
        return _error(None, -32700, "Parse error")

    def handle_bytes(self, raw: bytes) -> bytes | None:
        """Decode, answer and encode; raises :class:`Fatal` for an HTTP 500."""
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            payload = None
        reply = self.handle(payload)
        if reply is None:
            return None
        return encode(reply)

    def _one(self, req: Any) -> Any:
        if (
            not isinstance(req, dict)
            or req.get("jsonrpc") != "2.0"
            or not isinstance(req.get("method"), str)
            or not isinstance(req.get("params", []), list | dict | None)
        ):
            return _error(None, -32600, "Invalid Request")
        rpc_id = req.get("id")
        notification = rpc_id is None
        spec = _REGISTRY.get(req["method"])
        if spec is None:
            return None if notification else _error(rpc_id, -32601, "Method not found")
        try:
            args = _bind(spec, req.get("params"))
        except InvalidParams as exc:
            return None if notification else _error(rpc_id, -32602, "Invalid params", str(exc))
        if self.flavour.cut_nul:
            args = fl.cut_nul(args)
        try:
            fl.check_int32(self.flavour, req["method"], dict(zip(spec.names, args, strict=True)))
            result = spec.fn(self, *args)
        except SqlError as exc:
            # The statement failed and Kanboard rolled its transaction back (Store.write
            # did the same); PDO's message reaches the caller as a code 0 error.
            return None if notification else _error(rpc_id, 0, exc.message)
        except sqlite3.OperationalError as exc:
            # Kanboard (PDO) reports SQL errors as a JSON-RPC error with code 0; the
            # statement may or may not have committed, as far as the caller knows.
            message = f"SQL Error[HY000]: SQLSTATE[HY000]: General error: 5 {exc}"
            return None if notification else _error(rpc_id, 0, message)
        if notification:
            return None
        return {"jsonrpc": "2.0", "result": result, "id": rpc_id}

    # -- helpers --------------------------------------------------------------------

    def now(self) -> int:
        return int(self.clock())

    def _task_row(self, db: sqlite3.Connection, task_id: Any) -> dict[str, Any] | None:
        row = db.execute("SELECT * FROM tasks WHERE id = ?", (_int(task_id),)).fetchone()
        return None if row is None else dict(row)

    def _format_task(self, task: dict[str, Any]) -> dict[str, Any]:
        task = self._shape("tasks", task)
        task["url"] = f"{self.base_url}?controller=TaskViewController&action=show&task_id={task['id']}"
        task["color"] = COLORS.get(str(task["color_id"]), COLORS["yellow"])
        return task

    def _format_project(self, project: dict[str, Any]) -> dict[str, Any]:
        project = self._shape("projects", project)
        pid = project["id"]
        project["url"] = {
            "board": f"{self.base_url}?controller=BoardViewController&action=show&project_id={pid}",
            "list": f"{self.base_url}?controller=TaskListController&action=show&project_id={pid}",
        }
        return project

    # -- the flavour's rules ---------------------------------------------------------

    def _shape(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """A stored row as the flavour's backend answers it."""
        return fl.shape(self.flavour, table, row)

    def _rows(self, table: str, rows: Any) -> list[dict[str, Any]]:
        return [self._shape(table, dict(r)) for r in rows]

    def _fit(self, table: str, column: str, value: Any) -> Any:
        """``value`` within ``table.column``'s VARCHAR limit, or an SQL error."""
        return fl.fit(self.flavour, table, column, value)

    def _eq(self, column: str, *, nocase: bool = False) -> str:
        """``column = ?`` compared as the backend compares names."""
        return fl.eq_sql(self.flavour, column, nocase=nocase)

    def _order(self, column: str, *, nocase: bool = False) -> str:
        return fl.order_sql(self.flavour, column, nocase=nocase)

    def _insert(self, db: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
        """INSERT one row with the flavour's id rule (reused on SQLite, a sequence else)."""
        return self.store.insert(db, table, values, reuse_ids=self.flavour.reuse_ids)

    def _refused(self, db: sqlite3.Connection, table: str) -> bool:
        """A unique-key refusal found before the INSERT: ``False``, and on a backend with
        sequences the id that the failed INSERT would have taken is gone."""
        if not self.flavour.reuse_ids:
            self.store.next_id(db, table)
        return False


def encode(reply: Any) -> bytes:
    """JSON as Kanboard sends it (unescaped slashes and unicode)."""
    text = json.dumps(reply, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate came in; escape rather than fail
        return json.dumps(reply, separators=(",", ":")).encode()


def _error(rpc_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return {"jsonrpc": "2.0", "error": err, "id": rpc_id}


def _bind(spec: _Spec, params: Any) -> list[Any]:
    """Kanboard's argument binding (JsonRPC ProcedureHandler).

    The number of params is checked first: fewer than the required count is "Wrong
    number of arguments", more than the total is "Too many arguments" (named params
    included, unknown keys counted). Then positional params bind in order, and named
    ones by exact, case-sensitive name ("Missing argument: <name>"); unknown names are
    ignored and a named ``null`` is passed as ``null``.
    """
    if not params:
        params = []
    n = len(params)
    if n < spec.required:
        raise InvalidParams("Wrong number of arguments")
    if n > len(spec.names):
        raise InvalidParams("Too many arguments")
    if isinstance(params, dict):
        if list(params) == [str(i) for i in range(n)]:
            params = list(params.values())  # PHP sees {"0":..,"1":..} as a list
        else:
            args: list[Any] = []
            for name, default in zip(spec.names, spec.defaults, strict=True):
                if name in params:
                    args.append(params[name])
                elif default is not inspect.Parameter.empty:
                    args.append(default)
                else:
                    raise InvalidParams(f"Missing argument: {name}")
            return args
    return [*params, *spec.defaults[n:]]


# Kanboard's default task colors, as getDefaultTaskColors reports them.
COLORS: dict[str, dict[str, str]] = {
    "yellow": {"name": "Yellow", "background": "rgb(245, 247, 196)", "border": "rgb(223, 227, 45)"},
    "blue": {"name": "Blue", "background": "rgb(219, 235, 255)", "border": "rgb(168, 207, 255)"},
    "green": {"name": "Green", "background": "rgb(189, 244, 203)", "border": "rgb(74, 227, 113)"},
    "purple": {"name": "Purple", "background": "rgb(223, 176, 255)", "border": "rgb(205, 133, 254)"},
    "red": {"name": "Red", "background": "rgb(255, 187, 187)", "border": "rgb(255, 151, 151)"},
    "orange": {"name": "Orange", "background": "rgb(255, 215, 179)", "border": "rgb(255, 172, 98)"},
    "grey": {"name": "Grey", "background": "rgb(238, 238, 238)", "border": "rgb(204, 204, 204)"},
    "brown": {"name": "Brown", "background": "#d7ccc8", "border": "#4e342e"},
    "deep_orange": {"name": "Deep Orange", "background": "#ffab91", "border": "#e64a19"},
    "dark_grey": {"name": "Dark Grey", "background": "#cfd8dc", "border": "#455a64"},
    "pink": {"name": "Pink", "background": "#f48fb1", "border": "#d81b60"},
    "teal": {"name": "Teal", "background": "#80cbc4", "border": "#00695c"},
    "cyan": {"name": "Cyan", "background": "#b2ebf2", "border": "#00bcd4"},
    "lime": {"name": "Lime", "background": "#e6ee9c", "border": "#afb42b"},
    "light_green": {"name": "Light Green", "background": "#dcedc8", "border": "#689f38"},
    "amber": {"name": "Amber", "background": "#ffe082", "border": "#ffa000"},
}

_IDENTIFIER = re.compile(r"^[A-Za-z0-9]+$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")


def _row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    return None if row is None else dict(row)


# --------------------------------------------------------------------------- misc


@procedure
def getVersion(api: BoardApi) -> str:
    return API_VERSION


@procedure
def getTimezone(api: BoardApi) -> str:
    return "UTC"


@procedure
def getDefaultTaskColors(api: BoardApi) -> dict[str, dict[str, str]]:
    return COLORS


@procedure
def getDefaultTaskColor(api: BoardApi) -> str:
    return "yellow"


@procedure
def getColorList(api: BoardApi) -> dict[str, str]:
    return {k: v["name"] for k, v in COLORS.items()}


# ----------------------------------------------------------------------- projects


def _project(db: sqlite3.Connection, project_id: Any) -> dict[str, Any] | None:
    return _row(db.execute("SELECT * FROM projects WHERE id = ?", (_int(project_id),)).fetchone())


def _user_exists(db: sqlite3.Connection, user_id: Any) -> bool:
    return db.execute("SELECT 1 FROM users WHERE id = ?", (_int(user_id),)).fetchone() is not None


@procedure
def createProject(
    api: BoardApi,
    name: Any,
    description: Any = None,
    owner_id: Any = 0,
    identifier: Any = None,
    start_date: Any = None,
    end_date: Any = None,
    priority_default: Any = None,
    priority_start: Any = None,
    priority_end: Any = None,
    email: Any = None,
) -> int | bool:
    if not _given(name) or len(_as_text(name)) > 65535:  # the validator's MaxLength
        return False
    ident = _as_text(identifier).upper() if _given(identifier) else None
    if ident is not None and (not _IDENTIFIER.match(ident) or len(ident) > 50):
        return False
    if not all(_is_integer(v) for v in (priority_default, priority_start, priority_end)):
        return False
    for date in (start_date, end_date):
        if _given(date) and len(_as_text(date)) > 10:
            return False
    if _given(email) and not _EMAIL.match(_as_text(email)):
        return False
    values: dict[str, Any] = {
        "name": name,
        "description": description,
        "identifier": ident,
        "start_date": start_date,
        "end_date": end_date,
        "email": email,
        "priority_default": None if priority_default is None else _int(priority_default),
        "priority_start": None if priority_start is None else _int(priority_start),
        "priority_end": None if priority_end is None else _int(priority_end),
    }
    values = {k: _stored(v) for k, v in values.items() if v is not None}
    with api.store.write() as db:
        # The validator's unique checks are plain SELECTs: they compare as the backend does.
        if ident and db.execute(f"SELECT 1 FROM projects WHERE {api._eq('identifier')}", (ident,)).fetchone():
            return False
        if (
            _given(email)
            and db.execute(f"SELECT 1 FROM projects WHERE {api._eq('email')}", (values["email"],)).fetchone()
        ):
            return False
        if not _empty(owner_id) and not _user_exists(db, owner_id):
            return False
        values.update(token="", last_modified=api.now(), is_private=0, owner_id=_stored(owner_id))
        pid = api._insert(db, "projects", values)
        for pos, title in enumerate(DEFAULT_COLUMNS, start=1):
            api._insert(
                db, "columns", {"title": title, "position": pos, "project_id": pid, "description": ""}
            )
        api._insert(
            db, "swimlanes", {"name": DEFAULT_SWIMLANE, "position": 1, "project_id": pid, "description": ""}
        )
        # With the app token Kanboard adds no member, not even owner_id.
        return pid


@procedure
def getProjectById(api: BoardApi, project_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        project = _project(db, project_id)
        return None if project is None else api._format_project(project)


@procedure
def getProjectByName(api: BoardApi, name: Any) -> dict[str, Any] | bool:
    with api.store.read() as db:
        row = _row(
            db.execute(
                f"SELECT * FROM projects WHERE {api._eq('name')} ORDER BY id LIMIT 1",
                (_as_text(name),),
            ).fetchone()
        )
        return False if row is None else api._format_project(row)


@procedure
def getProjectByIdentifier(api: BoardApi, identifier: Any) -> dict[str, Any] | bool:
    ident = _as_text(identifier).upper()
    if not ident:
        return False
    with api.store.read() as db:
        row = _row(
            db.execute(
                f"SELECT * FROM projects WHERE {api._eq('identifier')} ORDER BY id LIMIT 1", (ident,)
            ).fetchone()
        )
        return False if row is None else api._format_project(row)


@procedure
def getAllProjects(api: BoardApi) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [
            api._format_project(dict(r))
            for r in db.execute(f"SELECT * FROM projects ORDER BY {api._order('name')}, id")
        ]


@procedure
def removeProject(api: BoardApi, project_id: Any) -> bool:
    with api.store.write() as db:
        pid = _int(project_id)
        if _project(db, pid) is None:
            return False
        db.execute("DELETE FROM tags WHERE project_id = ?", (pid,))
        db.execute("DELETE FROM projects WHERE id = ?", (pid,))
        return True


@procedure
def enableProject(api: BoardApi, project_id: Any) -> bool:
    return _set_project_active(api, project_id, 1)


@procedure
def disableProject(api: BoardApi, project_id: Any) -> bool:
    return _set_project_active(api, project_id, 0)


def _set_project_active(api: BoardApi, project_id: Any, active: int) -> bool:
    with api.store.write() as db:
        return (
            db.execute("UPDATE projects SET is_active = ? WHERE id = ?", (active, _int(project_id))).rowcount
            > 0
        )


# ------------------------------------------------------------------------ columns


@procedure
def getColumns(api: BoardApi, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM columns WHERE project_id = ? ORDER BY position, id",
            (_int(project_id),),
        )
        return api._rows("columns", rows)


@procedure
def getColumn(api: BoardApi, column_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(db.execute("SELECT * FROM columns WHERE id = ?", (_int(column_id),)).fetchone())
        return None if row is None else api._shape("columns", row)


def _title_taken(api: BoardApi, db: sqlite3.Connection, project_id: int, title: str, but: int = 0) -> bool:
    """UNIQUE(title, project_id), compared as the backend compares (MySQL: ignoring case)."""
    return (
        db.execute(
            f"SELECT 1 FROM columns WHERE project_id = ? AND id != ? AND {api._eq('title')}",
            (project_id, but, title),
        ).fetchone()
        is not None
    )


@procedure
def addColumn(
    api: BoardApi, project_id: Any, title: Any, task_limit: Any = 0, description: Any = ""
) -> int | bool:
    with api.store.write() as db:
        pid = _int(project_id)
        if _project(db, pid) is None:
            return False
        (pos,) = db.execute(
            "SELECT COALESCE(MAX(position), 0) + 1 FROM columns WHERE project_id = ?", (pid,)
        ).fetchone()
        text = api._fit("columns", "title", _as_text(title))
        if _title_taken(api, db, pid, text):
            return api._refused(db, "columns")  # the unique index: Kanboard answers false
        try:
            return api._insert(
                db,
                "columns",
                {
                    "title": text,
                    "position": pos,
                    "project_id": pid,
                    "task_limit": _int(task_limit),
                    "description": _as_text(description),
                },
            )
        except sqlite3.IntegrityError:
            return False


@procedure
def updateColumn(
    api: BoardApi, column_id: Any, title: Any, task_limit: Any = 0, description: Any = ""
) -> bool:
    with api.store.write() as db:
        text = api._fit("columns", "title", _as_text(title))
        row = db.execute("SELECT project_id FROM columns WHERE id = ?", (_int(column_id),)).fetchone()
        if row is not None and _title_taken(api, db, row[0], text, but=_int(column_id)):
            return False
        try:
            db.execute(
                "UPDATE columns SET title = ?, task_limit = ?, description = ? WHERE id = ?",
                (text, _int(task_limit), _as_text(description), _int(column_id)),
            )
        except sqlite3.IntegrityError:
            return False
        return True  # an UPDATE of no row is a success for Kanboard


@procedure
def changeColumnPosition(api: BoardApi, project_id: Any, column_id: Any, position: Any) -> bool:
    pos = _int(position)
    with api.store.write() as db:
        ids = [
            r[0]
            for r in db.execute(
                "SELECT id FROM columns WHERE project_id = ? ORDER BY position, id",
                (_int(project_id),),
            )
        ]
        cid = _int(column_id)
        if cid not in ids or pos < 1 or pos > len(ids):
            return False
        ids.remove(cid)
        ids.insert(pos - 1, cid)
        db.executemany(
            "UPDATE columns SET position = ? WHERE id = ?", [(i, c) for i, c in enumerate(ids, start=1)]
        )
        return True


@procedure
def removeColumn(api: BoardApi, column_id: Any) -> bool:
    with api.store.write() as db:
        cid = _int(column_id)
        if db.execute("SELECT 1 FROM tasks WHERE column_id = ?", (cid,)).fetchone():
            return False
        return db.execute("DELETE FROM columns WHERE id = ?", (cid,)).rowcount > 0


# ---------------------------------------------------------------------- swimlanes


@procedure
def getActiveSwimlanes(api: BoardApi, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM swimlanes WHERE project_id = ? AND is_active = 1 ORDER BY position, id",
            (_int(project_id),),
        )
        return api._rows("swimlanes", rows)


@procedure
def getAllSwimlanes(api: BoardApi, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM swimlanes WHERE project_id = ? ORDER BY position, id",
            (_int(project_id),),
        )
        return api._rows("swimlanes", rows)


@procedure
def getSwimlaneByName(api: BoardApi, project_id: Any, name: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(
            db.execute(
                f"SELECT * FROM swimlanes WHERE project_id = ? AND {api._eq('name')} ORDER BY id LIMIT 1",
                (_int(project_id), _as_text(name)),
            ).fetchone()
        )
        return None if row is None else api._shape("swimlanes", row)


@procedure
def getSwimlane(api: BoardApi, swimlane_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(db.execute("SELECT * FROM swimlanes WHERE id = ?", (_int(swimlane_id),)).fetchone())
        return None if row is None else api._shape("swimlanes", row)


@procedure
def getSwimlaneById(api: BoardApi, swimlane_id: Any) -> dict[str, Any] | None:
    return getSwimlane(api, swimlane_id)  # type: ignore[no-any-return]


@procedure
def addSwimlane(api: BoardApi, project_id: Any, name: Any, description: Any = "") -> int | bool:
    with api.store.write() as db:
        pid = _int(project_id)
        if db.execute(
            f"SELECT 1 FROM swimlanes WHERE project_id = ? AND {api._eq('name')}",
            (pid, _as_text(name)),
        ).fetchone():
            return False
        if _project(db, pid) is None:
            return 0  # the insert fails on the foreign key: (int) false
        (pos,) = db.execute(
            "SELECT COALESCE(MAX(position), 0) + 1 FROM swimlanes WHERE project_id = ?", (pid,)
        ).fetchone()
        return api._insert(
            db,
            "swimlanes",
            {
                "name": api._fit("swimlanes", "name", _as_text(name)),
                "position": pos,
                "project_id": pid,
                "description": _as_text(description),
            },
        )


# --------------------------------------------------------------------- categories


@procedure
def createCategory(api: BoardApi, project_id: Any, name: Any, color_id: Any = None) -> int | bool:
    if not _given(name) or not _is_integer(project_id):
        return False
    with api.store.write() as db:
        text = api._fit("categories", "name", _as_text(name))
        # SQLite's schema declares the name NOCASE, MySQL's collation ignores case too.
        if db.execute(
            f"SELECT 1 FROM categories WHERE project_id = ? AND {api._eq('name', nocase=True)}",
            (_int(project_id), text),
        ).fetchone():
            return api._refused(db, "categories")
        try:
            return api._insert(
                db,
                "categories",
                {
                    "name": text,
                    "project_id": _int(project_id),
                    "color_id": None
                    if color_id is None
                    else api._fit("categories", "color_id", _as_text(color_id)),
                },
            )
        except sqlite3.IntegrityError:
            return False


@procedure
def getCategory(api: BoardApi, category_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        return _row(db.execute("SELECT * FROM categories WHERE id = ?", (_int(category_id),)).fetchone())


@procedure
def getAllCategories(api: BoardApi, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [
            dict(r)
            for r in db.execute(
                f"SELECT * FROM categories WHERE project_id = ? ORDER BY {api._order('name', nocase=True)}",
                (_int(project_id),),
            )
        ]


@procedure
def removeCategory(api: BoardApi, category_id: Any) -> bool:
    with api.store.write() as db:
        cid = _int(category_id)
        db.execute("UPDATE tasks SET category_id = 0 WHERE category_id = ?", (cid,))
        return db.execute("DELETE FROM categories WHERE id = ?", (cid,)).rowcount > 0


# -------------------------------------------------------------------------- users


@procedure
def createUser(
    api: BoardApi,
    username: Any,
    password: Any,
    name: Any = "",
    email: Any = "",
    role: Any = "app-user",
) -> int | bool:
    if not _given(username) or len(_as_text(username)) > 191:
        return False
    if len(_as_text(password)) < 6:
        return False
    if _given(email) and not _EMAIL.match(_as_text(email)):
        return False
    if _given(role) and role not in APP_ROLES:
        return False
    with api.store.write() as db:
        if db.execute(f"SELECT 1 FROM users WHERE {api._eq('username')}", (_as_text(username),)).fetchone():
            return False  # the validator's unique check: MySQL compares ignoring case
        values: dict[str, Any] = {
            "username": _as_text(username),
            "password": hash_password(_as_text(password)),
            "name": api._fit("users", "name", _as_text(name)),
            "email": api._fit("users", "email", _as_text(email)),
            "role": _as_text(role) or "app-user",
        }
        if api.flavour.null_lock_expiration:
            values["lock_expiration_date"] = None  # MySQL's column has no default
        try:
            return api._insert(db, "users", values)
        except sqlite3.IntegrityError:
            return False


@procedure
def getUser(api: BoardApi, user_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(db.execute("SELECT * FROM users WHERE id = ?", (_int(user_id),)).fetchone())
        return None if row is None else api._shape("users", row)


@procedure
def getUserByName(api: BoardApi, username: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(
            db.execute(f"SELECT * FROM users WHERE {api._eq('username')}", (_as_text(username),)).fetchone()
        )
        return None if row is None else api._shape("users", row)


@procedure
def getAllUsers(api: BoardApi) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return api._rows("users", db.execute(f"SELECT * FROM users ORDER BY {api._order('username')}, id"))


@procedure
def addProjectUser(api: BoardApi, project_id: Any, user_id: Any, role: Any = "project-member") -> bool:
    if role not in PROJECT_ROLES:
        return False
    with api.store.write() as db:
        pid, uid = _int(project_id), _int(user_id)
        if _project(db, pid) is None or not _user_exists(db, uid):
            return False
        try:
            db.execute(
                "INSERT INTO project_has_users (project_id, user_id, role) VALUES (?,?,?)",
                (pid, uid, role),
            )
        except sqlite3.IntegrityError:
            return False
        return True


@procedure
def removeProjectUser(api: BoardApi, project_id: Any, user_id: Any) -> bool:
    with api.store.write() as db:
        return (
            db.execute(
                "DELETE FROM project_has_users WHERE project_id = ? AND user_id = ?",
                (_int(project_id), _int(user_id)),
            ).rowcount
            > 0
        )


@procedure
def getProjectUserRole(api: BoardApi, project_id: Any, user_id: Any) -> str:
    with api.store.read() as db:
        row = db.execute(
            "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?",
            (_int(project_id), _int(user_id)),
        ).fetchone()
        return "" if row is None else str(row[0])


def _user_list(rows: Any) -> dict[str, str]:
    """Kanboard's ``prepareList``: id -> name (username when empty), sorted by value."""
    users = {str(r["id"]): (r["name"] or r["username"]) for r in rows}
    return dict(sorted(users.items(), key=lambda kv: kv[1]))


@procedure
def getProjectUsers(api: BoardApi, project_id: Any) -> dict[str, str]:
    with api.store.read() as db:
        return _user_list(
            db.execute(
                "SELECT u.id, u.username, u.name FROM project_has_users p JOIN users u"
                " ON u.id = p.user_id WHERE p.project_id = ?",
                (_int(project_id),),
            )
        )


@procedure
def getAssignableUsers(api: BoardApi, project_id: Any, prepend_unassigned: Any = False) -> dict[str, str]:
    with api.store.read() as db:
        users = _user_list(
            db.execute(
                "SELECT u.id, u.username, u.name FROM project_has_users p JOIN users u"
                " ON u.id = p.user_id WHERE p.project_id = ? AND u.is_active = 1"
                " AND p.role != 'project-viewer'",
                (_int(project_id),),
            )
        )
    if prepend_unassigned:
        users = {"0": "Unassigned", **users}
    return users


def _assignable(db: sqlite3.Connection, project_id: Any, user_id: Any) -> bool:
    """Kanboard's ``isAssignable``: an active project member or manager (not a viewer)."""
    if not _is_integer(user_id) or not _given(user_id):
        return False
    user = db.execute("SELECT is_active FROM users WHERE id = ?", (_int(user_id),)).fetchone()
    if user is None or user[0] != 1:
        return False
    project = db.execute(
        "SELECT is_everybody_allowed FROM projects WHERE id = ?", (_int(project_id),)
    ).fetchone()
    if project is not None and project[0] == 1:
        return True
    row = db.execute(
        "SELECT role FROM project_has_users WHERE project_id = ? AND user_id = ?",
        (_int(project_id), _int(user_id)),
    ).fetchone()
    return row is not None and row[0] != "project-viewer"


# --------------------------------------------------------------------------- tags


def _tag_list(tags: Any) -> list[str]:
    """The names of a ``tags`` param; PHP types it ``array``, so anything else is fatal."""
    if not isinstance(tags, list | dict):
        raise Fatal("tags must be an array")
    values = tags.values() if isinstance(tags, dict) else tags
    return [_as_text(t) for t in values if not _empty(t)]


def _tag_taken(api: BoardApi, db: sqlite3.Connection, project_id: int, name: str, but: int = 0) -> bool:
    """UNIQUE(project_id, name) as the backend compares (MySQL: ignoring case, accents)."""
    return (
        db.execute(
            f"SELECT 1 FROM tags WHERE project_id = ? AND id != ? AND {api._eq('name')}",
            (project_id, but, name),
        ).fetchone()
        is not None
    )


def _find_or_create_tag(api: BoardApi, db: sqlite3.Connection, project_id: int, name: str) -> int | None:
    # Kanboard resolves a name with ILIKE (wildcards live; SQLite folds ASCII only,
    # PostgreSQL all of Unicode, MySQL accents too), preferring a global tag (project 0);
    # a name not found is created.
    row = db.execute(
        f"SELECT id FROM tags WHERE project_id IN (0, ?) AND {fl.like_sql(api.flavour, 'name')}"
        " ORDER BY project_id, id LIMIT 1",
        (project_id, name),
    ).fetchone()
    if row is not None:
        return int(row[0])
    name = api._fit("tags", "name", name)
    if _tag_taken(api, db, project_id, name):
        api._refused(db, "tags")
        return None
    try:
        return api._insert(db, "tags", {"name": name, "project_id": project_id})
    except sqlite3.IntegrityError:
        return None


def _save_tags(
    api: BoardApi, db: sqlite3.Connection, project_id: int, task_id: int, names: list[str]
) -> None:
    """Kanboard's TaskTagModel::save, quirks included.

    Tags are attached by case-insensitive lookup, but the removal step compares the
    stored names case-sensitively: calling it again with ``["BACKEND"]`` drops
    ``backend``. Keep tag names lowercase.
    """
    current = {
        int(r[0]): str(r[1])
        for r in db.execute(
            "SELECT g.id, g.name FROM task_has_tags th JOIN tags g ON g.id = th.tag_id WHERE th.task_id = ?",
            (task_id,),
        )
    }
    for name in names:
        tag_id = _find_or_create_tag(api, db, project_id, name)
        if tag_id is not None and tag_id not in current:
            db.execute(
                "INSERT OR IGNORE INTO task_has_tags (task_id, tag_id) VALUES (?, ?)", (task_id, tag_id)
            )
    for tag_id, name in current.items():
        if name not in names:
            db.execute("DELETE FROM task_has_tags WHERE task_id = ? AND tag_id = ?", (task_id, tag_id))


@procedure
def getAllTags(api: BoardApi) -> list[dict[str, Any]]:
    with api.store.read() as db:
        return [dict(r) for r in db.execute(f"SELECT * FROM tags ORDER BY {api._order('name')}, id")]


@procedure
def getTagsByProject(api: BoardApi, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT * FROM tags WHERE project_id = ? ORDER BY {api._order('name')}, id",
            (_int(project_id),),
        )
        return [dict(r) for r in rows]


@procedure
def createTag(api: BoardApi, project_id: Any, tag: Any, color_id: Any = None) -> int | bool:
    """A plain INSERT under UNIQUE(project_id, name): exactly one concurrent caller wins.

    Any project id is accepted (no foreign key); project 0 makes a global tag. The
    unique check and the name's length follow the flavour: ``ABC`` is a duplicate of
    ``abc`` on MySQL, and a name over 191 (MySQL) or 255 (PostgreSQL) characters, or a
    color_id over 50, is an SQL error there.
    """
    pid = _int(project_id)
    with api.store.write() as db:
        name = api._fit("tags", "name", _as_text(tag))
        color = None if _empty(color_id) else api._fit("tags", "color_id", _as_text(color_id))
        if _tag_taken(api, db, pid, name):
            return api._refused(db, "tags")
        try:
            return api._insert(db, "tags", {"name": name, "project_id": pid, "color_id": color})
        except sqlite3.IntegrityError:
            return False


@procedure
def updateTag(api: BoardApi, tag_id: Any, tag: Any, color_id: Any = None) -> bool:
    with api.store.write() as db:
        name = api._fit("tags", "name", _as_text(tag))
        color = None if _empty(color_id) else api._fit("tags", "color_id", _as_text(color_id))
        row = db.execute("SELECT project_id FROM tags WHERE id = ?", (_int(tag_id),)).fetchone()
        if row is not None and _tag_taken(api, db, row[0], name, but=_int(tag_id)):
            return False
        try:
            db.execute("UPDATE tags SET name = ?, color_id = ? WHERE id = ?", (name, color, _int(tag_id)))
        except sqlite3.IntegrityError:
            return False
        return True  # a missing tag_id updates no row, which is a success


@procedure
def removeTag(api: BoardApi, tag_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM tags WHERE id = ?", (_int(tag_id),)).rowcount > 0


@procedure
def setTaskTags(api: BoardApi, project_id: Any, task_id: Any, tags: Any) -> bool:
    names = _tag_list(tags)
    with api.store.write() as db:
        task = api._task_row(db, task_id)
        if task is None:
            return False
        # The project is not checked against the task's: new tags land in project_id.
        _save_tags(api, db, _int(project_id), task["id"], names)
        return True


@procedure
def getTaskTags(api: BoardApi, task_id: Any) -> dict[str, str]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT g.id, g.name FROM task_has_tags th JOIN tags g ON g.id = th.tag_id"
            " WHERE th.task_id = ? ORDER BY g.id",
            (_int(task_id),),
        )
        return {str(r["id"]): r["name"] for r in rows}


# -------------------------------------------------------------------------- tasks

_TASK_INTEGERS = (
    "project_id",
    "column_id",
    "owner_id",
    "creator_id",
    "score",
    "category_id",
    "swimlane_id",
    "recurrence_status",
    "recurrence_trigger",
    "recurrence_factor",
    "recurrence_timeframe",
    "recurrence_basedate",
    "priority",
)


def _validate_task(values: dict[str, Any], now: int) -> dict[str, Any] | None:
    """Kanboard's TaskValidator common rules; the values with dates converted, or None."""
    if not all(_is_integer(values.get(k)) for k in _TASK_INTEGERS):
        return None
    if _given(values.get("score")) and abs(_int(values["score"])) > 2147483647:
        return None
    if _given(values.get("swimlane_id")) and _int(values["swimlane_id"]) <= 0:
        return None
    if len(_as_text(values.get("title"))) > 65535 or len(_as_text(values.get("reference"))) > 191:
        return None
    if not (_is_numeric(values.get("time_spent")) and _is_numeric(values.get("time_estimated"))):
        return None
    out = dict(values)
    for key in ("date_due", "date_started"):
        v = values.get(key)
        if _given(v):
            try:
                out[key] = parse_input_date(v, now)
            except BadDate:
                return None
    started, due = out.get("date_started"), out.get("date_due")
    if not _empty(started) and not _empty(due) and _int(started) > _int(due):
        return None
    # resetFields: a given-but-empty value becomes 0.
    for key in (
        "creator_id",
        "owner_id",
        "date_due",
        "date_started",
        "score",
        "category_id",
        "time_estimated",
        "time_spent",
    ):
        if key in out and out[key] is not None and _empty(out[key]):
            out[key] = 0
    return out


@procedure
def createTask(
    api: BoardApi,
    title: Any,
    project_id: Any,
    color_id: Any = "",
    column_id: Any = 0,
    owner_id: Any = 0,
    creator_id: Any = 0,
    date_due: Any = "",
    description: Any = "",
    category_id: Any = 0,
    score: Any = 0,
    swimlane_id: Any = None,
    priority: Any = 0,
    recurrence_status: Any = 0,
    recurrence_trigger: Any = 0,
    recurrence_factor: Any = 0,
    recurrence_timeframe: Any = 0,
    recurrence_basedate: Any = 0,
    reference: Any = "",
    tags: Any = ABSENT,
    date_started: Any = "",
    time_spent: Any = None,
    time_estimated: Any = None,
) -> int | bool:
    tag_names = [] if tags is ABSENT else _tag_list(tags)
    given = dict(locals())
    for k in ("api", "tags", "tag_names"):
        given.pop(k)
    if not _given(project_id) or not _given(title):
        return False
    now = api.now()
    values = _validate_task(given, now)
    if values is None:
        return False
    with api.store.write() as db:
        # The owner and the creator must be assignable, unless exactly the integer 0.
        for who in (owner_id, creator_id):
            if not (type(who) is int and who == 0) and not _assignable(db, project_id, who):
                return False
        pid = _int(project_id)
        if _empty(values["column_id"]):
            row = db.execute(
                "SELECT id FROM columns WHERE project_id = ? ORDER BY position, id LIMIT 1",
                (pid,),
            ).fetchone()
            values["column_id"] = None if row is None else row[0]
            if row is None and api.flavour.sql_errors:
                # An unknown project has no first column: '' is bound for an integer.
                raise SqlError(fl.no_column_error(api.flavour))
        if _empty(values["color_id"]):
            values["color_id"] = "yellow"
        if _empty(values["title"]):
            values["title"] = "Untitled"
        if _empty(values["swimlane_id"]):
            row = db.execute(
                "SELECT id FROM swimlanes WHERE project_id = ? AND is_active = 1"
                " ORDER BY position, id LIMIT 1",
                (pid,),
            ).fetchone()
            values["swimlane_id"] = None if row is None else row[0]
        (count,) = db.execute(
            "SELECT COUNT(*) FROM tasks WHERE project_id = ? AND column_id = ?"
            " AND swimlane_id = ? AND is_active = 1",
            (pid, values["column_id"], values["swimlane_id"]),
        ).fetchone()
        values.update(position=count + 1, date_creation=now, date_modification=now, date_moved=now)
        stored = {k: _stored(v) for k, v in values.items()}
        stored["color_id"] = api._fit("tasks", "color_id", stored["color_id"])
        try:
            task_id = api._insert(db, "tasks", stored)
        except sqlite3.IntegrityError:
            return 0  # a foreign key (project, column, swimlane) or NOT NULL failed
        if tag_names:
            _save_tags(api, db, pid, task_id, tag_names)
        return task_id


@procedure
def getTask(api: BoardApi, task_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        task = api._task_row(db, task_id)
        return None if task is None else api._format_task(task)


@procedure
def getTaskByReference(api: BoardApi, project_id: Any, reference: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = _row(
            db.execute(
                f"SELECT * FROM tasks WHERE project_id = ? AND {api._eq('reference')} ORDER BY id LIMIT 1",
                (_int(project_id), _as_text(reference)),
            ).fetchone()
        )
        return None if row is None else api._format_task(row)


@procedure
def getAllTasks(api: BoardApi, project_id: Any, status_id: Any = 1) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM tasks WHERE project_id = ? AND is_active = ? ORDER BY id",
            (_int(project_id), _int(status_id)),
        )
        return [api._format_task(dict(r)) for r in rows]


@procedure
def updateTask(
    api: BoardApi,
    id: Any,
    title: Any = None,
    color_id: Any = None,
    owner_id: Any = None,
    date_due: Any = None,
    description: Any = None,
    category_id: Any = None,
    score: Any = None,
    priority: Any = None,
    recurrence_status: Any = None,
    recurrence_trigger: Any = None,
    recurrence_factor: Any = None,
    recurrence_timeframe: Any = None,
    recurrence_basedate: Any = None,
    reference: Any = None,
    tags: Any = None,
    date_started: Any = None,
    time_spent: Any = None,
    time_estimated: Any = None,
) -> bool:
    given = {k: v for k, v in locals().items() if v is not None and k not in ("api", "id")}
    tag_names = _tag_list(given.pop("tags")) if "tags" in given else None
    now = api.now()
    with api.store.write() as db:
        task = api._task_row(db, id)
        if task is None:
            return False
        if (
            "owner_id" in given
            and not _same(owner_id, 0)
            and not _assignable(db, task["project_id"], owner_id)
        ):
            return False
        values = _validate_task(given, now)
        if values is None or not _is_integer(id):
            return False
        if tag_names is not None:
            _save_tags(api, db, task["project_id"], task["id"], tag_names)
        for key in (
            "priority",
            "recurrence_status",
            "recurrence_trigger",
            "recurrence_factor",
            "recurrence_timeframe",
            "recurrence_basedate",
        ):
            if key in values:
                values[key] = _int(values[key])
        values["date_modification"] = now
        stored = {k: _stored(v) for k, v in values.items()}
        if "color_id" in stored:
            stored["color_id"] = api._fit("tasks", "color_id", stored["color_id"])
        cols = ", ".join(f"{k} = ?" for k in stored)
        db.execute(f"UPDATE tasks SET {cols} WHERE id = ?", (*stored.values(), task["id"]))
        return True


@procedure
def openTask(api: BoardApi, task_id: Any) -> bool:
    with api.store.write() as db:
        return (
            db.execute(
                "UPDATE tasks SET is_active = 1, date_completed = 0, date_modification = ? WHERE id = ?",
                (api.now(), _int(task_id)),
            ).rowcount
            > 0
        )


@procedure
def closeTask(api: BoardApi, task_id: Any) -> bool:
    now = api.now()
    with api.store.write() as db:
        return (
            db.execute(
                "UPDATE tasks SET is_active = 0, date_completed = ?, date_modification = ? WHERE id = ?",
                (now, now, _int(task_id)),
            ).rowcount
            > 0
        )


@procedure
def removeTask(api: BoardApi, task_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM tasks WHERE id = ?", (_int(task_id),)).rowcount > 0


def _renumber(
    db: sqlite3.Connection, project_id: int, task_id: int, position: int, column_id: int, swimlane_id: int
) -> None:
    """Kanboard's saveTaskPositions: open tasks of a cell renumbered 1..n, the task put
    at ``position`` (clamped to the bottom); position 0 only closes the gap it left."""
    siblings = [
        r[0]
        for r in db.execute(
            "SELECT id FROM tasks WHERE is_active = 1 AND swimlane_id = ? AND project_id = ?"
            " AND column_id = ? AND id != ? ORDER BY position, id",
            (swimlane_id, project_id, column_id, task_id),
        )
    ]
    if position >= 1:
        siblings.insert(min(position, len(siblings) + 1) - 1, task_id)
    db.executemany(
        "UPDATE tasks SET position = ?, column_id = ?, swimlane_id = ? WHERE id = ?",
        [(i, column_id, swimlane_id, tid) for i, tid in enumerate(siblings, start=1)],
    )


@procedure
def moveTaskPosition(
    api: BoardApi,
    project_id: Any,
    task_id: Any,
    column_id: Any,
    position: Any,
    swimlane_id: Any,
) -> bool:
    pos, col, lane = _int(position), _int(column_id), _int(swimlane_id)
    now = api.now()
    with api.store.write() as db:
        task = api._task_row(db, task_id)
        if task is None or task["project_id"] != _int(project_id) or pos < 1:
            return False
        pid = task["project_id"]
        if lane == 0:
            lane = task["swimlane_id"]
        if (task["column_id"], task["swimlane_id"]) == (col, lane):
            if task["position"] == pos:
                return False  # already there: Kanboard reports false
            _renumber(db, pid, task["id"], pos, col, lane)
            return True
        db.execute("SAVEPOINT move")
        try:
            _renumber(db, pid, task["id"], 0, task["column_id"], task["swimlane_id"])
            _renumber(db, pid, task["id"], pos, col, lane)
            ok = True
        except sqlite3.IntegrityError:
            ok = False  # a missing column or swimlane: the renumbering is undone...
            db.execute("ROLLBACK TO move")
        db.execute("RELEASE move")
        # ...but the timestamps are written anyway, as in Kanboard.
        db.execute(
            "UPDATE tasks SET date_moved = ?, date_modification = ? WHERE id = ?", (now, now, task["id"])
        )
        return ok


@procedure
def moveTaskToProject(
    api: BoardApi,
    task_id: Any,
    project_id: Any,
    swimlane_id: Any = None,
    column_id: Any = None,
    category_id: Any = None,
    owner_id: Any = None,
) -> bool:
    now = api.now()
    with api.store.write() as db:
        task = api._task_row(db, task_id)
        if task is None:
            return False
        pid = _int(project_id)
        col = _int(column_id) or _first_id(db, "columns", pid)
        lane = _int(swimlane_id) or _first_id(db, "swimlanes", pid, active_only=True)
        owner = _int(owner_id) if owner_id is not None else task["owner_id"]
        if owner and not _assignable(db, pid, owner):
            owner = 0
        (count,) = db.execute(
            "SELECT COUNT(*) FROM tasks WHERE project_id = ? AND column_id = ?"
            " AND swimlane_id = ? AND is_active = 1",
            (pid, col, lane),
        ).fetchone()
        try:
            db.execute(
                "UPDATE tasks SET project_id = ?, column_id = ?, swimlane_id = ?,"
                " category_id = ?, owner_id = ?, position = ?, is_active = 1,"
                " date_moved = ?, date_modification = ? WHERE id = ?",
                (pid, col, lane, _int(category_id), owner, count + 1, now, now, task["id"]),
            )
        except sqlite3.IntegrityError:
            return False
        return True


def _first_id(
    db: sqlite3.Connection, table: str, project_id: int, *, active_only: bool = False
) -> int | None:
    extra = " AND is_active = 1" if active_only else ""
    row = db.execute(
        f"SELECT id FROM {table} WHERE project_id = ?{extra} ORDER BY position, id LIMIT 1",
        (project_id,),
    ).fetchone()
    return None if row is None else int(row[0])


_SEARCH_SELECT = """
SELECT
  (SELECT COUNT(*) FROM comments WHERE task_id = t.id) AS nb_comments,
  (SELECT COUNT(*) FROM task_has_files WHERE task_id = t.id) AS nb_files,
  0 AS nb_subtasks, 0 AS nb_completed_subtasks, 0 AS nb_links, 0 AS nb_external_links,
  NULL AS is_milestone,
  t.id, t.reference, t.title, t.description, t.date_creation, t.date_modification,
  t.date_completed, t.date_started, t.date_due, t.color_id, t.project_id, t.column_id,
  t.swimlane_id, t.owner_id, t.creator_id, t.position, t.is_active, t.score, t.category_id,
  t.priority, t.date_moved, t.recurrence_status, t.recurrence_trigger, t.recurrence_factor,
  t.recurrence_timeframe, t.recurrence_basedate, t.recurrence_parent, t.recurrence_child,
  t.time_estimated, t.time_spent,
  u.username AS assignee_username, u.name AS assignee_name, u.email AS assignee_email,
  u.avatar_path AS assignee_avatar_path,
  cat.name AS category_name, cat.description AS category_description,
  cat.color_id AS category_color_id,
  c.title AS column_name, c.position AS column_position,
  s.name AS swimlane_name, p.name AS project_name
FROM tasks t
LEFT JOIN users u ON u.id = t.owner_id
LEFT JOIN users uc ON uc.id = t.creator_id
LEFT JOIN categories cat ON cat.id = t.category_id
LEFT JOIN columns c ON c.id = t.column_id
LEFT JOIN swimlanes s ON s.id = t.swimlane_id
LEFT JOIN projects p ON p.id = t.project_id
WHERE t.project_id = ?
"""


@procedure
def searchTasks(api: BoardApi, project_id: Any, query: Any) -> list[dict[str, Any]]:
    where = build_where(_as_text(query), api.flavour)
    sql = _SEARCH_SELECT + "".join(f" AND {c}" for c in where.sql)
    if api.flavour.search_reversed:
        # Kanboard has no ORDER BY here; the real backends happen to answer in id order.
        # Strict answers the other way so nothing comes to depend on it.
        sql += " ORDER BY t.id DESC"
    with api.store.read() as db:
        rows = db.execute(sql, (_int(project_id), *where.params))
        return [fl.shape(api.flavour, "tasks", dict(r), reorder=False) for r in rows]


# ----------------------------------------------------------------------- metadata


# Task and project metadata behave alike in Kanboard; one implementation serves both.
_META_TABLES = {
    "task": ("task_has_metadata", "task_id", "tasks"),
    "project": ("project_has_metadata", "project_id", "projects"),
}


def _meta_all(api: BoardApi, kind: str, owner: Any) -> dict[str, Any]:
    table, col, _ = _META_TABLES[kind]
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT name, value FROM {table} WHERE {col} = ? ORDER BY {api._order('name')}", (_int(owner),)
        )
        return {r["name"]: r["value"] for r in rows}


def _meta_one(api: BoardApi, kind: str, owner: Any, name: Any) -> str:
    table, col, _ = _META_TABLES[kind]
    with api.store.read() as db:
        row = db.execute(
            f"SELECT value FROM {table} WHERE {col} = ? AND {api._eq('name')}", (_int(owner), _as_text(name))
        ).fetchone()
    # Kanboard answers `$value ?: ''`: "" for a missing key, and for "0", "" and null.
    value = None if row is None else row["value"]
    return "" if _empty(value) else str(value)


def _metadata_value(v: Any) -> str | None:
    return None if v is None else _as_text(v)


def _meta_save(api: BoardApi, kind: str, owner: Any, values: Any) -> bool:
    if not isinstance(values, dict | list):
        raise Fatal("values must be an array")  # a PHP TypeError: HTTP 500
    table, col, owners = _META_TABLES[kind]
    items = values.items() if isinstance(values, dict) else enumerate(values)
    rows = [(str(k), _metadata_value(v)) for k, v in items]
    if not rows:
        return True  # Kanboard: saving nothing succeeds without looking
    oid, now, same = _int(owner), api.now(), api._eq("name")
    with api.store.write() as db:
        if db.execute(f"SELECT 1 FROM {owners} WHERE id = ?", (oid,)).fetchone() is None:
            return False
        # Kanboard's MetadataModel::save, in one transaction: UPDATE when exists(name),
        # else INSERT. The lookup compares as the backend does (on MySQL {"key": ..}
        # updates a stored "Key"); a name or value over its VARCHAR limit is an SQL error
        # that rolls back every key of the call.
        for name, value in rows:
            if db.execute(f"SELECT 1 FROM {table} WHERE {col} = ? AND {same}", (oid, name)).fetchone():
                db.execute(
                    f"UPDATE {table} SET value = ?, changed_on = ? WHERE {col} = ? AND {same}",
                    (api._fit(table, "value", value), now, oid, name),
                )
            else:
                db.execute(
                    f"INSERT INTO {table} ({col}, name, changed_on, value) VALUES (?,?,?,?)",
                    (oid, api._fit(table, "name", name), now, api._fit(table, "value", value)),
                )
        return True


def _meta_remove(api: BoardApi, kind: str, owner: Any, name: Any) -> bool:
    table, col, _ = _META_TABLES[kind]
    with api.store.write() as db:
        return (
            db.execute(
                f"DELETE FROM {table} WHERE {col} = ? AND {api._eq('name')}", (_int(owner), _as_text(name))
            ).rowcount
            > 0
        )


@procedure
def getTaskMetadata(api: BoardApi, task_id: Any) -> dict[str, Any]:
    return _meta_all(api, "task", task_id)


@procedure
def getTaskMetadataByName(api: BoardApi, task_id: Any, name: Any) -> str:
    return _meta_one(api, "task", task_id, name)


@procedure
def saveTaskMetadata(api: BoardApi, task_id: Any, values: Any) -> bool:
    return _meta_save(api, "task", task_id, values)


@procedure
def removeTaskMetadata(api: BoardApi, task_id: Any, name: Any) -> bool:
    return _meta_remove(api, "task", task_id, name)


@procedure
def getProjectMetadata(api: BoardApi, project_id: Any) -> dict[str, Any]:
    return _meta_all(api, "project", project_id)


@procedure
def getProjectMetadataByName(api: BoardApi, project_id: Any, name: Any) -> str:
    return _meta_one(api, "project", project_id, name)


@procedure
def saveProjectMetadata(api: BoardApi, project_id: Any, values: Any) -> bool:
    return _meta_save(api, "project", project_id, values)


@procedure
def removeProjectMetadata(api: BoardApi, project_id: Any, name: Any) -> bool:
    return _meta_remove(api, "project", project_id, name)


# ----------------------------------------------------------------------- comments

_COMMENT_USER = "u.username AS username, u.name AS name, u.email AS email, u.avatar_path"
_COMMENT_FROM = " FROM comments c LEFT JOIN users u ON u.id = c.user_id"


@procedure
def createComment(
    api: BoardApi,
    task_id: Any,
    user_id: Any,
    content: Any,
    reference: Any = "",
    visibility: Any = "app-user",
) -> int | bool:
    if not _given(content) or visibility not in APP_ROLES:
        return False
    if not (_is_integer(task_id) and _is_integer(user_id)) or len(_as_text(reference)) > 191:
        return False
    now = api.now()
    with api.store.write() as db:
        try:
            return api._insert(
                db,
                "comments",
                {
                    "task_id": _int(task_id),
                    "user_id": _stored(user_id),
                    "date_creation": now,
                    "date_modification": now,
                    "comment": _as_text(content),
                    "reference": _stored(reference),
                    "visibility": visibility,
                },
            )
        except sqlite3.IntegrityError:
            return False  # the task is missing


@procedure
def getComment(api: BoardApi, comment_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        return _row(
            db.execute(
                "SELECT c.id, c.task_id, c.user_id, c.date_creation, c.date_modification,"
                " c.comment, c.reference, c.visibility, " + _COMMENT_USER + _COMMENT_FROM + " WHERE c.id = ?",
                (_int(comment_id),),
            ).fetchone()
        )


@procedure
def getAllComments(api: BoardApi, task_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT c.id, c.date_creation, c.date_modification, c.task_id, c.user_id,"
            " c.comment, c.visibility, "
            + _COMMENT_USER
            + _COMMENT_FROM
            + " WHERE c.task_id = ? ORDER BY c.date_creation, c.id",
            (_int(task_id),),
        )
        return [dict(r) for r in rows]


@procedure
def updateComment(api: BoardApi, id: Any, content: Any) -> bool:
    if not _given(content):
        return False
    with api.store.write() as db:
        return (
            db.execute(
                "UPDATE comments SET comment = ?, date_modification = ? WHERE id = ?",
                (_as_text(content), api.now(), _int(id)),
            ).rowcount
            > 0
        )


@procedure
def removeComment(api: BoardApi, comment_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM comments WHERE id = ?", (_int(comment_id),)).rowcount > 0


# -------------------------------------------------------------------------- files

_B64_ALPHABET = re.compile(rb"[^A-Za-z0-9+/]")
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")


def _php_base64_decode(text: str) -> bytes:
    """PHP's non-strict ``base64_decode``: foreign characters are skipped, padding optional."""
    data = _B64_ALPHABET.sub(b"", text.split("=", 1)[0].encode("utf-8", "replace"))
    data = data[: len(data) - (len(data) % 4 == 1)]
    return base64.b64decode(data + b"=" * (-len(data) % 4))


_FILE_COLUMNS = "f.id, f.name, f.path, f.is_image, f.task_id, f.date, f.user_id, f.size"


def _file(row: sqlite3.Row) -> dict[str, Any]:
    file = dict(row)
    file["etag"] = hashlib.md5(str(file["path"]).encode()).hexdigest()
    return file


@procedure
def createTaskFile(api: BoardApi, project_id: Any, task_id: Any, filename: Any, blob: Any) -> int | bool:
    data = _php_base64_decode(_as_text(blob))
    name = _as_text(filename)
    now = api.now()
    with api.store.write() as db:
        task = api._task_row(db, task_id)
        if task is None or not _same(task["project_id"], project_id):
            return False
        if not data or data == b"0":
            return False  # PHP's empty(): no content
        is_image = int(
            name.rsplit(".", 1)[-1].lower() in ("jpeg", "jpg", "png", "gif") if "." in name else False
        )
        if is_image and not data.startswith(_IMAGE_MAGIC):
            # Kanboard's thumbnailer dies on an image name with non-image bytes.
            raise Fatal("not an image")
        digest = hashlib.sha1(f"{name}{now}".encode()).hexdigest()
        return api._insert(
            db,
            "task_has_files",
            {
                "name": name,
                "path": f"tasks/{task['id']}/{digest}",
                "is_image": is_image,
                "task_id": task["id"],
                "date": now,
                "user_id": 0,
                "size": len(data),
                "blob": data,
            },
        )


@procedure
def getAllTaskFiles(api: BoardApi, task_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT {_FILE_COLUMNS}, u.username AS username, u.name AS user_name"
            " FROM task_has_files f LEFT JOIN users u ON u.id = f.user_id"
            f" WHERE f.task_id = ? ORDER BY {api._order('f.name', nocase=True)}, f.id",
            (_int(task_id),),
        )
        return [api._shape("task_has_files", _file(r)) for r in rows]


@procedure
def getTaskFile(api: BoardApi, file_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = db.execute(
            f"SELECT {_FILE_COLUMNS} FROM task_has_files f WHERE f.id = ?", (_int(file_id),)
        ).fetchone()
        return None if row is None else api._shape("task_has_files", _file(row))


@procedure
def downloadTaskFile(api: BoardApi, file_id: Any) -> str:
    with api.store.read() as db:
        row = db.execute("SELECT blob FROM task_has_files WHERE id = ?", (_int(file_id),)).fetchone()
        return "" if row is None else base64.b64encode(row["blob"]).decode()


@procedure
def removeTaskFile(api: BoardApi, file_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM task_has_files WHERE id = ?", (_int(file_id),)).rowcount > 0


@procedure
def removeAllTaskFiles(api: BoardApi, task_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM task_has_files WHERE task_id = ?", (_int(task_id),)).rowcount > 0
