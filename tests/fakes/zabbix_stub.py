"""A loopback stand-in speaking Zabbix 6.0's JSON-RPC (``api_jsonrpc.php``), for CI runs
without Debian's Zabbix: ``apiinfo.version``, ``problem.get`` and ``event.acknowledge``,
the token in the body's ``auth`` as 6.0 wants it. ``raw`` replaces the next answer's body
(an answer the agent cannot read)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import JsonHandler, Loopback


class ZabbixStub:
    def __init__(self, token: str = "zbx-token") -> None:
        self.token = token
        self.problems: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.raw: bytes | None = None
        self.lock = threading.Lock()
        self._loop = Loopback(self._handler(), "zabbix-stub")

    def __enter__(self) -> ZabbixStub:
        self._loop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.stop()

    @property
    def url(self) -> str:
        return f"{self._loop.url}/api_jsonrpc.php"

    def add_problem(self, eventid: str, name: str, tags: dict[str, str], severity: int = 2) -> None:
        with self.lock:
            self.problems.append(
                {
                    "eventid": eventid,
                    "objectid": "900" + eventid,
                    "name": name,
                    "severity": str(severity),
                    "clock": "1800000000",
                    "r_eventid": "0",
                    "tags": [{"tag": k, "value": v} for k, v in tags.items()],
                }
            )

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        rid, method, params = body.get("id"), body.get("method"), body.get("params") or {}
        if method == "apiinfo.version":
            return {"jsonrpc": "2.0", "result": "6.0.14", "id": rid}
        if body.get("auth") != self.token:
            err = {"code": -32602, "message": "Invalid params.", "data": "Not authorised."}
            return {"jsonrpc": "2.0", "error": err, "id": rid}
        with self.lock:
            if method == "problem.get":
                return {"jsonrpc": "2.0", "result": list(self.problems), "id": rid}
            if method == "event.acknowledge":
                self.acks.append(dict(params))
                return {"jsonrpc": "2.0", "result": {"eventids": params.get("eventids", [])}, "id": rid}
        err = {"code": -32601, "message": "Method not found.", "data": str(method)}
        return {"jsonrpc": "2.0", "error": err, "id": rid}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if stub.raw is not None and body.get("method") != "apiinfo.version":
                    raw, stub.raw = stub.raw, None
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                self.send_json(200, stub.answer(body))

        return Handler
