"""What every loopback stand-in shares: an HTTP server on 127.0.0.1 (ephemeral port)
serving from a daemon thread, and a quiet handler that answers JSON."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Loopback:
    """One running server: ``start()``, ``stop()``, ``port``, ``url``."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        name: str,
        server_cls: type[ThreadingHTTPServer] = ThreadingHTTPServer,
    ) -> None:
        self.server = server_cls(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name=name, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> Loopback:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and replies with JSON."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def send_json(
        self,
        status: int,
        payload: Any,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
