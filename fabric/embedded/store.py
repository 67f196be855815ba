"""SQLite storage for the embedded board: schema and per-thread connections.

The schema copies the columns of Kanboard's own tables that the API exposes, and, above
all, its unique indexes: ``UNIQUE(project_id, name)`` on tags is what the epoch ledger's
test-and-set stands on.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fabric.embedded.flavour import DEFAULT_FLAVOUR, get_flavour, install

SCHEMA_VERSION = 2
BUSY_SECONDS = 30.0  # how long a write waits for another writer before "database is locked"

# Column order matters: ``SELECT *`` rows are returned as they are, and the API objects
# then have Kanboard's key order. Every table uses ``INTEGER PRIMARY KEY`` *without*
# AUTOINCREMENT, like Kanboard's SQLite schema, so the id of a deleted newest row is reused.
SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (option TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY,
    username TEXT NOT NULL UNIQUE,
    password TEXT,
    is_admin INTEGER DEFAULT 0,
    is_ldap_user INTEGER DEFAULT 0,
    name TEXT,
    email TEXT,
    google_id TEXT,
    github_id TEXT,
    notifications_enabled INTEGER DEFAULT 0,
    timezone TEXT,
    language TEXT,
    disable_login_form INTEGER DEFAULT 0,
    twofactor_activated INTEGER DEFAULT 0,
    twofactor_secret TEXT,
    token TEXT DEFAULT '',
    notifications_filter INTEGER DEFAULT 4,
    nb_failed_login INTEGER DEFAULT 0,
    lock_expiration_date INTEGER DEFAULT 0,
    is_project_admin INTEGER DEFAULT 0,
    gitlab_id INTEGER,
    role TEXT NOT NULL DEFAULT 'app-user',
    is_active INTEGER DEFAULT 1,
    avatar_path TEXT,
    api_access_token TEXT DEFAULT NULL,
    filter TEXT DEFAULT NULL,
    theme TEXT NOT NULL DEFAULT 'light'
);
CREATE TABLE IF NOT EXISTS projects (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    is_active INTEGER DEFAULT 1,
    token TEXT DEFAULT '',
    last_modified INTEGER DEFAULT 0,
    is_public INTEGER DEFAULT 0,
    is_private INTEGER DEFAULT 0,
    is_everybody_allowed INTEGER DEFAULT 0,
    default_swimlane TEXT DEFAULT 'Default swimlane',
    show_default_swimlane INTEGER DEFAULT 1,
    description TEXT,
    identifier TEXT DEFAULT '',
    start_date TEXT DEFAULT '',
    end_date TEXT DEFAULT '',
    owner_id INTEGER DEFAULT 0,
    priority_default INTEGER DEFAULT 0,
    priority_start INTEGER DEFAULT 0,
    priority_end INTEGER DEFAULT 3,
    email TEXT,
    predefined_email_subjects TEXT,
    per_swimlane_task_limits INTEGER DEFAULT 0 NOT NULL,
    task_limit INTEGER DEFAULT 0 NOT NULL,
    enable_global_tags INTEGER DEFAULT 1 NOT NULL
);
CREATE TABLE IF NOT EXISTS columns (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    position INTEGER,
    project_id INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    task_limit INTEGER DEFAULT 0,
    description TEXT,
    hide_in_dashboard INTEGER DEFAULT 0 NOT NULL,
    UNIQUE(title, project_id)
);
CREATE TABLE IF NOT EXISTS swimlanes (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    position INTEGER DEFAULT 1,
    is_active INTEGER DEFAULT 1,
    project_id INTEGER REFERENCES projects(id) ON DELETE CASCADE,
    description TEXT,
    task_limit INTEGER DEFAULT 0,
    UNIQUE(name, project_id)
);
CREATE TABLE IF NOT EXISTS categories (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    project_id INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    description TEXT,
    color_id TEXT DEFAULT NULL,
    UNIQUE(project_id, name)
);
CREATE TABLE IF NOT EXISTS project_has_users (
    project_id INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    UNIQUE(project_id, user_id)
);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    description TEXT,
    date_creation INTEGER,
    color_id TEXT,
    project_id INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    column_id INTEGER NOT NULL REFERENCES columns(id) ON DELETE CASCADE,
    owner_id INTEGER DEFAULT 0,
    position INTEGER,
    is_active INTEGER DEFAULT 1,
    date_completed INTEGER,
    score INTEGER,
    date_due INTEGER,
    category_id INTEGER DEFAULT 0,
    creator_id INTEGER DEFAULT 0,
    date_modification INTEGER DEFAULT 0,
    reference TEXT DEFAULT '',
    date_started INTEGER,
    time_spent NUMERIC DEFAULT 0,
    time_estimated NUMERIC DEFAULT 0,
    swimlane_id INTEGER NOT NULL REFERENCES swimlanes(id) ON DELETE CASCADE,
    date_moved INTEGER DEFAULT 0,
    recurrence_status INTEGER NOT NULL DEFAULT 0,
    recurrence_trigger INTEGER NOT NULL DEFAULT 0,
    recurrence_factor INTEGER NOT NULL DEFAULT 0,
    recurrence_timeframe INTEGER NOT NULL DEFAULT 0,
    recurrence_basedate INTEGER NOT NULL DEFAULT 0,
    recurrence_parent INTEGER,
    recurrence_child INTEGER,
    priority INTEGER DEFAULT 0,
    external_provider TEXT,
    external_uri TEXT
);
-- With column_id, the open cards of one column are counted in the index alone (the
-- position moveTaskToProject gives a card, on every move), not by reading every open
-- task of the project. It replaces (project_id, is_active), which it serves as well.
DROP INDEX IF EXISTS tasks_project_active;
CREATE INDEX IF NOT EXISTS tasks_project_active_column ON tasks(project_id, is_active, column_id);
CREATE INDEX IF NOT EXISTS tasks_column ON tasks(column_id, swimlane_id, position);
CREATE INDEX IF NOT EXISTS tasks_reference ON tasks(project_id, reference);
CREATE INDEX IF NOT EXISTS tasks_swimlane ON tasks(swimlane_id);
CREATE TABLE IF NOT EXISTS task_has_metadata (
    task_id INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    changed_by INTEGER NOT NULL DEFAULT 0,
    changed_on INTEGER NOT NULL DEFAULT 0,
    value TEXT DEFAULT '',
    PRIMARY KEY(task_id, name)
);
CREATE TABLE IF NOT EXISTS project_has_metadata (
    project_id INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    changed_by INTEGER NOT NULL DEFAULT 0,
    changed_on INTEGER NOT NULL DEFAULT 0,
    value TEXT DEFAULT '',
    PRIMARY KEY(project_id, name)
);
CREATE TABLE IF NOT EXISTS tags (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    project_id INTEGER NOT NULL,
    color_id TEXT DEFAULT NULL,
    UNIQUE(project_id, name)
);
CREATE TABLE IF NOT EXISTS task_has_tags (
    task_id INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    tag_id INTEGER NOT NULL REFERENCES tags(id) ON DELETE CASCADE,
    UNIQUE(tag_id, task_id)
);
CREATE INDEX IF NOT EXISTS task_has_tags_task ON task_has_tags(task_id);
CREATE TABLE IF NOT EXISTS comments (
    id INTEGER PRIMARY KEY,
    task_id INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    user_id INTEGER DEFAULT 0,
    date_creation INTEGER NOT NULL,
    date_modification INTEGER,
    comment TEXT,
    reference TEXT DEFAULT '',
    visibility TEXT NOT NULL DEFAULT 'app-user'
);
CREATE INDEX IF NOT EXISTS comments_task ON comments(task_id);
CREATE TABLE IF NOT EXISTS task_has_files (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    path TEXT,
    is_image INTEGER DEFAULT 0,
    task_id INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    date INTEGER NOT NULL DEFAULT 0,
    user_id INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    blob BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_task ON task_has_files(task_id);
-- The flavours that compare names as MySQL does (strict, mysql) look them up with
-- "= ? COLLATE kb_ci"; an index in that collation turns each lookup from a scan calling the
-- collation on every row (every lock tag of the locks project, on each createTag) into a
-- search. Every connection registers kb_ci (flavour.install) before it writes, and any
-- other reader that checks the file must too; a change to kb_ci's order needs REINDEX.
CREATE INDEX IF NOT EXISTS tags_name_ci ON tags(project_id, name COLLATE kb_ci);
CREATE INDEX IF NOT EXISTS task_has_metadata_name_ci ON task_has_metadata(task_id, name COLLATE kb_ci);
CREATE INDEX IF NOT EXISTS project_has_metadata_name_ci
    ON project_has_metadata(project_id, name COLLATE kb_ci);
CREATE INDEX IF NOT EXISTS tasks_reference_ci ON tasks(project_id, reference COLLATE kb_ci);
CREATE TABLE IF NOT EXISTS sequences (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS project_activities (
    id INTEGER PRIMARY KEY,
    date_creation INTEGER NOT NULL,
    event_name TEXT NOT NULL,
    creator_id INTEGER,
    project_id INTEGER REFERENCES projects(id) ON DELETE CASCADE,
    task_id INTEGER REFERENCES tasks(id) ON DELETE CASCADE,
    data TEXT
);
"""


@functools.lru_cache(maxsize=512)
def _distinct(keys: tuple[str, ...]) -> bool:
    return len({k.lower() for k in keys}) == len(keys)


def as_dict(row: sqlite3.Row) -> dict[str, Any]:
    """``dict(row)`` in one pass over the columns.

    ``dict(row)`` looks every key up again by name, each lookup a case-insensitive scan
    of the columns: quadratic, about 5 µs for a task's 32 columns and more for a joined
    row, on every task a request reads. Where two column names differ only in case it
    is left to ``dict(row)``, which gives both the first one's value.
    """
    keys = tuple(row.keys())
    return dict(zip(keys, row, strict=True)) if _distinct(keys) else dict(row)


class StoreError(RuntimeError):
    """The database file cannot be used by this version of the embedded board."""


def hash_password(password: str) -> str:
    """A salted PBKDF2 hash, checked by :func:`password_matches` (user-auth JSON-RPC)."""
    salt = secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 1000)
    return "$pbkdf2-sha256$1000$" + salt.hex() + "$" + digest.hex()


def password_matches(stored: str | None, password: str) -> bool:
    """True when ``password`` hashes to ``stored`` (a :func:`hash_password` value)."""
    parts = (stored or "").split("$")
    if len(parts) != 5 or parts[1] != "pbkdf2-sha256":
        return False
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(parts[3]), int(parts[2]))
    return hmac.compare_digest(digest.hex(), parts[4])


def new_api_token(store: Store, username: str) -> str | None:
    """A new personal API token for ``username`` (replacing any), as Kanboard's "My profile >
    API > Generate a new API token" makes one (there is no API procedure for it); None when
    no such user. Kanboard keeps it as it is, not hashed, and so does this board."""
    token = secrets.token_hex(30)  # Kanboard's Token::getToken(): 60 hex characters
    with store.write() as db:
        done = db.execute("UPDATE users SET api_access_token = ? WHERE username = ?", (token, username))
        return token if done.rowcount else None


class _Snapshot:
    """Store.read's context: BEGIN on entry, COMMIT on exit (a class, not a generator: it
    is entered several times a request, and a generator's context costs more)."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN")
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.execute("COMMIT")


class Store:
    """Owns the database file; hands each thread its own connection.

    SQLite in WAL mode serialises writers; ``BEGIN IMMEDIATE`` takes the write lock up
    front so two writers never deadlock upgrading a read lock. The threads of this
    process queue for it on a lock of their own first (see :meth:`write`). ``flavour``
    names the backend the board imitates (see :mod:`fabric.embedded.flavour`); the API on
    this store takes it unless told otherwise.
    """

    def __init__(self, path: str | Path, *, flavour: str = DEFAULT_FLAVOUR) -> None:
        self.flavour = get_flavour(flavour).name
        self.path = str(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._free: list[sqlite3.Connection] = []  # connections of threads that ended
        self._lock = threading.Lock()
        # Reentrant, so a nested write fails in SQLite ("cannot start a transaction within
        # a transaction") as it did before this lock, rather than deadlocking.
        self._writer = threading.RLock()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._init_schema()

    def _init_schema(self) -> None:
        db = self.connection()
        (version,) = db.execute("PRAGMA user_version").fetchone()
        old = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tasks'").fetchone()
        if old is not None and version < SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by an older embedded board (schema {version},"
                f" this one needs {SCHEMA_VERSION}); move it away to start a fresh board"
            )
        # executescript commits on its own; CREATE ... IF NOT EXISTS makes it idempotent.
        db.executescript(SCHEMA)
        with self.write() as tx:
            # Like a fresh Kanboard: an "admin" user with id 1 (no name, no email).
            tx.execute(
                "INSERT OR IGNORE INTO users (id, username, password, is_admin, name, email,"
                " role) VALUES (1, 'admin', ?, 1, NULL, NULL, 'app-admin')",
                (hash_password(secrets.token_hex(16)),),
            )
            tx.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (created on first use)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None and self.path == ":memory:" and self._all:
            # An in-memory board (unit tests) is one database: share its one connection.
            db = self._all[0]
        if db is None:
            with self._lock:
                db = self._free.pop() if self._free else None
            if db is not None:
                self._local.db = db
        if db is None:
            db = sqlite3.connect(
                self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
            )
            db.row_factory = sqlite3.Row
            install(db)
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute(f"PRAGMA busy_timeout={int(BUSY_SECONDS * 1000)}")
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    def insert(
        self, db: sqlite3.Connection, table: str, values: dict[str, Any], *, reuse_ids: bool = True
    ) -> int:
        """INSERT one row; its id.

        ``reuse_ids`` is SQLite's rule (``INTEGER PRIMARY KEY``: max + 1, so a deleted
        newest row's id comes back). Without it ids come from a sequence, as on
        PostgreSQL and MySQL: never reused, and taken even by an INSERT that then fails
        on a unique or foreign key (the caller keeps the transaction).
        """
        if not reuse_ids:
            values = {"id": self.next_id(db, table), **values}
        cur = db.execute(
            f"INSERT INTO {table} ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
            tuple(values.values()),
        )
        return int(cur.lastrowid or 0)

    def next_id(self, db: sqlite3.Connection, table: str) -> int:
        """Take the next value of ``table``'s sequence (in the caller's transaction)."""
        (top,) = db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()
        row = db.execute("SELECT value FROM sequences WHERE name = ?", (table,)).fetchone()
        new = max(int(top), 0 if row is None else int(row[0])) + 1
        db.execute(
            "INSERT INTO sequences (name, value) VALUES (?, ?) ON CONFLICT(name)"
            " DO UPDATE SET value = excluded.value",
            (table, new),
        )
        return new

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed on success, rolled back on any exception.

        The board's threads take turns on an in-process lock before ``BEGIN IMMEDIATE``:
        a thread that finds SQLite's write lock taken otherwise sleeps in SQLite's busy
        handler (steps of 1, 2, 5, 10 ... 100 ms), long after a write of a fraction of a
        millisecond has ended; on the lock it wakes when the write ends. Waiting for it is
        bounded like the busy handler (``BUSY_SECONDS``) and fails with the same "database
        is locked". Another process writing the file is still waited for by the handler.
        """
        db = self.connection()
        if not self._writer.acquire(timeout=BUSY_SECONDS):
            raise sqlite3.OperationalError("database is locked")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            self._writer.release()

    def read(self) -> _Snapshot:
        """A consistent read snapshot (``with store.read() as db``)."""
        return _Snapshot(self.connection())

    def release(self) -> None:
        """The calling thread is done (a served request): keep its connection for the next.

        The HTTP server runs a thread per connection; without this every one of them
        would keep an open database (three file descriptors) until the board stops.
        """
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or self.path == ":memory:":
            return
        self._local.db = None
        with self._lock:
            self._free.append(db)

    def close(self) -> None:
        """Close every connection this store handed out."""
        with self._lock:
            for db in self._all:
                db.close()
            self._all.clear()
            self._free.clear()
        self._local = threading.local()
