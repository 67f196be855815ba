"""fabric.plain: a Plain class behaves as the dataclass it stands for, side by side with real
dataclasses of the same fields (construction, defaults, repr, equality, hash, frozenness,
``dataclasses.fields``/``replace``/``asdict``, ``__post_init__``, inheritance, matching)."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, ClassVar

import pytest

from fabric.plain import Plain


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)


class PlainPoint(Plain):
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Spec:
    mode: str = "demo"
    n: int
    seen: ClassVar[int] = 0


class PlainSpec(Plain, kw_only=True):
    mode: str = "demo"
    n: int
    seen: ClassVar[int] = 0


@dataclass
class Counter:
    name: str
    count: int = 0

    def __post_init__(self) -> None:
        self.count = max(self.count, 0)


class PlainCounter(Plain, frozen=False):
    name: str
    count: int = 0

    def __post_init__(self) -> None:
        self.count = max(self.count, 0)


@dataclass(frozen=True)
class Row:
    id: int
    token: str = field(default="", repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


class PlainRow(Plain):
    id: int
    token: str = field(default="", repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Point3(Point):
    z: int = 0


class PlainPoint3(PlainPoint):
    z: int = 0


PAIRS: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = [
    (Point, PlainPoint, (1,), {}),
    (Point, PlainPoint, (1, 2), {"tags": ["a"]}),
    (Spec, PlainSpec, (), {"n": 3}),
    (Spec, PlainSpec, (), {"n": 3, "mode": "gateway"}),
    (Counter, PlainCounter, ("c",), {"count": -5}),
    (Point3, PlainPoint3, (1, 2), {"z": 3}),
    (Row, PlainRow, (7, "secret"), {"raw": {"a": 1}}),
]


def _renamed(text: str, real: type, plain: type) -> str:
    return text.replace(plain.__qualname__, real.__qualname__)


@pytest.mark.parametrize(("real", "plain", "args", "kwargs"), PAIRS)
def test_a_plain_class_behaves_as_its_dataclass(real: Any, plain: Any, args: Any, kwargs: Any) -> None:
    a, b = real(*args, **kwargs), plain(*args, **kwargs)
    assert _renamed(repr(b), real, plain) == repr(a)
    assert [f.name for f in dataclasses.fields(b)] == [f.name for f in dataclasses.fields(a)]
    assert dataclasses.asdict(b) == dataclasses.asdict(a) and dataclasses.astuple(b) == dataclasses.astuple(a)
    assert dataclasses.is_dataclass(plain(*args, **kwargs)) and plain.__match_args__ == real.__match_args__
    assert b == plain(*args, **kwargs) and b != a  # equal by value, within one class only
    name = dataclasses.fields(a)[-1].name
    changed = dataclasses.replace(b, **{name: getattr(a, name)})
    assert type(changed) is plain and changed == b
    if real.__hash__ is None:
        assert plain.__hash__ is None
        setattr(b, name, getattr(b, name))  # mutable
    else:
        try:
            want: Any = hash(a)
        except TypeError:
            want = TypeError
        if want is TypeError:
            with pytest.raises(TypeError):
                hash(b)
        else:
            assert hash(b) == hash(plain(*args, **kwargs))
        with pytest.raises(FrozenInstanceError) as got:
            setattr(b, name, None)
        with pytest.raises(FrozenInstanceError) as was:
            setattr(a, name, None)
        assert str(got.value) == str(was.value)
        with pytest.raises(FrozenInstanceError):
            delattr(b, name)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, 2, [], 4), {}), ((1,), {"x": 1}), ((1,), {"w": 1})],
)
def test_a_plain_class_refuses_what_its_dataclass_refuses(args: Any, kwargs: Any) -> None:
    with pytest.raises(TypeError):
        Point(*args, **kwargs)
    with pytest.raises(TypeError):
        PlainPoint(*args, **kwargs)


def test_a_field_out_of_repr_or_comparison_is_left_out_as_a_dataclass_leaves_it() -> None:
    assert "secret" not in repr(PlainRow(7, "secret")) and repr(Row(7, "secret")) == "Row(id=7)"
    assert PlainRow(7, raw={"a": 1}) == PlainRow(7, raw={"b": 2})
    assert hash(PlainRow(7, raw={"a": 1})) == hash(PlainRow(7))
    assert PlainRow(7, "a") != PlainRow(7, "b")


def test_keyword_only_defaults_factories_and_class_variables() -> None:
    with pytest.raises(TypeError):
        PlainSpec("gateway", 3)  # type: ignore[misc]
    assert PlainSpec.mode == Spec.mode == "demo"  # a plain default stays a class attribute
    assert PlainSpec.seen == 0 and [f.name for f in dataclasses.fields(PlainSpec)] == ["mode", "n"]
    one, two = PlainPoint(1), PlainPoint(1)
    assert one.tags == [] and one.tags is not two.tags  # a factory per instance
    assert PlainCounter("c", -5).count == 0  # __post_init__ ran
    for made, cls in ((Point3(1, 2, z=3), Point3), (PlainPoint3(1, 2, z=3), PlainPoint3)):
        match made:
            case cls(1, 2, [], 3):
                pass
            case _:
                pytest.fail(f"{cls.__name__} did not match by position")


def test_evaluated_annotations_are_read_alike() -> None:
    # A module without `from __future__ import annotations` gives types, not strings.
    made = type("Evaluated", (Plain,), {"__annotations__": {"x": int, "seen": ClassVar[int]}, "seen": 0})
    assert [f.name for f in dataclasses.fields(made)] == ["x"] and made(x=1) == made(1)


def test_a_plain_class_refuses_a_definition_its_dataclass_would_refuse() -> None:
    with pytest.raises(ValueError, match="mutable default"):

        class Bad(Plain):
            xs: list[int] = []

    with pytest.raises(TypeError, match="follows default"):

        class Late(Plain):
            a: int = 1
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="a Plain field takes"):

        class Hidden(Plain):
            a: int = field(default=1, init=False)


def test_the_dataclass_internals_it_borrows_are_still_there() -> None:
    # fabric.plain marks its fields with dataclasses' private marker: a Python whose
    # dataclasses changed it fails here, before any card is read wrong.
    marker = dataclasses._FIELD  # type: ignore[attr-defined]
    assert all(f._field_type is marker for f in dataclasses.fields(Point))  # type: ignore[attr-defined]
    assert all(f._field_type is marker for f in PlainPoint.__dataclass_fields__.values())
