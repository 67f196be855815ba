"""Stopping a daemon: SIGTERM or SIGINT ends every fabric process within :data:`STOP_BOUND`.

Two ways a Python daemon can miss or hang on SIGTERM, both seen here on a loaded machine:

* A Python-level handler runs in the main thread, between two bytecodes, once the main
  thread gets to run. A main thread asleep in ``Event.wait()`` may never run it, and a
  handler that does run may be inside a lock it then needs (an ``Event``'s condition,
  ``threading``'s registry lock when it starts a thread, a logging lock).
* An exception raised from a handler (``SystemExit``, ``KeyboardInterrupt``) lands at an
  arbitrary point, even in a callback that swallows it.

So the fabric never acts inside a handler. Python's own C-level handler writes the
signal's number to a pipe (:func:`signal.set_wakeup_fd`: whatever thread the kernel chose,
before any Python code runs); the Python-level handler does nothing. A relay thread reads
the pipe and does the rest in ordinary thread context:

1. during a daemon's start-up (:func:`exit_on_signal`) it exits at once: nothing is held
   yet that is worth finishing;
2. afterwards (:func:`set_on_signal`) it says so (the daemon's ``note``), sets
   :data:`STOPPING` (what the board client, the notifiers and the retry loops look at, so
   nothing retries or backs off once a stop is asked for) and each registered event, and
   arms a watchdog: a daemon still alive :func:`grace` seconds later names what it is
   still doing in one line and ends with :func:`os._exit`. To the board that is a crash,
   which the epoch ledger is built to survive (a lock without its record is a gap the
   keeper resolves; a lease runs out), so the bound holds whatever a job, a socket or a C
   call is doing;
3. a second signal ends the process at once, unless it is the first one said again (a
   terminal's Ctrl-C and ``agap up`` both signal a child within a moment).

The orderly path is the common one: loops wait on events (never ``time.sleep``), retries
give up when :func:`stop_requested`, servers close their connections after a short
graceful timeout, and a worker gives a claimed task back to its queue.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from fabric.settings import registry

log = logging.getLogger("agap.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any]
#: The promise: a daemon is gone this many seconds after SIGTERM/SIGINT (README).
STOP_BOUND = 3.0
#: A second signal within this many seconds of the first is the same stop said twice.
SAME_STOP = 1.0

#: Set (process-wide) by the first stop signal; cleared only by tests.
STOPPING = threading.Event()


def stop_requested() -> bool:
    """True once this process was told to stop: give up retries, waits and backoffs."""
    return STOPPING.is_set()


def pause(seconds: float) -> bool:
    """Sleep ``seconds``, cut short by a stop; True when stopping (then do not retry)."""
    return STOPPING.wait(max(0.0, seconds))


def grace() -> float:
    """How long the orderly stop may take before the watchdog ends the process."""
    value = registry.get_duration("AGAP_STOP_GRACE")
    return max(0.1, min(value, STOP_BOUND - 0.5))


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: nothing (the relay acts on the wakeup fd's byte)."""


class _Relay:
    """The pipe Python's C handler writes to, and the thread that acts on what it reads."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.events: list[threading.Event] = []
        self.notes: list[Callable[[int], None]] = []
        self.on_force: list[Callable[[], None]] = []
        self.watchdog = True
        self.grace = 2.0
        self.exit_code = 0
        self.starting = False  # a daemon's start-up (exit_on_signal): a stop exits at once
        self.signals = 0
        self.first_at = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="agap-signals", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            # Signals read together arrived together: one time for all of them, taken
            # before acting on the first (which starts threads and may wait for a CPU on a
            # busy machine), or a second Ctrl-C sent with the first would read as a
            # deliberate second stop.
            now = time.monotonic()
            for signum in data:
                if signum in STOP_SIGNALS:  # the fd carries every handled signal
                    self._received(signum, now)

    def _received(self, signum: int, now: float) -> None:
        with self.lock:
            self.signals += 1
            first = self.signals == 1
            if first:
                self.first_at = now
            events, notes = list(self.events), list(self.notes)
            watchdog, seconds, starting = self.watchdog, self.grace, self.starting
        if not first:
            if watchdog and now - self.first_at > SAME_STOP:
                self._force(f"signal {signum} again: exiting now")
            return
        STOPPING.set()
        if starting:
            self._exit()
        for note in notes:
            with contextlib.suppress(Exception):
                note(signum)
        for event in events:
            event.set()
        if watchdog:
            threading.Thread(target=self._watch, args=(seconds,), name="agap-watchdog", daemon=True).start()

    def _watch(self, seconds: float) -> None:
        time.sleep(seconds)  # a fixed bound, not a synchronisation: the process should be gone
        self._force(f"still stopping {seconds:.1f}s after the signal ({_busy()}); exiting now")

    def _force(self, why: str) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"agap: {why}; the board keeps the truth (a half-done step is resolved)\n")
        self._exit()

    def _exit(self) -> None:
        for hook in list(self.on_force):
            with contextlib.suppress(Exception):
                hook()
        exit_now(self.exit_code)


_relay: _Relay | None = None
_relay_lock = threading.Lock()


def _install() -> _Relay | None:
    """The process's relay, on both stop signals; None off the main thread."""
    global _relay
    if threading.current_thread() is not threading.main_thread():
        return None
    with _relay_lock:
        if _relay is None:
            _relay = _Relay()
            atexit.register(_ignore_at_exit)
    _relay.grace = grace()  # read here: a bad AGAP_STOP_GRACE is a start-up error, said once
    signal.set_wakeup_fd(_relay.write_fd, warn_on_full_buffer=False)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _ignore)
    return _relay


def _ignore_at_exit() -> None:
    """A process on its way out ignores stop signals from here on.

    Interpreter shutdown puts back the default action of every signal Python handles,
    and the default action of SIGTERM kills: the same stop said twice (a Ctrl-C with
    `agap up`'s) whose second signal lands after an orderly stop's last line would end a
    clean exit as -15. Exit handlers run once the process's threads have been joined, so
    what is left of it is short; an ignored signal is left ignored by the shutdown.
    """
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # off the main thread: nothing to do
            signal.signal(sig, signal.SIG_IGN)


def exit_on_signal(code: int = 0) -> None:
    """Until a daemon's stop is in place (:func:`set_on_signal`), SIGTERM and SIGINT exit
    with ``code`` at once: a start-up (imports, cards, counters, the first connection)
    holds nothing worth finishing. Without it a SIGTERM then kills the process (-15)."""
    relay = _install()
    if relay is None:
        return
    with relay.lock:
        relay.starting = True
        relay.exit_code = code
        told = relay.signals > 0
    if told:
        relay._exit()


def set_on_signal(
    stop: threading.Event,
    *,
    note: Callable[[int], None] | None = None,
    on_force: Callable[[], None] | None = None,
    watchdog: bool = True,
    exit_code: int = 0,
    grace: float | None = None,
) -> None:
    """Make SIGTERM and SIGINT set ``stop`` (and :data:`STOPPING`); from the main thread
    only (elsewhere a no-op).

    ``note(signum)`` runs first, in the relay thread (a log line; a server told to exit).
    ``on_force()`` runs before the process ends at once (e.g. ``agap up`` kills its
    children); ``grace`` overrides when (a supervisor waits longer than its children).
    ``watchdog=False`` only in tests that signal the test process itself.
    """
    relay = _install()
    if relay is None:
        return
    with relay.lock:
        relay.starting = False
        relay.events.append(stop)
        if note is not None:
            relay.notes.append(note)
        if on_force is not None:
            relay.on_force.append(on_force)
        relay.watchdog = watchdog
        relay.exit_code = exit_code
        if grace is not None:
            relay.grace = grace
        told = relay.signals > 0
    if told:  # the signal came before this: the stop is already asked for
        if note is not None:
            note(signal.SIGTERM)
        stop.set()


def exit_now(code: int = 0) -> None:
    """End the process at once, its output flushed: for a stop whose orderly part is done
    while a thread blocks in a read nothing can interrupt (a stdio server's stdin)."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _busy() -> str:
    """The threads still running, each with its innermost frame of the fabric's own code."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    busy = []
    for ident, frame in frames.items():
        name = names.get(ident, "?")
        if name in ("agap-signals", "agap-watchdog"):
            continue
        where = _innermost_own(frame)
        if where:
            busy.append(f"{name} at {where}")
    return "; ".join(busy[:4]) or "no thread running"


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = tuple(os.path.join(_ROOT, p) + os.sep for p in ("fabric", "workers", "keeper"))


def _innermost_own(frame: FrameType | None) -> str:
    """The innermost frame of the fabric's own code (else the innermost frame at all)."""
    first = frame
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_OWN):
            return f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
        frame = frame.f_back
    if first is None:
        return ""
    return f"{os.path.basename(first.f_code.co_filename)}:{first.f_lineno}"


def deliver_for_tests(signum: int) -> None:
    """Put ``signum`` on the relay's pipe, as Python's C handler does on a real signal."""
    assert _relay is not None, "install a handler first"
    os.write(_relay.write_fd, bytes([signum]))


def reset_for_tests() -> None:
    """Forget a stop (unit tests that deliver a signal inside the test process)."""
    STOPPING.clear()
    if _relay is not None:
        with _relay.lock:
            _relay.signals = 0
            _relay.events.clear()
            _relay.notes.clear()
            _relay.on_force.clear()
            _relay.starting = False
