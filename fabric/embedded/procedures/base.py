"""What every procedure module shares: the registry, and the board a procedure works on.

A procedure is a plain function named as in Kanboard's API, registered by
:func:`procedure`; its first argument is the :class:`Board`, the rest are Kanboard's
parameters in Kanboard's order (the dispatcher binds them from the names and defaults).
"""

from __future__ import annotations

import inspect
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabric.embedded import flavour as fl
from fabric.embedded import php
from fabric.embedded.flavour import Flavour, get_flavour
from fabric.embedded.store import Store, as_dict

Procedure = Callable[..., Any]


@dataclass(frozen=True)
class ProcedureSpec:
    """A registered procedure and its parameters, for binding a call's params."""

    fn: Procedure
    names: tuple[str, ...]
    defaults: tuple[Any, ...]  # inspect.Parameter.empty for a required parameter
    required: int


REGISTRY: dict[str, ProcedureSpec] = {}


def procedure(fn: Procedure) -> Procedure:
    """Register ``fn`` under its own name as a JSON-RPC procedure."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop the `api` argument
    REGISTRY[fn.__name__] = ProcedureSpec(
        fn,
        tuple(p.name for p in params),
        tuple(p.default for p in params),
        sum(1 for p in params if p.default is inspect.Parameter.empty),
    )
    return fn


class Board:
    """The store, the clock and the flavour's rules, as the procedures see them.

    ``flavour`` is the backend imitated (default: the store's, itself ``strict`` unless
    told otherwise).
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        flavour: str | Flavour | None = None,
    ):
        self.store = store
        self.clock = clock
        self.flavour = get_flavour(store.flavour if flavour is None else flavour)
        self.base_url = "http://localhost/"

    def now(self) -> int:
        return int(self.clock())

    # -- the flavour's rules ---------------------------------------------------------

    def shape(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """A stored row as the flavour's backend answers it."""
        return fl.shape(self.flavour, table, row)

    def rows(self, table: str, rows: Any) -> list[dict[str, Any]]:
        return [self.shape(table, as_dict(r)) for r in rows]

    def fit(self, table: str, column: str, value: Any) -> Any:
        """``value`` within ``table.column``'s VARCHAR limit, or an SQL error."""
        return fl.fit_varchar(self.flavour, table, column, value)

    def eq(self, column: str, *, nocase: bool = False) -> str:
        """``column = ?`` compared as the backend compares names."""
        return fl.eq_sql(self.flavour, column, nocase=nocase)

    def order(self, column: str, *, nocase: bool = False) -> str:
        return fl.order_sql(self.flavour, column, nocase=nocase)

    def insert(self, db: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
        """INSERT one row with the flavour's id rule (reused on SQLite, a sequence else)."""
        return self.store.insert(db, table, values, reuse_ids=self.flavour.reuse_ids)

    def refused(self, db: sqlite3.Connection, table: str) -> bool:
        """A unique-key refusal found before the INSERT: ``False``, and on a backend with
        sequences the id that the failed INSERT would have taken is gone."""
        if not self.flavour.reuse_ids:
            self.store.next_id(db, table)
        return False


# ------------------------------------------------- shared by several groups

EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")  # the validators' Email rule (projects, users)


def row_dict(row: sqlite3.Row | None) -> dict[str, Any] | None:
    return None if row is None else as_dict(row)


def project_row(db: sqlite3.Connection, project_id: Any) -> dict[str, Any] | None:
    return row_dict(db.execute("SELECT * FROM projects WHERE id = ?", (php.to_int(project_id),)).fetchone())


def task_row(db: sqlite3.Connection, task_id: Any) -> dict[str, Any] | None:
    return row_dict(db.execute("SELECT * FROM tasks WHERE id = ?", (php.to_int(task_id),)).fetchone())


def user_exists(db: sqlite3.Connection, user_id: Any) -> bool:
    return db.execute("SELECT 1 FROM users WHERE id = ?", (php.to_int(user_id),)).fetchone() is not None
