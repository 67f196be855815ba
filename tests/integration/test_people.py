"""People get into Kanboard: `agap init` gives each new person's user a password (the
operator's, or a one-time one printed once), the card's name and e-mail, and hides the
lanes nobody uses. Over real HTTP against the embedded board, signing in as the person."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from tests.conftest import ROOT


@pytest.fixture
def env(embedded_board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    cards = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", cards)
    shutil.copytree(ROOT / "souls", tmp_path / "souls")  # the cards' personas
    return {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(cards),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_PROJECT": "People Fabric",
        "AGAP_LOCKS_PROJECT": "People Fabric Locks",
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def sign_in(board: EmbeddedBoard, username: str, password: str) -> requests.Response:
    """A JSON-RPC call as the person (user auth, as Kanboard's own clients do)."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return requests.post(
        board.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "getMe"},
        headers={"Authorization": f"Basic {auth}"},
        timeout=10,
    )


def test_new_people_get_the_operators_password_or_a_one_time_one(
    env: dict[str, str], embedded_board: EmbeddedBoard
) -> None:
    env["AGAP_PASSWORD_ALVIS"] = "alvis-chose-this"
    out = run(env, "init", "--json")
    assert out.exit_code == 0, out.output
    sign = json.loads(out.output)["sign_in"]
    assert sign["alvis"] == {"password_from": "AGAP_PASSWORD_ALVIS"}
    assert sign["elizaveta"]["kind"] == "one-time"
    once = sign["elizaveta"]["password"]
    assert len(once) >= 12
    me = sign_in(embedded_board, "alvis", "alvis-chose-this")
    assert me.status_code == 200 and me.json()["result"]["username"] == "alvis"
    assert sign_in(embedded_board, "elizaveta", once).json()["result"]["username"] == "elizaveta"
    assert sign_in(embedded_board, "elizaveta", "guess-again").status_code == 401
    # Shown once: a second init makes no password and prints none.
    again = run(env, "init", "--json")
    assert json.loads(again.output)["sign_in"] == {"alvis": {"password_not_set": _change("alvis")}}
    assert once not in again.output


def _change(user: str) -> str:
    return f"Users management > {user} > Change password"


def test_the_text_output_prints_the_one_time_password_and_where_to_change_it(
    env: dict[str, str], embedded_board: EmbeddedBoard
) -> None:
    out = run(env, "init")
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("  elizaveta  "))
    password = line.split()[1]
    assert sign_in(embedded_board, "elizaveta", password).status_code == 200
    assert f"sign in to Kanboard at http://{embedded_board.host}:{embedded_board.port}/" in out.output
    assert _change("the person") in out.output
    assert "Users > Edit" not in out.output
    # A password given later for an existing user cannot be applied: init says who can.
    env["AGAP_PASSWORD_ELIZAVETA"] = "too-late-for-this"
    later = run(env, "init")
    assert later.exit_code == 0
    assert f"an admin sets it in Kanboard ({_change('elizaveta')})" in later.output
    assert sign_in(embedded_board, "elizaveta", "too-late-for-this").status_code == 401


def test_a_short_password_stops_init_before_anything_is_written(
    env: dict[str, str], embedded_board: EmbeddedBoard
) -> None:
    env["AGAP_PASSWORD_ELIZAVETA"] = "12345"
    out = run(env, "init")
    assert out.exit_code == 2
    assert out.output.count("\n") == 1 and "AGAP_PASSWORD_ELIZAVETA" in out.output
    assert "6 or more" in out.output and "12345" not in out.output
    client = KanboardClient(embedded_board.url, embedded_board.token)
    assert client.call("getProjectByName", {"name": "People Fabric"}) is False
    assert client.call("getUserByName", {"username": "alvis"}) is None


def test_cards_e_mail_reaches_the_kanboard_user(env: dict[str, str], embedded_board: EmbeddedBoard) -> None:
    card = Path(env["AGAP_CARDS_DIR"]) / "alvis.yaml"
    card.write_text(
        card.read_text().replace(
            "  display_name: Alvis\n", "  display_name: Alvis\n  email: alvis@home.arpa\n"
        )
    )
    assert run(env, "init").exit_code == 0
    client = KanboardClient(embedded_board.url, embedded_board.token)
    assert client.call("getUserByName", {"username": "alvis"})["email"] == "alvis@home.arpa"
    # The card changes: the next init follows it (Kanboard mails password resets there).
    card.write_text(card.read_text().replace("alvis@home.arpa", "alvis@example.org"))
    out = run(env, "init", "--json")
    assert "user 'alvis' email" in json.loads(out.output)["changed"]
    assert client.call("getUserByName", {"username": "alvis"})["email"] == "alvis@example.org"


def test_init_hides_the_lanes_nobody_uses(env: dict[str, str], embedded_board: EmbeddedBoard) -> None:
    out = json.loads(run(env, "init", "--json").output)
    assert "hid unused swimlane 'Default swimlane'" in out["changed"]
    client = KanboardClient(embedded_board.url, embedded_board.token)
    pid = out["project_id"]
    active = {s["name"] for s in client.call("getActiveSwimlanes", {"project_id": pid})}
    assert active == set(out["queues"]) - {"Default swimlane"}
    # A lane a card no longer names is hidden once it is empty; the queue's lane comes back
    # when a card names it again.
    cards = Path(env["AGAP_CARDS_DIR"])
    moved = cards / "torgash.yaml"
    kept = moved.read_text()
    moved.unlink()
    out = json.loads(run(env, "init", "--json").output)
    assert "hid unused swimlane 'torgash'" in out["changed"]
    assert "torgash" not in {s["name"] for s in client.call("getActiveSwimlanes", {"project_id": pid})}
    moved.write_text(kept)
    out = json.loads(run(env, "init", "--json").output)
    assert out["changed"] == ["showed swimlane 'torgash'"]
    assert "torgash" in {s["name"] for s in client.call("getActiveSwimlanes", {"project_id": pid})}
    assert run(env, "init").output.startswith("board already in shape")
