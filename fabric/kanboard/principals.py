"""Who signs in to the board, and where a confined agent's work lives.

The application token (``KANBOARD_API_TOKEN``) may do anything on the board: the CLI,
the keeper, the A2A server and the trusted agents' workers hold it. A **confined** agent
(a card whose trust is ``sandboxed`` or ``untrusted``: it may be steered by what it
reads) never does. Its queue lives in a **home** of its own, a work project and a locks
project named after it, and its worker signs in as its own Kanboard user
(``agap-<agent>``), a ``project-member`` of those two projects only. Kanboard's user API
then refuses it every other project: it cannot read another task, another person's
inbox, or another queue's lock tags, whatever its runtime tries.

``agap init`` creates the homes, the users and their memberships; each user's password
comes from the environment (``AGAP_BOARD_PASSWORD_<AGENT>``), and the worker gets only
its own (``AGAP_BOARD_USER``, ``AGAP_BOARD_PASSWORD``).

A **person** at a shell or an MCP client signs in as their own Kanboard user
(``AGAP_USER`` and ``AGAP_USER_PASSWORD``, a password or a personal API token):
:func:`sign_in` asks the board who those credentials are, once per process. The work
itself still goes through the application token (the ledger's lock tags live in a project
people are no members of); the sign-in is what makes a gesture that person's.
"""

from __future__ import annotations

import dataclasses

from fabric.cards import Card, CardSet
from fabric.errors import ConfigError
from fabric.kanboard.client import DEFAULT_TIMEOUT, KanboardClient
from fabric.kanboard.port import BoardAuthError
from fabric.plain import Plain
from fabric.settings import registry
from fabric.settings.resolve import Settings

#: Trust classes whose agents run confined to their home (docs: README, least privilege).
CONFINED_TRUST = frozenset({"sandboxed", "untrusted"})
#: The family of variables holding each confined agent's board password (for `agap init`).
AGENT_PASSWORD = registry.AGENT_BOARD_PASSWORD
#: What a confined agent's user may do in its home: write tasks, tags, comments, files.
HOME_ROLE = "project-member"
#: Kanboard's validator wants at least 6 characters; the fabric asks for more.
MIN_PASSWORD = 16


def confined(card: Card) -> bool:
    """Whether ``card``'s agent runs as its own board user, in a home of its own."""
    return card.kind != "human" and card.trust in CONFINED_TRUST


def board_username(card: Card) -> str:
    """The Kanboard user a confined agent signs in as."""
    return f"agap-{card.id}"


def password_variable(card: Card) -> str:
    """The variable holding ``card``'s board password: ``AGAP_BOARD_PASSWORD_TORGASH``."""
    return registry.person_variable(AGENT_PASSWORD, card.id)


def agent_password(card: Card, env: registry.Env = None) -> str:
    """``card``'s board password from the environment ("" when unset)."""
    return registry.person_secret(AGENT_PASSWORD, card.id, env)


def home_names(settings: Settings, card: Card) -> tuple[str, str]:
    """The work and locks projects of ``card``'s home."""
    return f"{settings.project}: {card.id}", f"{settings.locks_project}: {card.id}"


def home_settings(settings: Settings, card: Card) -> Settings:
    """``settings`` with the projects of ``card``'s home (the same board and credentials)."""
    project, locks = home_names(settings, card)
    return dataclasses.replace(settings, project=project, locks_project=locks)


def home_work_settings(settings: Settings, card: Card) -> Settings:
    """The work project's settings when ``settings`` name ``card``'s home, else ``settings``
    (the inverse of :func:`home_settings`)."""
    tail = f": {card.id}"
    if settings.project.endswith(tail) and settings.locks_project.endswith(tail):
        cut = -len(tail)
        return dataclasses.replace(
            settings, project=settings.project[:cut], locks_project=settings.locks_project[:cut]
        )
    return settings


#: The name Kanboard gives the application token: never a person's user.
APP_USER = "jsonrpc"
#: What a person checks when the board refuses their sign-in (Kanboard 1.2.53 counts each
#: failed API sign-in, and locks the user for 15 minutes after the 7th in a row).
SIGN_IN_HINT = (
    "check AGAP_USER (your Kanboard username) and AGAP_USER_PASSWORD (your Kanboard password, "
    "or a personal API token from My profile > API); after 7 failures in a row Kanboard "
    "locks the user for 15 minutes"
)


class BoardUser(Plain):
    """A Kanboard user the board vouched for: its id and its username as the board stores it."""

    user_id: int
    username: str
    name: str = ""


def sign_in(url: str, username: str, secret: str, *, timeout: float | None = None) -> BoardUser:
    """Who ``username`` and ``secret`` (a password or a personal API token) are on the board
    at ``url``: Kanboard's ``getMe`` over those credentials (one call; Kanboard checks a
    bcrypt hash for it). Refused credentials raise :class:`BoardAuthError` (exit 3)."""
    if username == APP_USER:
        raise ConfigError(
            f"{APP_USER!r} is the application token's name, not a person's Kanboard user",
            where="AGAP_USER",
            hint="set AGAP_USER to your own Kanboard username",
        )
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"signing in needs the board over HTTP, and KANBOARD_URL is {url!r}",
            where="AGAP_USER",
            hint="point KANBOARD_URL at the board's …/jsonrpc.php",
        )
    client = KanboardClient(
        url, secret, user=username, timeout=DEFAULT_TIMEOUT if timeout is None else timeout
    )
    try:
        me = client.call("getMe")
    except BoardAuthError:
        raise BoardAuthError(
            f"the board refused the sign-in of {username!r}", where="AGAP_USER", hint=SIGN_IN_HINT
        ) from None
    finally:
        client.close()
    if not isinstance(me, dict) or not me.get("username"):
        raise BoardAuthError(
            f"the board did not say who {username!r} is", where="AGAP_USER", hint=SIGN_IN_HINT
        )
    return BoardUser(int(me.get("id") or 0), str(me["username"]), str(me.get("name") or ""))


def board_client(settings: Settings, *, timeout: float | None = None) -> KanboardClient:
    """A client signed in as ``settings`` say: a board user when ``AGAP_BOARD_USER`` is
    set, else the application token."""
    url, token = settings.require_board()
    wait = DEFAULT_TIMEOUT if timeout is None else timeout
    if settings.board_user:
        return KanboardClient(url, settings.board_password, user=settings.board_user, timeout=wait)
    return KanboardClient(url, token, timeout=wait)


def worker_settings(settings: Settings, card: Card) -> Settings:
    """The settings ``card``'s worker runs with: its home and its own user when confined.

    A confined agent's worker refuses to start with the application token alone: that
    token reads the whole board, which is what confinement takes away.
    """
    if not confined(card):
        return settings
    if not settings.board_user or not settings.board_password:
        raise ConfigError(
            f"{card.id!r} is {card.trust}: its worker signs in as its own board user, "
            "never with the application token",
            where="AGAP_BOARD_USER / AGAP_BOARD_PASSWORD",
            hint=f"set AGAP_BOARD_USER={board_username(card)} and AGAP_BOARD_PASSWORD to the "
            f"value of {password_variable(card)} that `agap init` used",
        )
    if settings.board_user.casefold() != board_username(card).casefold():
        raise ConfigError(
            f"AGAP_BOARD_USER is {settings.board_user!r}, but {card.id!r} signs in as "
            f"{board_username(card)!r}",
            where="AGAP_BOARD_USER",
            hint=f"set AGAP_BOARD_USER={board_username(card)}",
        )
    # The worker keeps no application token: nothing it runs can fall back on it. Its
    # fabric finds its home from its user (signed_in).
    return dataclasses.replace(settings, board_token="")


def signed_in(settings: Settings, cards: CardSet) -> Settings:
    """``settings`` as a board user's fabric uses them: on the home of the confined card
    the user signs in for (``agap-<agent>``), whatever runs as it (a worker, `agap claim`,
    an MCP server). Unchanged for the application token, or when they name the home."""
    if not settings.board_user:
        return settings
    for card in cards:
        if confined(card) and board_username(card).casefold() == settings.board_user.casefold():
            if settings.project.endswith(f": {card.id}"):
                return settings  # already the home's (AGAP_PROJECT set to it)
            return home_settings(settings, card)
    return settings


__all__ = [
    "AGENT_PASSWORD",
    "APP_USER",
    "CONFINED_TRUST",
    "HOME_ROLE",
    "MIN_PASSWORD",
    "SIGN_IN_HINT",
    "BoardUser",
    "agent_password",
    "board_client",
    "board_username",
    "confined",
    "home_names",
    "home_settings",
    "password_variable",
    "sign_in",
    "signed_in",
    "worker_settings",
]
