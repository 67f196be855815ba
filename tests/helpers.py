"""Small helpers shared by the integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from workers.loop import Worker


def wait_until(
    check: Callable[[], Any],
    timeout: float = 20.0,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``check`` until it returns something truthy (returned), or fail after ``timeout``.

    Exceptions listed in ``ignoring`` count as "not yet" (e.g. a board that is down).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ignoring:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or check}")


class Running:
    """A worker running in a thread for the duration of a ``with`` block."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"
