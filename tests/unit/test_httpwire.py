"""fabric.httpwire: a POST leaves in one write, and still reads as the same request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fabric.httpwire import KeptAlive


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        seen = {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
        reply = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _Counting:
    """A socket that notes each ``sendall``."""

    def __init__(self, real: Any, writes: list[bytes]) -> None:
        self.real, self.writes = real, writes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.real.sendall(data)


def test_a_post_is_one_write_and_the_same_request() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    writes: list[bytes] = []
    try:
        client = KeptAlive(
            f"http://127.0.0.1:{server.server_address[1]}/jsonrpc.php?x=1",
            headers={"Authorization": "Basic abc"},
            timeout=10,
        )
        for n in range(2):  # a fresh connection, then the kept-alive one
            conn = client._take()
            if conn.sock is None:
                client._connect(conn, 10)
            real = conn.sock
            assert real is not None
            conn.sock = _Counting(real, writes)
            client._give_back(conn)
            sent = f'{{"n": {n}}}'
            reply = client.post(sent.encode(), headers={"X-Extra": "1"})
            conn.sock = real
            seen = json.loads(reply.body)
            assert reply.status == 200
            assert seen["path"] == "/jsonrpc.php?x=1" and seen["body"] == sent
            assert seen["headers"]["Authorization"] == "Basic abc" and seen["headers"]["X-Extra"] == "1"
            assert seen["headers"]["Content-Length"] == str(len(seen["body"]))
            assert seen["headers"]["Host"] == f"127.0.0.1:{server.server_address[1]}"
        # http.client alone writes the head and the body apart: two wake-ups per call.
        assert len(writes) == 2 and all(w.endswith(b"}") and w.startswith(b"POST ") for w in writes)
        client.close()
    finally:
        server.shutdown()
        server.server_close()
