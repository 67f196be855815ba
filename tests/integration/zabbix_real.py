"""A real Zabbix for the tests, from Debian's packages (``.ci/run`` installs them).

The server (``zabbix-server-pgsql``) runs as a child on loopback with a database of its
own on the machine's PostgreSQL; the frontend (``zabbix-frontend-php``) is copied into a
temporary folder (it reads its configuration from beside its own files) and served by
``php -S 127.0.0.1:PORT``. Nothing outside the temporary folder and the database changes.
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from fabric.apps.ops.zabbix import ZabbixClient, ZabbixError

SERVER = Path("/usr/sbin/zabbix_server")
FRONTEND = Path("/usr/share/zabbix")
SQL = Path("/usr/share/zabbix-server-pgsql")
PHP = shutil.which("php") or "/usr/bin/php"
PSQL = shutil.which("psql") or "/usr/bin/psql"
PG = ["-h", "127.0.0.1", "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-q"]
# One seeded database per machine; each run copies it (CREATE DATABASE ... TEMPLATE): the
# schema takes ~20 s to load, a copy well under a second.
SEED_DB = "agap_zbx_seed_60"

T = TypeVar("T")


def missing(root_dir: Path = Path("/"), *, server: bool = True) -> str | None:
    """Why a real Zabbix (under ``root_dir``) cannot run here, or None."""
    front, sql = root_dir / FRONTEND.relative_to("/"), root_dir / SQL.relative_to("/")
    needed = [front / "api_jsonrpc.php", sql / "schema.sql.gz", Path(PHP), Path(PSQL)]
    for path in [SERVER, *needed] if server else needed:
        if not path.exists():
            return (
                f"{path} is missing: install Debian's zabbix-server-pgsql, zabbix-frontend-php, "
                "php-cli and php-pgsql (.ci/run does) to run the real-Zabbix tests"
            )
    if subprocess.run([PSQL, *PG, "-c", "select 1"], capture_output=True, timeout=30).returncode:
        return "PostgreSQL does not answer on 127.0.0.1:5432 as postgres: the real-Zabbix tests need it"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_trapper_port() -> int:
    """A free port Zabbix accepts as ListenPort (1024-32767: below the ephemeral range)."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 20000-32000 for the Zabbix server")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """``probe()``'s first truthy answer, polled until ``timeout`` (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            got = probe()
            if got:
                return got
        except ZabbixError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}" + (f" (last: {last})" if last else ""))
        time.sleep(every)


def _psql(sql: str, db: str = "postgres") -> None:
    subprocess.run([PSQL, *PG, "-d", db, "-c", sql], check=True, capture_output=True, timeout=120)


def _seed(sql_dir: Path = SQL, seed: str = SEED_DB) -> None:
    """The seeded database (schema, images, data), made once per machine."""
    have = subprocess.run(
        [PSQL, *PG, "-At", "-c", f"select 1 from pg_database where datname='{seed}'"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    if have == "1":
        return
    staging = f"{seed}_{os.getpid()}"
    _psql(f"create database {staging}")
    for part in ("schema", "images", "data"):
        sql = subprocess.run(
            ["zcat", str(sql_dir / f"{part}.sql.gz")], capture_output=True, check=True
        ).stdout
        subprocess.run([PSQL, *PG, "-d", staging], input=sql, check=True, capture_output=True, timeout=300)
    # Renamed only when whole: a run killed half-way leaves no half-seeded database behind.
    try:
        _psql(f"alter database {staging} rename to {seed}")
    except subprocess.CalledProcessError:  # another run seeded it meanwhile
        _psql(f"drop database {staging}")


class RealZabbix:
    """A running server and frontend; ``api`` is logged in as Admin."""

    def __init__(self, root: Path, db: str, api_url: str, server_conf: Path, log: Path) -> None:
        self.root = root
        self.db = db
        self.api_url = api_url
        self.server_conf = server_conf
        self.log = log
        self.api = ZabbixClient(api_url, timeout=30)

    def reload_config(self) -> None:
        """Make the server read new hosts and items now (not at its next cache update)."""
        subprocess.run(
            [str(SERVER), "-c", str(self.server_conf), "-R", "config_cache_reload"],
            capture_output=True,
            timeout=30,
        )

    def api_token(self, name: str = "agap-ops") -> str:
        """A new API token for Admin (what a household registers as AGAP_ZABBIX_TOKEN)."""
        users = self.api.call("user.get", {"filter": {"username": "Admin"}, "output": ["userid"]})
        tid = self.api.call(
            "token.create", {"name": f"{name}-{uuid.uuid4().hex[:6]}", "userid": users[0]["userid"]}
        )
        (gen,) = self.api.call("token.generate", tid["tokenids"])
        return str(gen["token"])


def _server_conf(path: Path, db: str, run: Path) -> None:
    lines = {
        "DBName": db,
        "DBUser": "postgres",
        "DBHost": "",  # the socket, "local all all trust" on this machine kind
        "ListenIP": "127.0.0.1",
        "ListenPort": str(free_trapper_port()),
        "LogFile": str(run / "server.log"),
        "PidFile": str(run / "server.pid"),
        "SocketDir": str(run),
        "AllowRoot": "1",
        "Timeout": "4",
        # Small: a test host's few HTTP items, on a 2-core machine beside the suite.
        "StartPollers": "2",
        "StartPollersUnreachable": "1",
        "StartTrappers": "1",
        "StartPingers": "1",
        "StartDiscoverers": "0",
        "StartHTTPPollers": "0",
        "StartTimers": "1",
        "StartEscalators": "1",
        "StartAlerters": "1",
        "StartPreprocessors": "2",
        "StartLLDProcessors": "1",
        "StartHistoryPollers": "1",
        "StartDBSyncers": "1",
        "CacheUpdateFrequency": "2",
        "HousekeepingFrequency": "0",
        "CacheSize": "32M",
        "LogSlowQueries": "0",
        "FpingLocation": "/usr/bin/fping",
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))


def _frontend_conf(web: Path, db: str) -> None:
    # Debian's frontend reads /etc/zabbix/zabbix.conf.php; this copy reads its own.
    conf = web / "conf" / "zabbix.conf.php"
    cls = web / "include" / "classes" / "core" / "CConfigFile.php"
    cls.write_text(cls.read_text().replace("'/etc/zabbix/zabbix.conf.php'", repr(str(conf))))
    conf.write_text(
        f"""<?php
$DB['TYPE'] = 'POSTGRESQL';
$DB['SERVER'] = '127.0.0.1';
$DB['PORT'] = '5432';
$DB['DATABASE'] = '{db}';
$DB['USER'] = 'postgres';
$DB['PASSWORD'] = '';
$DB['SCHEMA'] = '';
$DB['ENCRYPTION'] = false;
$DB['KEY_FILE'] = '';
$DB['CERT_FILE'] = '';
$DB['CA_FILE'] = '';
$DB['VERIFY_HOST'] = false;
$DB['CIPHER_LIST'] = '';
$DB['VAULT_URL'] = '';
$DB['VAULT_DB_PATH'] = '';
$DB['VAULT_TOKEN'] = '';
$DB['DOUBLE_IEEE754'] = true;
$ZBX_SERVER_NAME = 'agap-tests';
$IMAGE_FORMAT_DEFAULT = IMAGE_FORMAT_PNG;
"""
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc`` and its own process group: ``php -S`` with workers forks children that
    outlive a signal to the parent alone."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a worker that ignored the parent's end


@contextmanager
def real_zabbix(root_dir: Path = Path("/"), *, server: bool = True) -> Iterator[RealZabbix]:
    """Start a server and frontend on a fresh database; drop it all afterwards.

    ``root_dir`` is where the packages' files are (``/``, or a folder an unpacked Debian
    13 7.0 frontend and schema sit in: then ``server=False``, the frontend alone, enough
    to check an import)."""
    frontend = root_dir / FRONTEND.relative_to("/")
    sql_dir = root_dir / SQL.relative_to("/")
    tag = hashlib.sha256(str(root_dir.resolve()).encode()).hexdigest()[:8]
    seed = SEED_DB if root_dir == Path("/") else f"{SEED_DB}_{tag}"
    _seed(sql_dir, seed)
    db = f"agap_zbx_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _psql(f"create database {db} template {seed}")
    # A short path: the server's IPC sockets live in SocketDir (a 108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="zbx", dir="/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        web = root / "web"
        shutil.copytree(frontend, web, symlinks=True)
        _frontend_conf(web, db)
        port = free_port()
        php_log = (root / "php.log").open("wb")
        procs.append(
            subprocess.Popen(
                [PHP, "-S", f"127.0.0.1:{port}", "-t", str(web)],
                cwd=web,
                stdout=php_log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PHP_CLI_SERVER_WORKERS": "4"},
                start_new_session=True,
            )
        )
        conf = root / "zabbix_server.conf"
        _server_conf(conf, db, root)
        if server:
            cmd = [str(SERVER), "-c", str(conf), "-f"]
            procs.append(
                subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
            )
        zbx = RealZabbix(root, db, f"http://127.0.0.1:{port}/api_jsonrpc.php", conf, root / "server.log")
        wait_for("the Zabbix frontend to answer", lambda: zbx.api.version(), 60, 0.3)
        zbx.api.login("Admin", "zabbix")
        # The seeded "Zabbix server" host polls an agent nobody runs here: quiet it.
        for host in zbx.api.call("host.get", {"output": ["hostid"], "filter": {"host": "Zabbix server"}}):
            zbx.api.call("host.update", {"hostid": host["hostid"], "status": 1})
        if server:
            wait_for(
                "the Zabbix server to start",
                lambda: zbx.log.exists() and "server #0 started" in zbx.log.read_text(errors="replace"),
                60,
                0.3,
            )
        yield zbx
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(
            [PSQL, *PG, "-c", f"drop database if exists {db} with (force)"], capture_output=True, timeout=60
        )


def import_rules(version: tuple[int, ...]) -> dict[str, Any]:
    """configuration.import's rules that bring the whole template (see compose/zabbix/README.md)."""
    both = {"createMissing": True, "updateExisting": True}
    rules: dict[str, Any] = {
        "templates": both,
        "items": {**both, "deleteMissing": True},
        "discoveryRules": {**both, "deleteMissing": True},
        "triggers": {**both, "deleteMissing": True},
        "graphs": {**both, "deleteMissing": True},
        "valueMaps": {**both, "deleteMissing": True},
        "templateLinkage": {"createMissing": True},
        "templateDashboards": {**both, "deleteMissing": True},
        "httptests": {**both, "deleteMissing": True},
    }
    rules["template_groups" if version >= (6, 2) else "groups"] = {"createMissing": True}
    return rules
