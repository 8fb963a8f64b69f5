"""Hypothesis strategies derived from the official SDKs' request TypedDicts.

``from_typeddict(T)`` walks ``T``'s annotations (``Required``/``NotRequired``,
``Literal``, unions, ``Iterable``/``List``, ``Dict``, ``Optional``, nested
TypedDicts) and draws dicts the SDK type accepts, so the round-trip
properties see every block, part and item shape the SDK defines, with
optional fields present or absent and ``null`` where allowed. Strings are
short and never blank (blank text is not sendable; see docs/wire.md).
"""

from __future__ import annotations

import collections.abc
import string
import types
import typing
from typing import Any

import typing_extensions
from hypothesis import strategies as st

__all__ = ["from_type", "json_object"]

_TEXT = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
_SCALAR = st.none() | st.booleans() | st.integers(-1000, 1000) | _TEXT
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_TEXT, inner, max_size=2),
    max_leaves=4,
)
json_object = st.dictionaries(_TEXT, _JSON, max_size=3)

_REQUIRED = {typing.Required, typing_extensions.Required}
_NOT_REQUIRED = {typing.NotRequired, typing_extensions.NotRequired}
_MAX_DEPTH = 4


def _is_typeddict(tp: object) -> bool:
    return typing_extensions.is_typeddict(tp)


def _strip(tp: Any) -> tuple[Any, bool | None]:
    """``tp`` without Required/NotRequired/Annotated, and what the wrapper said."""
    required: bool | None = None
    while True:
        origin = typing.get_origin(tp)
        if origin in _REQUIRED:
            required, tp = True, typing.get_args(tp)[0]
        elif origin in _NOT_REQUIRED:
            required, tp = False, typing.get_args(tp)[0]
        elif origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        else:
            return tp, required


def _typeddict(tp: Any, depth: int) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(tp, include_extras=True)
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for key, annotation in hints.items():
        inner, flag = _strip(annotation)
        is_required = flag if flag is not None else tp.__total__
        strategy = from_type(inner, depth + 1)
        (required if is_required else optional)[key] = strategy
    if depth >= _MAX_DEPTH:
        optional = {}
    return st.fixed_dictionaries(required, optional=optional)


def from_type(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values the SDK annotation ``tp`` accepts."""
    tp, _ = _strip(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_typeddict(tp):
        return st.deferred(lambda: _typeddict(tp, depth))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if _accepts(a)]
        if depth >= _MAX_DEPTH:  # prefer leaves deep down: None, scalars, plain dicts
            shallow = [a for a in members if not _is_typeddict(_strip(a)[0])]
            members = shallow or members
        return st.one_of([from_type(a, depth) for a in members])
    if tp is type(None):
        return st.none()
    if tp is str:
        return _TEXT
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 1000)
    if tp is float:
        return st.floats(0, 1000, allow_nan=False).map(lambda x: round(x, 2))
    if tp is object:
        return _JSON
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.Iterable):
        if depth >= _MAX_DEPTH:
            return st.just([])
        return st.lists(from_type(args[0], depth + 1), min_size=1, max_size=2)
    if origin in (dict, collections.abc.Mapping):
        if not args or args[1] is object:
            return json_object
        return st.dictionaries(_TEXT, from_type(args[1], depth + 1), max_size=2)
    raise TypeError(f"no strategy for {tp!r}")


def _accepts(tp: Any) -> bool:
    """Union members a JSON payload can be: not pydantic models, file objects or paths."""
    inner, _ = _strip(tp)
    origin = typing.get_origin(inner)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a) for a in typing.get_args(inner))
    if _is_typeddict(inner) or inner in (str, int, bool, float, object, type(None)):
        return True
    return origin in (
        typing.Literal,
        list,
        dict,
        collections.abc.Iterable,
        collections.abc.Sequence,
        collections.abc.Mapping,
    )
