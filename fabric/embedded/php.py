"""PHP's value semantics, as Kanboard's API exposes them to a JSON-RPC caller.

Kanboard is PHP: an int param may arrive as ``"2"``, ``empty()`` treats ``"0"`` as
nothing, PDO binds ``true`` as ``1``, and a type error is an HTTP 500. The procedures of
the embedded board use these helpers wherever Kanboard's answer depends on them.
"""

from __future__ import annotations

import base64
import re
from typing import Any


class Fatal(Exception):
    """What PHP would turn into an HTTP 500 with an empty body (e.g. a type error)."""


class _Absent:
    """Default of a parameter PHP types as ``array``: tells "not given" from ``null``."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def empty(v: Any) -> bool:
    """PHP's ``empty()``."""
    return v is None or v is False or v == 0 or v == "" or v == "0" or v == [] or v == {}


def given(v: Any) -> bool:
    """SimpleValidator's "field not empty": set and not the empty string."""
    return v is not None and v is not ABSENT and v != ""


def to_int(v: Any) -> int:
    """PHP's ``(int)`` cast, for lookups."""
    if v is None or isinstance(v, list | dict):
        return 0
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else 0
    m = re.match(r"\s*([+-]?\d+)", str(v))
    return int(m.group(1)) if m else 0


def is_integer(v: Any) -> bool:
    """SimpleValidator's Integer rule (empty passes)."""
    if not given(v):
        return True
    if isinstance(v, str):
        digits = v[1:] if v.startswith("-") else v
        return digits.isascii() and digits.isdigit()
    return isinstance(v, int) and not isinstance(v, bool)


_NUMERIC = re.compile(r"^[ \t\n\r\v\f]*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?[ \t\n\r\v\f]*$")


def is_numeric(v: Any) -> bool:
    """PHP's ``is_numeric`` (empty passes, as in the Numeric rule)."""
    if not given(v):
        return True
    if isinstance(v, bool):
        return False
    if isinstance(v, int | float):
        return True
    return isinstance(v, str) and bool(_NUMERIC.match(v))


def as_text(v: Any) -> str:
    """PHP's string conversion of a scalar (what Kanboard stores in a text column)."""
    if v is None or v is False or v is ABSENT:
        return ""
    if v is True:
        return "1"
    if isinstance(v, list | dict):
        return "Array"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return repr(v)
    return str(v)


def stored(v: Any) -> Any:
    """A value as PDO binds it: scalars as they are, booleans as 1/"", arrays fatal."""
    if isinstance(v, list | dict):
        raise Fatal("array to scalar conversion")
    if v is True:
        return 1
    if v is False:
        return ""
    return v


def same(a: Any, b: Any) -> bool:
    """PHP 8's loose ``==`` between ids: ``"2" == 2``, but ``"" != 0`` and ``"x" != 0``."""
    if a is None or b is None:
        return empty(a) and empty(b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


_B64_ALPHABET = re.compile(rb"[^A-Za-z0-9+/]")


def base64_decode(text: str) -> bytes:
    """PHP's non-strict ``base64_decode``: foreign characters are skipped, padding optional."""
    data = _B64_ALPHABET.sub(b"", text.split("=", 1)[0].encode("utf-8", "replace"))
    data = data[: len(data) - (len(data) % 4 == 1)]
    return base64.b64decode(data + b"=" * (-len(data) % 4))
