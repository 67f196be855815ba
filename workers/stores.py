"""The context stores a worker reads refs from, beside files, tasks and loopback URLs:
scheme → :class:`~workers.refs.SchemeReader`, built from the settings.

* ``hindsight`` — a recall from a Hindsight bank (:mod:`workers.memory`,
  ``AGAP_HINDSIGHT_URL``, ``AGAP_HINDSIGHT_KEY``);
* ``git+file`` — a file of a local repository at a revision (:mod:`workers.gitref`), under
  the same roots as ``file://`` refs.

A new store is one module with a reader and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabric.settings import registry
from workers.gitref import GitFileReader
from workers.memory import HindsightRecall
from workers.refs import SchemeReader

__all__ = ["store_readers"]


def store_readers(env: Mapping[str, str] | None = None) -> dict[str, SchemeReader]:
    """The readers of the store schemes, configured from ``env``."""
    return {
        "hindsight": HindsightRecall(
            registry.get_str("AGAP_HINDSIGHT_URL", env), registry.get_str("AGAP_HINDSIGHT_KEY", env)
        ),
        "git+file": GitFileReader(),
    }
