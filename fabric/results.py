"""Where results go. A result is always addressed by a reference (a URI), never pasted.

Two stores:

* :class:`AttachmentStore` (the default): the result is a file attached to the Kanboard
  task; its ref is ``kanboard://task/<id>/file/<name>``.
* :class:`DirectoryStore`: the result is a file in a directory (a shared volume, a
  synced folder); its ref is a ``file://`` URI.

File names carry the epoch that produced them, so a fenced owner's late file can never
be mistaken for the accepted result: only the ref in the done record counts.
"""

from __future__ import annotations

import base64
import re
import threading
from pathlib import Path
from typing import Protocol

from fabric.errors import ConfigError, InvalidInput
from fabric.kanboard.taskboard import TaskBoard
from fabric.ledger import Lease

_ATTACHMENT = re.compile(r"^kanboard://task/(\d+)/file/([^/]+)$")


def result_name(lease: Lease, suffix: str = "md") -> str:
    """``result-e<epoch>.<suffix>``: the file name of the result made under ``lease``."""
    return f"result-e{lease.epoch}.{suffix}"


class AttachedFiles:
    """The Kanboard file id of each result this process attached, by ref, so the done
    card can link the attachment itself (a worker's slots each have their own board
    connection; this is shared). Bounded: an id not found only makes the link coarser."""

    def __init__(self, limit: int = 1024) -> None:
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()
        self.limit = limit

    def add(self, ref: str, file_id: int) -> None:
        with self._lock:
            if len(self._ids) >= self.limit:
                self._ids.pop(next(iter(self._ids)))
            self._ids[ref] = file_id

    def take(self, ref: str) -> int | None:
        with self._lock:
            return self._ids.pop(ref, None)


ATTACHED = AttachedFiles()


def result_url(board: TaskBoard, ref: str) -> str | None:
    """The page in Kanboard that opens the result ``ref`` (its attachment in the file
    viewer), when this process attached it and the board has a web address."""
    m = _ATTACHMENT.match(ref)
    file_id = ATTACHED.take(ref) if m else None
    if m is None or file_id is None or board.links is None:
        return None
    return board.links.file(int(m.group(1)), file_id)


class ResultStore(Protocol):
    """Stores a result and returns its ref; reads a ref back."""

    def put(self, lease: Lease, text: str) -> str:
        """Store ``text`` as the result made under ``lease``; return its ref."""
        ...

    def get(self, ref: str) -> str:
        """The text behind a ref this store made."""
        ...


class AttachmentStore:
    """Results as Kanboard task attachments (one round trip per result)."""

    def __init__(self, board: TaskBoard) -> None:
        self.board = board

    def put(self, lease: Lease, text: str) -> str:
        name = result_name(lease)
        blob = base64.b64encode(text.encode()).decode()
        file_id = self.board.attach_file(lease.task_id, name, blob, what="the result")
        ref = f"kanboard://task/{lease.task_id}/file/{name}"
        ATTACHED.add(ref, file_id)
        return ref

    def get(self, ref: str) -> str:
        m = _ATTACHMENT.match(ref)
        if not m:
            raise InvalidInput(
                f"not an attachment ref: {ref!r}",
                where="result ref",
                hint="expected kanboard://task/<id>/file/<name>",
            )
        task_id, name = int(m.group(1)), m.group(2)
        for f in self.board.files(task_id):
            if f.name == name:
                return base64.b64decode(self.board.download(f.id)).decode()
        raise InvalidInput(f"task #{task_id} has no file {name!r}", where=ref)


class DirectoryStore:
    """Results as files under a directory: ``<root>/<task uid>/result-e<epoch>.md``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def put(self, lease: Lease, text: str) -> str:
        folder = self.root / lease.uid
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / result_name(lease)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # a reader never sees half a result
        return path.as_uri()

    def get(self, ref: str) -> str:
        if not ref.startswith("file://"):
            raise InvalidInput(f"not a file ref: {ref!r}", where="result ref")
        path = Path(ref[len("file://") :]).resolve()
        if self.root not in path.parents:
            raise InvalidInput(f"{ref} is outside the result directory {self.root}", where="result ref")
        return path.read_text()


def read_result(board: TaskBoard, task_id: int, ref: str, result_dir: str | None = None) -> str | None:
    """The text of a result the fabric stored, or None for a ref it did not store (a pull
    request, a page): only ``task_id``'s own attachment, or a file under ``result_dir``."""
    m = _ATTACHMENT.match(ref)
    if m and int(m.group(1)) == task_id:
        return AttachmentStore(board).get(ref)
    if ref.startswith("file://") and result_dir:
        return DirectoryStore(result_dir).get(ref)  # refuses paths outside the directory
    return None


def store_for(kind: str, board: TaskBoard, directory: str | None = None) -> ResultStore:
    """The store named by ``AGAP_RESULT_STORE`` (``attachment`` or ``dir``)."""
    if kind in ("", "attachment", "kanboard"):
        return AttachmentStore(board)
    if kind in ("dir", "directory"):
        if not directory:
            raise ConfigError(
                "AGAP_RESULT_STORE=dir needs AGAP_RESULT_DIR",
                hint="set AGAP_RESULT_DIR to a directory for results",
            )
        return DirectoryStore(directory)
    raise ConfigError(
        f"unknown result store {kind!r}", where="AGAP_RESULT_STORE", hint="use attachment or dir"
    )
