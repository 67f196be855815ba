"""Migrating a board written by storage layout 1 (long values, `actor:key` references)."""

from __future__ import annotations

import json

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.layout import META_LAYOUT, legacy_receipt_reference
from fabric.kanboard.migrate import layout_version, migrate
from fabric.submit import SPEC_FENCE, parse_description
from tests.conftest import FakeClock, make_fabric


def legacy_board(cards: CardSet) -> tuple[LocalPort, Fabric, int, int]:
    """A SQLite board as layout 1 left it: one keyed task, one plain, one bare card."""
    raw = LocalPort(clock=FakeClock(), flavour="sqlite")  # SQLite held any value
    fab = make_fabric(raw, cards)
    keyed = fab.submit(
        "x" * 1500,
        target="kimi",
        key="Weekly-Report",
        actor="cron",
        refs=[f"https://example.org/{i}" for i in range(10)],
    )
    plain = fab.submit("plain", target="kimi")
    lease = fab.ledger.claim(fab.board.read(plain.task_id), "w" * 200, lease_seconds=60)
    fab.ledger.complete(lease, "https://example.org/" + "r" * 400)
    pid = fab.board.layout.project_id
    raw.call("removeProjectMetadata", {"project_id": pid, "name": META_LAYOUT})
    for tid in (keyed.task_id, plain.task_id):
        view = fab.board.read(tid)  # logical values, whole
        for key in list(raw.call("getTaskMetadata", {"task_id": tid})):
            raw.call("removeTaskMetadata", {"task_id": tid, "name": key})
        raw.call("saveTaskMetadata", {"task_id": tid, "values": view.meta})  # unchunked
        desc = str(view.row["description"])
        start = desc.rfind(SPEC_FENCE) + len(SPEC_FENCE) + 1
        end = desc.find("\n```", start)
        block = json.loads(desc[start:end])
        block.pop("seal")
        update = {"id": tid, "description": desc[:start] + json.dumps(block) + desc[end:]}
        if tid == keyed.task_id:
            update["reference"] = legacy_receipt_reference("cron", "Weekly-Report")
        raw.call("updateTask", update)
    layout = fab.board.layout
    bare = raw.call(
        "createTask",
        {
            "title": "made by hand",
            "project_id": pid,
            "column_id": layout.columns["Queued"],  # type: ignore[index]
            "swimlane_id": layout.swimlanes["kimi"],
        },
    )
    return raw, fab, keyed.task_id, int(bare)


def test_migration_fits_every_value_hashes_references_and_seals_blocks(cards: CardSet) -> None:
    raw, fab, keyed, bare = legacy_board(cards)
    layout = fab.board.layout
    before = {t: fab.board.read(t).meta for t in (keyed, keyed + 1)}
    assert layout_version(raw, layout) == "1"
    assert max(len(v) for v in raw.call("getTaskMetadata", {"task_id": keyed}).values()) > 255

    report = migrate(raw, layout, seal_key=fab.board.seal_key)
    assert (report.from_version, report.references, report.blocks_sealed) == ("1", 1, 2)
    assert report.values_chunked >= 3 and report.unrecorded == [bare]
    for tid in (keyed, keyed + 1):
        stored = raw.call("getTaskMetadata", {"task_id": tid})
        assert max(len(k) for k in stored) <= 50 and max(len(v) for v in stored.values()) <= 255
        view = fab.board.read(tid)
        assert view.meta == before[tid] and not view.problems
        assert parse_description(str(view.row["description"]), fab.board.seal_key)
    # The same key after the migration finds the same task.
    again = fab.submit(
        "x" * 1500,
        target="kimi",
        key="Weekly-Report",
        actor="cron",
        refs=[f"https://example.org/{i}" for i in range(10)],
    )
    assert again.task_id == keyed and not again.created
    assert layout_version(raw, layout) == "2"
    assert not migrate(raw, layout, seal_key=fab.board.seal_key).changed
    forced = migrate(raw, layout, seal_key=fab.board.seal_key, force=True)
    assert not forced.changed and forced.tasks_seen == 3
    assert raw.call("getTaskMetadata", {"task_id": bare}) == {}  # never adopted
