"""Talking to Kanboard: the RPC port, its HTTP client and its failure vocabulary.

Nothing outside this package (and the embedded stand-in, :mod:`fabric.embedded`) knows a
Kanboard method name, a row's field names or a metadata key: the rest of the fabric calls
:class:`~fabric.kanboard.taskboard.TaskBoard` and reads the typed rows of
:mod:`fabric.kanboard.rows`.
"""

from fabric.kanboard.port import (
    BoardAuthError,
    BoardError,
    BoardRefused,
    BoardUnavailable,
    Call,
    MaybeDone,
    Outcome,
    RpcError,
    RpcPort,
)

__all__ = [
    "BoardAuthError",
    "BoardError",
    "BoardRefused",
    "BoardUnavailable",
    "Call",
    "MaybeDone",
    "Outcome",
    "RpcError",
    "RpcPort",
]
