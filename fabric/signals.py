"""SIGTERM/SIGINT set a ``threading.Event``: the one safe way the daemons stop.

A Python signal handler runs in the main thread between two bytecodes, and that may be
inside ``Event.wait()`` while it holds the event's internal (non re-entrant) lock. A
handler that calls ``event.set()`` there waits for a lock its own thread holds: the
process hangs on SIGTERM, and it happens most on a busy machine, right after start-up,
which is exactly when a supervisor stops a daemon it has just started. So the handler
only starts a thread that sets the event; that thread takes the lock as soon as the
main thread lets go of it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("agap.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signal(stop: threading.Event, *, note: Callable[[int], None] | None = None) -> None:
    """Make SIGTERM and SIGINT set ``stop``. Only from the main thread (else a no-op).

    ``note(signum)`` runs first, in the handler, for a log line; it must not take locks
    other threads hold (``logging`` handlers are re-entrant-safe for this purpose).
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def _handler(signum: int, frame: FrameType | None) -> None:
        if note is not None:
            note(signum)
        threading.Thread(target=stop.set, name="agap-stop", daemon=True).start()

    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)


def exit_on_signal(code: int = 0) -> None:
    """Until a daemon's own handler is in place, SIGTERM and SIGINT exit with ``code``.

    A daemon's start-up (imports, cards, counters, the first connection) holds nothing
    worth finishing, so a stop then is a clean exit, like a stop later; without this a
    SIGTERM in that window kills the process (exit -15). :func:`set_on_signal` replaces it.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def _exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(code)

    for sig in STOP_SIGNALS:
        signal.signal(sig, _exit)
