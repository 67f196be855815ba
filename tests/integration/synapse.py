"""A real Matrix homeserver for the tests: Synapse (the ``matrix`` extra), SQLite, loopback.

:func:`start` writes a minimal configuration (one client listener on 127.0.0.1, no
federation listener, rate limits out of the way), starts ``synapse.app.homeserver`` with
this interpreter and waits (bounded) for its ``/health``. Users are made with its
shared-secret registration (``/_synapse/admin/v1/register``), as an operator makes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

SERVER_NAME = "localhost"
CALL_TIMEOUT = 30.0  # one API call, on a busy machine
START_TIMEOUT = 240.0  # a first start creates the database schema; slow on a busy machine


def available() -> str | None:
    """None when Synapse can run here, else why not (the skip's reason)."""
    if importlib.util.find_spec("synapse") is None:
        return "synapse is not importable: install the matrix extra (pip install -e '.[matrix]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LIMIT = "{{per_second: 1000, burst_count: 1000}}"  # doubled: the template is .format()ed
_CONFIG = f"""\
server_name: "{SERVER_NAME}"
pid_file: "{{dir}}/homeserver.pid"
listeners:
  - port: {{port}}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{{dir}}/homeserver.db"
media_store_path: "{{dir}}/media"
signing_key_path: "{{dir}}/signing.key"
registration_shared_secret: "{{secret}}"
report_stats: false
trusted_key_servers: []
suppress_key_server_warning: true
enable_metrics: false
rc_message: {_LIMIT}
rc_room_creation: {_LIMIT}
rc_registration: {_LIMIT}
rc_login:
  address: {_LIMIT}
  account: {_LIMIT}
  failed_attempts: {_LIMIT}
rc_joins:
  local: {_LIMIT}
  remote: {_LIMIT}
rc_invites:
  per_room: {_LIMIT}
  per_user: {_LIMIT}
  per_issuer: {_LIMIT}
"""


@dataclass
class User:
    """A registered user and their access token."""

    user_id: str
    token: str = field(repr=False)


@dataclass
class Synapse:
    """One running homeserver."""

    url: str
    secret: str = field(repr=False)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def register(self, localpart: str, *, admin: bool = False) -> User:
        """A new user, by shared-secret registration (nonce, then HMAC-SHA1 of the fields)."""
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        nonce = requests.get(endpoint, timeout=CALL_TIMEOUT).json()["nonce"]
        password = secrets.token_hex(12)
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
        role = b"admin" if admin else b"notadmin"
        mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode(), role]))
        body = {"nonce": nonce, "username": localpart, "password": password, "admin": admin}
        body["mac"] = mac.hexdigest()
        resp = requests.post(endpoint, json=body, timeout=CALL_TIMEOUT)
        resp.raise_for_status()
        out = resp.json()
        return User(str(out["user_id"]), str(out["access_token"]))

    def call(self, user: User, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One client-server API call as ``user`` (raises on an HTTP error)."""
        resp = requests.request(
            method,
            f"{self.url}/_matrix/client/v3{path}",
            json=body,
            headers={"Authorization": f"Bearer {user.token}"},
            timeout=CALL_TIMEOUT,
        )
        resp.raise_for_status()
        return resp.json()

    def direct_room(self, bot: User, person: User) -> str:
        """An unencrypted private room the bot made and ``person`` joined."""
        room = self.call(bot, "POST", "/createRoom", {"preset": "private_chat", "invite": [person.user_id]})
        room_id = str(room["room_id"])
        self.call(person, "POST", f"/join/{quote(room_id, safe='')}", {})
        return room_id

    def send(self, user: User, room: str, content: dict[str, Any]) -> str:
        """Post ``content`` as ``user``; its event id."""
        txn = secrets.token_hex(8)
        path = f"/rooms/{quote(room, safe='')}/send/m.room.message/{txn}"
        return str(self.call(user, "PUT", path, content)["event_id"])

    def reply(self, user: User, room: str, to: str, text: str) -> str:
        """A reply to event ``to``, as a Matrix client writes one (m.relates_to in_reply_to)."""
        content = {"msgtype": "m.text", "body": text, "m.relates_to": {"m.in_reply_to": {"event_id": to}}}
        return self.send(user, room, content)

    def messages(self, user: User, room: str, limit: int = 100) -> list[dict[str, Any]]:
        """The room's newest ``m.room.message`` events, oldest first."""
        path = f"/rooms/{quote(room, safe='')}/messages?dir=b&limit={limit}"
        chunk = self.call(user, "GET", path)["chunk"]
        return [e for e in reversed(chunk) if e.get("type") == "m.room.message"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=CALL_TIMEOUT)


def start(directory: Path) -> Synapse:
    """Start Synapse in ``directory`` on a free loopback port; ready when it returns."""
    port, secret = _free_port(), secrets.token_hex(16)
    cfg = directory / "homeserver.yaml"
    cfg.write_text(_CONFIG.format(dir=directory, port=port, secret=secret), encoding="utf-8")
    app = [sys.executable, "-m", "synapse.app.homeserver", "-c", str(cfg)]
    subprocess.run([*app, "--generate-keys"], check=True, capture_output=True, timeout=START_TIMEOUT)
    log = directory / "synapse.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(app, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    server = Synapse(f"http://127.0.0.1:{port}", secret, proc, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"synapse exited ({proc.returncode}): {tail}")
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        proc_wait(proc, 0.1)
    server.stop()
    raise RuntimeError(f"synapse did not answer /health within {START_TIMEOUT:.0f} s; see {log}")


def proc_wait(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait for the process to exit, at most ``seconds`` (the poll's pace, not a sync)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)
