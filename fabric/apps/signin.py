"""Who a gesture from the CLI or an MCP client is by: a person signed in as themselves.

A person's gesture (an approval, an answer, a refusal, a send-back, a submit) counts as
theirs only when they signed in as their own Kanboard user: ``AGAP_USER`` and
``AGAP_USER_PASSWORD`` (their password or a personal API token), which the board checks
once per process (:func:`fabric.kanboard.principals.sign_in`). ``AGAP_ACTOR`` naming a
person is no longer believed: anyone holding the application token can type a name. An
agent runtime keeps its card identity (``AGAP_ACTOR=openclaw``), and the operator's shell
acts as ``cli``, under their own names, never as a person.

An approval needs the person the card waits on, or one of their ``deputies``, signed in
(:func:`check_may_answer`; the same rule as the keeper's for Kanboard gestures,
:mod:`keeper.acts`). How a person sets it up: docs/HOUSEHOLD.md, "Signing in".
"""

from __future__ import annotations

import hashlib

from fabric.cards import Card, CardSet
from fabric.domains import person_of
from fabric.errors import ConfigError
from fabric.kanboard.principals import BoardUser, sign_in
from fabric.refusals import PolicyRefused
from fabric.settings import registry
from fabric.settings.resolve import Settings
from keeper import acts

SIGN_IN = (
    "set AGAP_USER to your Kanboard username and AGAP_USER_PASSWORD to your password or a "
    "personal API token (docs/HOUSEHOLD.md, signing in)"
)

# One sign-in per process and credentials: Kanboard checks a bcrypt hash on every user call
# (~75 ms), so a process asks once. The key holds a digest, never the secret itself.
_SIGNED: dict[tuple[str, str, str], BoardUser] = {}


def signed_in_user(settings: Settings, env: registry.Env = None) -> BoardUser | None:
    """The Kanboard user ``AGAP_USER`` signs in (asked of the board once per process), or
    None when it is unset. Refused credentials raise :class:`~fabric.kanboard.port.BoardAuthError`."""
    user = registry.get_str("AGAP_USER", env).strip()
    if not user:
        return None
    secret = registry.get_str("AGAP_USER_PASSWORD", env)
    if not secret:
        raise ConfigError(
            f"AGAP_USER is {user!r} but AGAP_USER_PASSWORD is not set",
            where="AGAP_USER_PASSWORD",
            hint="set it to your Kanboard password or a personal API token (My profile > API)",
        )
    url, _ = settings.require_board()
    key = (url, user, hashlib.sha256(secret.encode()).hexdigest())
    found = _SIGNED.get(key)
    if found is None:
        found = _SIGNED[key] = sign_in(url, user, secret)
    return found


def signed_in_person(settings: Settings, cards: CardSet, env: registry.Env = None) -> Card | None:
    """The person whose Kanboard user ``AGAP_USER`` signs in, or None when nobody signs in.
    A user no person's card names (an admin, an agent's own user) is refused."""
    user = signed_in_user(settings, env)
    if user is None:
        return None
    card = person_of(cards, user.username)
    if card is None or card.human is None:
        people = ", ".join(f"{c.id} ({c.human.username})" for c in cards.humans() if c.human) or "none"
        raise ConfigError(
            f"{user.username!r} signed in, but no person's card has that Kanboard username",
            where="AGAP_USER",
            hint=f"sign in as a person of the household: {people}",
        )
    return card


def gesture_actor(
    settings: Settings, cards: CardSet, actor: str | None = None, env: registry.Env = None
) -> str:
    """Who a gesture or a submit from this process is by: the signed-in person's card id
    (unless ``actor``, ``--actor``, names an agent for this one command); else ``actor``,
    else ``AGAP_ACTOR`` (default ``cli``), when that names no person. A person named
    without signing in as them, or another person than the one signed in, is refused
    (exit 2)."""
    named = actor if actor is not None else registry.get_str("AGAP_ACTOR", env, fallback="")
    claimed = person_of(cards, named) if named else None
    person = signed_in_person(settings, cards, env)
    where = "--actor" if actor is not None else "AGAP_ACTOR"
    if person is not None:
        if claimed is not None and claimed.id != person.id:
            raise ConfigError(
                f"{where} names {claimed.id}, but AGAP_USER signs in {person.id}",
                where=where,
                hint=f"a person acts only as themselves: unset {where}, or sign in as {claimed.id}",
            )
        # `--actor kimi` names who one command is by; AGAP_ACTOR is only the shell's default,
        # and a signed-in person at the shell is who acts.
        return actor if actor and claimed is None else person.id
    if claimed is not None:
        username = claimed.human.username if claimed.human else claimed.id
        raise ConfigError(
            f"{where} names {claimed.id}, a person: a person's gesture needs them signed in, "
            f"and {where} alone is not who you are",
            where=where,
            hint=f"{claimed.id}: set AGAP_USER={username} and AGAP_USER_PASSWORD (your Kanboard "
            "password or a personal API token); an agent runtime sets AGAP_ACTOR to its card id",
        )
    return named or registry.get_str("AGAP_ACTOR", env)


def check_may_answer(
    cards: CardSet, owner: str | None, actor: str, verb: str, task_id: int, *, people_only: bool = False
) -> None:
    """Refuse (exit 6) unless ``actor`` may ``verb`` what waits on ``owner`` (a Kanboard
    username; None: nobody's): that person or one of their deputies, signed in. With
    ``people_only``, an actor that is no person (an agent, the operator's ``cli``) may: it
    acts under its own name (an answer, a refusal), never as the person."""
    if owner is None:
        return
    person = person_of(cards, actor)
    if person is None and people_only:
        return
    username = person.human.username if person is not None and person.human is not None else actor
    if acts.allowed(cards, owner, username):
        return
    may = acts.who_may(cards, owner)
    hint = (
        f"sign in as {may}: {SIGN_IN}"
        if person is None
        else f"you are signed in as {username}; {may} signs in to {verb} it"
    )
    raise PolicyRefused(
        "gesture.person",
        f"task #{task_id} waits on {owner}: only {may} may {verb} it ({actor} tried)",
        limit="the person it waits on, or their deputies, signed in",
        where=f"task #{task_id}",
        hint=hint,
    )


__all__ = ["SIGN_IN", "check_may_answer", "gesture_actor", "signed_in_person", "signed_in_user"]
