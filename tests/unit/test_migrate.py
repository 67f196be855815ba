"""Migrating a board written by storage layout 1 (long values, `actor:key` references)."""

from __future__ import annotations

import json

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.kanboard.card import SPEC_FENCE, SPEC_LINE
from fabric.kanboard.layout import META_LAYOUT, legacy_receipt_reference
from fabric.kanboard.migrate import layout_version, migrate
from tests.conftest import FakeClock, make_fabric

LEGACY_OPEN = "<details><summary>fabric spec (machine-readable)</summary>\n\n"


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
        # Layout 1's description: the unsealed spec in a fenced block inside <details>.
        desc = str(view.row["description"])
        start = desc.rfind(SPEC_LINE)
        block = json.loads(desc[start + len(SPEC_LINE) : -1])
        block.pop("seal")
        legacy = f"{LEGACY_OPEN}{SPEC_FENCE}\n{json.dumps(block)}\n```\n</details>"
        update = {"id": tid, "description": desc[:start] + legacy}
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

    report = migrate(raw, layout, secret=fab.settings.board_token)
    assert (report.from_version, report.references, report.blocks_sealed) == ("1", 1, 2)
    assert report.values_chunked >= 3 and report.unrecorded == [bare]
    for tid in (keyed, keyed + 1):
        stored = raw.call("getTaskMetadata", {"task_id": tid})
        assert max(len(k) for k in stored) <= 50 and max(len(v) for v in stored.values()) <= 255
        view = fab.board.read(tid)
        assert view.meta == before[tid] and not view.problems
        desc = str(view.row["description"])
        assert fab.board.sealed(desc)
        # Rewritten as a line Kanboard's Markdown does not show: no HTML left on the card.
        assert "<details>" not in desc and "</details>" not in desc and SPEC_FENCE not in desc
        assert desc.splitlines()[-1].startswith(SPEC_LINE)
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
    assert not migrate(raw, layout, secret=fab.settings.board_token).changed
    forced = migrate(raw, layout, secret=fab.settings.board_token, force=True)
    assert not forced.changed and forced.tasks_seen == 3
    assert raw.call("getTaskMetadata", {"task_id": bare}) == {}  # never adopted


def test_force_rewrites_a_layout_2_details_block_as_an_invisible_line(cards: CardSet) -> None:
    """Cards written before the spec moved out of sight lose their HTML on `agap migrate --force`."""
    raw = LocalPort(clock=FakeClock())
    fab = make_fabric(raw, cards)
    tid = fab.submit("Water the plants", target="kimi").task_id
    desc = str(fab.board.read(tid).row["description"])
    start = desc.rfind(SPEC_LINE)
    sealed = desc[start + len(SPEC_LINE) : -1]
    old = f"{desc[:start]}{LEGACY_OPEN}{SPEC_FENCE}\n{sealed}\n```\n</details>"
    raw.call("updateTask", {"id": tid, "description": old})
    assert fab.board.sealed(old)  # the old form still reads
    report = migrate(raw, fab.board.layout, secret=fab.settings.board_token, force=True)
    assert report.blocks_sealed == 1
    assert str(fab.board.read(tid).row["description"]) == desc
    again = migrate(raw, fab.board.layout, secret=fab.settings.board_token, force=True)
    assert again.blocks_sealed == 0
