"""Round trips of a few threads, sent to the board as one request.

A worker that has just finished a task records its outcome while it claims the next one:
two sequences of round trips that do not depend on each other (win the next epoch's
lock, then write; read and lock, then write). Sent together, each pair of trips costs
one: Kanboard runs a batch's items in order, each committed on its own, so the calls of
two tasks side by side do what they would do one request apart. Each rider still sees
only its own calls' outcomes, and the failure a request of its own would have had.

Riding together changes latency only. A rider that waits longer than :data:`WAIT` for
the others goes alone, so a rider busy elsewhere (or done with the board) never holds
the others up for more than that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fabric.kanboard.port import PROTOCOL_ERRORS, BoardError, Call, MaybeDone, Outcome, Params, RpcPort

# How long a rider waits for the others' calls before its own go alone: a partner between
# two trips builds a record or parses a reply (well under a millisecond to a few).
WAIT = 0.02


class _Ask:
    """One rider's calls and, once sent, their outcomes (or the request's failure)."""

    def __init__(self, calls: Sequence[Call]) -> None:
        self.calls = list(calls)
        self.out: list[Outcome] | None = None
        self.failure: BoardError | None = None
        self.shared = False  # sent beside another rider's writes
        self.done = False

    @property
    def reads_only(self) -> bool:
        return all(c.is_read for c in self.calls)


class GatheringPort:
    """An :class:`RpcPort` whose round trips from the threads of :meth:`together` ride
    together; every other caller's go straight through, one request each."""

    def __init__(self, inner: RpcPort, *, wait: float = WAIT) -> None:
        self.inner = inner
        self.stats = inner.stats  # a combined request is one round trip
        self.wait = wait
        self._cv = threading.Condition()
        self._riders: set[int] = set()  # thread idents riding together now
        self._pending: list[_Ask] = []
        # The inner port (one kept-alive connection) is used by one thread at a time.
        self._send_lock = threading.Lock()

    def call(self, method: str, params: Params = None) -> Any:
        return self.batch([Call(method, params)])[0].unwrap()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        if not calls:
            return []
        with self._cv:
            riding = threading.get_ident() in self._riders
        if not riding:
            with self._send_lock:
                return self.inner.batch(calls)
        return self._ride(_Ask(calls))

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

    def together(self, *jobs: Callable[[], Any]) -> list[Any]:
        """Run ``jobs`` side by side (the first in this thread), their round trips riding
        together; their results in order. A job's exception is raised here once all have
        ended (the first one's, if several raise)."""
        results: list[Any] = [None] * len(jobs)
        errors: list[BaseException | None] = [None] * len(jobs)
        joined = threading.Barrier(len(jobs))  # every rider counted before any trip goes

        def ride(i: int) -> None:
            with self._cv:
                self._riders.add(threading.get_ident())
            try:
                joined.wait()
                results[i] = jobs[i]()
            except BaseException as exc:  # handed to the caller's thread below
                errors[i] = exc
            finally:
                with self._cv:
                    self._riders.discard(threading.get_ident())
                    self._cv.notify_all()  # the others no longer wait for this rider

        threads = [
            threading.Thread(target=ride, args=(i,), name="ride", daemon=True) for i in range(1, len(jobs))
        ]
        for t in threads:
            t.start()
        try:
            ride(0)
        finally:
            for t in threads:
                t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    # -- riding ---------------------------------------------------------------------

    def _ride(self, ask: _Ask) -> list[Outcome]:
        deadline = time.monotonic() + self.wait
        with self._cv:
            self._pending.append(ask)
            self._cv.notify_all()
            while True:
                if ask.done:
                    return self._answer(ask)
                if ask in self._pending:
                    left = deadline - time.monotonic()
                    if len(self._pending) >= len(self._riders) or left <= 0:
                        asks, self._pending = self._pending, []
                        break  # this rider sends them all
                    self._cv.wait(left)
                else:
                    self._cv.wait()  # taken by another rider, whose request answers it
        self._send(asks)
        return self._answer(ask)

    def _send(self, asks: list[_Ask]) -> None:
        calls = [c for a in asks for c in a.calls]
        writes = any(not a.reads_only for a in asks)
        try:
            with self._send_lock:
                out = self.inner.batch(calls)
        except BoardError as exc:
            for a in asks:
                a.failure = exc
        else:
            at = 0
            for a in asks:
                a.out, at = out[at : at + len(a.calls)], at + len(a.calls)
        with self._cv:
            for a in asks:
                a.shared = len(asks) > 1 and writes
                a.done = True
            self._cv.notify_all()

    def _answer(self, ask: _Ask) -> list[Outcome]:
        """The rider's outcomes, or the failure its own request would have had.

        Reads sent beside another rider's writes lose what a request of reads alone gets:
        a retry when the board is busy or the answer is lost. They are sent again alone.
        A write's ambiguous failure names only the rider's own calls (what it may re-send).
        """
        failure = ask.failure
        if ask.shared and ask.reads_only and (failure is not None or _busy(ask.out or [])):
            with self._send_lock:
                return self.inner.batch(ask.calls)
        if isinstance(failure, MaybeDone):
            raise MaybeDone(str(failure.what), where=failure.where, calls=ask.calls) from None
        if failure is not None:
            # Riders of one failed request raise the same error object: it says what
            # happened to the request, which is what each rider's own would have said.
            raise failure
        assert ask.out is not None
        return ask.out


def _busy(out: Sequence[Outcome]) -> bool:
    """An outcome a read retries: a server-side error, not a refusal (as the client does)."""
    return any(
        o.error is not None and o.error.code not in PROTOCOL_ERRORS and not o.error.refused for o in out
    )


def gathering(port: RpcPort) -> GatheringPort:
    """``port`` wrapped in a :class:`GatheringPort` (once: wrapping twice is a no-op)."""
    return port if isinstance(port, GatheringPort) else GatheringPort(port)


def gathering_of(port: RpcPort) -> GatheringPort | None:
    """The :class:`GatheringPort` ``port`` is or wraps (through ``inner``), if any."""
    seen: Any = port
    for _ in range(8):  # ports wrap a few deep at most
        if isinstance(seen, GatheringPort):
            return seen
        seen = getattr(seen, "inner", None)
        if seen is None:
            return None
    return None
