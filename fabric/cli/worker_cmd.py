"""``agap worker``: run one queue's worker daemon."""

from __future__ import annotations

from fabric.cli import main  # noqa: F401
