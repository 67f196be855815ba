"""Kanboard's "Files" procedures (task files; the content is kept in the database)."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
from typing import Any

from fabric.embedded import php
from fabric.embedded.procedures.activity import caller, deliver, file_event
from fabric.embedded.procedures.base import Board, procedure, task_row

_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")
_FILE_COLUMNS = "f.id, f.name, f.path, f.is_image, f.task_id, f.date, f.user_id, f.size"


def _file(row: sqlite3.Row) -> dict[str, Any]:
    file = dict(row)
    file["etag"] = hashlib.md5(str(file["path"]).encode()).hexdigest()
    return file


@procedure
def createTaskFile(api: Board, project_id: Any, task_id: Any, filename: Any, blob: Any) -> int | bool:
    data = php.base64_decode(php.as_text(blob))
    name = php.as_text(filename)
    now = api.now()
    with api.store.write() as db:
        task = task_row(db, task_id)
        if task is None or not php.same(task["project_id"], project_id):
            return False
        if not data or data == b"0":
            return False  # PHP's empty(): no content
        is_image = int(
            name.rsplit(".", 1)[-1].lower() in ("jpeg", "jpg", "png", "gif") if "." in name else False
        )
        if is_image and not data.startswith(_IMAGE_MAGIC):
            # Kanboard's thumbnailer dies on an image name with non-image bytes.
            raise php.Fatal("not an image")
        digest = hashlib.sha1(f"{name}{now}".encode()).hexdigest()
        file_id = api.insert(
            db,
            "task_has_files",
            {
                "name": name,
                "path": f"tasks/{task['id']}/{digest}",
                "is_image": is_image,
                "task_id": task["id"],
                "date": now,
                "user_id": caller(),  # FileModel::create: the signed-in user, else 0
                "size": len(data),
                "blob": data,
            },
        )
        event = file_event(api, db, file_id)
    deliver(api, [event])
    return file_id


@procedure
def getAllTaskFiles(api: Board, task_id: Any) -> list[dict[str, Any]]:
    with api.store.read() as db:
        rows = db.execute(
            f"SELECT {_FILE_COLUMNS}, u.username AS username, u.name AS user_name"
            " FROM task_has_files f LEFT JOIN users u ON u.id = f.user_id"
            f" WHERE f.task_id = ? ORDER BY {api.order('f.name', nocase=True)}, f.id",
            (php.to_int(task_id),),
        )
        return [api.shape("task_has_files", _file(r)) for r in rows]


@procedure
def getTaskFile(api: Board, file_id: Any) -> dict[str, Any] | None:
    with api.store.read() as db:
        row = db.execute(
            f"SELECT {_FILE_COLUMNS} FROM task_has_files f WHERE f.id = ?", (php.to_int(file_id),)
        ).fetchone()
        return None if row is None else api.shape("task_has_files", _file(row))


@procedure
def downloadTaskFile(api: Board, file_id: Any) -> str:
    with api.store.read() as db:
        row = db.execute("SELECT blob FROM task_has_files WHERE id = ?", (php.to_int(file_id),)).fetchone()
        return "" if row is None else base64.b64encode(row["blob"]).decode()


@procedure
def removeTaskFile(api: Board, file_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM task_has_files WHERE id = ?", (php.to_int(file_id),)).rowcount > 0


@procedure
def removeAllTaskFiles(api: Board, task_id: Any) -> bool:
    with api.store.write() as db:
        return db.execute("DELETE FROM task_has_files WHERE task_id = ?", (php.to_int(task_id),)).rowcount > 0
