"""``agap backup`` / ``agap restore``: a populated board round-trips into a fresh one, and
the restored board works (claims, verification, no epoch won twice)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import fabric.apps.cli.backup_cmd  # noqa: F401  (registers `agap backup` / `agap restore`)
from fabric.apps.cli import main
from fabric.apps.deploy.backup import FORMAT, VERSION, map_refs
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import epoch_lock
from fabric.ledger import IllegalTransition, LostRace
from fabric.results import AttachmentStore
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT, make_fabric
from workers.queue import QueueReader


def env_for(board: EmbeddedBoard, tmp_path: Path) -> dict[str, str]:
    return {
        "KANBOARD_URL": board.url,
        "KANBOARD_API_TOKEN": board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def fabric_on(board: EmbeddedBoard, cards: CardSet) -> Fabric:
    settings = Settings(board_url=board.url, board_token=board.token, cards_dir=ROOT / "cards")
    return make_fabric(KanboardClient(board.url, board.token), cards, settings=settings)


@pytest.fixture
def fresh_board(tmp_path: Path) -> Iterator[EmbeddedBoard]:
    with EmbeddedBoard(tmp_path / "restored.sqlite3") as board:
        yield board


def populate(fab: Fabric) -> dict[str, int]:
    """Tasks in every interesting state, through the fabric's own operations."""
    ids: dict[str, int] = {}
    store = AttachmentStore(fab.board)
    # done, with its result attached
    ids["done"] = fab.submit("Summarise the notes", target="gemma-local").task_id
    lease = fab.ledger.claim(fab.board.read(ids["done"]), "w-gemma", lease_seconds=60)
    fab.ledger.complete(lease, store.put(lease, "the summary\n"))
    # closed: done and verified by someone else
    ids["closed"] = fab.submit("Old finished work", target="gemma-local").task_id
    lease = fab.ledger.claim(fab.board.read(ids["closed"]), "w-gemma", lease_seconds=60)
    fab.ledger.complete(lease, store.put(lease, "old result"))
    fab.ledger.verify(ids["closed"], "alvis", note="looks right")
    # waiting on a human
    ids["asking"] = fab.submit("Fix the deploy script", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(ids["asking"]), "w-kimi", lease_seconds=60)
    fab.ledger.ask(lease, "Which branch?", "alvis")
    # queued, referring to the done task, idempotent under a key, with a comment
    ids["queued"] = fab.submit(
        "Build on the summary", target="kimi", refs=[f"task:{ids['done']}"], priority="high"
    ).task_id
    fab.board.comment(ids["queued"], f"see also kanboard://task/{ids['done']}/file/result-e1.md")
    ids["keyed"] = fab.submit("Nightly digest", target="kimi", key="cron:digest:1").task_id
    # working under a lease
    ids["working"] = fab.submit("Long job", target="qwen-remote").task_id
    fab.ledger.claim(fab.board.read(ids["working"]), "w-qwen", lease_seconds=600)
    return ids


def snapshot(fab: Fabric) -> dict[str, dict[str, Any]]:
    """Every task by uid, in board-independent terms (names, not ids)."""
    port = fab.port
    layout = fab.board.layout
    cols = {v: k.value for k, v in layout.columns.items()}
    users = {int(u["id"]): u["username"] for u in port.call("getAllUsers")}
    rows = [
        *port.call("getAllTasks", {"project_id": layout.project_id, "status_id": 1}),
        *port.call("getAllTasks", {"project_id": layout.project_id, "status_id": 0}),
    ]
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        tid = int(row["id"])
        view = fab.board.read(tid)
        assert view.uid is not None
        files = {}
        for f in fab.board.files(tid):
            files[f.name] = base64.b64decode(fab.board.download(f.id))
        out[view.uid] = {
            "id": tid,
            "title": row["title"],
            "reference": row["reference"],
            "priority": int(row["priority"]),
            "is_active": int(row["is_active"]),
            "column": cols[int(row["column_id"])],
            "swimlane": layout.queue_of(int(row["swimlane_id"])),
            "owner": users.get(int(row["owner_id"] or 0)),
            "date_due": int(row["date_due"] or 0),
            "description": row["description"],
            "metadata": dict(view.meta),
            "comments": [c.text for c in fab.board.comments(tid)],
            "files": files,
        }
    return out


def test_a_populated_board_round_trips_into_a_fresh_one_and_works(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    src = fabric_on(embedded_board, cards)
    ids = populate(src)
    before = snapshot(src)
    assert len(before) == len(ids)

    path = tmp_path / "fabric-backup.json"
    res = run(env_for(embedded_board, tmp_path), "backup", str(path))
    assert res.exit_code == 0, res.output
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"]) == (FORMAT, VERSION)
    assert doc["projects"]["work"]["name"] == "Agent Fabric"
    assert doc["projects"]["locks"]["name"] == "Agent Fabric Locks"
    assert {"Queued", "Working", "Waiting on me", "Done", "Dead letter"} <= set(
        doc["projects"]["work"]["columns"]
    )

    # Another project's tasks on the new board shift the ids: references must follow.
    other = KanboardClient(fresh_board.url, fresh_board.token)
    pid = other.call("createProject", {"name": "Household chores"})
    for i in range(3):
        other.call("createTask", {"project_id": pid, "title": f"chore {i}"})
    res = run(env_for(fresh_board, tmp_path / "b"), "restore", str(path), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    id_map = {int(k): v for k, v in report["id_map"].items()}
    assert report["tasks"] == len(ids) and report["closed"] == 1 and report["files"] == 2

    dst = fabric_on(fresh_board, cards)
    after = snapshot(dst)
    assert set(after) == set(before), "every uid is back"
    assert all(id_map[i] == i + 3 for i in id_map), "the numeric ids changed"
    for uid, old in before.items():
        new = after[uid]
        assert id_map[old["id"]] == new["id"]
        for key in (
            "title",
            "reference",
            "priority",
            "is_active",
            "column",
            "swimlane",
            "owner",
            "date_due",
            "files",
        ):
            assert new[key] == old[key], (uid, key)
        assert new["description"] == map_refs(old["description"], id_map)
        assert new["metadata"] == {k: map_refs(v, id_map) for k, v in old["metadata"].items()}
        assert new["comments"] == [map_refs(c, id_map) for c in old["comments"]]

    # References follow the new numeric ids.
    queued = dst.board.read(id_map[ids["queued"]])
    assert queued.spec is not None and queued.spec.refs == (f"task:{id_map[ids['done']]}",)
    done = dst.board.read(id_map[ids["done"]])
    ref = done.current.result_ref  # type: ignore[union-attr]
    assert ref == f"kanboard://task/{id_map[ids['done']]}/file/result-e1.md"
    assert AttachmentStore(dst.board).get(ref) == "the summary\n"

    # No epoch that has a record can be won again: every lock tag is back.
    for uid in after:
        view = dst.board.read(after[uid]["id"])
        for epoch in range(1, view.epoch + 1):
            assert dst.board.lock(epoch_lock(uid, epoch)) is False, (uid, epoch)
    # ... so a transition from a stale view (one that missed the restored records) loses.
    stale = dst.board.read(id_map[ids["asking"]])
    stale.records = {e: r for e, r in stale.records.items() if e < stale.epoch}
    with pytest.raises(LostRace):
        dst.ledger.cancel(stale.id, "alvis", view=stale)

    # The restored board works: a worker claims a queued task and completes it ...
    lease = QueueReader.for_agent(dst, dst.cards.get("kimi")).claim_next("w-new", lease_seconds=30)
    assert lease is not None and lease.task_id in (id_map[ids["queued"]], id_map[ids["keyed"]])
    dst.ledger.complete(lease, "file:///tmp/out.md")
    # ... a done task is verified (and its producer still may not) ...
    with pytest.raises(IllegalTransition):
        dst.ledger.verify(id_map[ids["done"]], "w-gemma")
    dst.ledger.verify(id_map[ids["done"]], "alvis")
    assert dst.board.read(id_map[ids["done"]]).current.state == State.CLOSED  # type: ignore[union-attr]
    # ... the human's question is still theirs to answer ...
    dst.ledger.resume(id_map[ids["asking"]], "alvis", answer="main")
    # ... and a resubmit under the same action id finds the restored task.
    again = dst.submit("Nightly digest", target="kimi", key="cron:digest:1")
    assert again.created is False and again.task_id == id_map[ids["keyed"]]


def test_restore_refuses_a_board_that_is_not_empty(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    src = fabric_on(embedded_board, cards)
    src.submit("already here", target="kimi")
    path = tmp_path / "b.json"
    env = env_for(embedded_board, tmp_path)
    assert run(env, "backup", str(path)).exit_code == 0
    res = run(env, "restore", str(path))
    assert res.exit_code == 2
    assert "not empty" in res.output and "1 task" in res.output
    assert len(src.listing()) == 1, "nothing was added"


def test_restore_refuses_a_file_that_is_not_a_backup(fresh_board: EmbeddedBoard, tmp_path: Path) -> None:
    env = env_for(fresh_board, tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": FORMAT, "version": VERSION + 1, "tasks": []}))
    res = run(env, "restore", str(bad))
    assert res.exit_code == 2 and "version" in res.output
    bad.write_text("{not json")
    res = run(env, "restore", str(bad))
    assert res.exit_code == 2 and "not a readable backup" in res.output


def test_an_empty_board_backs_up_and_restores(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    fabric_on(embedded_board, cards)  # the layout only
    path = tmp_path / "empty.json"
    assert run(env_for(embedded_board, tmp_path), "backup", str(path)).exit_code == 0
    res = run(env_for(fresh_board, tmp_path / "b"), "restore", str(path))
    assert res.exit_code == 0, res.output
    assert "restore: 0 tasks" in res.output


def test_links_on_cards_follow_the_new_ids() -> None:
    """A task's page link gets the new id; a file link (its file id changes) becomes the
    task's page, which lists the attachments."""
    base = "http://kb.home.arpa/"
    text = (
        f"[task:5]({base}?controller=TaskViewController&action=show&task_id=5) and "
        f"[r.md]({base}?controller=FileViewerController&action=show&task_id=5&file_id=3), "
        f"[other]({base}?controller=TaskViewController&action=show&task_id=8)"
    )
    assert map_refs(text, {5: 12}) == (
        f"[task:12]({base}?controller=TaskViewController&action=show&task_id=12) and "
        f"[r.md]({base}?controller=TaskViewController&action=show&task_id=12), "
        f"[other]({base}?controller=TaskViewController&action=show&task_id=8)"
    )


def test_backup_to_stdout_restores_from_stdin_and_an_unwritable_folder_is_one_line(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    # A container's user (uid 10001) cannot write a host folder owned by root: the compose
    # recipe pipes `agap backup -` into the host's file instead.
    fab = fabric_on(embedded_board, cards)
    fab.submit("Water the plants", target="gemma-local")
    out = CliRunner().invoke(main, ["backup", "-"], env=env_for(embedded_board, tmp_path))
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert json.loads(text)["format"] == FORMAT and "lock tags -> stdout" in out.stderr
    res = CliRunner().invoke(main, ["restore", "-"], input=text, env=env_for(fresh_board, tmp_path / "b"))
    assert res.exit_code == 0, res.output
    assert "restore: 1 tasks" in res.output
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: make the folder a file instead
            locked.chmod(0o700)
            locked.rmdir()
            locked.write_text("")
        bad = run(env_for(embedded_board, tmp_path), "backup", str(locked / "x.json"))
    finally:
        if locked.is_dir():
            locked.chmod(0o700)
    assert bad.exit_code == 2, bad.output
    assert bad.output.startswith("agap: error: ") and "agap backup - > FILE" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_restore_refuses_a_board_whose_home_holds_a_task_and_writes_nothing(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    """The rule of the work project holds for every project the backup has: a home (or a
    quota project) that holds tasks or tags is refused before anything is written."""
    src = fabric_on(embedded_board, cards)
    src.submit("Price a kettle", target="torgash")
    path = tmp_path / "b.json"
    assert run(env_for(embedded_board, tmp_path), "backup", str(path)).exit_code == 0
    doc = json.loads(path.read_text())
    assert len(doc["homes"]["torgash"]["tasks"]) == 1 and doc["tasks"] == []
    # The fresh board already has torgash's home, holding a task.
    other = fabric_on(fresh_board, cards)
    other.submit("Already here", target="torgash")
    before = other.port.call("getAllProjects")
    res = run(env_for(fresh_board, tmp_path / "b"), "restore", str(path))
    assert res.exit_code == 2, res.output
    assert "not empty" in res.output and "'Agent Fabric: torgash' holds 1 task" in res.output
    assert other.port.call("getAllProjects") == before
    assert len(other.listing()) == 1, "nothing was added"


def test_restore_refuses_a_home_the_cards_do_not_make(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    fabric_on(embedded_board, cards)
    path = tmp_path / "b.json"
    assert run(env_for(embedded_board, tmp_path), "backup", str(path)).exit_code == 0
    doc = json.loads(path.read_text())
    doc["homes"]["kimi"] = doc["homes"]["torgash"]  # kimi is trusted: it has no home
    path.write_text(json.dumps(doc))
    res = run(env_for(fresh_board, tmp_path / "b"), "restore", str(path))
    assert res.exit_code == 2 and "the home of 'kimi'" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    client = KanboardClient(fresh_board.url, fresh_board.token)
    assert client.call("getAllProjects") == [], "nothing was written"


def test_a_version_1_backup_still_restores(
    embedded_board: EmbeddedBoard, fresh_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    """A file written before homes were backed up: the work project alone comes back."""
    src = fabric_on(embedded_board, cards)
    tid = src.submit("Water the plants", target="gemma-local").task_id
    path = tmp_path / "b.json"
    assert run(env_for(embedded_board, tmp_path), "backup", str(path)).exit_code == 0
    doc = json.loads(path.read_text())
    doc["version"] = 1
    del doc["homes"]
    for key in ("work", "locks"):
        del doc["projects"][key]["members"]
    path.write_text(json.dumps(doc))
    res = run(env_for(fresh_board, tmp_path / "b"), "restore", str(path), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    assert report["tasks"] == 1 and report["homes"] == {}
    dst = fabric_on(fresh_board, cards)
    assert dst.board.read(report["id_map"][str(tid)]).spec.intent == "Water the plants"  # type: ignore[union-attr]
