"""SIGTERM must stop a daemon even when it lands inside ``Event.wait()``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from fabric.signals import STOP_SIGNALS, set_on_signal


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.timeout(20)  # a handler that takes the event's lock hangs here, then fails
@pytest.mark.usefixtures("saved_handlers")
def test_the_handler_works_while_the_main_thread_holds_the_events_lock() -> None:
    stop = threading.Event()
    set_on_signal(stop)
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    # Event.wait() holds this (non re-entrant) lock for a moment on entry and exit; a
    # signal delivered then runs its handler in the same thread.
    with stop._cond:  # type: ignore[attr-defined]
        handler(signal.SIGTERM, None)
    assert stop.wait(10)


@pytest.mark.usefixtures("saved_handlers")
def test_sigint_too_and_a_note_says_which_signal() -> None:
    stop = threading.Event()
    seen: list[int] = []
    set_on_signal(stop, note=seen.append)
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    handler(signal.SIGINT, None)
    assert stop.wait(10) and seen == [signal.SIGINT]


@pytest.mark.usefixtures("saved_handlers")
def test_off_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=set_on_signal, args=(threading.Event(),))
    worker.start()
    worker.join(10)
    assert signal.getsignal(signal.SIGTERM) is before
