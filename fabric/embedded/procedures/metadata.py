"""Kanboard's "Task metadata" and "Project metadata" procedures (MetadataModel)."""

from __future__ import annotations

from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.base import Board, procedure

# Task and project metadata behave alike in Kanboard; one implementation serves both.
_META_TABLES = {
    "task": ("task_has_metadata", "task_id", "tasks"),
    "project": ("project_has_metadata", "project_id", "projects"),
}


def _meta_all(api: Board, kind: str, owner: Any) -> dict[str, Any]:
    table, col, _ = _META_TABLES[kind]
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT name, value FROM {table} WHERE {col} = ? ORDER BY {api.order('name')}",
            (php.to_int(owner),),
        )
        return {r["name"]: r["value"] for r in rows}


def _meta_one(api: Board, kind: str, owner: Any, name: Any) -> str:
    table, col, _ = _META_TABLES[kind]
    with api.store.read() as db:
        row = db.execute(
            f"SELECT value FROM {table} WHERE {col} = ? AND {api.eq('name')}",
            (php.to_int(owner), php.as_text(name)),
        ).fetchone()
    # Kanboard answers `$value ?: ''`: "" for a missing key, and for "0", "" and null.
    value = None if row is None else row["value"]
    return "" if php.empty(value) else str(value)


def _metadata_value(v: Any) -> str | None:
    return None if v is None else php.as_text(v)


def _meta_save(api: Board, kind: str, owner: Any, values: Any) -> bool:
    if not isinstance(values, dict | list):
        raise php.Fatal("values must be an array")  # a PHP TypeError: HTTP 500
    table, col, owners = _META_TABLES[kind]
    items = values.items() if isinstance(values, dict) else enumerate(values)
    rows = [(str(k), _metadata_value(v)) for k, v in items]
    if not rows:
        return True  # Kanboard: saving nothing succeeds without looking
    oid, now, same = php.to_int(owner), api.now(), api.eq("name")
    with api.store.write() as db:
        if db.execute(f"SELECT 1 FROM {owners} WHERE id = ?", (oid,)).fetchone() is None:
            return False
        # Kanboard's MetadataModel::save, in one transaction: UPDATE when exists(name),
        # else INSERT. The lookup compares as the backend does (on MySQL {"key": ..}
        # updates a stored "Key"); a name or value over its VARCHAR limit is an SQL error
        # that rolls back every key of the call.
        for name, value in rows:
            if db.execute(f"SELECT 1 FROM {table} WHERE {col} = ? AND {same}", (oid, name)).fetchone():
                db.execute(
                    f"UPDATE {table} SET value = ?, changed_on = ? WHERE {col} = ? AND {same}",
                    (api.fit(table, "value", value), now, oid, name),
                )
            else:
                db.execute(
                    f"INSERT INTO {table} ({col}, name, changed_on, value) VALUES (?,?,?,?)",
                    (oid, api.fit(table, "name", name), now, api.fit(table, "value", value)),
                )
        return True


def _meta_remove(api: Board, kind: str, owner: Any, name: Any) -> bool:
    table, col, _ = _META_TABLES[kind]
    with api.store.write() as db:
        return (
            db.execute(
                f"DELETE FROM {table} WHERE {col} = ? AND {api.eq('name')}",
                (php.to_int(owner), php.as_text(name)),
            ).rowcount
            > 0
        )


@procedure
def getTaskMetadata(api: Board, task_id: Any) -> dict[str, Any]:
    return _meta_all(api, "task", task_id)


@procedure
def getTaskMetadataByName(api: Board, task_id: Any, name: Any) -> str:
    return _meta_one(api, "task", task_id, name)


@procedure
def saveTaskMetadata(api: Board, task_id: Any, values: Any) -> bool:
    return _meta_save(api, "task", task_id, values)


@procedure
def removeTaskMetadata(api: Board, task_id: Any, name: Any) -> bool:
    return _meta_remove(api, "task", task_id, name)


@procedure
def getProjectMetadata(api: Board, project_id: Any) -> dict[str, Any]:
    return _meta_all(api, "project", project_id)


@procedure
def getProjectMetadataByName(api: Board, project_id: Any, name: Any) -> str:
    return _meta_one(api, "project", project_id, name)


@procedure
def saveProjectMetadata(api: Board, project_id: Any, values: Any) -> bool:
    return _meta_save(api, "project", project_id, values)


@procedure
def removeProjectMetadata(api: Board, project_id: Any, name: Any) -> bool:
    return _meta_remove(api, "project", project_id, name)
