"""What every benchmark shares: targets (boards), counting clients, a counting proxy.

The real Kanboards to measure are named by ``AGAP_BENCH_KANBOARDS`` only (never by the
fabric's own ``KANBOARD_URL``): see :mod:`bench` for the syntax.
"""

from __future__ import annotations

import compileall
import contextlib
import http.client
import json
import os
import platform
import secrets
import statistics
import sys
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fabric.cards import CardSet, load_cards
from fabric.kanboard.bootstrap import init_board, save_layout_cache
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardError, Call, Outcome
from fabric.kanboard.taskboard import BoardLayout
from fabric.settings.resolve import Settings

ROOT = Path(__file__).resolve().parent.parent
CARDS_DIR = ROOT / "cards"


def with_bytecode() -> None:
    """Time processes as an installed fabric runs them: its modules' bytecode cached.

    ``PYTHONDONTWRITEBYTECODE`` (some CI shells and containers set it) leaves an editable
    checkout without ``__pycache__``, so each ``agap`` process would compile every module
    it imports again: as long as the rest of its start. An installed package (pip
    compiles on install, as the fabric image does) or a shell without the variable has
    the bytecode, so the benchmark writes it once and lets its processes read it.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for package in ("fabric", "workers", "keeper"):
        compileall.compile_dir(ROOT / package, quiet=1)


QUEUE_AGENT = "gemma-local"  # a demo-mode card: a fine drill queue


def load_bench_cards() -> CardSet:
    return load_cards(CARDS_DIR, base_dir=ROOT)


class CountingClient(KanboardClient):
    """A :class:`KanboardClient` that also counts error outcomes and failed round trips.

    Real Kanboard on SQLite answers JSON-RPC error code 0 ("database is locked") under
    parallel load; the benchmarks report such errors instead of crashing on them.
    """

    def __init__(self, url: str, token: str, **kw: Any) -> None:
        super().__init__(url, token, **kw)
        self.errors: Counter[str] = Counter()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        try:
            out = super().batch(calls)
        except BoardError as exc:
            self.errors[f"{calls[0].method if len(calls) == 1 else 'batch'}: {type(exc).__name__}"] += 1
            raise
        for o in out:
            if o.error is not None:
                self.errors[error_label(o.call.method, o.error.code, o.error.message)] += 1
        return out


def error_label(method: str, code: int, message: str) -> str:
    """A short, groupable name for a JSON-RPC error."""
    if "database is locked" in message:
        message = "database is locked"
    return f"{method}: rpc {code} {message[:60]}"


@dataclass
class Target:
    """A board to measure: the embedded one, or a real Kanboard."""

    name: str
    url: str
    token: str
    label: str  # column heading in the table
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    real: bool = False
    flavour: str = ""  # the database backend (real) or the imitated one (embedded)
    projects: list[int] = field(default_factory=list)
    users: list[int] = field(default_factory=list)

    def settings(self, tag: str) -> Settings:
        base = f"bench-{self.run_id}-{tag}"
        return Settings(
            board_url=self.url,
            board_token=self.token,
            cards_dir=CARDS_DIR,
            project=base,
            locks_project=f"bench-locks-{self.run_id}-{tag}",
        )

    def client(self) -> CountingClient:
        return CountingClient(self.url, self.token)

    def fresh(self, tag: str, cards: CardSet) -> tuple[Settings, BoardLayout]:
        """A new project pair for one measurement, its layout cached for worker processes."""
        settings = self.settings(tag)
        client = self.client()
        report = init_board(client, settings, cards)
        assert report.layout is not None
        self.projects += [report.layout.project_id, report.layout.locks_project_id]
        for home in report.layout.homes.values():  # the confined agents' homes go too
            self.projects += [home.project_id, home.locks_project_id]
        for username in report.new_users:
            uid = report.layout.users.get(username)
            if uid:
                self.users.append(uid)
        save_layout_cache(settings, report.layout)
        client.close()
        return settings, report.layout

    def add_user(self, client: KanboardClient, username: str, project_id: int) -> int:
        """A Kanboard user that is a member of ``project_id`` (the naive claimer assigns to it)."""
        user = client.call("getUserByName", {"username": username})
        if isinstance(user, dict):
            uid = int(user["id"])
        else:
            uid = int(
                client.call("createUser", {"username": username, "password": secrets.token_urlsafe(16)})
            )
            self.users.append(uid)
        client.call("addProjectUser", {"project_id": project_id, "user_id": uid, "role": "project-member"})
        return uid

    def cleanup(self) -> None:
        """Remove what this run created on a real Kanboard (projects, users)."""
        if not self.real:
            return
        client = self.client()
        for pid in self.projects:
            with contextlib.suppress(BoardError):
                client.call("removeProject", {"project_id": pid})
        for uid in self.users:
            with contextlib.suppress(BoardError):
                client.call("removeUser", {"user_id": uid})
        client.close()


FLAVOUR_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MySQL/MariaDB"}
_FLAVOUR_ALIASES = {
    "sqlite": "sqlite",
    "sqlite3": "sqlite",
    "postgres": "postgres",
    "postgresql": "postgres",
    "pg": "postgres",
    "pgsql": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
}


class TargetSpecError(ValueError):
    """A malformed ``AGAP_BENCH_KANBOARDS``."""


def flavour_of(text: str, where: str) -> str:
    flavour = _FLAVOUR_ALIASES.get(text.strip().lower())
    if flavour is None:
        raise TargetSpecError(
            f"{where}: unknown database flavour {text.strip()!r} (expected one of {', '.join(FLAVOUR_NAMES)})"
        )
    return flavour


def parse_kanboards(spec: str, default_token: str | None = None) -> list[tuple[str, str, str]]:
    """``AGAP_BENCH_KANBOARDS`` as (flavour, url, token) triples, in the order given."""
    out: list[tuple[str, str, str]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        flavour, eq, rest = entry.partition("=")
        if not eq or not rest.strip():
            raise TargetSpecError(f"AGAP_BENCH_KANBOARDS: {entry!r} is not <flavour>=<url>|<token>")
        url, bar, token = rest.strip().partition("|")
        url, token = url.strip(), token.strip()
        if not bar or not token:
            token = default_token or ""
        if not token:
            raise TargetSpecError(f"AGAP_BENCH_KANBOARDS: {flavour.strip()}= has no token (add |<token>)")
        if not urlsplit(url).scheme.startswith("http"):
            raise TargetSpecError(f"AGAP_BENCH_KANBOARDS: {url!r} is not an http(s) URL")
        out.append((flavour_of(flavour, "AGAP_BENCH_KANBOARDS"), url, token))
    return out


def real_targets(environ: Mapping[str, str] | None = None) -> list[Target]:
    """The real Kanboards named by the environment (see the module docstring)."""
    env = os.environ if environ is None else environ
    # Only boards named for the benchmark: a KANBOARD_URL in the shell is the user's own
    # Kanboard, which the run would fill with projects and load hard.
    found = parse_kanboards(env.get("AGAP_BENCH_KANBOARDS", ""))
    targets: list[Target] = []
    seen: set[str] = set()
    per_flavour: Counter[str] = Counter()
    for flavour, url, token in found:
        if url.rstrip("/") in seen:
            continue
        seen.add(url.rstrip("/"))
        per_flavour[flavour] += 1
        n = per_flavour[flavour]
        suffix = "" if n == 1 else f"-{n}"
        label = f"real Kanboard ({FLAVOUR_NAMES[flavour]}{'' if n == 1 else f' #{n}'})"
        targets.append(Target(f"kanboard-{flavour}{suffix}", url, token, label, real=True, flavour=flavour))
    return targets


class CountingProxy:
    """A loopback HTTP proxy in front of a board that counts the POSTs passing through.

    It lets a benchmark count the round trips of another process (the ``agap`` CLI)
    without trusting that process's own counter.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.up_host = parts.hostname or "127.0.0.1"
        self.up_port = parts.port or 80
        self.path = parts.path or "/"
        self.posts = 0
        self.calls = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.count(body)
                conn = http.client.HTTPConnection(proxy.up_host, proxy.up_port, timeout=30)
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")
                }
                conn.request("POST", proxy.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type") or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def count(self, body: bytes) -> None:
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        with self._lock:
            self.posts += 1
            self.calls += len(payload) if isinstance(payload, list) else 1

    def reset(self) -> None:
        with self._lock:
            self.posts = 0
            self.calls = 0

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.path}"

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def latency_ms(xs: list[float]) -> dict[str, float]:
    """Median and 95th percentile of durations in seconds, as milliseconds."""
    xs = sorted(xs)
    return {
        "median_ms": round(statistics.median(xs) * 1000, 2),
        "p95_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1000, 2),
    }
