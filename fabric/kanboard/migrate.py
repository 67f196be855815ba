"""Bringing a board written by an older storage layout up to the current one.

Layout 1 (the fabric before 2026-12) stored each record and spec in one metadata value of
any length, gave a keyed task the reference ``actor:key`` and wrote an unsealed spec
block. That works only on SQLite Kanboards; layout 2 (``LAYOUT_VERSION``) fits every
backend (``fabric.kanboard.fit``). Migrating, idempotently and task by task:

* every metadata value over 255 characters is written again through the fitting port,
  which stores it in chunks (the logical value is unchanged);
* a keyed task's reference becomes the hashed receipt reference;
* the spec block of a task that has records is sealed again from its metadata (the
  truth), as the line Markdown does not show (an older fenced block goes, with the HTML
  ``<details>`` around it, which Kanboard shows as text: ``--force`` does this for boards
  already at layout 2); a card with no records is left alone and counted (it was never
  the fabric's to adopt unsealed);
* the work project records ``fabric.layout = 2``.

Reading needs no migration (a long value reads as it is), so a half-migrated board
keeps working and the next run finishes the job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import field
from typing import Any

from fabric.kanboard.card import SPEC_FENCE, SPEC_LINE, derive_seal_key, spec_block
from fabric.kanboard.fit import VALUE_MAX, FittedPort, fit, unpack
from fabric.kanboard.layout import (
    LAYOUT_VERSION,
    META_LAYOUT,
    legacy_receipt_reference,
    receipt_reference,
)
from fabric.kanboard.port import Call, RpcPort
from fabric.kanboard.taskboard import BoardLayout, parse_view
from fabric.plain import Plain

CHUNK = 50  # tasks per round trip


class MigrationReport(Plain, frozen=False):
    """What a migration changed; all zero on a board already at the current layout."""

    from_version: str = ""
    tasks_seen: int = 0
    values_chunked: int = 0
    references: int = 0
    blocks_sealed: int = 0
    unrecorded: list[int] = field(default_factory=list)  # cards left alone

    @property
    def changed(self) -> bool:
        return bool(self.values_chunked or self.references or self.blocks_sealed)


def layout_version(port: RpcPort, layout: BoardLayout) -> str:
    """The storage layout the board says it holds ("1" when it says nothing)."""
    meta = fit(port).call("getProjectMetadata", {"project_id": layout.project_id})
    return str((meta or {}).get(META_LAYOUT) or "1") if isinstance(meta, dict) else "1"


def migrate(port: RpcPort, layout: BoardLayout, *, secret: str, force: bool = False) -> MigrationReport:
    """Migrate the board to ``LAYOUT_VERSION`` (a no-op on a board already there)."""
    # Reads go to the raw port, to see which values are stored unchunked; writes go
    # through the fitting one, which chunks them.
    raw = port.inner if isinstance(port, FittedPort) else port
    port = fit(raw)
    report = MigrationReport(from_version=layout_version(port, layout))
    if report.from_version == LAYOUT_VERSION and not force:
        return report
    _long_project_values(raw, port, layout, report)
    seal_key = derive_seal_key(secret)
    rows: list[dict[str, Any]] = []
    for status in (1, 0):
        rows += list(port.call("getAllTasks", {"project_id": layout.project_id, "status_id": status}) or [])
    for chunk in _chunks(rows, CHUNK):
        metas = raw.batch([Call("getTaskMetadata", {"task_id": int(r["id"])}) for r in chunk])
        calls: list[Call] = []
        for row, out in zip(chunk, metas, strict=True):
            report.tasks_seen += 1
            calls += _task_calls(row, out.unwrap(), seal_key, report)
        if calls:
            for out in port.batch(calls):
                out.unwrap()
    port.call(
        "saveProjectMetadata", {"project_id": layout.project_id, "values": {META_LAYOUT: LAYOUT_VERSION}}
    )
    return report


def _long_project_values(raw: RpcPort, port: RpcPort, layout: BoardLayout, report: MigrationReport) -> None:
    for pid in (layout.project_id, layout.locks_project_id):
        meta = raw.call("getProjectMetadata", {"project_id": pid})
        long = {k: v for k, v in (meta or {}).items() if isinstance(v, str) and len(v) > VALUE_MAX}
        if long:
            port.call("saveProjectMetadata", {"project_id": pid, "values": long})
            report.values_chunked += len(long)


def _task_calls(row: dict[str, Any], meta: Any, seal_key: bytes, report: MigrationReport) -> list[Call]:
    tid = int(row["id"])
    stored = meta if isinstance(meta, dict) else {}
    calls: list[Call] = []
    long = {k: v for k, v in stored.items() if isinstance(v, str) and len(v) > VALUE_MAX}
    meta = unpack(stored)
    if long:
        # Written again through the fitting port: the same values, now in chunks.
        calls.append(Call("saveTaskMetadata", {"task_id": tid, "values": long}))
        report.values_chunked += len(long)
    view = parse_view(tid, row, meta, 0.0)
    if view.spec is None or view.uid is None or view.current is None:
        if not meta:
            report.unrecorded.append(tid)
        return calls
    update: dict[str, Any] = {}
    spec = view.spec
    if spec.action_id and row.get("reference") == legacy_receipt_reference(spec.actor, spec.action_id):
        update["reference"] = receipt_reference(spec.actor, spec.action_id)
        report.references += 1
    description = str(row.get("description") or "")
    assignee = view.records[0].assignee if 0 in view.records else None
    block = f"{SPEC_LINE}{spec_block(spec, view.uid, assignee=assignee, key=seal_key)})"
    sealed = replace_last_block(description, block)
    if sealed != description:
        update["description"] = sealed
        report.blocks_sealed += 1
    if update:
        calls.append(Call("updateTask", {"id": tid, **update}))
    return calls


# Layout 2 wrapped the fenced block in HTML, which Kanboard shows as text.
_DETAILS_OPEN = "<details><summary>fabric spec (machine-readable)</summary>\n\n"
_DETAILS_CLOSE = "\n</details>"


def replace_last_block(description: str, line: str) -> str:
    """``description`` with its last spec block (the fabric's own) replaced by ``line``.

    An old fenced block goes with the ``<details>`` element around it; "" when the
    description has no block (nothing is added).
    """
    fence, ref = description.rfind(SPEC_FENCE), description.rfind(SPEC_LINE)
    if ref > fence:
        end = description.find("\n", ref)
        return description[:ref] + line + (description[end:] if end >= 0 else "")
    end = description.find("\n```", fence + len(SPEC_FENCE)) if fence >= 0 else -1
    if end < 0:
        return description
    start, stop = fence, end + 4
    if description[:start].endswith(_DETAILS_OPEN) and description[stop:].startswith(_DETAILS_CLOSE):
        start, stop = start - len(_DETAILS_OPEN), stop + len(_DETAILS_CLOSE)
    return description[:start] + line + description[stop:]


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
