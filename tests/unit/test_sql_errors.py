"""SQL errors from the board: a refusal is its own error, never re-sent as 'maybe done'."""

from __future__ import annotations

import pytest

from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.kanboard.port import RpcError

PG_TOO_LONG = (
    "SQL Error[22001]: SQLSTATE[22001]: String data, right truncated: 7 ERROR:  "
    "value too long for type character varying(255)"
)
MYSQL_BAD_INT = (
    "SQL Error[22007]: SQLSTATE[22007]: Invalid datetime format: 1366 Incorrect "
    "integer value: '' for column `kanboard`.`tasks`.`column_id` at row 1"
)
LOCKED = "SQLSTATE[HY000]: General error: 5 database is locked"


@pytest.mark.parametrize("message", [PG_TOO_LONG, MYSQL_BAD_INT])
def test_a_refusing_sql_error_is_not_maybe_done_and_exits_7(message: str) -> None:
    exc = RpcError(0, message, method="saveTaskMetadata")
    assert exc.refused and not exc.maybe_done and exc.exit_code == 7
    line = exc.line()
    assert "database refused" in line and "SQL error 22" in line and "\n" not in line
    assert "unreachable" not in line and "token" not in line


def test_database_is_locked_stays_maybe_done() -> None:
    exc = RpcError(0, LOCKED, method="createTask")
    assert exc.maybe_done and not exc.refused and exc.exit_code == 3


def test_a_missing_project_is_a_stale_layout_and_the_receipt_is_given_back(local_fabric: Fabric) -> None:
    fab = local_fabric
    gone = fab.board.layout.project_id
    fab.port.call("removeProject", {"project_id": gone})  # strict: createTask is an SQL error
    fab.port.stats.reset()
    with pytest.raises(ConfigError, match="stale"):
        fab.board.create_task(
            fab_spec(fab), uid="ab" * 8, reference="uid:x", receipt="rcpt/feedfeedfeedfeedfeedfeedfeedfeed"
        )
    tags = fab.port.call("getTagsByProject", {"project_id": fab.board.layout.locks_project_id})
    assert "rcpt/feedfeedfeedfeedfeedfeedfeedfeed" not in {t["name"] for t in tags or []}
    # A refusal is answered once: no re-sends of a call that can only be refused again.
    assert fab.port.stats.by_method.get("createTask") == 1


def fab_spec(fab: Fabric):  # type: ignore[no-untyped-def]
    from fabric.submit import build_spec

    return build_spec(intent="x", target="kimi", queue="kimi", now=fab.clock())
