"""zeromon.model.classes' ``@frozen`` and ``@mutable`` against ``dataclasses.dataclass(slots=True)``: random classes
made both ways must have the same signature, docstring, fields, slots, repr, equality, hash, frozenness and
``replace``; pickling and a recursive repr on fixed classes."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.model.classes import frozen, mutable

_NO = dataclasses.MISSING
_VALUES = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.tuples(st.integers(0, 2)))


def _pair() -> list[int]:
    """A factory other than list or dict (those are written as their literals)."""
    return [1, 2]


@st.composite
def _specs(draw: Any) -> dict[str, Any]:
    """A class: its fields' options, whether it is frozen, compares, has a docstring and a __post_init__."""
    fields = []
    for i in range(draw(st.integers(0, 6))):
        default = draw(st.one_of(st.just(_NO), _VALUES))
        factory = draw(st.sampled_from([_NO, list, dict, _pair])) if default is _NO else _NO
        fields.append({"name": f"f{i}", "default": default, "default_factory": factory,
                       "init": draw(st.booleans()) if default is not _NO or factory is not _NO else True,
                       "kw_only": draw(st.booleans()), "repr": draw(st.booleans()), "compare": draw(st.booleans()),
                       "hash": draw(st.sampled_from([None, True, False]))})
    return {"fields": fields, "frozen": draw(st.booleans()), "eq": draw(st.booleans()),
            "doc": draw(st.booleans()), "post_init": draw(st.booleans())}


def _build(spec: dict[str, Any], standard: bool) -> type:
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": "C",
                                 "__annotations__": {f["name"]: "Any" for f in spec["fields"]}}
    for f in spec["fields"]:
        options = {k: f[k] for k in ("init", "kw_only", "repr", "compare", "hash")}
        namespace[f["name"]] = dataclasses.field(default=f["default"], default_factory=f["default_factory"], **options)
    if spec["doc"]:
        namespace["__doc__"] = "A class."
    if spec["post_init"]:
        def __post_init__(self: Any) -> None:
            type(self).posted = getattr(type(self), "posted", 0) + 1
        namespace["__post_init__"] = __post_init__
    cls = type("C", (), namespace)
    if standard:
        return dataclasses.dataclass(cls, frozen=spec["frozen"], eq=spec["eq"], slots=True)  # type: ignore[no-any-return]
    return (frozen if spec["frozen"] else mutable)(eq=spec["eq"])(cls)


def _made(build: Any) -> tuple[type | None, str | None]:
    try:
        return build(), None
    except TypeError as exc:
        return None, str(exc)


def _arguments(spec: dict[str, Any], seed: int) -> tuple[list[Any], dict[str, Any]]:
    """Values for every field __init__ takes: positional in order, keyword-only by name."""
    args, kwargs = [], {}
    for i, f in enumerate(spec["fields"]):
        if f["init"]:
            value = (seed + i, f"v{i}")
            if f["kw_only"]:
                kwargs[f["name"]] = value
            else:
                args.append(value)
    return args, kwargs


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the kind of failure is what is compared
        return type(exc).__name__, str(exc)


@settings(max_examples=300, deadline=None)
@given(_specs(), st.integers(0, 5))
def test_a_class_behaves_as_dataclasses_makes_it(spec: dict[str, Any], seed: int) -> None:
    theirs, their_error = _made(lambda: _build(spec, standard=True))
    ours, our_error = _made(lambda: _build(spec, standard=False))
    assert our_error == their_error  # e.g. a field without a default after one with it
    if theirs is None or ours is None:
        return
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    assert ours.__doc__ == theirs.__doc__
    assert ours.__slots__ == theirs.__slots__  # type: ignore[attr-defined]
    assert ours.__match_args__ == theirs.__match_args__  # type: ignore[attr-defined]
    assert [(f.name, f.init, f.repr, f.compare, f.hash, f.kw_only) for f in dataclasses.fields(ours)] == \
        [(f.name, f.init, f.repr, f.compare, f.hash, f.kw_only) for f in dataclasses.fields(theirs)]
    assert ours.__dataclass_params__.frozen == spec["frozen"]  # type: ignore[attr-defined]
    assert ("__hash__" in ours.__dict__, ours.__hash__ is None) == ("__hash__" in theirs.__dict__, theirs.__hash__ is None)

    args, kwargs = _arguments(spec, seed)
    a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
    assert repr(a) == repr(b)
    assert getattr(ours, "posted", 0) == getattr(theirs, "posted", 0)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)  # type: ignore[call-overload]
    again_ours, again_theirs = ours(*args, **kwargs), theirs(*args, **kwargs)
    for f in spec["fields"]:  # each instance its own container from a factory
        if f["default_factory"] is not _NO and not f["init"]:
            assert getattr(a, f["name"]) is not getattr(again_ours, f["name"])
    assert (a == again_ours) == (b == again_theirs)
    assert (a == 1) == (b == 1)
    assert _outcome(lambda: hash(a) if spec["eq"] else 0) == _outcome(lambda: hash(b) if spec["eq"] else 0)
    if spec["fields"]:
        name = spec["fields"][0]["name"]
        ours_set, theirs_set = _outcome(lambda: setattr(a, name, 9)), _outcome(lambda: setattr(b, name, 9))
        assert ours_set == theirs_set
        ours_del, theirs_del = _outcome(lambda: delattr(a, name)), _outcome(lambda: delattr(b, name))
        assert ours_del[0] == theirs_del[0]
    if spec["frozen"] and any(f["init"] for f in spec["fields"]):
        name = next(f["name"] for f in spec["fields"] if f["init"])
        assert repr(dataclasses.replace(a, **{name: "new"})) == repr(dataclasses.replace(b, **{name: "new"}))


@frozen
class _Point:
    x: int
    y: list[int] = dataclasses.field(default_factory=list, compare=False)


@mutable
class _Node:
    name: str
    child: Any = None


def test_pickling_a_frozen_class_and_equality_by_its_compared_fields() -> None:
    point = _Point(1, [2])
    back = pickle.loads(pickle.dumps(point))
    assert back == point and back.y == [2] and back is not point
    assert _Point(1, [5]) == point and hash(_Point(1, [5])) == hash(point)  # y is not compared
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
        point.x = 2  # type: ignore[misc]
    assert not hasattr(point, "__dict__")


def test_a_mutable_class_is_unhashable_and_its_repr_stops_at_a_cycle() -> None:
    node = _Node("a")
    node.child = node
    assert repr(node) == "_Node(name='a', child=...)"
    with pytest.raises(TypeError, match="unhashable"):
        hash(node)
    assert _Node.__init__.__qualname__ == "_Node.__init__" and _Node.__repr__.__qualname__ == "_Node.__repr__"


def test_an_initvar_class_and_one_with_init_s_own_names_are_left_to_dataclasses() -> None:
    @frozen
    class WithInitVar:
        x: int
        scale: dataclasses.InitVar[int] = 1

        def __post_init__(self, scale: int) -> None:
            object.__setattr__(self, "x", self.x * scale)

    assert WithInitVar(2, 3).x == 6 and WithInitVar(2) == WithInitVar(2)

    @frozen
    class NamedSelf:  # a name the compiled __init__ takes for itself
        self: int
        _zm_factory: int = 0

    assert NamedSelf(self=1, _zm_factory=2) == NamedSelf(1, 2) and NamedSelf(1).self == 1
