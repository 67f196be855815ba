"""Unit tests of the embedded board's flavours (what the contract suite cannot reach)."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabric.embedded.flavour import FLAVOURS, SqlError, _collate, ci_key, fit_varchar, get_flavour
from fabric.embedded.local import LocalPort
from fabric.embedded.rpc import BoardApi
from fabric.embedded.server import EmbeddedBoard
from fabric.embedded.store import Store


def rpc(api: BoardApi, method: str, params: Any = None) -> Any:
    reply = api.handle({"jsonrpc": "2.0", "method": method, "id": 1, "params": params})
    return reply.get("result", reply.get("error"))


@pytest.fixture(params=FLAVOURS)
def api(request: pytest.FixtureRequest) -> BoardApi:
    return BoardApi(Store(":memory:", flavour=str(request.param)), "tok")


def test_strict_is_the_default_everywhere(tmp_path: Path) -> None:
    assert Store(":memory:").flavour == "strict"
    assert BoardApi(Store(":memory:"), "t").flavour.name == "strict"
    assert LocalPort().api.flavour.name == "strict"
    with EmbeddedBoard(tmp_path / "b.sqlite3") as board:
        assert board.flavour == "strict"


def test_the_flavour_reaches_every_entry_point(tmp_path: Path) -> None:
    assert BoardApi(Store(":memory:", flavour="mysql"), "t").flavour.name == "mysql"
    assert BoardApi(Store(":memory:"), "t", flavour="sqlite").flavour.name == "sqlite"
    port = LocalPort(flavour="postgres")
    pid = port.call("createProject", {"name": "p"})
    assert port.call("getProjectById", {"project_id": pid})["is_active"] is True
    with EmbeddedBoard(tmp_path / "b.sqlite3", flavour="sqlite") as board:
        assert board.api.flavour.name == "sqlite"
    with pytest.raises(ValueError, match="unknown board flavour"):
        get_flavour("oracle")


def test_cli_offers_the_flavours() -> None:
    from fabric.apps.cli import main

    result = CliRunner().invoke(main, ["board", "serve", "--help"])
    assert result.exit_code == 0, result.output
    assert "--flavour" in result.output and "strict|sqlite|postgres|mysql" in result.output


def test_search_order_is_not_to_be_relied_on_in_strict(api: BoardApi) -> None:
    pid = rpc(api, "createProject", ["p"])
    ids = [rpc(api, "createTask", [f"t{i}", pid]) for i in range(4)]
    got = [t["id"] for t in rpc(api, "searchTasks", [pid, "status:open"])]
    # Kanboard has no ORDER BY there; strict answers against the id order.
    assert got == (ids[::-1] if api.flavour.name == "strict" else ids)
    assert [t["id"] for t in rpc(api, "getAllTasks", [pid, 1])] == ids  # sorted by id


def test_search_order_is_the_id_order_across_columns(api: BoardApi) -> None:
    # The open cards are found by column (an index on project, status, column): the order
    # is still the id order (reversed in strict), not column by column.
    pid = rpc(api, "createProject", ["p"])
    first, second = rpc(api, "getColumns", [pid])[:2]
    columns = [second["id"], first["id"]] * 2
    ids = [rpc(api, "createTask", {"title": "t", "project_id": pid, "column_id": c}) for c in columns]
    query = f'status:open column:"{first["title"]}" column:"{second["title"]}"'
    got = [t["id"] for t in rpc(api, "searchTasks", [pid, query])]
    assert got == (ids[::-1] if api.flavour.name == "strict" else ids)


def test_sequences_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    first = BoardApi(Store(path, flavour="postgres"), "t")
    pid = rpc(first, "createProject", ["p"])
    task = rpc(first, "createTask", ["a", pid])
    assert rpc(first, "removeTask", [task]) is True
    first.store.close()
    again = BoardApi(Store(path, flavour="postgres"), "t")
    assert rpc(again, "createTask", ["b", pid]) == task + 1


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("abc", "ABC", True),
        ("abc", "abc  ", True),
        ("àbc", "abc", True),
        ("straße", "strasse", True),
        ("ﬁ", "fi", True),
        ("e😀", "e😃", True),
        ("İ", "i", True),
        ("abc", " abc", False),
        ("abc", "abc\t", False),
        ("Æ", "ae", False),
        ("ø", "o", False),
    ],
)
def test_mysql_collation(a: str, b: str, equal: bool) -> None:
    assert (ci_key(a) == ci_key(b)) is equal


def test_fit_cuts_only_excess_spaces() -> None:
    strict, sqlite = get_flavour("strict"), get_flavour("sqlite")
    assert fit_varchar(strict, "tags", "name", "t" + " " * 300) == "t" + " " * 190
    assert fit_varchar(sqlite, "tags", "name", "t" * 300) == "t" * 300
    with pytest.raises(SqlError, match=r"character varying\(255\)"):
        fit_varchar(strict, "tags", "name", "t" * 256)
    with pytest.raises(SqlError, match="Data too long for column 'name'"):
        fit_varchar(strict, "tags", "name", "t" * 192)  # only MySQL fails: its message
    assert fit_varchar(strict, "tags", "name", 7) == 7


def test_a_refused_metadata_call_rolls_back_in_every_strict_flavour(api: BoardApi) -> None:
    pid = rpc(api, "createProject", ["p"])
    task = rpc(api, "createTask", ["t", pid])
    reply = rpc(api, "saveTaskMetadata", [task, {"a": "1", "b": "x" * 256}])
    if api.flavour.name == "sqlite":
        assert reply is True
    else:
        assert reply["code"] == 0
        assert rpc(api, "getTaskMetadata", [task]) == {}
        # The board is still usable after the rollback.
        assert rpc(api, "saveTaskMetadata", [task, {"a": "1"}]) is True


def _tuple_key(text: str) -> tuple[tuple[int, str], ...]:
    """The collation's sort key as it was first written: (UCA rank, character) pairs."""
    ranks = {"Z": 0, "P": 1, "S": 2, "N": 3}
    return tuple((ranks.get(unicodedata.category(c)[0], 4), c) for c in ci_key(text))


def test_the_collation_orders_as_its_rank_character_pairs() -> None:
    # The kb_ci collation compares one translated string per side (cheap: it runs for every
    # row an index search compares); its order is the (rank, character) pairs' order.
    alphabet = "aAbZz09 _-.!~é€ßﬁİı\t😀中\u0301"
    draw = random.Random(31)
    words = ["", " ", "a ", "a", "A", "b", "ab", "a-b", "a b", "\uff41"]
    words += ["".join(draw.choice(alphabet) for _ in range(draw.randint(0, 6))) for _ in range(400)]
    for a in words:
        for b in words[:60]:
            ka, kb = _tuple_key(a), _tuple_key(b)
            assert _collate(a, b) == (0 if a == b else (ka > kb) - (ka < kb)), (a, b)
