"""A loopback stand-in for **Hindsight**'s memory API, for tests.

It is the stand-in ``agap up`` embeds (:class:`fabric.embedded.hindsight.HindsightStandIn`:
Hindsight's recall path and JSON shapes, bearer auth, banks of memories, recall by keyword
overlap, every request recorded), plus what tests need on top: :meth:`HindsightStub.fail_next`
makes the next N requests (or the next N to one endpoint) answer a given status (503, 429,
500, …) in FastAPI's error shape.
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
    _failures: list[tuple[int, str | None]] = field(default_factory=list, repr=False)
    _fail_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_next(self, count: int, status: int = 503, *, on: str | None = None) -> None:
        """Answer the next ``count`` requests (only those whose path ends with ``on``, e.g.
        ``"/reflect"``, when given) with ``status``."""
        with self._fail_lock:
            self._failures.extend([(status, on)] * count)

    def answer(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any]:
        route = path.split("?", 1)[0]
        with self._fail_lock:
            hit = next((f for f in self._failures if f[1] is None or route.endswith(f[1])), None)
            if hit is not None:
                self._failures.remove(hit)
            status = hit[0] if hit is not None else None
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
