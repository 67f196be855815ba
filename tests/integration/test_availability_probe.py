"""The real probes and hooks behind a(t): HTTP health and wake URL on a loopback server,
wake commands and the GPU probe as real subprocesses (no GPU needed)."""

from __future__ import annotations

import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabric.availability import reason_key
from workers.probes import (
    GpuProbeError,
    LocalGpu,
    OnDemand,
    command_waker,
    http_health_probe,
    nvidia_smi_probe,
    url_waker,
)

T0 = 1_800_000_000.0


class Node:
    """What the fake node answers; the handler reads it."""

    def __init__(self) -> None:
        self.status = 503
        self.delay = 0.0
        self.posts: list[str] = []


class Server(ThreadingHTTPServer):
    daemon_threads = True
    node: Node


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        node = self.server.node
        if node.delay:
            time.sleep(node.delay)
        body = b"ok" if node.status < 300 else b"down"
        self.send_response(node.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.server.node.posts.append(self.path)
        self.server.node.status = 200  # the wake worked
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def node() -> Iterator[tuple[Node, str]]:
    server = Server(("127.0.0.1", 0), Handler)
    server.node = Node()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.node, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(20)
def test_http_health_probe_statuses(node: tuple[Node, str]) -> None:
    state, base = node
    state.status = 200
    assert http_health_probe(base + "/health", 2.0) == (True, "HTTP 200")
    state.status = 204
    assert http_health_probe(base + "/health", 2.0)[0] is True
    for status in (404, 500, 503):
        state.status = status
        assert http_health_probe(base + "/health", 2.0) == (False, f"HTTP {status}")


@pytest.mark.timeout(20)
def test_http_health_probe_timeout_and_refused(node: tuple[Node, str]) -> None:
    state, base = node
    state.status, state.delay = 200, 5.0  # the node answers late (daemon handler threads)
    started = time.monotonic()
    healthy, detail = http_health_probe(base + "/health", 0.2)
    assert not healthy and detail
    assert time.monotonic() - started < 4.0, "the probe's 0.2 s timeout, not the node's 5 s"
    healthy, detail = http_health_probe(f"http://127.0.0.1:{free_port()}/health", 1.0)
    assert not healthy and detail


@pytest.mark.timeout(20)
def test_on_demand_over_real_http_wakes_by_url(node: tuple[Node, str]) -> None:
    state, base = node
    od = OnDemand(
        base + "/health", wake=url_waker(base + "/wake"), probe_timeout=2.0, wake_timeout=60, retry_seconds=0
    )
    v = od.check(T0)
    assert not v.available and reason_key(v.reason) == "asleep" and "HTTP 503" in v.reason
    assert state.posts == ["/wake"]
    assert od.check(T0 + 1).available  # the POST woke it
    assert state.posts == ["/wake"]


@pytest.mark.timeout(20)
def test_url_waker_failure_is_reported(node: tuple[Node, str]) -> None:
    _, _base = node
    wake = url_waker(f"http://127.0.0.1:{free_port()}/wake", timeout=1.0)
    with pytest.raises(RuntimeError, match="wake URL failed"):
        wake()


@pytest.mark.timeout(20)
def test_command_waker_runs_and_reports_failures() -> None:
    py = shlex.quote(sys.executable)
    command_waker(f"{py} -c 'pass'", timeout=10)()
    with pytest.raises(RuntimeError, match="exited 3 nope"):
        command_waker(f"{py} -c 'import sys; print(\"nope\", file=sys.stderr); sys.exit(3)'", timeout=10)()
    with pytest.raises(RuntimeError, match="not found"):
        command_waker("wakeonlan-not-installed-here 00:00:00:00:00:00")()
    with pytest.raises(RuntimeError, match="timed out"):
        command_waker(f"{py} -c 'import time; time.sleep(5)'", timeout=0.3)()


@pytest.mark.timeout(20)
def test_gpu_probe_command_as_real_subprocess() -> None:
    py = shlex.quote(sys.executable)
    probe = nvidia_smi_probe(f"{py} -c 'print(1200); print(5100)'", timeout=10)
    assert probe() == [1200, 5100]
    assert LocalGpu(3300, headroom_mb=256, probe=probe).check(T0).available
    failing = nvidia_smi_probe(f"{py} -c 'import sys; print(\"NVML failed\"); sys.exit(9)'", timeout=10)
    with pytest.raises(GpuProbeError, match="exited 9 NVML failed"):
        failing()
    v = LocalGpu(3300, probe=failing).check(T0)
    assert not v.available and v.reason.startswith("GPU probe failed:")
    slow = nvidia_smi_probe(f"{py} -c 'import time; time.sleep(5)'", timeout=0.3)
    assert "timed out" in LocalGpu(3300, probe=slow).check(T0).reason
