"""The restore drill: fill a board, back it up, start from an empty one, restore, carry on.

The board is filled as a household's is (tests/integration/backup_drill.py): the work
project and torgash's home (a confined agent working as its own board user), the quota
project, tasks queued, working under a lease, asking a person, done with an attachment,
closed; comments, files, metadata; a member no card makes. ``agap backup`` writes it out;
the board is then emptied; ``agap restore`` brings it back, and the check is that every
task is back in its own project with everything it had, every member with its role, every
quota slot with its holder, and that the fabric carries on: queued tasks are claimed and
completed (torgash's by its own user, its card drawn by its home's keeper), a question is
still its person's, a resubmit under an action id finds its task.

On the embedded board "empty" is a second, fresh board. On the real Kanboard that
``AGAP_TEST_KANBOARD_URL`` / ``_TOKEN`` / ``_FLAVOUR`` name (PostgreSQL in production),
the drill empties that board between backup and restore: with
``AGAP_TEST_KANBOARD_RESET`` set to a shell command that resets it to an empty database
(keeping its application token), that command runs (the whole board goes: its users too,
so the restore makes them again from the cards); without it, the drill removes the
projects it made (``removeProject``), which empties them just as well for the restore but
leaves the board's users. Without a real Kanboard named, that case skips, saying why.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import fabric.apps.cli.backup_cmd  # noqa: F401  (registers `agap backup` / `agap restore`)
from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from tests.conftest import REAL_FLAVOUR, REAL_SKIP, real_kanboard, scratch_board
from tests.integration import backup_drill as drill

RESET = "AGAP_TEST_KANBOARD_RESET"


@dataclass
class Boards:
    """Where the drill backs up from, and where it restores to (None: the same board,
    emptied by ``empty``)."""

    url: str
    token: str
    fresh: EmbeddedBoard | None = None
    reset: str = ""  # a shell command that empties the real board ("": remove the projects)


@pytest.fixture(params=["embedded", "real-kanboard"])
def boards(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Boards]:
    if request.param == "embedded":
        with EmbeddedBoard(tmp_path / "a.sqlite3") as a, EmbeddedBoard(tmp_path / "b.sqlite3") as b:
            yield Boards(a.url, a.token, fresh=b)
        return
    real = real_kanboard()
    if real is None:
        print(f"real Kanboard skipped: {REAL_SKIP}")
        pytest.skip(REAL_SKIP)
    scratch_board(*real)
    print(f"restore drill on {real[0]} ({os.environ.get(REAL_FLAVOUR, 'flavour not named')})")
    yield Boards(*real, reset=os.environ.get(RESET, ""))


def empty(boards: Boards, settings: Settings) -> None:
    """Empty the real board between backup and restore (see the module doc)."""
    if boards.reset:
        done = subprocess.run(boards.reset, shell=True, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        scratch_board(boards.url, boards.token)  # a reset board is marked again
        return
    client = KanboardClient(boards.url, boards.token, timeout=60)
    try:
        ours = (settings.project, settings.locks_project, settings.quota_project)
        for p in client.call("getAllProjects") or []:
            name = str(p["name"])
            if name in ours or name.startswith((f"{settings.project}: ", f"{settings.locks_project}: ")):
                assert client.call("removeProject", {"project_id": int(p["id"])}) is True
    finally:
        client.close()


@pytest.mark.timeout(900)
def test_restore_drill(boards: Boards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in drill.PASSWORDS.items():
        monkeypatch.setenv(name, value)
    run = secrets.token_hex(3)
    cards_dir = drill.drill_cards(tmp_path)
    src = drill.drill_settings(boards.url, boards.token, cards_dir, run)
    cards = drill.load(src)
    ids = drill.fill(src, cards)
    fab = drill.connect(src, cards)
    before, roles, slots = drill.snapshot(fab), drill.members(fab), drill.quota_tags(fab)
    assert {t["project"] for t in before.values()} == {src.project, f"{src.project}: torgash"}
    assert roles[f"{src.project}: torgash"][drill.GUEST] == drill.GUEST_ROLE
    assert len(slots) == 1

    path = tmp_path / "backup.json"
    res = CliRunner().invoke(main, ["backup", str(path)], env=drill.drill_env(src, tmp_path / "c1"))
    assert res.exit_code == 0, res.output
    print(res.output.strip())
    doc = json.loads(path.read_text())
    assert set(doc["homes"]) == {"researcher", "torgash"}
    assert len(doc["homes"]["torgash"]["tasks"]) == 3 and "quota" in doc["projects"]

    if boards.fresh is not None:
        dst = drill.drill_settings(boards.fresh.url, boards.fresh.token, cards_dir, run)
    else:
        dst = src
        empty(boards, src)
        client = KanboardClient(dst.board_url, dst.board_token)
        names = {str(p["name"]) for p in client.call("getAllProjects") or []}
        client.close()
        assert src.project not in names and f"{src.project}: torgash" not in names, "emptied"
    # The fabric's processes start afresh after a restore (docs/OPERATIONS.md): no layout
    # cached before it (on the same board those name the projects that were removed).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "after"))
    drill.ensure_guest(dst)  # made again by hand: its membership comes back with the backup's role

    res = CliRunner().invoke(
        main, ["restore", str(path), "--json"], env=drill.drill_env(dst, tmp_path / "c2")
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    print({k: v for k, v in report.items() if k != "id_map"})
    id_map = {int(k): v for k, v in report["id_map"].items()}
    assert report["tasks"] == len(ids) and report["homes"] == {"torgash": 3}
    assert report["quota_tags"] == 1 and report["members"] >= 1

    after_fab = drill.connect(dst, cards)
    drill.same(before, drill.snapshot(after_fab), id_map)
    assert drill.members(after_fab)[f"{dst.project}: torgash"][drill.GUEST] == drill.GUEST_ROLE
    for project, who in roles.items():
        assert drill.members(after_fab)[project] == who, project
    assert drill.quota_tags(after_fab) == drill.moved_quota(slots, id_map)
    drill.carries_on(dst, cards, ids, id_map)

    # A second restore refuses: the projects now hold tasks, and nothing is added.
    res = CliRunner().invoke(main, ["restore", str(path)], env=drill.drill_env(dst, tmp_path / "c3"))
    assert res.exit_code == 2 and "not empty" in res.output, res.output
    assert len(drill.snapshot(drill.connect(dst, cards))) == len(ids)
