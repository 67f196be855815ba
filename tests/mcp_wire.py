"""The 2026-07-28 Streamable HTTP wire of ``agap mcp serve``, spoken with httpx2, for the
task status notification tests and bench (the SDK's client has no ``taskIds`` listen):
the server as a process, one-shot requests, a ``subscriptions/listen`` stream on its own
thread, and a worker's side of the board that publishes what a worker publishes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2

from fabric.core import Fabric
from fabric.events.attach import canceled_event
from fabric.events.brokers import open_transport
from fabric.events.publisher import Publisher
from fabric.ledger import Lease
from fabric.settings.events import EventsConfig
from tests.conftest import ROOT
from tests.helpers import wait_until
from workers.attach import WorkerEvents

TOKEN = "mcp-token-" + "m" * 30
TASKS = "io.modelcontextprotocol/tasks"
KEY = "task-key-" + "n" * 30
MODERN = "2026-07-28"
SUB_META = "io.modelcontextprotocol/subscriptionId"


class Server:
    """``agap mcp serve --transport http --port 0`` for ``agent``; its URL comes on stderr."""

    def __init__(
        self, env: dict[str, str], agent: str = "claude-coder", *, key: str | None = KEY, **extra: str
    ) -> None:
        """``env`` reaches the board; ``key`` signs task handles (None: the server's default);
        ``extra`` (AGAP_EVENTS_*, AGAP_MCP_*) is added to the environment."""
        keyed = {"AGAP_MCP_TASK_KEY": key} if key is not None else {}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fabric.apps.cli",
                "mcp",
                "serve",
                "--agent",
                agent,
                "--transport",
                "http",
                "--port",
                "0",
            ],
            env={**env, "AGAP_MCP_TOKEN": TOKEN, **keyed, **extra},
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        line = wait_until(lambda: next((x for x in self.lines if "serving" in x), None), 30, "the server")
        self.url = line.split(" on ")[1].split(" ")[0]

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> int:
        """Stop it as SIGTERM does; its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _meta(tasks: bool) -> dict[str, Any]:
    caps: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "notify-test", "version": "1"},
    }


def _headers(method: str, name: str | None = None) -> dict[str, str]:
    out = {
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if name is not None:
        out["Mcp-Name"] = name
    return out


def sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body (events without data, e.g. priming, skipped)."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data and "".join(data).strip():
                yield json.loads("\n".join(data))
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def rpc(url: str, method: str, params: dict[str, Any], *, tasks: bool = True, name: str | None = None) -> Any:
    """One 2026-07-28 request; its JSON-RPC response."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": _meta(tasks)}}
    with httpx2.Client(timeout=30) as http:
        r = http.post(url, json=body, headers=_headers(method, name))
        if r.headers["content-type"].startswith("application/json"):
            return r.json()  # a result, or an error (a refused request is a 400 with it)
        assert r.status_code == 200, r.text
        return next(m for m in sse(iter([*r.text.splitlines(), ""])) if m.get("id") == 1)


def submit(url: str, intent: str, target: str = "researcher") -> str:
    out = rpc(
        url,
        "tools/call",
        {"name": "submit_task", "arguments": {"intent": intent, "target": target}},
        name="submit_task",
    )
    assert out["result"]["resultType"] == "task", out
    handle: str = out["result"]["taskId"]
    return handle


def tasks_get(url: str, handle: str) -> dict[str, Any]:
    result: dict[str, Any] = rpc(url, "tasks/get", {"taskId": handle}, name=handle)["result"]
    return result


def board_id(handle: str) -> int:
    return int(handle.split("-")[1])


class Listener:
    """A ``subscriptions/listen`` stream on its own thread: every message it carries, in order."""

    def __init__(self, url: str, task_ids: list[str], *, tasks: bool = True, listen_id: int = 41) -> None:
        self.messages: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # time.perf_counter() of each message, for the bench
        self.ended = threading.Event()
        self.status = 0
        self.listen_id = listen_id
        body = {
            "jsonrpc": "2.0",
            "id": listen_id,
            "method": "subscriptions/listen",
            "params": {"notifications": {"taskIds": task_ids}, "_meta": _meta(tasks)},
        }
        self._http = httpx2.Client(timeout=httpx2.Timeout(30, read=None))
        threading.Thread(target=self._run, args=(url, body), daemon=True).start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with self._http.stream("POST", url, json=body, headers=_headers("subscriptions/listen")) as r:
                self.status = r.status_code
                if r.headers["content-type"].startswith("application/json"):  # refused at once
                    self.messages.append(json.loads(r.read()))
                    return
                for message in sse(r.iter_lines()):
                    self.arrived.append(time.perf_counter())
                    self.messages.append(message)
                    if message.get("id") == self.listen_id:
                        return  # the stream's end: its result, or an error
        except httpx2.HTTPError:
            pass  # closed by the test
        finally:
            self.ended.set()

    def close(self) -> None:
        self._http.close()

    @property
    def ack(self) -> dict[str, Any] | None:
        acks = [m for m in self.messages if m.get("method") == "notifications/subscriptions/acknowledged"]
        return acks[0]["params"] if acks else None

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return [m["params"] for m in self.messages if m.get("method") == "notifications/tasks"]

    def statuses(self) -> list[str]:
        return [t["status"] for t in self.tasks]

    def wait_for(self, status: str, count: int = 1, timeout: float = 20) -> dict[str, Any]:
        """The ``count``-th notification with ``status`` (waited for, within ``timeout``)."""

        def nth() -> dict[str, Any] | None:
            hits = [t for t in self.tasks if t["status"] == status]
            return hits[count - 1] if len(hits) >= count else None

        found: dict[str, Any] = wait_until(nth, timeout, f"notification #{count} {status!r}")
        return found


# -- the worker's side ------------------------------------------------------------------------


class WorkerSide:
    """The board through the target's ledger, publishing what a worker publishes."""

    def __init__(self, fab: Fabric, config: EventsConfig | None, agent: str = "researcher") -> None:
        self.fab = fab.home_fabric(fab.cards.get(agent))
        self.pub = Publisher(open_transport(config), config.secret) if config is not None else None
        self.events = WorkerEvents(self.pub) if self.pub is not None else None

    def say(self, what: str, lease: Lease, detail: str = "") -> None:
        """Publish the worker event ``what`` (as workers.attach does), when events are on."""
        if self.events is not None:
            self.events(what, lease, detail)

    def claim(self, task_id: int) -> Lease:
        lease = self.fab.ledger.claim(self.fab.show(task_id), "worker-1", lease_seconds=300)
        self.say("started", lease)
        return lease

    def ask(self, lease: Lease, question: str, person: str) -> None:
        self.fab.ledger.ask(lease, question, person)
        self.say("input_required", lease, question)

    def complete(self, lease: Lease, ref: str) -> None:
        self.fab.ledger.complete(lease, result_ref=ref)
        self.say("completed", lease, ref)

    def fail(self, lease: Lease, reason: str) -> None:
        self.fab.ledger.fail(lease, reason, poison=True)
        self.say("failed", lease, reason)

    def cancel(self, task_id: int) -> None:
        record = self.fab.ledger.cancel(task_id, "alvis", "not needed")
        if self.pub is not None:
            self.pub.publish(canceled_event(task_id, record))

    def close(self) -> None:
        if self.pub is not None:
            self.pub.close(2.0)
