"""The keeper's reads and writes that no other caller makes.

The keeper reads wider than a worker: several searches and the work project's metadata
in one round trip, then the metadata of every task found (and full reads of a few more)
in a second; once a day, every lock tag and every task, to collect the tags of
long-closed and deleted tasks. Its writes go through the same re-send after an
ambiguous failure as :class:`~fabric.kanboard.taskboard.TaskBoard`'s
(:mod:`fabric.kanboard.resend`); its per-task writes are TaskBoard's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fabric.kanboard.fit import fit
from fabric.kanboard.layout import META_HOOK
from fabric.kanboard.port import Call, RpcPort
from fabric.kanboard.resend import send
from fabric.kanboard.rows import (
    BoardActivity,
    BoardTag,
    BoardTask,
    activity_rows,
    meta_map,
    tag_rows,
    task_rows,
)
from fabric.kanboard.taskboard import TaskBoard
from fabric.kanboard.views import BoardLayout, TaskView, parse_view


@dataclass(frozen=True)
class LockInventory:
    """Every lock tag, every task of the work project, and the locks project's metadata."""

    tags: list[BoardTag]
    tasks: list[BoardTask]
    meta: dict[str, str]


class KeeperStore:
    """The keeper's wide reads and lock-tag removal, on one board connection."""

    def __init__(self, board: TaskBoard) -> None:
        self.board = board

    def search_with_meta(self, queries: Sequence[str]) -> tuple[list[list[BoardTask]], dict[str, str]]:
        """Each query's rows (in the work project) and the work project's metadata, in one
        round trip."""
        found, meta, _ = self.search_meta_activity(queries, with_activity=False)
        return found, meta

    def search_meta_activity(
        self, queries: Sequence[str], *, with_activity: bool = True
    ) -> tuple[list[list[BoardTask]], dict[str, str], list[BoardActivity]]:
        """:meth:`search_with_meta`, plus the work project's newest activity (who moved,
        closed, created or commented on which card), in the same round trip."""
        pid = self.board.layout.project_id
        calls = [Call("searchTasks", {"project_id": pid, "query": q}) for q in queries]
        calls.append(Call("getProjectMetadata", {"project_id": pid}))
        if with_activity:
            calls.append(Call("getProjectActivity", {"project_id": pid}))
        out = self.board.port.batch(calls)
        n = len(queries)
        activity = activity_rows(out[n + 1].unwrap()) if with_activity else []
        return [task_rows(o.unwrap()) for o in out[:n]], meta_map(out[n].unwrap()), activity

    def read_views(
        self, rows: Sequence[BoardTask], task_ids: Sequence[int]
    ) -> tuple[list[TaskView], list[TaskView]]:
        """Views of rows already fetched (only their metadata is read) and of tasks by id
        (row and metadata), in one round trip; a task gone from the board is left out."""
        if not rows and not task_ids:
            return [], []
        out = self.board.port.batch([*self.board.meta_calls(rows), *self.board.read_calls(task_ids)])
        now = self.board.clock()
        n = len(rows)
        views = [parse_view(r.id, r, o.unwrap(), now) for r, o in zip(rows, out[:n], strict=True)]
        by_id: list[TaskView] = []
        for i, tid in enumerate(task_ids):
            row, meta = out[n + 2 * i].unwrap(), out[n + 2 * i + 1].unwrap()
            if row:
                by_id.append(parse_view(tid, row, meta, now))
        return views, by_id

    def lock_inventory(self) -> LockInventory:
        """Every lock tag and every task, with the locks project's metadata (one round
        trip: its cost grows with history, so only the daily collection reads it)."""
        layout = self.board.layout
        out = self.board.port.batch(
            [
                Call("getTagsByProject", {"project_id": layout.locks_project_id}),
                Call("searchTasks", {"project_id": layout.project_id, "query": ""}),
                Call("getProjectMetadata", {"project_id": layout.locks_project_id}),
            ]
        )
        return LockInventory(tag_rows(out[0].unwrap()), task_rows(out[1].unwrap()), meta_map(out[2].unwrap()))

    def remove_tags(
        self, tags: Sequence[BoardTag], *, locks_meta: dict[str, str] | None = None
    ) -> list[BoardTag]:
        """Remove lock tags and, if given, upsert locks-project metadata, in one round trip
        (none when there is nothing to do). Returns the tags the board removed."""
        calls = [Call("removeTag", {"tag_id": t.id}) for t in tags]
        if locks_meta is not None:
            calls.append(
                Call(
                    "saveProjectMetadata",
                    {"project_id": self.board.layout.locks_project_id, "values": locks_meta},
                )
            )
        if not calls:
            return []
        out = send(self.board.port, calls)
        return [t for t, o in zip(tags, out, strict=False) if o.error is None and o.value]


def published_hooks(port: RpcPort, layout: BoardLayout) -> dict[int, str]:
    """project id -> the receiver its home's keeper published (META_HOOK), for the homes
    of ``layout`` that published one (one round trip, none without homes)."""
    homes = list(layout.homes.values())
    if not homes:
        return {}
    out = fit(port).batch([Call("getProjectMetadata", {"project_id": h.project_id}) for h in homes])
    hooks = {}
    for home, o in zip(homes, out, strict=True):
        url = str((o.unwrap() or {}).get(META_HOOK) or "")
        if url.startswith(("http://", "https://")):
            hooks[home.project_id] = url
    return hooks


__all__ = ["KeeperStore", "LockInventory", "published_hooks"]
