"""Command-line values every command reads the same way."""

from __future__ import annotations

import re
from typing import Any

import click

# 7, #7, task:7, task:#7, kanboard://task/7 (and a file under it): what `agap submit`
# prints, what a card links and what people write.
_TASK = re.compile(r"^(?:#|task:#?|kanboard://task/)?(\d+)(?:/.*)?$")


def task_number(text: str) -> int | None:
    """The task id ``text`` names, or None when it names none."""
    m = _TASK.match(text.strip())
    return int(m.group(1)) if m is not None and int(m.group(1)) > 0 else None


class TaskRef(click.ParamType[int]):
    """A task, named by its id or any of its refs (``7``, ``#7``, ``task:7``, ``kanboard://task/7``)."""

    name = "TASK"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        number = task_number(str(value))
        if number is None:
            self.fail(f"{value!r} is not a task: give its id or ref (7, #7 or task:7)", param, ctx)
        return number


TASK = TaskRef()

__all__ = ["TASK", "TaskRef", "task_number"]
