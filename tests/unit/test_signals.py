"""SIGTERM/SIGINT stop a daemon whatever its main thread holds, and within the bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from fabric import signals
from fabric.signals import STOP_BOUND, STOP_SIGNALS, set_on_signal, stop_requested


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    signals.reset_for_tests()
    yield
    signal.set_wakeup_fd(-1)
    signals.reset_for_tests()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.timeout(20)  # a handler that takes the event's lock hangs here, then fails
@pytest.mark.usefixtures("saved_handlers")
def test_a_real_signal_stops_while_the_main_thread_holds_the_events_lock() -> None:
    stop = threading.Event()
    set_on_signal(stop, watchdog=False)
    # Event.wait() holds this (non re-entrant) lock for a moment on entry and exit; a
    # signal delivered then used to run a handler that needed it, in the same thread.
    with stop._cond:  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGTERM)
        assert not stop.is_set()
    assert stop.wait(10) and stop_requested()


@pytest.mark.timeout(20)
@pytest.mark.usefixtures("saved_handlers")
def test_nothing_in_the_signal_path_needs_threadings_own_lock() -> None:
    # Thread.start() takes threading's registry lock: a handler that starts a thread while
    # the main thread holds it (inside another Thread.start) waits forever.
    stop = threading.Event()
    set_on_signal(stop, watchdog=False)
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(10)


@pytest.mark.usefixtures("saved_handlers")
def test_sigint_too_and_a_note_says_which_signal() -> None:
    stop = threading.Event()
    seen: list[int] = []
    set_on_signal(stop, note=seen.append, watchdog=False)
    signals.deliver_for_tests(signal.SIGINT)
    assert stop.wait(10) and seen == [signal.SIGINT]


@pytest.mark.usefixtures("saved_handlers")
def test_a_stop_asked_for_before_the_handler_is_still_a_stop() -> None:
    first = threading.Event()
    set_on_signal(first, watchdog=False)
    signals.deliver_for_tests(signal.SIGTERM)
    assert first.wait(10)
    later = threading.Event()
    set_on_signal(later, watchdog=False)  # a daemon that got this far anyway
    assert later.is_set()


@pytest.mark.usefixtures("saved_handlers")
def test_other_signals_on_the_wakeup_fd_are_not_a_stop() -> None:
    stop = threading.Event()
    set_on_signal(stop, watchdog=False)
    signals.deliver_for_tests(signal.SIGALRM)  # pytest-timeout's, say
    signals.deliver_for_tests(signal.SIGTERM)
    assert stop.wait(10)
    assert signals._relay is not None and signals._relay.signals == 1


@pytest.mark.usefixtures("saved_handlers")
def test_off_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=set_on_signal, args=(threading.Event(),))
    worker.start()
    worker.join(10)
    assert signal.getsignal(signal.SIGTERM) is before


def _run(code: str, *, signals_to_send: int = 1, gap: float = 0.0) -> tuple[float, str, int]:
    """Run ``code`` in a fresh interpreter; signal it once it says "ready"; time its exit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    for i in range(signals_to_send):
        if i:
            threading.Event().wait(gap)  # the pause a person leaves between two Ctrl-Cs
        proc.send_signal(signal.SIGTERM)
    proc.wait(20)
    return time.monotonic() - sent, proc.stderr.read() if proc.stderr else "", proc.returncode


HANGS = """
    import threading
    from fabric.signals import set_on_signal
    stop = threading.Event()
    set_on_signal(stop)
    # A non-daemon thread that never ends: the interpreter would wait for it at exit.
    threading.Thread(target=threading.Event().wait, name="stuck").start()
    print("ready", flush=True)
    stop.wait()
"""


def test_the_watchdog_ends_a_daemon_whose_stop_hangs_within_the_bound() -> None:
    seconds, err, code = _run(HANGS)
    assert code == 0
    assert seconds < STOP_BOUND, seconds
    assert "exiting now" in err and "still stopping" in err, err


def test_a_second_signal_a_person_sends_ends_it_at_once() -> None:
    seconds, err, code = _run(HANGS, signals_to_send=2, gap=signals.SAME_STOP + 0.2)
    assert code == 0 and "again: exiting now" in err, err
    assert seconds < STOP_BOUND, seconds


def test_the_same_stop_said_twice_at_once_is_one_stop() -> None:
    # A terminal's Ctrl-C and `agap up` both signal a child within a moment: still one
    # orderly stop, not an exit without releasing.
    _, err, code = _run(
        """
        import threading, time
        from fabric.signals import set_on_signal
        stop = threading.Event()
        set_on_signal(stop)
        print("ready", flush=True)
        stop.wait()
        import sys
        sys.stderr.write("orderly\\n")
        """,
        signals_to_send=2,
    )
    assert code == 0 and "orderly" in err and "exiting now" not in err, err


def test_a_process_on_its_way_out_ignores_stop_signals() -> None:
    # Interpreter shutdown puts SIGTERM's default action back after the exit handlers;
    # one that ran after the fabric's (registered first: they run last) sees what the
    # shutdown will keep. A late second signal of one stop then ends nothing.
    _, err, code = _run(
        """
        import atexit, signal, sys, threading
        atexit.register(lambda: sys.stderr.write(f"at exit: {signal.getsignal(signal.SIGTERM)!r}\\n"))
        from fabric.signals import set_on_signal
        stop = threading.Event()
        set_on_signal(stop)
        print("ready", flush=True)
        stop.wait()
        """
    )
    assert code == 0 and "at exit: <Handlers.SIG_IGN: 1>" in err, err


def test_a_stop_during_start_up_exits_at_once() -> None:
    seconds, err, code = _run(
        """
        import threading
        from fabric.signals import exit_on_signal
        exit_on_signal(0)
        threading.Thread(target=threading.Event().wait, name="stuck").start()
        print("ready", flush=True)
        threading.Event().wait()
        """
    )
    assert code == 0 and "exiting now" not in err, err
    assert seconds < STOP_BOUND, seconds
