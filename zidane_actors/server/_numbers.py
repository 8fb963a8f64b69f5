"""JSON numbers as JSON Schema reads them: ``2.0`` is the integer 2 where an integer is due.

The OpenAPI document (JSON Schema 2020-12) calls ``2.0`` a valid
``integer``, and JavaScript cannot tell it from ``2``; msgspec refuses a
float for an ``int`` field. A body refused only for that is walked along
its type and decoded again with each integral float due as an integer made
one: exact (``2.5`` and free-form JSON values are left alone), and only on
that slow path.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec.inspect as mi

from ..model._codec import object_type

__all__ = ["integral_floats_as_ints"]

_SEQUENCES = (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)


@functools.cache
def _info(type_: Any) -> mi.Type:
    return mi.type_info(type_)


def integral_floats_as_ints(value: Any, type_: Any) -> Any:
    """``value`` (decoded JSON) with the integral floats at ``int`` places of ``type_`` as ints."""
    return _walk(value, _info(type_))


def _members(t: mi.Type) -> tuple[mi.Type, ...]:
    return t.types if isinstance(t, mi.UnionType) else (t,)


def _wants_int(t: mi.Type) -> bool:
    members = _members(t)
    return any(isinstance(m, mi.IntType) for m in members) and not any(
        isinstance(m, mi.FloatType) for m in members
    )


def _walk(value: Any, t: mi.Type) -> Any:
    if type(value) is float:
        return int(value) if value.is_integer() and _wants_int(t) else value
    if isinstance(value, list):
        for m in _members(t):
            if isinstance(m, _SEQUENCES):
                return [_walk(item, m.item_type) for item in value]
            if isinstance(m, (mi.TupleType, mi.NamedTupleType)):
                types = m.item_types if isinstance(m, mi.TupleType) else [f.type for f in m.fields]
                return [_walk(item, it) for item, it in zip(value, types, strict=False)] + value[
                    len(types) :
                ]
        return value
    if isinstance(value, dict):
        mapping = object_type(value, t)
        if isinstance(mapping, mi.DictType):
            return {k: _walk(v, mapping.value_type) for k, v in value.items()}
        if isinstance(mapping, (mi.StructType, mi.TypedDictType, mi.DataclassType)):
            fields = {f.encode_name: f.type for f in mapping.fields}
            return {k: _walk(v, fields[k]) if k in fields else v for k, v in value.items()}
    return value
