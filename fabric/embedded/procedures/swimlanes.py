"""Kanboard's "Swimlanes" procedures."""

from __future__ import annotations

from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure, project_row, row_dict


@procedure
def getActiveSwimlanes(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM swimlanes WHERE project_id = ? AND is_active = 1 ORDER BY position, id",
            (php.to_int(project_id),),
        )
        return api.rows("swimlanes", rows)


@procedure
def getAllSwimlanes(api: Board, project_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            "SELECT * FROM swimlanes WHERE project_id = ? ORDER BY position, id",
            (php.to_int(project_id),),
        )
        return api.rows("swimlanes", rows)


@procedure
def getSwimlaneByName(api: Board, project_id: Any, name: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(
            db.execute(
                f"SELECT * FROM swimlanes WHERE project_id = ? AND {api.eq('name')} ORDER BY id LIMIT 1",
                (php.to_int(project_id), php.as_text(name)),
            ).fetchone()
        )
        return None if row is None else api.shape("swimlanes", row)


@procedure
def getSwimlane(api: Board, swimlane_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = row_dict(
            db.execute("SELECT * FROM swimlanes WHERE id = ?", (php.to_int(swimlane_id),)).fetchone()
        )
        return None if row is None else api.shape("swimlanes", row)


@procedure
def getSwimlaneById(api: Board, swimlane_id: Any) -> dict[str, Any] | None:
    return getSwimlane(api, swimlane_id)  # type: ignore[no-any-return]


@procedure
def addSwimlane(api: Board, project_id: Any, name: Any, description: Any = "") -> int | bool:
    with api.store.write() as db:
        pid = php.to_int(project_id)
        if db.execute(
            f"SELECT 1 FROM swimlanes WHERE project_id = ? AND {api.eq('name')}",
            (pid, php.as_text(name)),
        ).fetchone():
            return False
        if project_row(db, pid) is None:
            return 0  # the insert fails on the foreign key: (int) false
        (pos,) = db.execute(
            "SELECT COALESCE(MAX(position), 0) + 1 FROM swimlanes WHERE project_id = ?", (pid,)
        ).fetchone()
        return api.insert(
            db,
            "swimlanes",
            {
                "name": api.fit("swimlanes", "name", php.as_text(name)),
                "position": pos,
                "project_id": pid,
                "description": php.as_text(description),
            },
        )


@procedure
def disableSwimlane(api: Board, project_id: Any, swimlane_id: Any) -> bool:
    """Hide a lane from the board (its tasks with it). As Kanboard: position 0, the active
    lanes renumbered from 1, and true even when no lane matched."""
    with api.store.write() as db:
        pid = php.to_int(project_id)
        db.execute(
            "UPDATE swimlanes SET is_active = 0, position = 0 WHERE id = ? AND project_id = ?",
            (php.to_int(swimlane_id), pid),
        )
        active = db.execute(
            "SELECT id FROM swimlanes WHERE project_id = ? AND is_active = 1 ORDER BY position, id", (pid,)
        ).fetchall()
        db.executemany(
            "UPDATE swimlanes SET position = ? WHERE id = ?",
            [(i, lane) for i, (lane,) in enumerate(active, start=1)],
        )
        return True


@procedure
def enableSwimlane(api: Board, project_id: Any, swimlane_id: Any) -> bool:
    """Show a lane again, last (at the number of active lanes plus one); true even when
    no lane matched, as Kanboard."""
    with api.store.write() as db:
        pid = php.to_int(project_id)
        (last,) = db.execute(
            "SELECT COUNT(*) + 1 FROM swimlanes WHERE project_id = ? AND is_active = 1", (pid,)
        ).fetchone()
        db.execute(
            "UPDATE swimlanes SET is_active = 1, position = ? WHERE id = ? AND project_id = ?",
            (last, php.to_int(swimlane_id), pid),
        )
        return True
