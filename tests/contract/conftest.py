"""Fixtures of the contract suite: one set of assertions, run against every board.

``board`` is parametrised over:

* ``embedded-<flavour>``: the embedded board over real HTTP (an :class:`EmbeddedBoard`
  on an ephemeral loopback port with a temporary database), once per flavour
  (``strict``, ``sqlite``, ``postgres``, ``mysql``; see :mod:`fabric.embedded.flavour`),
  always;
* ``real``: a real, scratch Kanboard, when ``AGAP_TEST_KANBOARD_URL`` (the full
  ``.../jsonrpc.php`` URL), ``AGAP_TEST_KANBOARD_TOKEN`` (its application token) and
  ``AGAP_TEST_KANBOARD_FLAVOUR`` (its database: ``sqlite``, ``postgres`` or ``mysql``) are
  set; skipped with a reason otherwise. ``KANBOARD_URL`` is never read: a shell that points
  at a household's Kanboard sends no test there. A board holding projects the tests did
  not make is refused (:func:`tests.conftest.scratch_board`).

Where the backends differ, a test asks the board's traits (:attr:`Board.ci`,
:attr:`Board.booleans`, ...) what to expect; ``strict`` must fail wherever any real
backend fails.

Every test makes its own projects with unique names, so the suite runs unchanged
against a shared, non-empty Kanboard; it never assumes an id. Run it serially: a real
Kanboard on SQLite with several PHP workers reports "database is locked" under load.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from fabric.embedded.flavour import FLAVOURS
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from tests.conftest import REAL_FLAVOUR, REAL_SKIP, REAL_TOKEN, REAL_URL, scratch_board

REAL_FLAVOURS = ("sqlite", "postgres", "mysql")


@dataclass
class Board:
    """One board under test: its endpoint, a JSON-RPC client and raw HTTP access."""

    kind: str  # "embedded" or "real"
    url: str
    token: str
    client: KanboardClient
    flavour: str  # the database backend: strict (embedded only), sqlite, postgres, mysql
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def is_real(self) -> bool:
        return self.kind == "real"

    # -- what differs between backends (strict takes the strictest of each) ----------

    @property
    def ci(self) -> bool:
        """Names compare case- and accent-insensitively (MySQL's utf8mb4_unicode_ci)."""
        return self.flavour in ("mysql", "strict")

    @property
    def booleans(self) -> bool:
        """BOOLEAN columns answer true/false (PostgreSQL), not 1/0."""
        return self.flavour in ("postgres", "strict")

    @property
    def sql_errors(self) -> bool:
        """Statements fail where SQLite lets them through (types, lengths, ranges)."""
        return self.flavour != "sqlite"

    @property
    def pg_limits(self) -> bool:
        """The VARCHAR(n) limits of Kanboard's PostgreSQL schema hold."""
        return self.flavour in ("postgres", "strict")

    @property
    def mysql_limits(self) -> bool:
        """The VARCHAR(n) limits of Kanboard's MySQL schema hold."""
        return self.flavour in ("mysql", "strict")

    @property
    def pg_messages(self) -> bool:
        """SQL errors read as PostgreSQL's (strict copies them where PostgreSQL fails)."""
        return self.flavour in ("postgres", "strict")

    def flag(self, value: int) -> object:
        """What a BOOLEAN column holding ``value`` answers."""
        return bool(value) if self.booleans else value

    def call(self, method: str, params: Any = None) -> Any:
        """One procedure through the fabric's client (raises RpcError on an RPC error)."""
        return self.client.call(method, params)

    def post(
        self, body: Any, *, token: str | None = None, auth: bool = True, method: str = "POST"
    ) -> requests.Response:
        """A raw HTTP request: ``body`` is sent as is when bytes/str, else JSON-encoded."""
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        creds = ("jsonrpc", self.token if token is None else token) if auth else None
        return requests.request(method, self.url, data=data, auth=creds, timeout=30)

    def rpc(self, method: str, params: Any = None) -> dict[str, Any]:
        """A raw single request; the decoded JSON-RPC reply object."""
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": next(self._ids)}
        if params is not None:
            req["params"] = params
        resp = self.post(req)
        assert resp.status_code == 200, resp.text
        reply: dict[str, Any] = resp.json()
        return reply

    def unique(self, prefix: str = "ct") -> str:
        """A name no other test (or earlier run against the same board) has used."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Project:
    """A fresh project on the board under test, with its default columns and lane."""

    board: Board
    id: int
    name: str
    columns: dict[str, int]  # title -> id, in position order
    swimlane_id: int

    def column(self, title: str) -> int:
        return self.columns[title]

    def task(self, title: str = "task", **params: Any) -> int:
        task_id = self.board.call("createTask", {"title": title, "project_id": self.id, **params})
        assert isinstance(task_id, int) and task_id > 0, task_id
        return task_id


def make_project(board: Board, prefix: str = "ct") -> Project:
    name = board.unique(prefix)
    pid = board.call("createProject", {"name": name})
    assert isinstance(pid, int) and pid > 0, pid
    columns = {c["title"]: c["id"] for c in board.call("getColumns", [pid])}
    lanes = board.call("getActiveSwimlanes", [pid])
    return Project(board, pid, name, columns, lanes[0]["id"])


@pytest.fixture(scope="session")
def _embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], EmbeddedBoard]]:
    """One embedded board per flavour, started on first use."""
    boards: dict[str, EmbeddedBoard] = {}

    def get(flavour: str) -> EmbeddedBoard:
        if flavour not in boards:
            path: Path = tmp_path_factory.mktemp(f"contract-{flavour}") / "board.sqlite3"
            boards[flavour] = EmbeddedBoard(path, token="contract-embedded-token", flavour=flavour).start()
        return boards[flavour]

    try:
        yield get
    finally:
        for emb in boards.values():
            emb.stop()


@pytest.fixture(params=[*(f"embedded-{f}" for f in FLAVOURS), "real"])
def board(request: pytest.FixtureRequest) -> Iterator[Board]:
    """The board under test (see the module docstring)."""
    kind, _, flavour = str(request.param).partition("-")
    if kind == "embedded":
        emb: EmbeddedBoard = request.getfixturevalue("_embedded")(flavour)
        url, token = emb.url, emb.token
    else:
        url = os.environ.get(REAL_URL, "")
        token = os.environ.get(REAL_TOKEN, "")
        flavour = os.environ.get(REAL_FLAVOUR, "")
        if not url or not token:
            pytest.skip(REAL_SKIP)
        if flavour not in REAL_FLAVOURS:
            pytest.skip(
                f"{REAL_FLAVOUR} is {flavour or 'not set'}: with {REAL_URL}, set it"
                f" to the real Kanboard's database ({', '.join(REAL_FLAVOURS)}); the"
                " expected behaviour depends on it"
            )
        scratch_board(url, token)
    client = KanboardClient(url, token, timeout=30)
    try:
        yield Board(kind, url, token, client, flavour)
    finally:
        client.close()


@pytest.fixture
def project(board: Board) -> Project:
    """A fresh project with a unique name on the board under test."""
    return make_project(board)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def same(value: object, expected: object) -> bool:
    """Equal and of the same JSON type (``True`` is not ``1`` here)."""
    return value == expected and type(value) is type(expected)
