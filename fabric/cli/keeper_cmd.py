"""``agap keeper``: run the fabric-keeper."""

from __future__ import annotations

from fabric.cli import main  # noqa: F401
