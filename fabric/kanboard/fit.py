"""Fitting what the fabric stores into the columns of every Kanboard backend.

Kanboard on PostgreSQL and MySQL/MariaDB keeps metadata in ``name VARCHAR(50)`` and
``value VARCHAR(255)`` (SQLite uses TEXT), and its validator caps a task's ``reference``
at 191 characters. The fabric's records, specs and answers are often longer, so a
value over 255 characters is stored in *chunks*: the head under the key itself, the
rest under ``<key>~1``, ``<key>~2``, … all in the same ``saveTaskMetadata`` call, which
Kanboard runs in one transaction, so a reader never sees half a value.

A head value is ``~<count>.<digest>~<first part>``; ``digest`` is the first 8 hex digits
of the SHA-256 of the whole value, so a chunk that does not belong (left from an older,
longer value, or mangled by hand) is detected instead of read. A short value is stored
as it is, unless it starts with ``~``: then it is chunked too, so no stored value is
ambiguous. Old values of any length written before this layout are read as they are.

:class:`FittedPort` applies this on the storage port itself, so no caller can write a
value that some backend would refuse: it packs on the ``save*Metadata`` procedures,
unpacks on ``get*Metadata``, and refuses, before sending anything, a name or reference
that cannot fit. It also replaces the two things no backend stores in text, a NUL
(PostgreSQL refuses it) and a lone UTF-16 surrogate (PHP's JSON decoder refuses the
whole request), with U+FFFD: such text can only come from a caller's JSON, and losing
one unprintable character beats losing the write.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fabric.errors import EXIT_STORAGE, FabricError
from fabric.kanboard.port import Call, Outcome, Params, RoundTrips, RpcPort
from fabric.task import clean_text

NAME_MAX = 50  # task/project/user metadata name: VARCHAR(50) on PostgreSQL and MySQL
VALUE_MAX = 255  # metadata value: VARCHAR(255) on PostgreSQL and MySQL
REFERENCE_MAX = 191  # a task reference: Kanboard's TaskValidator, every backend
CHUNK_MARK = "~"
MAX_CHUNKS = 999  # three digits of suffix
LOGICAL_NAME_MAX = NAME_MAX - 1 - len(str(MAX_CHUNKS))  # room for "~999"
MAX_VALUE_CHARS = MAX_CHUNKS * VALUE_MAX - 16  # less the longest head header

SAVE_METADATA = frozenset({"saveTaskMetadata", "saveProjectMetadata", "saveUserMetadata"})
GET_METADATA = frozenset({"getTaskMetadata", "getProjectMetadata", "getUserMetadata"})
# Reading one key cannot reassemble its chunks: the fabric never reads by name.
BY_NAME = frozenset({"getTaskMetadataByName", "getProjectMetadataByName", "getUserMetadataByName"})
WITH_REFERENCE = frozenset({"createTask", "updateTask"})

_HEAD = re.compile(r"^~(\d{1,3})\.([0-9a-f]{8})~")


class StorageLimit(FabricError):
    """Something the fabric was about to store cannot fit on a real Kanboard backend.

    Raised before anything is sent, so nothing is half-written. It means a name or a
    value the fabric builds is longer than any backend can hold: a bug to report.
    """

    exit_code = EXIT_STORAGE

    def __init__(self, what: str, *, where: str = "board storage") -> None:
        super().__init__(what, where=where, hint="nothing was written; shorten the input or report this line")


def check_name(name: str) -> str:
    """``name`` if it can be a logical metadata key on every backend, else StorageLimit."""
    if (
        not name
        or len(name) > LOGICAL_NAME_MAX
        or CHUNK_MARK in name
        or name != name.lower()
        or not name.isascii()
    ):
        raise StorageLimit(
            f"metadata name {name[:60]!r} is not lowercase ASCII of at most "
            f"{LOGICAL_NAME_MAX} characters without {CHUNK_MARK!r}"
        )
    return name


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def pack(values: Mapping[str, Any]) -> dict[str, Any]:
    """Logical ``{name: value}`` to stored ``{name: value}``, each fitting every backend."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        check_name(str(name))
        if not isinstance(value, str) or (len(value) <= VALUE_MAX and not value.startswith(CHUNK_MARK)):
            out[str(name)] = value  # numbers and short strings are stored as they are
            continue
        if len(value) > MAX_VALUE_CHARS:
            raise StorageLimit(
                f"metadata {name!r} would hold {len(value)} characters, more "
                f"than the {MAX_VALUE_CHARS} the fabric stores in one key"
            )
        out.update(_chunks(str(name), value))
    return out


def _chunks(name: str, value: str) -> dict[str, str]:
    digest = _digest(value)
    # The header's width depends on the count, and the count on the header's width.
    count = 1
    while True:
        head_room = VALUE_MAX - len(f"~{count}.{digest}~")
        needed = 1 + max(0, -(-(len(value) - head_room) // VALUE_MAX))
        if needed <= count:
            break
        count = needed
    header = f"~{count}.{digest}~"
    head_room = VALUE_MAX - len(header)
    parts = {name: header + value[:head_room]}
    rest = value[head_room:]
    for i in range(1, count):
        parts[f"{name}{CHUNK_MARK}{i}"] = rest[(i - 1) * VALUE_MAX : i * VALUE_MAX]
    return parts


def unpack(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Stored metadata back to logical ``{name: value}``.

    A chunked value whose pieces are missing or do not match its digest is returned as
    its raw head (which no reader parses), so the damage shows up as an unreadable key
    instead of a wrong value.
    """
    out: dict[str, Any] = {}
    for name, value in stored.items():
        if CHUNK_MARK in name:
            continue  # a continuation: read through its head
        m = _HEAD.match(value) if isinstance(value, str) else None
        if m is None:
            out[name] = value
            continue
        count, digest = int(m.group(1)), m.group(2)
        pieces = [value[m.end() :]]
        for i in range(1, count):
            piece = stored.get(f"{name}{CHUNK_MARK}{i}")
            if not isinstance(piece, str):
                break
            pieces.append(piece)
        whole = "".join(pieces)
        out[name] = whole if len(pieces) == count and _digest(whole) == digest else value
    return out


def stored_sizes(stored: Mapping[str, Any]) -> tuple[int, int]:
    """The longest stored name and value (what a backend's columns must hold)."""
    longest_name = max((len(str(k)) for k in stored), default=0)
    longest_value = max((len(v) for v in stored.values() if isinstance(v, str)), default=0)
    return longest_name, longest_value


class FittedPort:
    """An :class:`RpcPort` that stores metadata in chunks and refuses what cannot fit.

    It costs no round trip: each call stays one call, with more keys in its values.
    """

    def __init__(self, inner: RpcPort) -> None:
        self.inner = inner
        self.stats: RoundTrips = inner.stats  # the same counters: a call is still a call

    def call(self, method: str, params: Params = None) -> Any:
        return self.batch([Call(method, params)])[0].unwrap()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        sent = [_fit_call(c) for c in calls]
        out = self.inner.batch(sent)
        return [_fit_outcome(orig, o) for orig, o in zip(calls, out, strict=True)]

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def fit(port: RpcPort) -> RpcPort:
    """``port`` wrapped in a :class:`FittedPort` (once: wrapping twice is a no-op)."""
    return port if isinstance(port, FittedPort) else FittedPort(port)


def _fit_call(call: Call) -> Call:
    call = Call(call.method, clean_text(call.params))
    if call.method in BY_NAME:
        raise StorageLimit(f"{call.method} cannot read a chunked value", where=call.method)
    if call.method in SAVE_METADATA:
        return Call(call.method, _with_param(call.params, "values", 1, pack))
    if call.method in WITH_REFERENCE:
        # The fabric names its parameters; positional ones are left to the board.
        ref = call.params.get("reference") if isinstance(call.params, Mapping) else None
        if isinstance(ref, str) and len(ref) > REFERENCE_MAX:
            raise StorageLimit(
                f"task reference of {len(ref)} characters (Kanboard holds {REFERENCE_MAX})", where=call.method
            )
    return call


def _fit_outcome(call: Call, outcome: Outcome) -> Outcome:
    if call.method in GET_METADATA and isinstance(outcome.value, dict):
        return Outcome(call, value=unpack(outcome.value), error=outcome.error)
    return outcome


def _param(params: Params, name: str, position: int) -> Any:
    if isinstance(params, Mapping):
        return params.get(name)
    if isinstance(params, Sequence) and not isinstance(params, str) and len(params) > position:
        return params[position]
    return None


def _with_param(params: Params, name: str, position: int, change: Any) -> Params:
    value = _param(params, name, position)
    if not isinstance(value, Mapping):
        return params  # not a map: let the board answer as it would
    if isinstance(params, Mapping):
        return {**params, name: change(value)}
    assert isinstance(params, Sequence)
    items = list(params)
    items[position] = change(value)
    return items
