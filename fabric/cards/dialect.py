"""The cards' YAML dialect: YAML 1.2-ish scalars (no sexagesimal ``22:30`` -> 1350, no
yes/no/on/off booleans), and a duplicate key refused rather than silently overwritten.

Its own module so that yaml is imported only where a file is parsed: a process that reads
the checked cards back (fabric.cardcache) never parses one.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from fabric.cards.problems import CardProblem

__all__ = ["parse"]


class _CardLoader(yaml.SafeLoader):
    """The cards' dialect on PyYAML's Python parser: its error messages name what it found."""


_IMPLICIT: dict[Any, list[tuple[str, re.Pattern[str]]]] = {
    key: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SCALARS = (
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    ("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    ),
)


class _DuplicateKey(yaml.MarkedYAMLError):
    pass


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise _DuplicateKey(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


# The same dialect on libyaml's parser where PyYAML has it (its wheels do): parsing the cards
# is most of what a short-lived `agap claim` spends after its imports. Resolvers and
# constructors are Python with both parsers, so both read a file alike; only a file that
# does not parse is read again by the Python parser, whose messages are clearer.
_FastLoader: Any = type("_FastLoader", (getattr(yaml, "CSafeLoader", _CardLoader),), {})

for _loader in {_CardLoader, _FastLoader}:
    _loader.yaml_implicit_resolvers = {k: list(v) for k, v in _IMPLICIT.items()}
    for _tag, _rx, _first in _SCALARS:
        _loader.add_implicit_resolver(_tag, _rx, _first)
    _loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def parse(text: str, shown: str) -> tuple[Any, list[CardProblem]]:
    """The YAML in ``text`` (None if empty), or the problems parsing it; ``shown`` names the file."""
    try:
        return yaml.load(text, Loader=_FastLoader), []  # SafeLoader's constructors
    except yaml.YAMLError:
        pass
    try:
        return yaml.load(text, Loader=_CardLoader), []  # a file libyaml refused, for the message
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = f" (column {mark.column + 1})" if mark is not None else ""
        what = exc.problem or exc.context or "unreadable"
        return None, [CardProblem(shown, "", f"YAML error{col}: {what}", line=line)]
    except yaml.YAMLError as exc:
        return None, [CardProblem(shown, "", f"YAML error: {exc}")]
