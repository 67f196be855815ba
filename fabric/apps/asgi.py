"""uvicorn under the fabric's stop rule: gone within 3 s of SIGTERM/SIGINT (:mod:`fabric.signals`).

uvicorn installs its own signal handlers and, on a signal, waits for open connections
(an A2A stream, an MCP SSE stream a client keeps open) for as long as its graceful
timeout allows, then re-raises the signal. Here the fabric's relay owns the signals: the
first one tells the server to exit and arms the watchdog, and open connections get
:data:`GRACEFUL` seconds before they are closed.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn

from fabric.signals import set_on_signal

#: How long open connections may finish after a stop (well inside the 3 s bound).
GRACEFUL = 1  # uvicorn takes whole seconds


class BoundedServer(uvicorn.Server):
    """A uvicorn server that leaves the signals to :mod:`fabric.signals`."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(
    config: uvicorn.Config,
    sockets: list[socket.socket],
    *,
    note: Callable[[int], None] | None = None,
) -> None:
    """Serve in the foreground until SIGTERM/SIGINT; ``note(signum)`` says why it stops."""
    config.timeout_graceful_shutdown = min(config.timeout_graceful_shutdown or GRACEFUL, GRACEFUL)
    server = BoundedServer(config)

    def _stop(signum: int) -> None:
        if note is not None:
            note(signum)
        server.should_exit = True  # uvicorn polls it every 0.1 s

    set_on_signal(threading.Event(), note=_stop)
    asyncio.run(server.serve(sockets=sockets))


__all__ = ["GRACEFUL", "BoundedServer", "serve"]
