"""Dataclasses made without compiling code: what ``agap claim``, ``heartbeat`` and a worker
start with.

Python 3.11's ``@dataclass`` writes the source of each method of each class it makes
(``__init__``, ``__repr__``, ``__eq__``, a frozen class's ``__hash__``, ``__setattr__`` and
``__delattr__``) and compiles it with an ``exec`` apiece: about 4.7 M instructions for a
frozen class, 84 M for the cards' 18 classes, a tenth of a short-lived ``agap heartbeat``
(docs/BENCHMARKS.md, "Worker memory and CLI start"). A :class:`Plain` subclass declares
its fields as a dataclass does (annotations; defaults; :func:`dataclasses.field` with a
``default`` or a ``default_factory``) and gets the same behaviour from methods written once
here: construction (positional and keyword, or keyword only with ``kw_only=True``),
``__post_init__``, the dataclass ``repr``, equality and hash by field values, and no
assignment after construction (``frozen=False`` allows it, and makes the class unhashable,
as a dataclass with ``eq`` is). It is a dataclass to ``dataclasses.fields``, ``replace``,
``asdict`` and ``is_dataclass``, and through :func:`typing.dataclass_transform` to mypy.
``tests/unit/test_plain.py`` holds it beside real dataclasses.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import Field
from reprlib import recursive_repr
from typing import Any, ClassVar, dataclass_transform

__all__ = ["Plain"]

_MISSING: Any = dataclasses.MISSING
# dataclasses.fields() lists the fields that carry dataclasses' own marker (its private
# _FIELD, in a field's private _field_type: both unchanged since Python 3.7, and
# tests/unit/test_plain.py fails if they change). The only private names used here.
_KIND = dataclasses._FIELD  # type: ignore[attr-defined]
_PUBLIC_DEFAULTS = dataclasses.field()  # what a field() that says only default or factory holds


def _is_classvar(annotation: object) -> bool:
    # Annotations are strings under ``from __future__ import annotations`` (as dataclasses
    # reads them then: ``ClassVar[...]``, ``typing.ClassVar[...]``), objects without it.
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


def _field(name: str, annotation: object, kw_only: bool, given: Any) -> Field[Any]:
    """Field ``name`` as the class body gave it (a default, a :func:`dataclasses.field`, or
    nothing), marked as dataclasses marks its own."""
    if not isinstance(given, Field):
        if given is not _MISSING and type(given).__hash__ is None:  # dataclasses' own rule
            what = f"mutable default {type(given)} for field {name} is not allowed"
            raise ValueError(f"{what}: use default_factory")
        given = dataclasses.field(default=given)
    options = ("init", "hash", "metadata", "kw_only")
    said = sorted(a for a in options if getattr(given, a) != getattr(_PUBLIC_DEFAULTS, a))
    if said:
        raise TypeError(f"{name}: a Plain field takes a default or factory, repr and compare; not {said}")
    f: Field[Any] = dataclasses.field(
        default=given.default,
        default_factory=given.default_factory,
        repr=given.repr,
        compare=given.compare,
        kw_only=kw_only,
    )
    f.name, f.type = name, annotation
    f._field_type = _KIND  # type: ignore[attr-defined]
    return f


def _keep_default(cls: type, name: str, f: Field[Any]) -> None:
    # As dataclasses leaves it: a plain default stays a class attribute, a field() does not.
    if f.default is not _MISSING:
        setattr(cls, name, f.default)
    elif name in cls.__dict__:
        delattr(cls, name)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
class Plain:
    """The base of a class that is a dataclass without the code generation (module doc).
    Class keywords: ``frozen`` (default True), ``kw_only`` (default False)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]] = {}
    # (name, default, factory) in order; the names taken positionally, shown by repr, and
    # compared (and hashed); frozen or not.
    _plain_init: ClassVar[tuple[tuple[str, Any, Any], ...]] = ()
    _plain_positional: ClassVar[tuple[str, ...]] = ()
    _plain_repr: ClassVar[tuple[str, ...]] = ()
    _plain_compare: ClassVar[tuple[str, ...]] = ()
    _plain_frozen: ClassVar[bool] = True

    def __init_subclass__(cls, *, frozen: bool = True, kw_only: bool = False, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        found = dict(cls.__dataclass_fields__)  # the nearest Plain base's, in order
        for name, annotation in inspect.get_annotations(cls).items():
            if _is_classvar(annotation):
                continue
            found[name] = _field(name, annotation, kw_only, cls.__dict__.get(name, _MISSING))
            _keep_default(cls, name, found[name])
        fields = list(found.values())
        positional = [f for f in fields if not f.kw_only]
        _check_order(cls, positional)
        cls.__dataclass_fields__ = found
        cls._plain_init = tuple((f.name, f.default, f.default_factory) for f in fields)
        cls._plain_positional = tuple(f.name for f in positional)
        cls._plain_repr = tuple(f.name for f in fields if f.repr)
        cls._plain_compare = tuple(f.name for f in fields if f.compare)
        cls._plain_frozen = frozen
        setattr(cls, "__match_args__", cls._plain_positional)  # noqa: B010 (mypy: not declared here)
        if not frozen:
            cls.__hash__ = None  # type: ignore[assignment]  # equal by value and mutable: unhashable

    def __init__(self, *args: Any, **values: Any) -> None:
        cls = type(self)
        if len(args) > len(cls._plain_positional):
            n = len(cls._plain_positional)
            raise TypeError(f"{cls.__qualname__}() takes {n} positional arguments but {len(args)} were given")
        for name, value in zip(cls._plain_positional, args, strict=False):
            if name in values:
                raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
            values[name] = value
        put = object.__setattr__ if cls._plain_frozen else setattr
        for name, default, factory in cls._plain_init:
            if name in values:
                value = values.pop(name)
            elif factory is not _MISSING:
                value = factory()
            elif default is not _MISSING:
                value = default
            else:
                raise TypeError(f"{cls.__qualname__}() missing required argument: {name!r}")
            put(self, name, value)
        if values:
            raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {next(iter(values))!r}")
        post: Callable[[], None] | None = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    def _plain_values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._plain_compare)

    @recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._plain_repr)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Plain)
        return self._plain_values() == other._plain_values()

    def __hash__(self) -> int:
        return hash(self._plain_values())

    def __setattr__(self, name: str, value: Any) -> None:
        if self._plain_frozen:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if self._plain_frozen:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super().__delattr__(name)


def _check_order(cls: type, positional: list[Field[Any]]) -> None:
    seen_default = False
    for f in positional:
        has = f.default is not _MISSING or f.default_factory is not _MISSING
        if seen_default and not has:
            raise TypeError(f"{cls.__qualname__}: non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has
