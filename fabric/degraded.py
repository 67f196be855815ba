"""Degraded start: a daemon whose board is unreachable waits for it instead of exiting.

A worker or the keeper started before Kanboard answers (a host booting, a compose stack
starting everything at once, Kanboard restarting) retries with capped, jittered
exponential backoff, says so once, and starts working when the board answers. Only what
waiting cannot cure ends it: a rejected token, a missing project, a bad setting.

The sleep is injected (``threading.Event.wait`` in the daemons, so SIGTERM cuts a wait
short), and so is the randomness of the jitter: the tests never wait.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import field
from typing import TypeVar

from fabric.kanboard.port import PROTOCOL_ERRORS, BoardError, BoardUnavailable, RpcError
from fabric.plain import Plain

log = logging.getLogger("agap.board")

T = TypeVar("T")

FIRST_DELAY = 0.5  # seconds before the second try
DEFAULT_CAP = 30.0  # the longest wait between tries (AGAP_BOARD_WAIT_CAP)


def transient(exc: BoardError) -> bool:
    """True for a failure that waiting cures: the board is away, or busy on a read.

    A rejected token (``BoardAuthError``), a call the board cannot run (a protocol
    error) or an SQL refusal say the configuration is wrong; waiting will not help.
    """
    if isinstance(exc, BoardUnavailable):
        return True
    return isinstance(exc, RpcError) and exc.code not in PROTOCOL_ERRORS and not exc.refused


class Backoff(Plain, frozen=False):
    """Exponential delays from ``first``, capped at ``cap``, each jittered by ±``jitter``."""

    first: float = FIRST_DELAY
    cap: float = DEFAULT_CAP
    jitter: float = 0.2
    random: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        """The wait after failed try ``attempt`` (1 = the first failure); never above ``cap``."""
        base = min(self.cap, self.first * 2.0 ** max(0, attempt - 1))
        spread = 1.0 + self.jitter * (2.0 * self.random() - 1.0)
        return max(0.05, min(self.cap, base * spread))  # a zero cap must not spin


class BoardWait(Plain, frozen=False):
    """Runs an attempt until the board answers, waiting out an unreachable board.

    ``sleep(seconds)`` returns True when the daemon was told to stop meanwhile (as
    ``threading.Event.wait`` does); then :meth:`until` returns None at once.
    """

    url: str
    who: str
    sleep: Callable[[float], bool]
    backoff: Backoff = field(default_factory=Backoff)
    say: Callable[[str], None] = log.warning
    failures: int = 0  # failed tries in the current wait
    waits: int = 0  # waits that ended with the board answering

    def until(self, attempt: Callable[[], T]) -> T | None:
        """``attempt()``'s value once the board answers; None when stopped while waiting.

        The first failure is said once (one line: the URL, and that it keeps trying);
        the tries after it are quiet. A failure waiting cannot cure propagates.
        """
        self.failures = 0
        while True:
            try:
                value = attempt()
            except BoardError as exc:
                if not transient(exc):
                    raise
                self.failures += 1
                delay = self.backoff.delay(self.failures)
                if self.failures == 1:
                    self.say(
                        f"{self.who}: the board{self._at} is unreachable ({exc.what}); waiting for it, "
                        f"trying again every {self.backoff.cap:g}s at most until it answers"
                    )
                else:
                    log.debug("%s: try %d failed too; next in %.2fs", self.who, self.failures, delay)
                if self.sleep(delay):
                    return None
                continue
            if self.failures:
                self.waits += 1
                log.info("%s: the board%s answers after %d tries", self.who, self._at, self.failures + 1)
            return value

    @property
    def _at(self) -> str:
        return f" at {self.url}" if self.url else ""


__all__ = ["DEFAULT_CAP", "Backoff", "BoardWait", "transient"]
