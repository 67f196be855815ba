"""Kanboard's ``searchTasks`` query language, translated to SQL for the embedded board.

The lexer reproduces Kanboard's (measured against a real 1.2.53):

* an attribute token is ``name:`` with the name matched case-insensitively; its value is
  the *next* token only when that token is adjacent (``status: open`` drops the value and
  ``open`` becomes text);
* value tokens are tried in order: ``[<=>]{0,2}YYYY-MM-DD``, ``[<=>]{1,2}\\w+``,
  ``[<=>]{1,2}".+"``, ``"..."``, ``\\S+``; double quotes are removed from every token;
* every other token, whitespace included, is concatenated into *one* string, trimmed, that
  searches the title (``title LIKE %text%``; all digits or ``#digits`` also match the id);
* the same attribute repeated ORs, different attributes AND. ``ref:`` and ``reference:``
  are different attributes for this purpose, as in Kanboard.

Values use the flavour's ``ilike`` where Kanboard does (``%`` and ``_`` are wildcards;
SQLite folds ASCII case only, PostgreSQL all case, MySQL case and accents) and its ``=``
for names (MySQL: ``column:ready`` finds ``Ready``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from fabric.embedded.flavour import Flavour, eq_sql, get_flavour, like_sql

# Kanboard's attribute names (one filter may answer to several names).
ATTRIBUTES: tuple[str, ...] = (
    "status",
    "column",
    "swimlane",
    "assignee",
    "tag",
    "priority",
    "reference",
    "ref",
    "title",
    "description",
    "desc",
    "id",
    "color",
    "colour",
    "category",
    "creator",
    "score",
    "complexity",
    "project",
)

_ATTRIBUTE = re.compile(r"^(" + "|".join(ATTRIBUTES) + r"):", re.IGNORECASE)
_VALUE_PATTERNS = (
    re.compile(r"^(\s+)"),
    re.compile(r"^([<=>]{0,2}[0-9]{4}-[0-9]{2}-[0-9]{2})"),
    re.compile(r"^([<=>]{1,2}\w+)"),
    re.compile(r'^([<=>]{1,2}".+")'),
    re.compile(r'^("(.*?)")'),
    re.compile(r"^(\S+)"),
)
_COMPARISON_OPS = ("<=", ">=", "<", ">")

Term = tuple[str, list[object]]  # an SQL condition (empty: none) and its parameters


@dataclass
class Where:
    """An SQL condition over ``tasks t``, joined as in
    :data:`fabric.embedded.procedures.tasks._SEARCH_SELECT`."""

    sql: list[str] = field(default_factory=list)
    params: list[object] = field(default_factory=list)


def tokenize(query: str) -> dict[str, list[str]]:
    """Group a query's values by attribute (``title`` for the free text), in order."""
    tokens: list[tuple[str, str]] = []  # (kind, text): kind is an attribute, "ws" or "str"
    rest = query or ""
    while rest:
        m = _ATTRIBUTE.match(rest)
        if m:
            tokens.append((m.group(1).lower(), ""))
            rest = rest[m.end() :]
            continue
        for pattern in _VALUE_PATTERNS:
            m = pattern.match(rest)
            if m:
                text = m.group(1)
                tokens.append(("ws" if text.isspace() else "str", text.replace('"', "")))
                rest = rest[len(text) :]
                break
        else:  # pragma: no cover - \S+ or \s+ always matches a non-empty string
            break
    groups: dict[str, list[str]] = {}
    leftover = ""
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind in ("str", "ws"):
            leftover += text
        else:
            # The attribute takes the next token if it is a value; either way that next
            # token is consumed (a space after "status:" disappears with it).
            if i + 1 < len(tokens) and tokens[i + 1][0] == "str":
                groups.setdefault(kind, []).append(tokens[i + 1][1])
            i += 1
        i += 1
    leftover = leftover.strip(" \t\n\r\0\x0b")
    if leftover:
        groups["title"] = [leftover]  # the free text replaces any title: values
    return groups


def build_where(query: str, flavour: Flavour | None = None) -> Where:
    """Translate a Kanboard search query into an SQL condition on ``tasks t``."""
    f = flavour or get_flavour("sqlite")
    where = Where()
    for attr, values in tokenize(query).items():
        clauses: list[str] = []
        for value in values:
            clause, params = _term(f, attr, value)
            if clause:
                clauses.append(clause)
                where.params.extend(params)
        if clauses:
            where.sql.append("(" + " OR ".join(clauses) + ")")
    return where


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _comparison(column: str, value: str) -> Term:
    for op in _COMPARISON_OPS:
        if value.startswith(op):
            return f"{column} {op} ?", [value[len(op) :]]
    return f"{column} = ?", [value]


def _people(f: Flavour, column: str, alias: str, value: str) -> Term:
    if _digits(value):
        return f"{column} = ?", [value]
    if value in ("me", "nobody"):
        # An app-token call has no current user (id 0): "me" behaves like "nobody".
        return f"{column} = 0", []
    if value == "anybody":
        return f"{column} > 0", []
    like = f"%{value}%"
    username, name = like_sql(f, f"{alias}.username"), like_sql(f, f"{alias}.name")
    return f"({username} OR {name})", [like, like]


# Names are matched in their own (small) tables, once per query: a collation or LIKE
# function evaluated for every task row makes a sweep's cost grow with history.


def _status(f: Flavour, value: str) -> Term:
    if value == "open":
        return "t.is_active = 1", []
    if value == "closed":
        return "t.is_active = 0", []
    if _digits(value):
        return "t.is_active = ?", [value]
    return "", []


def _column(f: Flavour, value: str) -> Term:
    if _digits(value):
        return "t.column_id = ?", [value]
    return f"t.column_id IN (SELECT c2.id FROM columns c2 WHERE {eq_sql(f, 'c2.title')})", [value]


def _swimlane(f: Flavour, value: str) -> Term:
    return f"t.swimlane_id IN (SELECT s2.id FROM swimlanes s2 WHERE {like_sql(f, 's2.name')})", [value]


def _assignee(f: Flavour, value: str) -> Term:
    return _people(f, "t.owner_id", "u", value)


def _creator(f: Flavour, value: str) -> Term:
    return _people(f, "t.creator_id", "uc", value)


def _tag(f: Flavour, value: str) -> Term:
    if value == "none":
        return "t.id NOT IN (SELECT task_id FROM task_has_tags)", []
    return (
        "t.id IN (SELECT th.task_id FROM tags g JOIN task_has_tags th"
        f" ON th.tag_id = g.id WHERE {like_sql(f, 'g.name')})",
        [f"%{value}%"],
    )


def _priority(f: Flavour, value: str) -> Term:
    return _comparison("t.priority", value)


def _score(f: Flavour, value: str) -> Term:
    return _comparison("t.score", value)


def _reference(f: Flavour, value: str) -> Term:
    if value == "none":
        return "(t.reference = '' OR t.reference IS NULL)", []
    return like_sql(f, "t.reference"), [value.replace("*", "%")]


def _description(f: Flavour, value: str) -> Term:
    return like_sql(f, "t.description"), [f"%{value}%"]


def _id(f: Flavour, value: str) -> Term:
    return "t.id = ?", [value]


def _color(f: Flavour, value: str) -> Term:
    return "t.color_id = (SELECT ?)", [_color_id(value)]


def _category(f: Flavour, value: str) -> Term:
    category = eq_sql(f, "cat.name", nocase=True)
    if _digits(value):
        return f"(t.category_id = ? OR {category})", [value, value]
    if value == "none":
        return "t.category_id = 0", []
    return category, [value]


def _project(f: Flavour, value: str) -> Term:
    if _digits(value):
        return "t.project_id = ?", [value]
    return like_sql(f, "p.name"), [value]


def _title(f: Flavour, value: str) -> Term:
    """``title:`` and the free text: the title, or the id when the value is ``123`` or ``#123``."""
    title = like_sql(f, "t.title")
    if _digits(value) or (len(value) > 1 and value[0] == "#" and _digits(value[1:])):
        return f"(t.id = ? OR {title})", [value.replace("#", ""), f"%{value}%"]
    return title, [f"%{value}%"]


# Each attribute's condition; any other attribute (``title``) searches the title.
_TERMS: dict[str, Callable[[Flavour, str], Term]] = {
    "status": _status,
    "column": _column,
    "swimlane": _swimlane,
    "assignee": _assignee,
    "creator": _creator,
    "tag": _tag,
    "priority": _priority,
    "score": _score,
    "complexity": _score,
    "ref": _reference,
    "reference": _reference,
    "description": _description,
    "desc": _description,
    "id": _id,
    "color": _color,
    "colour": _color,
    "category": _category,
    "project": _project,
}


def _term(f: Flavour, attr: str, value: str) -> Term:
    return _TERMS.get(attr, _title)(f, value)


_COLOR_NAMES = {
    "yellow": "yellow",
    "blue": "blue",
    "green": "green",
    "purple": "purple",
    "red": "red",
    "orange": "orange",
    "grey": "grey",
    "brown": "brown",
    "deep orange": "deep_orange",
    "dark grey": "dark_grey",
    "pink": "pink",
    "teal": "teal",
    "cyan": "cyan",
    "lime": "lime",
    "light green": "light_green",
    "amber": "amber",
}


def _color_id(value: str) -> str:
    """A color id from an id or a display name (case-insensitive), else the default."""
    v = value.lower()
    if v in _COLOR_NAMES.values():
        return v
    return _COLOR_NAMES.get(v, "yellow")
