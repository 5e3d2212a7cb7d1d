"""Slotted dataclasses made without compiling five of their six methods: ``@frozen`` and ``@mutable``.

``@frozen`` is ``@dataclass(frozen=True, slots=True)`` and ``@mutable`` is ``@dataclass(slots=True)``: the same
fields, the same ``__init__`` signature, ``repr``, equality, hash, ``FrozenInstanceError`` and pickling, and
``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work on them as on any dataclass
(tests/test_classes.py holds each against the standard library's). Both take ``eq=False`` for objects compared by
identity.

Why not ``dataclasses.dataclass`` itself: on Python 3.11 it compiles each generated method from source text, six for
a frozen class, about 1 ms a class on a 2-core machine; the agent's start in every rank made 64 such classes, more
than half of its CPU (tests/bench/RESULTS.md, "Slotted classes without compiling their methods"). attrs compiles
its methods the same way (1.2 ms a frozen class of ten fields, measured against dataclass's 1.6). Here
``dataclasses.dataclass`` still reads the fields and builds the slotted class; only ``__init__`` is compiled (it must
be fast: records are made on the agent's threads), and ``__repr__``, ``__eq__``, ``__hash__`` and a frozen class's
``__setattr__`` and ``__delattr__`` are closures over the class's field names. A class with an ``InitVar`` field is
left to ``dataclasses.dataclass`` whole, as is one with a field named ``self`` or ``_zm_...``
(names the compiled ``__init__`` uses).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import reprlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["factory_code", "frozen", "mutable"]

_T = TypeVar("_T")


class _Factory:
    """The default shown in ``__init__``'s signature for a field with a ``default_factory`` (as dataclasses')."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


@overload
def frozen(cls: type[_T], /) -> type[_T]: ...
@overload
def frozen(*, eq: bool = True) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[_T] | None = None, /, *, eq: bool = True) -> Any:
    """``@dataclass(frozen=True, slots=True)``, or with ``eq=False``, made at a fraction of its cost."""
    if cls is None:
        return lambda c: _make(c, frozen=True, eq=eq)
    return _make(cls, frozen=True, eq=eq)


@overload
def mutable(cls: type[_T], /) -> type[_T]: ...
@overload
def mutable(*, eq: bool = True) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def mutable(cls: type[_T] | None = None, /, *, eq: bool = True) -> Any:
    """``@dataclass(slots=True)``, or with ``eq=False``, made at a fraction of its cost."""
    if cls is None:
        return lambda c: _make(c, frozen=False, eq=eq)
    return _make(cls, frozen=False, eq=eq)


def _make(cls: type[_T], *, frozen: bool, eq: bool) -> type[_T]:
    body = dict(cls.__dict__)
    annotations = body.get("__annotations__", {})
    if any("InitVar" in str(kind) for kind in annotations.values()) \
            or any(name == "self" or name.startswith("_zm_") for name in annotations):  # names __init__ uses
        return dataclasses.dataclass(cls, frozen=frozen, eq=eq, slots=True)
    for name in ("__setattr__", "__delattr__") if frozen else ():
        if name in body:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    described = bool(body.get("__doc__"))
    if not described:
        cls.__doc__ = "-"  # a placeholder: dataclasses would take one from a signature that has no __init__ yet
    made: Any = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=True)
    fields = dataclasses.fields(made)
    params = made.__dataclass_params__
    params.init, params.repr, params.eq, params.frozen = True, True, eq, frozen

    def add(name: str, method: Callable[..., Any], own: bool = True) -> None:
        """``method`` as the class's ``name`` unless the class wrote its own (dataclasses leaves that one)."""
        if name not in body:
            if own:  # made for this class alone
                method.__qualname__ = f"{made.__qualname__}.{name}"
            setattr(made, name, method)

    add("__init__", _init(made, fields, frozen))
    add("__repr__", _repr([f.name for f in fields if f.repr]))
    if eq:
        compared = _values([f.name for f in fields if f.compare])
        add("__eq__", _eq(compared))
        explicit_hash = "__hash__" in body and not (body["__hash__"] is None and "__eq__" in body)
        if not explicit_hash:
            # dataclasses' rule: a frozen class with __eq__ hashes its compared fields, a mutable one is unhashable.
            hashed = _values([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
            made.__hash__ = _hash(hashed) if frozen else None
            if frozen:
                made.__hash__.__qualname__ = f"{made.__qualname__}.__hash__"
    if frozen:
        names = frozenset(f.name for f in fields)
        add("__setattr__", _frozen_setattr(made, names))
        add("__delattr__", _frozen_delattr(made, names))
        add("__getstate__", _getstate, own=False)
        add("__setstate__", _setstate, own=False)
    if not described:
        made.__doc__ = made.__name__ + str(inspect.signature(made)).replace(" -> None", "")
    return made  # type: ignore[no-any-return]


def factory_code(f: dataclasses.Field[Any], name: str, namespace: dict[str, Any]) -> str:
    """The source text of a field's factory's value in generated code: an empty list or dict as its literal (no
    call), another factory called as ``name`` (put in ``namespace``); "" for a field without a factory."""
    if f.default_factory is list or f.default_factory is dict:
        return "[]" if f.default_factory is list else "{}"
    if f.default_factory is dataclasses.MISSING:
        return ""
    namespace[name] = f.default_factory
    return f"{name}()"


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...], frozen: bool) -> Callable[..., None]:
    """``__init__`` compiled for the class's fields, as dataclasses writes it; a frozen class's fields set through
    their slots' descriptors (dataclasses calls ``object.__setattr__`` a field: the same result, dearer)."""
    values: dict[str, Any] = {"_zm_factory": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    lines: list[str] = []
    seen_default = False
    for i, f in enumerate(fields):
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        made = factory_code(f, f"_zm_make_{i}", values)
        if f.init:
            if has_factory:
                parameter = f"{f.name}=_zm_factory"
                value = f"{made} if {f.name} is _zm_factory else {f.name}"
            elif has_default:
                values[f"_zm_default_{i}"] = f.default
                parameter = f"{f.name}=_zm_default_{i}"
                value = f.name
            else:
                parameter = f.name
                value = f.name
            if f.kw_only:
                keyword.append(parameter)
            else:
                if seen_default and not (has_default or has_factory):
                    raise TypeError(f"non-default argument {f.name!r} follows default argument")
                seen_default = seen_default or has_default or has_factory
                positional.append(parameter)
        elif has_factory:
            value = made
        elif has_default:
            values[f"_zm_default_{i}"] = f.default
            value = f"_zm_default_{i}"
        else:
            continue
        if frozen:
            values[f"_zm_set_{i}"] = getattr(cls, f.name).__set__
            lines.append(f"  _zm_set_{i}(self, {value})")
        else:
            lines.append(f"  self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        lines.append("  self.__post_init__()")
    parameters = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = (f"def _zm_create({', '.join(values)}):\n def __init__({parameters}):\n"
              + ("\n".join(lines) or "  pass") + "\n return __init__\n")
    module = sys.modules.get(cls.__module__)
    namespace: dict[str, Any] = {}
    exec(source, module.__dict__ if module else {}, namespace)  # noqa: S102 - written from the class's field names
    init: Callable[..., None] = namespace["_zm_create"](**values)
    init.__annotations__ = {**{f.name: f.type for f in fields if f.init}, "return": None}
    return init


def _values(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The named attributes of an object as a tuple (dataclasses compares and hashes tuples of the fields)."""
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    if not names:
        return lambda obj: ()
    return operator.attrgetter(*names)


def _repr(names: list[str]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _eq(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen_setattr(cls: type, names: frozenset[str]) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)  # a subclass's own attribute (no class here has a base's __setattr__)

    return __setattr__


def _frozen_delattr(cls: type, names: frozenset[str]) -> Callable[[Any, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    return __delattr__


def _getstate(self: Any) -> list[Any]:
    """A frozen slotted class's pickled state: its fields' values (dataclasses' own, for the same reason)."""
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        object.__setattr__(self, f.name, value)
