"""The A2A server's local index: which caller sent which message, and sync calls in flight.

A small SQLite file in the state directory (``var/a2a.sqlite3`` by default). It is not
the truth about async tasks (the board is); it holds:

* every A2A task this server gave out: its caller (the scope), agent, context id, the
  message that created it, and for async tasks the board task behind it;
* sync calls, whose state lives here until they are journaled to the board: a row is
  written *before* the model is called (state ``working``), so a server that crashes
  mid-call finds it at the next start and records it as failed instead of leaving it
  working forever;
* every message id seen per caller, with a digest of what it carried, so a retried
  message returns the same task and a reused id carrying something else is refused;
* push notification configs (:class:`~fabric.apps.a2a.push.DurablePushConfigs`), and
  whether each task's terminal event has been delivered: a restarted server delivers it.

WAL mode with ``synchronous=NORMAL``: a process crash loses nothing committed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYNC = "sync"
ASYNC = "async"

# Local states of sync tasks (async tasks carry BOARD: their state is on the board).
WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELED = "canceled"
BOARD = "board"
SYNC_TERMINAL = frozenset({COMPLETED, FAILED, CANCELED})

# Journal progress of a sync task.
J_NONE = "none"  # not terminal yet: nothing to journal
J_PENDING = "pending"  # terminal, not yet on the board
J_DONE = "done"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    caller TEXT NOT NULL,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    context_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    intent TEXT NOT NULL,
    refs TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL,
    conversation TEXT NOT NULL DEFAULT '[]',
    result TEXT,
    error TEXT,
    board_task_id INTEGER,
    board_uid TEXT,
    journal TEXT NOT NULL DEFAULT 'none',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_caller ON tasks (caller, agent, created);
CREATE INDEX IF NOT EXISTS tasks_by_journal ON tasks (journal);
CREATE TABLE IF NOT EXISTS messages (
    caller TEXT NOT NULL,
    message_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (caller, message_id)
);
CREATE TABLE IF NOT EXISTS push_configs (
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    config TEXT NOT NULL,
    final_at REAL,
    PRIMARY KEY (task_id, config_id)
);
"""

_COLUMNS = (
    "task_id",
    "caller",
    "agent",
    "kind",
    "context_id",
    "message_id",
    "intent",
    "refs",
    "state",
    "conversation",
    "result",
    "error",
    "board_task_id",
    "board_uid",
    "journal",
    "created",
    "updated",
)


def message_digest(task_id: str, intent: str, refs: list[str]) -> str:
    """What a message carried: the task it answered ("" for a new one), its text and refs."""
    body = json.dumps([task_id, intent.strip(), list(refs)], ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass
class TaskRow:
    """One A2A task as this server knows it."""

    task_id: str
    caller: str
    agent: str
    kind: str
    context_id: str
    message_id: str
    intent: str
    refs: list[str] = field(default_factory=list)
    state: str = WORKING
    # (("question", text), ("answer", text), ...) of a sync task that asked for input
    conversation: list[tuple[str, str]] = field(default_factory=list)
    result: str | None = None
    error: str | None = None
    board_task_id: int | None = None
    board_uid: str | None = None
    journal: str = J_NONE
    created: float = 0.0
    updated: float = 0.0

    def _values(self) -> tuple[Any, ...]:
        return (
            self.task_id,
            self.caller,
            self.agent,
            self.kind,
            self.context_id,
            self.message_id,
            self.intent,
            json.dumps(self.refs),
            self.state,
            json.dumps(self.conversation),
            self.result,
            self.error,
            self.board_task_id,
            self.board_uid,
            self.journal,
            self.created,
            self.updated,
        )

    @classmethod
    def _from(cls, row: sqlite3.Row) -> TaskRow:
        d = dict(row)
        d["refs"] = list(json.loads(d["refs"] or "[]"))
        d["conversation"] = [(str(k), str(v)) for k, v in json.loads(d["conversation"] or "[]")]
        return cls(**d)


class CallStore:
    """Thread-safe access to the index (one connection, one lock: every write is tiny)."""

    def __init__(self, path: Path | str, *, clock: Any = time.time) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(messages)")}
        if "digest" not in columns:  # an index written before digests were kept
            self._db.execute("ALTER TABLE messages ADD COLUMN digest TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- writing ----------------------------------------------------------------------

    def claim_message(self, row: TaskRow) -> TaskRow | None:
        """Record a new task for (caller, message id); the existing task if the id was seen.

        Returns None when ``row`` was inserted, else the task the message id already names.
        """
        now = self.clock()
        row.created = row.created or now
        row.updated = now
        with self._tx() as db:
            known = db.execute(
                "SELECT task_id FROM messages WHERE caller=? AND message_id=?", (row.caller, row.message_id)
            ).fetchone()
            if known is not None:
                found = db.execute("SELECT * FROM tasks WHERE task_id=?", (known["task_id"],)).fetchone()
                if found is not None:
                    return TaskRow._from(found)
            db.execute(
                f"INSERT OR REPLACE INTO tasks ({', '.join(_COLUMNS)}) VALUES "
                f"({', '.join('?' * len(_COLUMNS))})",
                row._values(),
            )
            db.execute(
                "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?)",
                (row.caller, row.message_id, row.task_id, message_digest("", row.intent, row.refs)),
            )
        return None

    def seen_message(self, caller: str, message_id: str) -> str | None:
        """The task a message id of ``caller`` already went to, or None."""
        with self._lock:
            r = self._db.execute(
                "SELECT task_id FROM messages WHERE caller=? AND message_id=?", (caller, message_id)
            ).fetchone()
        return str(r["task_id"]) if r else None

    def note_message(self, caller: str, message_id: str, task_id: str, digest: str) -> str | None:
        """Remember a follow-up message id; None if new, else the digest it was first seen with.

        ``""`` for an id seen before digests were kept (or seen as a task's first message).
        """
        with self._tx() as db:
            known = db.execute(
                "SELECT digest FROM messages WHERE caller=? AND message_id=?", (caller, message_id)
            ).fetchone()
            if known is not None:
                return str(known["digest"])
            db.execute("INSERT INTO messages VALUES (?, ?, ?, ?)", (caller, message_id, task_id, digest))
            return None

    def forget_message(self, caller: str, message_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM messages WHERE caller=? AND message_id=?", (caller, message_id))

    def save(self, row: TaskRow, *, touch: bool = True) -> None:
        """Write ``row``; ``touch`` stamps it as changed now (a sync task's status time).

        Journaling passes ``touch=False``: recording a finished call on the board is not a
        status change, and the time a sync task reports must not move after it ended.
        """
        if touch:
            row.updated = self.clock()
        with self._tx() as db:
            db.execute(
                f"INSERT OR REPLACE INTO tasks ({', '.join(_COLUMNS)}) VALUES "
                f"({', '.join('?' * len(_COLUMNS))})",
                row._values(),
            )

    def drop(self, task_id: str) -> None:
        """Remove a task row and its message ids (an async submit that failed)."""
        with self._tx() as db:
            db.execute("DELETE FROM messages WHERE task_id=?", (task_id,))
            db.execute("DELETE FROM tasks WHERE task_id=?", (task_id,))
            db.execute("DELETE FROM push_configs WHERE task_id=?", (task_id,))

    # -- push configs -------------------------------------------------------------------

    def put_push(self, task_id: str, config_id: str, config: str) -> None:
        """Store (or replace) one push config of a task, as JSON; its task's end is not yet pushed."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO push_configs VALUES (?, ?, ?, NULL)", (task_id, config_id, config)
            )

    def pushes(self, task_id: str) -> list[str]:
        """The push configs of a task (JSON), in the order they were set."""
        with self._lock:
            rows = self._db.execute(
                "SELECT config FROM push_configs WHERE task_id=? ORDER BY rowid", (task_id,)
            ).fetchall()
        return [str(r["config"]) for r in rows]

    def drop_push(self, task_id: str, config_id: str | None = None) -> None:
        with self._tx() as db:
            if config_id is None:
                db.execute("DELETE FROM push_configs WHERE task_id=?", (task_id,))
            else:
                db.execute("DELETE FROM push_configs WHERE task_id=? AND config_id=?", (task_id, config_id))

    def push_finished(self, task_id: str) -> None:
        """The task's terminal event went out (or ran out of retries): nothing left to push."""
        with self._tx() as db:
            db.execute(
                "UPDATE push_configs SET final_at=? WHERE task_id=? AND final_at IS NULL",
                (self.clock(), task_id),
            )

    def open_pushes(self) -> list[str]:
        """Tasks with a push config whose terminal event has not been delivered yet."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT task_id FROM push_configs WHERE final_at IS NULL ORDER BY task_id"
            ).fetchall()
        return [str(r["task_id"]) for r in rows]

    # -- reading ----------------------------------------------------------------------

    def get(self, task_id: str) -> TaskRow | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        return TaskRow._from(r) if r else None

    def list_for(
        self, caller: str, agent: str, *, context_id: str = "", offset: int = 0, limit: int = 50
    ) -> tuple[list[TaskRow], int]:
        """A caller's tasks on one agent, newest first, and how many there are in all."""
        where, args = "caller=? AND agent=?", [caller, agent]
        if context_id:
            where += " AND context_id=?"
            args.append(context_id)
        with self._lock:
            total = int(self._db.execute(f"SELECT COUNT(*) FROM tasks WHERE {where}", args).fetchone()[0])
            rows = self._db.execute(
                f"SELECT * FROM tasks WHERE {where} ORDER BY created DESC, task_id LIMIT ? OFFSET ?",
                [*args, limit, offset],
            ).fetchall()
        return [TaskRow._from(r) for r in rows], total

    def in_state(self, kind: str, state: str) -> list[TaskRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM tasks WHERE kind=? AND state=?", (kind, state)).fetchall()
        return [TaskRow._from(r) for r in rows]

    def unjournaled(self) -> list[TaskRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM tasks WHERE journal=? ORDER BY created", (J_PENDING,)
            ).fetchall()
        return [TaskRow._from(r) for r in rows]

    def prune(self, older_than: float) -> int:
        """Forget journaled sync tasks and async index rows older than ``older_than``."""
        with self._tx() as db:
            old = [
                r["task_id"]
                for r in db.execute(
                    "SELECT task_id FROM tasks WHERE updated < ? AND (journal=? OR kind=?)",
                    (older_than, J_DONE, ASYNC),
                ).fetchall()
            ]
            for tid in old:
                db.execute("DELETE FROM messages WHERE task_id=?", (tid,))
                db.execute("DELETE FROM tasks WHERE task_id=?", (tid,))
                db.execute("DELETE FROM push_configs WHERE task_id=?", (tid,))
        return len(old)
