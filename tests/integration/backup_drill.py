"""A board filled as a household's is, and the checks a restore drill makes of it.

Shared by the restore drill (tests/integration/test_restore_drill.py, on the embedded board
and on a real Kanboard): the work project, torgash's home (a confined agent working as its
own board user), the quota project, tasks in several states, comments, files, metadata,
and a member nobody's card makes.
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
from pathlib import Path
from typing import Any

from fabric.apps.deploy.backup import map_refs
from fabric.cards import Card, CardSet, load_cards
from fabric.core import Fabric
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import epoch_lock
from fabric.kanboard.principals import home_settings, worker_settings
from fabric.kanboard.quotas import QuotaHolder, QuotaStore, SlotRef, moved_holder
from fabric.kanboard.views import BoardLayout
from fabric.results import AttachmentStore
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.daemon import Keeper
from tests.conftest import ROOT, make_fabric
from workers.queue import QueueReader

PASSWORDS = {
    "AGAP_BOARD_PASSWORD_TORGASH": "torgash-board-password-0123456789",
    "AGAP_BOARD_PASSWORD_RESEARCHER": "researcher-board-password-0123",
}
GUEST = "drill-guest"  # a member of torgash's home that no card makes
GUEST_ROLE = "project-viewer"


def drill_cards(tmp: Path) -> Path:
    """The project's cards, with kimi's quota kept across hosts (so there is a quota project)."""
    dst = tmp / "cards"
    shutil.copytree(ROOT / "cards", dst)
    shutil.copytree(ROOT / "souls", tmp / "souls")  # the personas, read from the folder above
    kimi = dst / "kimi.yaml"
    text = kimi.read_text()
    assert "    reserve_interactive: 0.2\n" in text
    kimi.write_text(
        text.replace(
            "    reserve_interactive: 0.2\n", "    reserve_interactive: 0.2\n    across_hosts: true\n"
        )
    )
    return dst


def drill_settings(url: str, token: str, cards_dir: Path, run: str) -> Settings:
    return Settings(
        board_url=url,
        board_token=token,
        cards_dir=cards_dir,
        project=f"Drill {run}",
        locks_project=f"Drill Locks {run}",
        quota_project=f"Drill Quota {run}",
    )


def drill_env(settings: Settings, cache: Path) -> dict[str, str]:
    """What `agap backup` / `agap restore` are given."""
    return {
        "KANBOARD_URL": settings.board_url,
        "KANBOARD_API_TOKEN": settings.board_token,
        "AGAP_CARDS_DIR": str(settings.cards_dir),
        "AGAP_PROJECT": settings.project,
        "AGAP_LOCKS_PROJECT": settings.locks_project,
        "AGAP_QUOTA_PROJECT": settings.quota_project,
        "XDG_CACHE_HOME": str(cache),
        **PASSWORDS,
    }


def load(settings: Settings) -> CardSet:
    return load_cards(Path(settings.cards_dir), base_dir=Path(settings.cards_dir).parent)


def connect(settings: Settings, cards: CardSet) -> Fabric:
    """The app token's fabric (``agap init`` first, as every drill step may be the first)."""
    return make_fabric(KanboardClient(settings.board_url, settings.board_token), cards, settings=settings)


def as_torgash(settings: Settings, cards: CardSet) -> Fabric:
    """torgash's own fabric: its board user, its home, no app token."""
    own = dataclasses.replace(
        settings,
        board_token="",
        board_user="agap-torgash",
        board_password=PASSWORDS["AGAP_BOARD_PASSWORD_TORGASH"],
    )
    return Fabric.connect(worker_settings(own, cards.get("torgash")), cards=cards)


def home_keeper(settings: Settings, cards: CardSet) -> Keeper:
    return Keeper.for_fabric(Fabric.connect(home_settings(settings, cards.get("torgash")), cards=cards))


def ensure_guest(settings: Settings) -> int:
    """The guest's user (made by hand in Kanboard, not by a card)."""
    client = KanboardClient(settings.board_url, settings.board_token)
    try:
        user = client.call("getUserByName", {"username": GUEST})
        if isinstance(user, dict):
            return int(user["id"])
        return int(client.call("createUser", {"username": GUEST, "password": "drill-guest-password"}))
    finally:
        client.close()


def fill(settings: Settings, cards: CardSet) -> dict[str, int]:
    """Tasks in every interesting state, in the work project and in torgash's home, through
    the fabric's own operations (torgash's as its own user); a quota slot held by a lease;
    a guest member of the home."""
    fab = connect(settings, cards)
    ids: dict[str, int] = {}
    store = AttachmentStore(fab.board)
    ids["done"] = fab.submit("Summarise the notes", target="gemma-local").task_id
    lease = fab.ledger.claim(fab.board.read(ids["done"]), "w-gemma", lease_seconds=60)
    fab.ledger.complete(lease, store.put(lease, "the summary\n"))
    ids["closed"] = fab.submit("Old finished work", target="gemma-local").task_id
    lease = fab.ledger.claim(fab.board.read(ids["closed"]), "w-gemma", lease_seconds=60)
    fab.ledger.complete(lease, store.put(lease, "old result"))
    fab.ledger.verify(ids["closed"], "alvis", note="looks right")
    ids["asking"] = fab.submit("Fix the deploy script", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(ids["asking"]), "w-kimi", lease_seconds=60)
    fab.ledger.ask(lease, "Which branch?", "alvis")
    ids["queued"] = fab.submit(
        "Build on the summary", target="gemma-local", refs=[f"task:{ids['done']}"], priority="high"
    ).task_id
    fab.board.comment(ids["queued"], f"see also kanboard://task/{ids['done']}/file/result-e1.md")
    ids["keyed"] = fab.submit("Nightly digest", target="kimi", key="cron:digest:1").task_id
    ids["working"] = fab.submit("Long job", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(ids["working"]), "w-kimi", lease_seconds=600)
    view = fab.board.read(ids["working"])
    assert view.uid is not None
    QuotaStore(fab.port, settings.quota_project).take(
        "kimi", [SlotRef(0, 0, 0)], QuotaHolder(view.id, view.uid, view.epoch), fab.clock()
    )
    # torgash's home: submitted from the work project, worked by torgash's own user.
    own = as_torgash(settings, cards)
    mine = AttachmentStore(own.board)
    ids["home-done"] = fab.submit("Price a heat pump", target="torgash", refs=[f"task:{ids['done']}"]).task_id
    lease = own.ledger.claim(own.board.read(ids["home-done"]), "w-torgash", lease_seconds=60)
    own.ledger.complete(lease, mine.put(lease, "three offers\n"))
    own.board.comment(ids["home-done"], "asked three shops")
    ids["home-asking"] = fab.submit("Sell the old bike", target="torgash", key="alvis:bike").task_id
    lease = own.ledger.claim(own.board.read(ids["home-asking"]), "w-torgash", lease_seconds=60)
    own.ledger.ask(lease, "Which price floor?", "alvis")
    ids["home-queued"] = fab.submit("Find a used e-bike", target="torgash").task_id
    home = fab.board.layout.homes["torgash"]
    guest = ensure_guest(settings)
    fab.port.call("addProjectUser", {"project_id": home.project_id, "user_id": guest, "role": GUEST_ROLE})
    # The home's keeper draws torgash's done card (its worker has no seal key).
    assert home_keeper(settings, cards).run_job("gestures")
    return ids


def layouts(fab: Fabric) -> list[BoardLayout]:
    return [fab.board.layout, *(fab.board.layout.homes[a] for a in sorted(fab.board.layout.homes))]


def snapshot(fab: Fabric) -> dict[str, dict[str, Any]]:
    """Every task of every project the fabric made, by uid, in board-independent terms."""
    port = fab.port
    users = {int(u["id"]): u["username"] for u in port.call("getAllUsers")}
    out: dict[str, dict[str, Any]] = {}
    for layout in layouts(fab):
        cols = {v: k.value for k, v in layout.columns.items()}
        rows = [
            *port.call("getAllTasks", {"project_id": layout.project_id, "status_id": 1}),
            *port.call("getAllTasks", {"project_id": layout.project_id, "status_id": 0}),
        ]
        for row in rows:
            tid = int(row["id"])
            view = fab.board.read(tid)
            assert view.uid is not None
            files = {f.name: base64.b64decode(fab.board.download(f.id)) for f in fab.board.files(tid)}
            out[view.uid] = {
                "id": tid,
                "project": layout.project_name,
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
                "comments": [(users.get(c.user_id), c.text) for c in fab.board.comments(tid)],
                "files": files,
            }
    return out


def members(fab: Fabric) -> dict[str, dict[str, str]]:
    """project name -> {username: role}, for the work projects."""
    users = {int(u["id"]): u["username"] for u in fab.port.call("getAllUsers")}
    out = {}
    for layout in layouts(fab):
        ids = [int(k) for k in fab.port.call("getProjectUsers", {"project_id": layout.project_id}) or {}]
        out[layout.project_name] = {
            users[u]: str(
                fab.port.call("getProjectUserRole", {"project_id": layout.project_id, "user_id": u})
            )
            for u in ids
        }
    return out


def quota_tags(fab: Fabric) -> dict[str, str]:
    """The quota project's tags: name -> colour."""
    store = QuotaStore(fab.port, fab.settings.quota_project)
    return {
        t["name"]: t["color_id"]
        for t in fab.port.call("getTagsByProject", {"project_id": store.project_id()}) or []
    }


def same(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], id_map: dict[int, int]) -> None:
    """Every task is back, in its own project, with everything it had (refs renumbered)."""
    assert set(after) == set(before), "every uid is back"
    for uid, old in before.items():
        new = after[uid]
        assert id_map[old["id"]] == new["id"]
        for key in (
            "project",
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
            assert new[key] == old[key], (uid, key, old[key], new[key])
        assert new["description"] == map_refs(old["description"], id_map), uid
        assert new["metadata"] == {k: map_refs(v, id_map) for k, v in old["metadata"].items()}, uid
        assert new["comments"] == [(u, map_refs(c, id_map)) for u, c in old["comments"]], uid


def moved_quota(before: dict[str, str], id_map: dict[int, int]) -> dict[str, str]:
    return {n: moved_holder(c, id_map) for n, c in before.items()}


def carries_on(settings: Settings, cards: CardSet, ids: dict[str, int], id_map: dict[int, int]) -> None:
    """The restored fabric works: no epoch with a record can be won again, queued tasks are
    claimed and completed (torgash's by its own user), a question is still its person's,
    a done card is verified, and a resubmit under an action id finds its task."""
    fab = connect(settings, cards)
    torgash: Card = cards.get("torgash")
    for name, old in ids.items():
        view = fab.board.read(id_map[old])
        board = fab.board_for(torgash) if name.startswith("home-") else fab.board
        assert view.uid is not None
        for epoch in range(1, view.epoch + 1):
            assert board.lock(epoch_lock(view.uid, epoch)) is False, (name, epoch)
    lease = QueueReader.for_agent(fab, cards.get("gemma-local")).claim_next("w-after", lease_seconds=30)
    assert lease is not None and lease.task_id == id_map[ids["queued"]]
    fab.ledger.complete(lease, AttachmentStore(fab.board).put(lease, "built on it"))
    own = as_torgash(settings, cards)
    lease = QueueReader.for_agent(own, torgash).claim_next("w-torgash-after", lease_seconds=30)
    assert lease is not None and lease.task_id == id_map[ids["home-queued"]]
    own.ledger.complete(lease, AttachmentStore(own.board).put(lease, "a used e-bike"))
    keeper = home_keeper(settings, cards)
    assert keeper.run_job("gestures") and id_map[ids["home-queued"]] in keeper.last["gestures"].redrawn
    fab.ledger.verify(id_map[ids["done"]], "alvis")
    assert fab.board.read(id_map[ids["done"]]).current.state == State.CLOSED  # type: ignore[union-attr]
    fab.ledger.resume(id_map[ids["asking"]], "alvis", answer="main")
    home = fab.home_fabric(torgash)
    home.ledger.resume(id_map[ids["home-asking"]], "alvis", answer="150 euros")
    assert home.show(id_map[ids["home-asking"]]).current.state == State.QUEUED  # type: ignore[union-attr]
    again = fab.submit("Nightly digest", target="kimi", key="cron:digest:1")
    assert again.created is False and again.task_id == id_map[ids["keyed"]]
    again = fab.submit("Sell the old bike", target="torgash", key="alvis:bike")
    assert again.created is False and again.task_id == id_map[ids["home-asking"]]
