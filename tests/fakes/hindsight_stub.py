"""A loopback stand-in for **Hindsight**'s memory API, for tests.

It is the stand-in ``agap up`` embeds (:class:`fabric.embedded.hindsight.HindsightStandIn`:
Hindsight's recall path and JSON shapes, bearer auth, banks of memories, recall by keyword
overlap, every request recorded), plus what tests need on top: :meth:`HindsightStub.fail_next`
makes the next N requests answer a given status (503, 429, 500, …) in FastAPI's error shape.
Binds 127.0.0.1 on an ephemeral port (``with HindsightStub(...) as stub: ...``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from fabric.embedded.hindsight import HindsightStandIn, Memory, RecallCall

__all__ = ["HindsightStub", "Memory"]


@dataclass
class HindsightStub(HindsightStandIn):
    _failures: list[int] = field(default_factory=list, repr=False)
    _fail_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._fail_lock:
            self._failures.extend([status] * count)

    def answer(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any]:
        with self._fail_lock:
            status = self._failures.pop(0) if self._failures else None
        if status is not None:
            with self._lock:  # a failed request was still received: recorded like the others
                self.requests.append(RecallCall(method, path, authorization, body))
            return status, {"detail": f"stub failure {status}"}
        return super().answer(method, path, authorization, body)

    @property
    def recalls(self) -> list[Any]:
        """The bodies of the recall requests received, in order."""
        return [r.body for r in self.requests if r.path.endswith("/memories/recall")]

    def __enter__(self) -> HindsightStub:
        self.start()
        return self
