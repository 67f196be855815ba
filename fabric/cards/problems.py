"""What is wrong with the cards, one readable line per problem.

A pydantic :class:`~pydantic.ValidationError` becomes :class:`CardProblem`\\ s here: the
field path without pydantic's union tags, and a message a person can act on. Pydantic is
not imported here: what reads the checked cards back needs :class:`CardErrors` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from functools import cache
from typing import TYPE_CHECKING, Any

from fabric.cards import schema
from fabric.cards.fields import CHANNEL_TYPES, SHAPES, RuleViolations
from fabric.errors import InvalidInput
from fabric.plain import Plain

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["CardErrors", "CardProblem", "error_message", "validation_problems"]


class CardProblem(Plain):
    """One thing wrong with one card file; ``field`` is a dotted path (``availability.0.limit``)
    or empty for the file as a whole; ``line`` is set for YAML syntax errors."""

    file: str
    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class CardErrors(InvalidInput):
    """The cards do not load; :attr:`problems` lists every problem found, one per line."""

    def __init__(self, problems: Sequence[CardProblem], *, where: str = "", hint: str = "") -> None:
        self.problems = list(problems)
        n = len(self.problems)
        what = f"{n} problem{'s' if n != 1 else ''} in agent cards"
        super().__init__(what, where=where, hint=hint)

    def line(self) -> str:
        if len(self.problems) == 1 and not self.hint:
            return str(self.problems[0])
        return "\n".join([super().line(), *(str(p) for p in self.problems)])


# ---------------------------------------------------------------------------------------
# Validation errors -> one readable line each

_TAGS = frozenset(SHAPES) | frozenset(CHANNEL_TYPES)


@cache
def _all_fields() -> list[str]:
    """Every field name of a card or golden set (for "did you mean")."""
    classes = (getattr(schema, name) for name in schema.__all__)
    return sorted({f.name for cls in classes if isinstance(cls, type) for f in fields(cls)})


_TAG_CHOICES = {"shape": SHAPES, "type": CHANNEL_TYPES}


def _clean_loc(loc: Sequence[int | str]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(loc):
        # A discriminated union puts the tag in the path (availability.0.quota.limit).
        if isinstance(part, str) and part in _TAGS and i > 0 and isinstance(loc[i - 1], int):
            continue
        out.append(str(part))
    return out


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_SIMPLE_MESSAGES = {
    "missing": "required",
    "string_type": "must be text",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "model_type": "must be a mapping (key: value)",
    "dict_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
}
# A bound's error type -> (the words, the ctx key holding the bound).
_BOUND_MESSAGES = {
    "greater_than": ("must be greater than", "gt"),
    "greater_than_equal": ("must be at least", "ge"),
    "less_than": ("must be less than", "lt"),
    "less_than_equal": ("must be at most", "le"),
}


def _message(err: Any) -> str:
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    if kind in _SIMPLE_MESSAGES:
        return _SIMPLE_MESSAGES[kind]
    if kind in _BOUND_MESSAGES:
        words, key = _BOUND_MESSAGES[kind]
        return f"{words} {_num(ctx[key])}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty" if ctx.get("min_length") == 1 else err["msg"]
    if kind in ("too_long", "string_too_long"):
        limit = ctx.get("max_length")
        unit = "characters" if kind == "string_too_long" else "items"
        return f"is longer than {limit} {unit} (pass long text by reference)"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {err['input']!r})"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return _union_tag_message(kind, ctx)
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    msg: str = err["msg"]
    return msg[:1].lower() + msg[1:]


def error_message(err: Any) -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) in the fabric's words."""
    return _message(err)


def _union_tag_message(kind: str, ctx: dict[str, Any]) -> str:
    """An unknown or missing ``shape``/``type`` tag, with the tags there are."""
    disc = str(ctx.get("discriminator", "")).strip("'")
    choices = ", ".join(_TAG_CHOICES.get(disc, ()))
    if kind == "union_tag_invalid":
        return f"unknown {disc} {ctx.get('tag')!r} (one of: {choices})"
    return f"needs a {disc!r} (one of: {choices})"


def validation_problems(shown: str, exc: ValidationError) -> list[CardProblem]:
    """Every error in ``exc`` as a problem of the file ``shown``, one per field."""
    out: list[CardProblem] = []
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        error = (err.get("ctx") or {}).get("error")
        if err["type"] == "value_error" and isinstance(error, RuleViolations):
            for sub, message in error.problems:
                path = [*loc, *sub.split(".")] if sub else loc
                out.append(CardProblem(shown, ".".join(path), message))
            continue
        if err["type"] == "extra_forbidden":
            unknown = loc[-1] if loc else ""
            import difflib  # here: only a refusal needs it

            close = difflib.get_close_matches(unknown, _all_fields(), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(CardProblem(shown, ".".join(loc), f"unknown field{hint}"))
            continue
        out.append(CardProblem(shown, ".".join(loc), _message(err)))
    return out
