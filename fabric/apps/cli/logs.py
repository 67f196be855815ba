"""How the daemons log: one place sets the level, so ``make run`` stays quiet.

A daemon started alone (``agap worker``, ``agap keeper``) logs at INFO; ``-v`` is DEBUG and
``-q`` is WARNING. APScheduler announces every job it runs at INFO (the keeper runs one
every few seconds), so its loggers stay at WARNING unless ``-v`` asks for everything.
``agap up`` starts its children with ``-q`` unless it was given ``-v`` itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fabric import cardcache
from fabric.cards import CardErrors, CardSet
from fabric.settings import registry

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


def daemon_cards(directory: str | Path, *, own: str | None = None) -> CardSet:
    """The cards a daemon runs with: every card that loads and checks. One bad card stops
    only what needs it: ``own`` (a worker's card) must be good, else its problems are the
    error; the others' are said once, as a warning (at INFO under ``agap up``, which says
    them itself)."""
    cards, problems = cardcache.daemon_cards(directory)
    if own is not None and own not in cards:
        mine = [p for p in problems if Path(p.file).stem == own] or problems
        raise CardErrors(mine, where=str(directory), hint="fix it and run `agap cards validate`")
    if problems:
        level = logging.INFO if registry.get_bool("AGAP_SUPERVISED") else logging.WARNING
        for p in problems:
            logging.getLogger("agap.cards").log(level, "running without it: %s", p)
    return cards
