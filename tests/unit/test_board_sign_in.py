"""The embedded board signs users in as Kanboard 1.2.53 does over its API: a password or a
personal API token, and a user locked for 15 minutes after the 7th failure in a row."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from fabric.cards import load_cards
from fabric.embedded.rpc import LOCKDOWN, LOCKDOWN_MINUTES, BoardApi
from fabric.embedded.store import Store, new_api_token
from fabric.errors import ConfigError
from fabric.settings.resolve import Settings
from tests.conftest import ROOT

PASSWORD = "a-long-password"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def basic(user: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


@pytest.fixture
def api(tmp_path: Path) -> tuple[BoardApi, Clock, int]:
    clock = Clock()
    board = BoardApi(Store(tmp_path / "b.sqlite3"), "app-token", clock=clock)
    uid = board.handle({"jsonrpc": "2.0", "id": 1, "method": "createUser", "params": ["anna", PASSWORD]})[
        "result"
    ]
    assert uid
    return board, clock, int(uid)


def test_a_password_or_a_personal_token_signs_in_and_nothing_else(api: tuple[BoardApi, Clock, int]) -> None:
    board, _, uid = api
    assert board.caller_of(basic("anna", PASSWORD)) == uid
    assert board.caller_of(basic("anna", "")) is None, "no token yet: an empty one is not it"
    token = new_api_token(board.store, "anna")
    assert token is not None and len(token) == 60
    assert board.caller_of(basic("anna", token)) == uid
    assert board.caller_of(basic("Anna", token)) is None, "usernames match exactly (strictest backend)"
    assert new_api_token(board.store, "nobody") is None
    with board.store.write() as db:  # Kanboard's DatabaseAuth skips a user whose login form is off
        db.execute("UPDATE users SET disable_login_form = 1 WHERE id = ?", (uid,))
    assert board.caller_of(basic("anna", PASSWORD)) is None
    assert board.caller_of(basic("anna", token)) == uid, "the token still signs in"
    with board.store.write() as db:
        db.execute("UPDATE users SET is_active = 0 WHERE id = ?", (uid,))
    assert board.caller_of(basic("anna", token)) is None


def test_the_failure_after_six_in_a_row_locks_the_user_for_15_minutes(
    api: tuple[BoardApi, Clock, int],
) -> None:
    board, clock, uid = api
    for _ in range(LOCKDOWN):
        assert board.caller_of(basic("anna", "wrong")) is None
    assert board.caller_of(basic("anna", PASSWORD)) == uid, "six failures do not lock; a success clears them"
    for _ in range(LOCKDOWN + 1):
        assert board.caller_of(basic("anna", "wrong")) is None
    assert board.caller_of(basic("anna", PASSWORD)) is None, "locked: the right password is refused too"
    clock.now += LOCKDOWN_MINUTES * 60 - 1
    assert board.caller_of(basic("anna", PASSWORD)) is None
    clock.now += 2
    assert board.caller_of(basic("anna", PASSWORD)) == uid, "the lock ran out"
    with board.store.read() as db:
        row = db.execute(
            "SELECT nb_failed_login, lock_expiration_date FROM users WHERE id = ?", (uid,)
        ).fetchone()
    assert tuple(row) == (0, 0)


def test_gesture_actor_without_a_sign_in() -> None:
    from fabric.apps.signin import gesture_actor

    cards = load_cards(ROOT / "cards")
    settings = Settings(board_url="http://127.0.0.1:1/jsonrpc.php", board_token="t", cards_dir=ROOT / "cards")
    assert gesture_actor(settings, cards, env={}) == "cli"
    assert gesture_actor(settings, cards, env={"AGAP_ACTOR": "openclaw"}) == "openclaw"
    assert gesture_actor(settings, cards, "kimi", env={}) == "kimi"
    for named in ("alvis", "a2a:alvis", "elizaveta"):
        with pytest.raises(ConfigError, match="a person's gesture needs them signed in"):
            gesture_actor(settings, cards, env={"AGAP_ACTOR": named})
    with pytest.raises(ConfigError, match="'jsonrpc' is the application token's name"):
        gesture_actor(settings, cards, env={"AGAP_USER": "jsonrpc", "AGAP_USER_PASSWORD": "t"})
