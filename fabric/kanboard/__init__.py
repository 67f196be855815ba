"""Talking to Kanboard: the RPC port, its HTTP client and its failure vocabulary.

Nothing outside this package and :mod:`fabric.gateway` knows a Kanboard method name.
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
