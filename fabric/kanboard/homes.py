"""``agap init``'s part for confined agents: their homes, their users, their memberships.

For each confined card (:mod:`fabric.kanboard.principals`), idempotently:

* the home's work project (the fabric's columns; the agent's queue and the people's as
  swimlanes, the people as members, so a question can wait in their inbox) and its locks
  project;
* the agent's Kanboard user ``agap-<agent>`` (application role ``app-user``: no user
  administration, no project creation), with the password from
  ``AGAP_BOARD_PASSWORD_<AGENT>``, a ``project-member`` of those two projects and of no
  other;
* the people's user ids in the home's metadata (``fabric.members``), because the agent's
  user may not list users.

Kanboard's API cannot change a password, so a user whose password no longer signs in
(the operator rotated it) is removed and created again, memberships included; one the
environment gives no password for gets a random one nobody knows, and its worker cannot
sign in until one is set and ``agap init`` runs again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fabric.cards import Card, CardSet
from fabric.errors import ConfigError
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.fit import fit, unpack
from fabric.kanboard.layout import META_MEMBERS
from fabric.kanboard.port import BoardAuthError, BoardRefused, Call, RpcPort
from fabric.kanboard.principals import (
    HOME_ROLE,
    MIN_PASSWORD,
    agent_password,
    board_username,
    confined,
    home_names,
    password_variable,
)
from fabric.settings import registry
from fabric.settings.resolve import Settings


def check_passwords(cards: CardSet, env: registry.Env = None) -> None:
    """Refuse a confined agent's password that is too short, before anything is written."""
    for card in cards:
        given = agent_password(card, env) if confined(card) else ""
        if given and len(given) < MIN_PASSWORD:
            raise ConfigError(
                f"the board password for {board_username(card)!r} has {len(given)} characters; "
                f"the fabric wants {MIN_PASSWORD} or more",
                where=password_variable(card),
                hint="make one with `openssl rand -hex 32`",
            )


#: Makes or adopts a work project with the fabric's columns and only these queues'
#: swimlanes: its id (``agap init``'s own steps, given by :mod:`fabric.kanboard.bootstrap`).
ShapeProject = Callable[[str, list[str]], int]
#: Makes or adopts a bare project (a locks project): its id.
EnsureProject = Callable[[str], int]


def ensure_homes(
    port: RpcPort,
    settings: Settings,
    cards: CardSet,
    people: dict[str, int],
    created: list[str],
    *,
    shape: ShapeProject,
    project: EnsureProject,
    env: registry.Env = None,
) -> None:
    """Every confined card's home, user and memberships (see the module docstring);
    what changed is appended to ``created``. Passwords come from ``env`` (default: the
    process environment)."""
    # The people's queues too: a home's own keeper puts a question or a decision about the
    # agent's task in their inbox there, where the people (members) see it.
    people_lanes = [h.queue_name for h in cards.humans()]
    for card in cards:
        if confined(card):
            lanes = [card.queue_name, *people_lanes]
            _ensure_home(port, settings, card, lanes, people, created, shape, project, env)


def _ensure_home(
    port: RpcPort,
    settings: Settings,
    card: Card,
    lanes: list[str],
    people: dict[str, int],
    created: list[str],
    shape: ShapeProject,
    project: EnsureProject,
    env: registry.Env,
) -> None:
    work, locks = home_names(settings, card)
    pid = shape(work, lanes)
    locks_pid = project(locks)
    # The user first: a recreated user (a rotated password) has lost its memberships.
    uid = _ensure_agent_user(port, settings, card, created, agent_password(card, env))
    out = port.batch(
        [
            Call("getProjectUsers", {"project_id": pid}),
            Call("getProjectUsers", {"project_id": locks_pid}),
            Call("getProjectMetadata", {"project_id": pid}),
        ]
    )
    members = {int(k) for k in (out[0].unwrap() or {})}
    for username, person in sorted(people.items()):
        _add_member(port, pid, person, members, f"{username!r} to {work!r}", created)
    _add_member(port, pid, uid, members, f"{board_username(card)!r} to {work!r}", created)
    locks_members = {int(k) for k in (out[1].unwrap() or {})}
    _add_member(port, locks_pid, uid, locks_members, f"{board_username(card)!r} to {locks!r}", created)
    wanted = json.dumps(people, sort_keys=True)
    if unpack(out[2].unwrap() or {}).get(META_MEMBERS) != wanted:
        done = fit(port).call("saveProjectMetadata", {"project_id": pid, "values": {META_MEMBERS: wanted}})
        _expect(done, "saveProjectMetadata", f"record the people of {work!r}")


def _add_member(port: RpcPort, pid: int, uid: int, members: set[int], what: str, created: list[str]) -> None:
    if uid in members:
        return
    _expect(
        port.call("addProjectUser", {"project_id": pid, "user_id": uid, "role": HOME_ROLE}),
        "addProjectUser",
        f"add {what}",
    )
    members.add(uid)
    created.append(f"member {what}")


def _ensure_agent_user(
    port: RpcPort, settings: Settings, card: Card, created: list[str], password: str
) -> int:
    """The agent's user, signing in with ``password`` (recreated if not; "": a random one)."""
    username = board_username(card)
    user = port.call("getUserByName", {"username": username})
    if isinstance(user, dict):
        if not password or _signs_in(settings.board_url, username, password) is not False:
            return int(user["id"])
        # The API cannot set a password: a rotated one means a new user (and memberships).
        _expect(port.call("removeUser", {"user_id": int(user["id"])}), "removeUser", f"remove {username!r}")
        created.append(f"user {username!r} recreated: its password changed")
    if not password:
        created.append(
            f"user {username!r} has no password: set {password_variable(card)} and run `agap init` again"
        )
    import secrets  # here: only making an agent's user needs it

    params: dict[str, Any] = {
        "username": username,
        "password": password or secrets.token_urlsafe(24),
        "name": f"{card.name or card.id} (agent)",
        "role": "app-user",
    }
    uid = _expect(port.call("createUser", params), "createUser", f"create user {username!r}")
    created.append(f"user {username!r}")
    return int(uid)


def _expect(result: Any, method: str, doing: str) -> Any:
    """``result``, unless it is Kanboard's way of saying no (false, 0, null)."""
    if result is None or result is False or result == 0:
        raise BoardRefused(method, result, doing)
    return result


def _signs_in(url: str, username: str, password: str) -> bool | None:
    """Whether the board takes ``password`` for ``username``; None when it cannot be asked
    here (an in-process board)."""
    if not url.startswith(("http://", "https://")):
        return None
    client = KanboardClient(url, password, user=username)
    try:
        client.call("getMe")
        return True
    except BoardAuthError:
        return False
    finally:
        client.close()


__all__ = ["check_passwords", "ensure_homes"]
