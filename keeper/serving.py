"""A keeper HTTP endpoint served from a daemon thread (metrics, Kanboard's webhook)."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Self


class BackgroundServer:
    """A :class:`ThreadingHTTPServer` in a daemon thread: start, stop, a context manager."""

    thread_name = "keeper-http"

    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self.httpd = httpd
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.httpd.server_address[0])
        return f"http://{host}:{self.port}"

    def start(self) -> Self:
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.1,), name=self.thread_name, daemon=True
        )  # a 0.1 s poll: stop() returns that fast
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.thread is not None:
            self.thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["BackgroundServer"]
