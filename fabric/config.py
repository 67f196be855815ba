"""Settings, read from the environment.

Secrets (the board's token) only ever come from the environment, never from the repo.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fabric.errors import ConfigError

DEFAULT_STATE_DIR = "var"


@dataclass(frozen=True)
class Settings:
    """Where the board is, how to log in, and where cards and state live."""

    board_url: str = ""
    board_token: str = field(default="", repr=False)
    cards_dir: Path = Path("cards")
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    project: str = "Agent Fabric"
    locks_project: str = "Agent Fabric Locks"
    actor: str = "cli"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read ``KANBOARD_URL``, ``KANBOARD_API_TOKEN`` and the ``AGAP_*`` variables."""
        e = dict(os.environ if env is None else env)
        return cls(
            board_url=e.get("KANBOARD_URL", ""),
            board_token=e.get("KANBOARD_API_TOKEN", ""),
            cards_dir=Path(e.get("AGAP_CARDS_DIR", "cards")),
            state_dir=Path(e.get("AGAP_STATE_DIR", DEFAULT_STATE_DIR)),
            project=e.get("AGAP_PROJECT", "Agent Fabric"),
            locks_project=e.get("AGAP_LOCKS_PROJECT", "Agent Fabric Locks"),
            actor=e.get("AGAP_ACTOR", "cli"),
        )

    def require_board(self) -> tuple[str, str]:
        """The board URL and token, or a :class:`ConfigError` that says how to set them."""
        if not self.board_url:
            raise ConfigError(
                "KANBOARD_URL is not set",
                hint="start the embedded board with `agap board serve` and export what it prints",
            )
        if not self.board_token:
            raise ConfigError(
                "KANBOARD_API_TOKEN is not set",
                hint="use the token `agap board serve` printed, or Kanboard's API token",
            )
        return self.board_url, self.board_token
