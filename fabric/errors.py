"""The fabric's error vocabulary.

Every error says *what* is wrong, *where* (a file, a field, a task, a URL) and *what to
do*, because the people reading them are running the fabric at home at 2 a.m.
"""

from __future__ import annotations


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
