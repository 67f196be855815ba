"""The storage port: a JSON-RPC conversation with a Kanboard-compatible board.

Kanboard reports most failures as *return values* (``false``, ``0``, ``null``) rather
than errors, and some writes commit and then fail. This module names each outcome so
callers cannot confuse "refused" with "maybe done".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Protocol, runtime_checkable

from fabric.errors import EXIT_STORAGE, EXIT_UNREACHABLE, FabricError
from fabric.plain import Plain

Params = Mapping[str, Any] | Sequence[Any] | None

# Kanboard procedures that never change the board. Only these may be retried blindly.
READ_PREFIXES = ("get", "search", "download")


def is_read(method: str) -> bool:
    """True for a procedure that only reads (safe to retry after an ambiguous failure)."""
    return method.startswith(READ_PREFIXES)


class Call(Plain):
    """One JSON-RPC procedure call, to be sent alone or inside a batch."""

    method: str
    params: Params = None

    @property
    def is_read(self) -> bool:
        return is_read(self.method)


class BoardError(FabricError):
    """Base of every failure talking to the board."""

    exit_code = EXIT_UNREACHABLE


class BoardUnavailable(BoardError):
    """The board could not be reached, or answered with a server error before acting."""

    def __init__(self, what: str, *, where: str = "") -> None:
        super().__init__(
            what,
            where=where,
            hint="is the board running? start it with `agap board serve` or check KANBOARD_URL",
        )


class MaybeDone(BoardError):
    """A write failed in a way that does not tell whether it happened.

    Kanboard can commit a write and then report an error (an SQL lock error after the
    insert, a PHP error after earlier batch items). Never repeat such a write blindly:
    read the board back and reconcile.
    """

    def __init__(self, what: str, *, where: str = "", calls: Sequence[Call] = ()) -> None:
        super().__init__(what, where=where, hint="the write may have happened; read back before retrying")
        self.calls = tuple(calls)


class BoardAuthError(BoardError):
    """The board rejected the credentials (HTTP 401) or the action (HTTP 403)."""

    def __init__(self, what: str, *, where: str = "", hint: str = "") -> None:
        super().__init__(
            what, where=where, hint=hint or "check KANBOARD_API_TOKEN (the board's application token)"
        )


# JSON-RPC errors raised before the procedure ran: the call certainly did nothing.
PROTOCOL_ERRORS = frozenset({-32700, -32600, -32601, -32602})


# Kanboard reports a database error as code 0 with "SQL Error[<state>]: SQLSTATE[<state>]:
# …" in the message (PostgreSQL and MySQL alike).
_SQL_STATE = re.compile(r"SQLSTATE\[(\w{5})\]|SQL Error\[(\w{5})\]")
# SQLSTATE classes of a statement refused as a whole and rolled back: cardinality (21),
# data exceptions (22: a value too long, a bad number), integrity violations (23: a
# foreign key, NOT NULL, a unique index), syntax or access rules (42). Nothing was
# written, and sending it again gets the same refusal. Anything else (SQLite's
# "database is locked" is HY000) may have committed.
REFUSING_SQL_CLASSES = frozenset({"21", "22", "23", "42"})


def sql_state(message: str) -> str | None:
    """The SQLSTATE a Kanboard error message carries, or None."""
    m = _SQL_STATE.search(message or "")
    return (m.group(1) or m.group(2)) if m else None


class RpcError(BoardError):
    """A JSON-RPC error object.

    Protocol errors (-32700 parse, -32600 request, -32601 method, -32602 params) mean
    nothing ran. So does an SQL error of a refusing class (``refused``: a value too long,
    a missing project): the board's database rolled the statement back. Anything else on
    a write (Kanboard reports "database is locked" as code 0, sometimes after the row was
    inserted) may have happened: ``maybe_done`` says so.
    """

    def __init__(self, code: int, message: str, data: Any = None, *, method: str = "") -> None:
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        self.sql_state = sql_state(message)
        self.refused = self.sql_state is not None and self.sql_state[:2] in REFUSING_SQL_CLASSES
        self.maybe_done = code not in PROTOCOL_ERRORS and not is_read(method) and not self.refused
        detail = f"{message}: {data}" if data else message
        if self.refused:
            # Not "unreachable or wrong token": the board answered, its database said no.
            self.exit_code = EXIT_STORAGE
            hint = (
                "a project or column the fabric expected is gone: run `agap init`"
                if self.sql_state and self.sql_state.startswith("23")
                else "nothing was written; the board's database cannot hold what was sent: report this line"
            )
            super().__init__(
                f"the board's database refused the call (SQL error {self.sql_state}: {_sql_text(message)})",
                where=method or "board",
                hint=hint,
            )
            return
        super().__init__(
            f"JSON-RPC error {code} ({detail})",
            where=method or "board",
            hint="the write may have happened; read back before retrying" if self.maybe_done else "",
        )


def _sql_text(message: str) -> str:
    """The database's own words, without Kanboard's and PDO's prefixes."""
    text = re.sub(r"^SQL Error\[\w+\]:\s*", "", message or "")
    text = re.sub(r"^SQLSTATE\[\w+\]:\s*", "", text)
    return " ".join(text.split())[:200]


class BoardRefused(BoardError):
    """The board answered with its failure channel: ``false``, ``0`` or ``null``."""

    def __init__(self, method: str, result: Any, doing: str) -> None:
        self.method = method
        self.result = result
        super().__init__(f"the board refused to {doing} ({method} returned {result!r})")


class Outcome(Plain, frozen=False):
    """The result of one call inside a batch: a value or an :class:`RpcError`."""

    call: Call
    value: Any = None
    error: RpcError | None = None

    def unwrap(self) -> Any:
        """The value, or raise the call's error."""
        if self.error is not None:
            raise self.error
        return self.value


@runtime_checkable
class RpcPort(Protocol):
    """What the fabric needs from a board: single calls, ordered batches, a trip counter."""

    stats: RoundTrips

    def call(self, method: str, params: Params = None) -> Any:
        """Run one procedure and return its raw result (``false``/``0``/``null`` included)."""
        ...

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        """Run calls in order in one round trip; items commit one by one (not atomic)."""
        ...


class RoundTrips(Plain, frozen=False):
    """Counts round trips to the board (what the benchmarks report) and calls per method."""

    trips: int = 0
    calls: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    def record(self, calls: Sequence[Call]) -> None:
        self.trips += 1
        self.calls += len(calls)
        for c in calls:
            self.by_method[c.method] = self.by_method.get(c.method, 0) + 1

    def reset(self) -> None:
        self.trips = 0
        self.calls = 0
        self.by_method.clear()


def refuse_falsy(method: str, result: Any, doing: str) -> Any:
    """Return ``result`` unless it is Kanboard's failure channel (false, 0, null)."""
    if result is None or result is False or result == 0:
        raise BoardRefused(method, result, doing)
    return result
