"""The board as routing and policy see it: read-only.

Routing (:mod:`fabric.router`) and policy (:mod:`fabric.policy`) decide; they never write
and never submit. What they may read is this protocol, which
:class:`~fabric.kanboard.taskboard.TaskBoard` satisfies (each method is one round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fabric.kanboard.card import Sealed
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.views import BoardLayout, TaskView


class ReadOnlyBoard(Protocol):
    """The reads routing and policy make: tasks, searches, references and park states.

    (A :class:`~fabric.kanboard.taskboard.TaskBoard` search also re-sends this
    connection's own lost card moves: a repair of the fabric's projection, not a change.)
    """

    @property
    def layout(self) -> BoardLayout:
        """The Kanboard ids of the work project, its columns and queue swimlanes."""
        ...

    def sealed(self, description: str) -> Sealed | None:
        """The spec the fabric sealed into a card's description (only its own blocks)."""
        ...

    def read(self, task_id: int) -> TaskView:
        """One task's row and metadata."""
        ...

    def read_many(self, task_ids: Sequence[int]) -> dict[int, TaskView]:
        """Several tasks' rows and metadata; missing tasks are omitted."""
        ...

    def search(self, query: str) -> list[BoardTask]:
        """``query`` in the work project."""
        ...

    def search_many(self, queries: Sequence[str]) -> list[list[BoardTask]]:
        """Several searches at once, answers in order."""
        ...

    def find_by_reference(self, reference: str) -> BoardTask | None:
        """The first task with this exact reference."""
        ...

    def park_states(self) -> dict[str, dict[str, Any]]:
        """Every queue's last published park state."""
        ...


__all__ = ["ReadOnlyBoard"]
