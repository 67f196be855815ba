"""The fabric's error vocabulary.

Every error says *what* is wrong, *where* (a file, a field, a task, a URL) and *what to
do*, because the people reading them are running the fabric at home at 2 a.m.
"""

from __future__ import annotations

# The one exit-code table: every command exits with one of these (the README's table).
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "a failed transition",
    2: "invalid input or configuration",
    3: "the board is unreachable or rejected the token",
    4: "lost a race, fenced, or nothing to claim",
    5: "ACTION_ID_COLLISION, or a stuck receipt",
    6: "refused by policy (quota, depth, cycle, privacy, trust, taint)",
    7: "the board's database refused the call (an SQL error), or the fabric refused to "
    "send what no backend can store; nothing was written",
}


class FabricError(Exception):
    """Base of every error the fabric raises on purpose."""

    exit_code = 1

    def __init__(self, what: str, *, where: str = "", hint: str = "") -> None:
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        """One human line: ``where: what (hint)``."""
        text = f"{self.where}: {self.what}" if self.where else self.what
        return f"{text} — {self.hint}" if self.hint else text


class InvalidInput(FabricError):
    """The caller gave the fabric something it cannot accept (bad task, bad card, bad flag)."""

    exit_code = 2


class ConfigError(FabricError):
    """The fabric's configuration is missing or wrong."""

    exit_code = 2
