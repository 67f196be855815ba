"""``agap up``: the whole fabric on the embedded board (what ``make run`` runs)."""

from __future__ import annotations

from fabric.cli import main  # noqa: F401
