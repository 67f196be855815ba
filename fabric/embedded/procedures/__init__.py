"""The embedded board's JSON-RPC procedures, one module per group of Kanboard's API reference.

Importing this package imports every group, and each group registers its procedures
(:func:`fabric.embedded.procedures.base.procedure`) as it is imported: the dispatcher
(:mod:`fabric.embedded.rpc`) imports it for that.
"""

# Imported for their side effect: each module registers its procedures.
from fabric.embedded.procedures import (
    activity,
    app,
    categories,
    columns,
    comments,
    files,
    metadata,
    projects,
    swimlanes,
    tags,
    tasks,
    users,
)

__all__ = [
    "activity",
    "app",
    "categories",
    "columns",
    "comments",
    "files",
    "metadata",
    "projects",
    "swimlanes",
    "tags",
    "tasks",
    "users",
]
