"""The work project and the confined agents' homes, read as one board, for policy.

A confined agent's tasks live in its home (:mod:`fabric.kanboard.principals`), yet what
they produced is referred to from everywhere: a task ref, a result file named after its
uid, a descendant's ancestry. Policy (privacy domains, taint) must find those tasks
wherever they are, so it reads through :class:`SpanningReader`: each search runs in the
work project and in every home *in the same round trip*, reads by id are global with the
application token anyway, and the park states are merged. Writes never go through it:
a task is written only on the board of the project it lives in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fabric.kanboard.card import Sealed
from fabric.kanboard.layout import Column
from fabric.kanboard.port import Call
from fabric.kanboard.rows import BoardTask, task_rows
from fabric.kanboard.taskboard import TaskBoard
from fabric.kanboard.views import BoardLayout, TaskView, parse_park_states


class SpanningReader:
    """A :class:`~fabric.kanboard.reader.ReadOnlyBoard` over ``main`` and ``homes``."""

    def __init__(self, main: TaskBoard, homes: Sequence[TaskBoard]) -> None:
        self.main = main
        self.homes = list(homes)

    @property
    def layout(self) -> BoardLayout:
        return self.main.layout

    def sealed(self, description: str) -> Sealed | None:
        return self.main.sealed(description)

    def read(self, task_id: int) -> TaskView:
        return self.main.read(task_id)

    def read_many(self, task_ids: Sequence[int]) -> dict[int, TaskView]:
        return self.main.read_many(task_ids)

    def search(self, query: str) -> list[BoardTask]:
        return self.search_many([query])[0]

    def search_many(self, queries: Sequence[str]) -> list[list[BoardTask]]:
        """Each query in every project, one round trip; a query's hits from all of them."""
        if not queries:
            return []
        boards = [self.main, *self.homes]
        calls = [
            Call("searchTasks", {"project_id": b.layout.project_id, "query": q})
            for q in queries
            for b in boards
        ]
        out = self.main.port.batch(calls)
        n = len(boards)
        return [
            [row for o in out[i * n : (i + 1) * n] for row in task_rows(o.unwrap())]
            for i in range(len(queries))
        ]

    def search_with_parks(self, query: str) -> tuple[list[BoardTask], dict[str, dict[str, Any]]]:
        """A search in every project and every park state, in one round trip."""
        boards = [self.main, *self.homes]
        calls = [Call("searchTasks", {"project_id": b.layout.project_id, "query": query}) for b in boards]
        calls += [Call("getProjectMetadata", {"project_id": b.layout.project_id}) for b in reversed(boards)]
        out = self.main.port.batch(calls)
        rows = [row for o in out[: len(boards)] for row in task_rows(o.unwrap())]
        parks: dict[str, dict[str, Any]] = {}
        for o in out[len(boards) :]:  # the work project's last: its park states win
            parks.update(parse_park_states(o.unwrap()))
        return rows, parks

    def columns(self) -> dict[int, Column]:
        """Every project's column ids, by the fabric column they are."""
        return {i: c for b in (self.main, *self.homes) for c, i in b.layout.columns.items()}

    def queue_of(self, swimlane_id: int) -> str | None:
        """The queue a swimlane of any of the projects is."""
        for board in (self.main, *self.homes):
            queue = board.layout.queue_of(swimlane_id)
            if queue is not None:
                return queue
        return None

    def find_by_reference(self, reference: str) -> BoardTask | None:
        for board in (self.main, *self.homes):
            row = board.find_by_reference(reference)
            if row is not None:
                return row
        return None

    def park_states(self) -> dict[str, dict[str, Any]]:
        """Every queue's park state, wherever its worker published it (one round trip)."""
        boards = [*self.homes, self.main]
        out = self.main.port.batch(
            [Call("getProjectMetadata", {"project_id": b.layout.project_id}) for b in boards]
        )
        states: dict[str, dict[str, Any]] = {}
        for o in out:
            states.update(parse_park_states(o.unwrap()))
        return states


__all__ = ["SpanningReader"]
