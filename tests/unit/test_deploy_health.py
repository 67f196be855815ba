"""The container healthchecks (python -m fabric.apps.deploy.health)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.apps.deploy.health import check_http, check_process, check_tcp, main


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            ok = self.headers.get("Authorization") == "Bearer s3cret" or self.path == "/open"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_process(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "status").write_text("Name:\tagap\nState:\tS (sleeping)\n")
    assert check_process(1, tmp_path) is None
    (tmp_path / "1" / "status").write_text("Name:\tagap\nState:\tZ (zombie)\n")
    assert check_process(1, tmp_path) == "process 1 is a zombie"
    assert check_process(2, tmp_path) == "process 2 is gone"


def test_http_with_a_bearer_from_the_environment(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_http(f"{server}/open") is None
    assert check_http(f"{server}/metrics.json", "HC_TOKEN") == "HC_TOKEN is not set"
    monkeypatch.setenv("HC_TOKEN", "wrong")
    assert check_http(f"{server}/metrics.json", "HC_TOKEN") == f"{server}/metrics.json: HTTP 401"
    monkeypatch.setenv("HC_TOKEN", "s3cret")
    assert main(["http", f"{server}/metrics.json", "--bearer-env", "HC_TOKEN"]) == 0


def test_tcp_and_usage(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    assert check_tcp("127.0.0.1", port) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert main(["tcp", "127.0.0.1", str(closed)]) == 1
    assert main(["nonsense"]) == 2
