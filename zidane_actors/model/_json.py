"""The one check of what JSON carries exactly, run on every value before it is stored.

msgspec would happily encode ``NaN`` as ``null``, ``bytes`` as base64 text,
an ``int`` key as a string and a ``set`` as an array: the write succeeds and
the value reads back different. :func:`check_json` and :func:`check_model`
refuse such values instead, with a :class:`~zidane_actors.errors.ValidationError`
whose ``path`` locates the bad node (``$.turns[3].content[0].input.x``).

A free-form value (metadata, a tool input, an artifact's ``meta``, a send
result: the ``JsonValue`` fields of the model) may hold ``None``, ``bool``,
``int``, finite ``float``, ``str``, lists and tuples (both read back as
lists) and dicts with ``str`` keys, nested at most :data:`MAX_JSON_DEPTH`
arrays and objects deep. Anything else is refused: ``NaN``/``±inf``,
``bytes``/``bytearray``/``memoryview``, sets, non-string keys, model values
inside a free-form value, and any other type (``datetime``, ``Decimal``…).
The walk stops at the depth limit, so a self-referencing or very deep value
never raises ``RecursionError``.
"""

from __future__ import annotations

import json
import math
import re
import typing
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from ..errors import ValidationError
from ._extra import EXTRA_KEY, ExtraFields
from ._preview import preview

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_STORED_JSON_DEPTH",
    "check_json",
    "check_model",
    "key_segment",
    "stored_too_deep",
]

MAX_JSON_DEPTH: Final = 128
"""Deepest nesting of arrays and objects a free-form JSON value may have.

Counted from the field holding it: a ``metadata`` object is level 1, an
object inside it level 2. Model values nest a few levels of their own on
top, well under the ~1000 levels a JSON parser recurses through.
"""

MAX_STORED_JSON_DEPTH: Final = 2 * MAX_JSON_DEPTH
"""Deepest nesting a stored document (a turn's or a header's JSON, a metadata column) may have.

Nothing this version writes comes near it (:data:`MAX_JSON_DEPTH` plus the
model's own few levels); a row nested deeper was written by another program,
and a store reads it as corrupt (:func:`stored_too_deep`) rather than handing
out a value that cannot be written back (a server would fail encoding it).
"""

_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_INNERMOST: Final = re.compile(rb"\[\]|\{\}")
_NOT_BRACKET: Final = bytes(b for b in range(256) if b not in b"[]{}")


def stored_too_deep(raw: bytes | str) -> bool:
    """Whether the JSON text ``raw`` nests deeper than :data:`MAX_STORED_JSON_DEPTH`.

    Costs two byte counts for a document with fewer brackets than the limit;
    otherwise the brackets outside strings are kept and the innermost pairs
    removed, one level a pass (each in C). Text that is not JSON answers
    ``False``: decoding it says what is wrong.
    """
    data = raw.encode(errors="surrogatepass") if isinstance(raw, str) else bytes(raw)
    if data.count(b"[") + data.count(b"{") <= MAX_STORED_JSON_DEPTH:
        return False
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    for _ in range(MAX_STORED_JSON_DEPTH):
        brackets, removed = _INNERMOST.subn(b"", brackets)
        if not brackets or not removed:
            return False
    return True


_SCALARS: Final = frozenset({str, int, bool, type(None)})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Refused(Exception):
    """Internal: a node was refused; ``segments`` are collected while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str] = []


def key_segment(key: str) -> str:
    """``key`` as a step of a located error's path: ``.name``, else ``["…"]`` in JSON.

    A lone surrogate is written as its escape (the path stays printable).
    """
    if _IDENT.fullmatch(key):
        return f".{key}"
    try:
        return f"[{msgspec.json.encode(key).decode()}]"
    except UnicodeEncodeError:
        return f"[{json.dumps(key)}]"


def _too_deep() -> _Refused:
    return _Refused(f"nested deeper than {MAX_JSON_DEPTH} arrays/objects (MAX_JSON_DEPTH)")


def _scalar(value: object) -> None:
    """Check a value that is not a plain container or exact scalar type."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused(
                f"{preview(value)} is not a JSON number (NaN and infinities are refused)"
            )
        return
    if isinstance(value, (str, int)):  # bool, enums: encoded by value, read back equal
        return
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise _Refused(f"{type(value).__name__} is not JSON (store text, e.g. base64, instead)")
    if isinstance(value, (set, frozenset)):
        raise _Refused(f"a {type(value).__name__} is not JSON (use a list)")
    if isinstance(value, msgspec.Struct):
        raise _Refused(f"a {type(value).__name__} is not a free-form JSON value")
    if value is msgspec.UNSET:
        raise _Refused("UNSET is not a JSON value")
    raise _Refused(f"a {type(value).__name__} is not a JSON value")


def _items(items: Iterable[Any], depth: int, check: Callable[[Any, int], None]) -> None:
    """``check`` each non-scalar item of an array at ``depth``; a refusal names the index."""
    for index, item in enumerate(items):
        if type(item) in _SCALARS:
            continue
        try:
            check(item, depth)
        except _Refused as exc:
            exc.segments.append(f"[{index}]")
            raise


def _free(value: Any, depth: int) -> None:
    """Check a free-form value sitting under ``depth`` arrays/objects."""
    kind = type(value)
    if kind is dict or (kind is not list and kind is not tuple and isinstance(value, dict)):
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                raise _Refused(f"object key {preview(key)} is a {type(key).__name__}, not a string")
            if type(item) in _SCALARS:
                continue
            try:
                _free(item, depth)
            except _Refused as exc:
                exc.segments.append(key_segment(key))
                raise
    elif kind is list or kind is tuple or isinstance(value, (list, tuple)):
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        _items(value, depth, _free)
    elif kind is float:
        if not math.isfinite(value):
            raise _Refused(
                f"{preview(value)} is not a JSON number (NaN and infinities are refused)"
            )
    elif kind not in _SCALARS:
        _scalar(value)


def _is_free(annotation: object) -> bool:
    if annotation is Any:
        return True
    return typing.get_origin(annotation) in (typing.Union, type(int | str)) and any(
        arg is Any for arg in typing.get_args(annotation)
    )


_astuple: Final = msgspec.structs.astuple
_isfinite: Final = math.isfinite


_FIELDS: Final[dict[type, tuple[tuple[str, bool], ...]]] = {}
_KNOWN: Final[dict[type, frozenset[str]]] = {}


def _fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, bool], ...]:
    """``(JSON name, holds a free-form value)`` for each field of ``cls``, in order."""
    found = _FIELDS.get(cls)
    if found is None:
        found = tuple((f.encode_name, _is_free(f.type)) for f in msgspec.structs.fields(cls))
        _FIELDS[cls] = found
        tag_field = cls.__struct_config__.tag_field
        known = {name for name, _ in found if name != EXTRA_KEY}
        _KNOWN[cls] = frozenset(known | {tag_field} if tag_field else known)
    return found


def _extra(value: object, cls: type) -> None:
    """Check a value's ``extra_fields``: an ``ExtraFields`` of JSON values under unknown keys."""
    if type(value) is not ExtraFields:
        raise _Refused(f"extra_fields must be an ExtraFields, not a {type(value).__name__}")
    known = _KNOWN[cls]
    for key in value:
        if type(key) is not str:
            raise _Refused(
                f"extra field key {preview(key)} is a {type(key).__name__}, not a string"
            )
        if key in known:
            raise _Refused(f"extra field `{key}` is a field of {cls.__name__}")
    _free(dict(value), 0)


def _typed(value: Any, depth: int) -> None:
    """Check a value in a typed position (a model field, an item of a typed tuple)."""
    kind = type(value)
    if kind in _SCALARS:
        return
    depth += 1
    if depth > MAX_JSON_DEPTH:
        raise _too_deep()
    if isinstance(value, msgspec.Struct):
        fields = _FIELDS.get(kind) or _fields(kind)
        for item, (json_name, free) in zip(_astuple(value), fields, strict=True):
            item_kind = type(item)
            if item_kind in _SCALARS or item is msgspec.UNSET:
                continue
            if item_kind is float and _isfinite(item):
                continue
            if json_name == EXTRA_KEY:
                _extra(item, kind)
                continue
            try:
                if free:
                    _free(item, 0)
                else:
                    _typed(item, depth)
            except _Refused as exc:
                exc.segments.append(f".{json_name}")
                raise
    elif kind is tuple or kind is list:
        _items(value, depth, _typed)
    elif kind is dict or isinstance(value, dict):
        _free(value, 0)
    else:
        _free(value, depth)


def _raise(exc: _Refused, path: str, what: str, error: type[ValidationError]) -> typing.NoReturn:
    where = path + "".join(reversed(exc.segments))
    raise error(f"{what} cannot be stored exactly as JSON: {exc.reason}", path=where) from None


def check_json(
    value: object,
    *,
    what: str = "value",
    path: str = "$",
    depth: int = 0,
    error: type[ValidationError] = ValidationError,
) -> None:
    """Refuse a free-form value JSON cannot carry exactly (see the module docstring).

    ``depth`` is how many arrays/objects already enclose ``value`` where it
    is stored (``1`` for a metadata value: the metadata object encloses it).
    """
    if type(value) in _SCALARS:
        return
    try:
        _free(value, depth)
    except _Refused as exc:
        _raise(exc, path, what, error)


def check_model(
    value: object,
    *,
    what: str = "value",
    path: str = "$",
    error: type[ValidationError] = ValidationError,
) -> None:
    """Refuse a model value (or a list/tuple of them) holding anything JSON cannot carry exactly.

    Typed fields and every ``JsonValue`` field are walked: a ``NaN`` cost,
    ``bytes`` in a text field or a set in a tool input are all refused.
    """
    if type(value) in _SCALARS:
        return
    try:
        _typed(value, -1)
    except _Refused as exc:
        _raise(exc, path, what, error)
