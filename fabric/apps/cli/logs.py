"""How the daemons log: one place sets the level, so ``make run`` stays quiet.

A daemon started alone (``agap worker``, ``agap keeper``) logs at INFO; ``-v`` is DEBUG and
``-q`` is WARNING. APScheduler announces every job it runs at INFO (the keeper runs one
every few seconds), so its loggers stay at WARNING unless ``-v`` asks for everything.
``agap up`` starts its children with ``-q`` unless it was given ``-v`` itself.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# Libraries whose INFO lines are per-call chatter, not events a person wants to read.
CHATTY = ("apscheduler", "urllib3", "httpx")


def configure(*, verbose: bool = False, quiet: bool = False) -> int:
    """Set the root level (DEBUG with ``verbose``, WARNING with ``quiet``, else INFO)."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format=FORMAT)
    logging.getLogger().setLevel(level)  # basicConfig leaves the level of a configured root
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
        # A library's own sub-loggers follow it (one set a level of its own somewhere).
        for child in list(logging.root.manager.loggerDict):
            if child.startswith(name + "."):
                logging.getLogger(child).setLevel(logging.NOTSET)
    return level


def child_flags(verbosity: int) -> list[str]:
    """The flags ``agap up`` gives its children: ``-q`` by default, none at ``-v``, ``-v``
    at ``-vv``."""
    if verbosity <= 0:
        return ["-q"]
    return ["-v"] if verbosity > 1 else []
