"""One JSON encoder and cached decoders for the model, with located errors."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Hashable, Mapping
from functools import cache
from typing import Any, Final, Generic, TypeVar, cast

import msgspec
import msgspec.inspect as mi

from ..errors import ValidationError
from ._extra import EXTRA_KEY, ExtraFields
from ._json import MAX_JSON_DEPTH, key_segment
from ._preview import preview

__all__ = [
    "Decoder",
    "convert",
    "convert_or_none",
    "decode",
    "decoder",
    "encode",
    "encode_checked",
    "encode_str",
    "extra_json",
    "object_type",
    "parse_json",
    "to_builtins",
    "too_deep",
]

T = TypeVar("T")

_PATH = re.compile(r" - at `(\$[^`]*)`$")
# Any escape of a UTF-16 surrogate: msgspec refuses a lone one (JavaScript writes them).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _HasExtra(Exception):
    """Internal: the value holds ``ExtraFields``; encode it the slow way."""


def _no_extra(value: object) -> object:
    if type(value) is ExtraFields:
        raise _HasExtra
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def _extra_dict(value: object) -> object:
    if type(value) is ExtraFields:
        return dict(value)
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


_ENCODER = msgspec.json.Encoder(enc_hook=_no_extra)
_PLAIN = frozenset({str, int, bool, type(None)})
_ANY = msgspec.json.Decoder()


@cache
def _field_names(cls: type) -> tuple[tuple[str, str], ...]:
    """``(attribute, JSON name)`` of each field of the struct type ``cls``, in order.

    Built once per type: ``msgspec.structs.fields`` evaluates the class's annotations
    again on every call (hundreds of microseconds for a model type).
    """
    return tuple((f.name, f.encode_name) for f in msgspec.structs.fields(cls))


def _merge(value: object, plain: Any) -> None:
    """Put each struct's ``extra_fields`` (under ``EXTRA_KEY`` in ``plain``) back as its keys.

    Walks the model value and its builtins side by side, so a free-form
    value holding an ``EXTRA_KEY`` key of its own is left alone.
    """
    if isinstance(value, msgspec.Struct):
        extra = plain.pop(EXTRA_KEY, None)
        for name, key in _field_names(type(value)):
            item = getattr(value, name)
            if isinstance(item, (msgspec.Struct, tuple, list)) and key in plain:
                _merge(item, plain[key])
        if extra:
            plain.update(extra)
    elif isinstance(value, (tuple, list)) and isinstance(plain, (tuple, list)):
        for item, item_plain in zip(value, plain, strict=False):
            if isinstance(item, (msgspec.Struct, tuple, list)):
                _merge(item, item_plain)


def _plain(value: object) -> Any:
    """``value`` as builtins with every struct's extra fields merged back."""
    plain = msgspec.to_builtins(value, enc_hook=_extra_dict)
    _merge(value, plain)
    return plain


def _escaped_json(plain: Any) -> bytes:
    """JSON for builtins holding lone surrogates: each written as its ``\\udXXX`` escape.

    That is what JavaScript's ``JSON.stringify`` writes, and the escape keeps
    the document valid UTF-8 (a text column, a file, an HTTP body can hold it).
    """
    text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


def _step(key: object) -> str:
    return key_segment(key) if isinstance(key, str) else f"[{preview(key)}]"


def _non_finite(value: object) -> tuple[str, float] | None:
    """The path and value of the first ``NaN``/``±inf`` in ``value`` (document order), if any.

    Iterative (no recursion limit of its own); run only on a value msgspec
    encoded, so it is acyclic. Steps are kept as parent links and joined
    only for the float found.
    """
    links: list[tuple[int, str]] = []  # (parent link, step)
    stack: list[tuple[object, int, str]] = [(value, -1, "")]
    while stack:
        node, parent, step = stack.pop()
        kind = type(node)
        if kind in _PLAIN:
            continue
        if kind is float or isinstance(node, float):
            if math.isfinite(node):  # type: ignore[arg-type]
                continue
            steps = [step]
            while parent >= 0:
                parent, up = links[parent]
                steps.append(up)
            return "$" + "".join(reversed(steps)), node  # type: ignore[return-value]
        here = len(links)
        links.append((parent, step))
        children: list[tuple[object, int, str]] = []
        if isinstance(node, msgspec.Struct):
            cls = type(node)
            for name, json_name in zip(
                cls.__struct_fields__, cls.__struct_encode_fields__, strict=True
            ):
                item = getattr(node, name)
                if json_name == EXTRA_KEY:
                    if isinstance(item, ExtraFields):
                        children.extend((v, here, _step(k)) for k, v in item.items())
                elif type(item) not in _PLAIN:
                    children.append((item, here, f".{json_name}"))
        elif isinstance(node, Mapping):
            children.extend((v, here, _step(k)) for k, v in node.items() if type(v) not in _PLAIN)
        elif isinstance(node, (list, tuple)):
            children.extend(
                (v, here, f"[{i}]") for i, v in enumerate(node) if type(v) not in _PLAIN
            )
        stack.extend(reversed(children))
    return None


def _refuse_non_finite(value: object) -> None:
    """Refuse ``value`` if it holds ``NaN``/``±inf`` (JSON has none; msgspec writes ``null``)."""
    found = _non_finite(value)
    if found is not None:
        path, number = found
        raise ValidationError(
            f"value cannot be encoded as JSON exactly: {preview(number)} is not a JSON number"
            " (NaN and infinities are refused)",
            path=path,
        )


def encode(value: object) -> bytes:
    """Encode a model value (or builtins) as compact JSON bytes.

    Unknown fields a value keeps (``extra_fields``) are written as the
    document's own keys; a lone surrogate in a string as its escape. A
    ``NaN`` or an infinity (msgspec would write ``null``: a different value
    on read) is refused with a :class:`~zidane_actors.errors.ValidationError`
    locating it; only a document holding ``null`` is searched for one.
    """
    raw = encode_checked(value)
    if b"null" in raw:  # NaN/±inf are written as null: look for one only then
        _refuse_non_finite(value)
    return raw


def encode_checked(value: object) -> bytes:
    """:func:`encode` for a value already checked (``check_model``, ``check_json``, or a
    read-back comparison, which ``NaN`` never passes): without the search for ``NaN``.

    For the write paths that check every value anyway; anything else uses :func:`encode`.
    """
    try:
        return _ENCODER.encode(value)
    except _HasExtra:
        plain = _plain(value)
    except UnicodeEncodeError:
        return _escaped(value, _plain(value))
    try:
        return _ENCODER.encode(plain)
    except UnicodeEncodeError:
        return _escaped(value, plain)


def _escaped(value: object, plain: Any) -> bytes:
    """:func:`_escaped_json`, with a non-finite number refused as :func:`encode` refuses it."""
    try:
        return _escaped_json(plain)
    except ValueError:  # json.dumps(allow_nan=False): an out-of-range float
        _refuse_non_finite(value)
        raise


def extra_json(extra: ExtraFields | None) -> str | None:
    """A value's ``extra_fields`` as a JSON object for a column of its own; ``None`` when none."""
    return None if not extra else encode(dict(extra)).decode()


def encode_str(value: object) -> str:
    """Encode as a JSON ``str`` (for text columns and JSONL lines)."""
    return encode(value).decode()


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range for a JSON number")
    return number


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _parse_escaped(data: Any, error: Exception) -> Any:
    """Untyped JSON holding surrogate escapes msgspec refuses, or ``error`` when it is not that."""
    if isinstance(data, str):
        if not _SURROGATE_ESCAPE_TEXT.search(data) and not _SURROGATE.search(data):
            raise error
        text = data
    else:
        raw = bytes(data)
        if not _SURROGATE_ESCAPE.search(raw):
            raise error
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise error from None
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except ValueError:
        raise error from None


def _parse(data: Any) -> Any:
    """Untyped JSON, lone surrogate escapes included."""
    try:
        return _ANY.decode(data)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        return _parse_escaped(data, msgspec.DecodeError(str(exc)))


def _holds_structs(info: mi.Type) -> bool:
    if isinstance(info, mi.StructType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_holds_structs(t) for t in info.types)
    if isinstance(info, (mi.ListType, mi.VarTupleType)):
        return _holds_structs(info.item_type)
    if isinstance(info, mi.TupleType):
        return any(_holds_structs(t) for t in info.item_types)
    if isinstance(info, mi.DictType):
        return _holds_structs(info.value_type)
    return False


_OBJECT_TYPES: Final = (mi.StructType, mi.DictType, mi.TypedDictType, mi.DataclassType)


def object_type(value: dict[str, Any], info: mi.Type) -> mi.Type | None:
    """The member of ``info`` a JSON object decodes as, as msgspec picks it.

    The tagged struct its tag names, else the one untagged object type
    (msgspec allows at most one in a union); ``None`` when neither is there.
    """
    members = info.types if isinstance(info, mi.UnionType) else (info,)
    candidates = [m for m in members if isinstance(m, _OBJECT_TYPES)]
    for m in candidates:
        if isinstance(m, mi.StructType) and m.tag_field and value.get(m.tag_field) == m.tag:
            return m
    untagged = [m for m in candidates if not (isinstance(m, mi.StructType) and m.tag_field)]
    return untagged[0] if len(untagged) == 1 else None


def _absorb(value: Any, info: mi.Type) -> Any:
    """Decoded JSON with the unknown keys of each model object moved into its extra fields.

    A new tree along struct positions; free-form values are shared, not copied.
    """
    if isinstance(value, dict):
        target = object_type(value, info)
        if isinstance(target, mi.DictType):
            if not _holds_structs(target.value_type):
                return value
            return {k: _absorb(v, target.value_type) for k, v in value.items()}
        if not isinstance(target, mi.StructType):
            return value
        fields = {f.encode_name: f.type for f in target.fields if f.encode_name != EXTRA_KEY}
        keeps = EXTRA_KEY in {f.encode_name for f in target.fields}
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, item in value.items():
            if key in fields:
                out[key] = _absorb(item, fields[key])
            elif key == target.tag_field or not keeps:
                out[key] = item
            else:
                extra[key] = item
        if extra:
            out[EXTRA_KEY] = ExtraFields(extra)
        return out
    if isinstance(value, list):
        members = info.types if isinstance(info, mi.UnionType) else (info,)
        for m in members:
            if isinstance(m, (mi.ListType, mi.VarTupleType)):
                return [_absorb(item, m.item_type) for item in value]
            if isinstance(m, mi.TupleType):
                types = m.item_types
                head = [_absorb(item, t) for item, t in zip(value, types, strict=False)]
                return head + value[len(types) :]
    return value


def _unknown(exc: msgspec.ValidationError) -> bool:
    """Whether msgspec refused a key the model does not know (or one spelling ``EXTRA_KEY``)."""
    text = str(exc)
    return "unknown field" in text or "`ExtraFields`" in text


class Decoder(Generic[T]):
    """A JSON decoder for one type that also reads what other writers produce.

    Documents msgspec reads decode at its full speed. Two kinds take a
    slower path: a document with fields the model does not know (kept in
    ``extra_fields``) and one with lone UTF-16 surrogate escapes (kept as
    such in the strings). Errors are msgspec's, as from its own decoder.
    """

    __slots__ = ("_decode", "_info", "_structs", "plain", "type")

    def __init__(self, type_: Any) -> None:
        self.type = type_
        self._decode = msgspec.json.Decoder(type_).decode
        self.plain: Callable[[Any], T] = self._decode
        """msgspec's own decode of the type, for a loop over many documents (no call of
        :meth:`decode` each): what it refuses (an unknown field, a lone surrogate escape),
        :meth:`decode` may still read."""
        self._info = mi.type_info(type_)
        self._structs = _holds_structs(self._info)

    def decode(self, data: Any) -> T:
        """Decode ``data`` (bytes, str or a buffer) as the decoder's type."""
        try:
            return self._decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            if not self._structs or not _unknown(exc):
                raise
            return self._convert(self._absorb(_parse(data)))
        except (msgspec.DecodeError, UnicodeEncodeError) as exc:
            error = exc if isinstance(exc, msgspec.DecodeError) else msgspec.DecodeError(str(exc))
            return self._convert(self._absorb(_parse_escaped(data, error)))

    def convert(self, value: Any) -> T:
        """Convert builtins (decoded JSON) as the decoder's type, keeping unknown fields."""
        try:
            return msgspec.convert(value, self.type)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            if not self._structs or not _unknown(exc):
                raise
        except UnicodeEncodeError:
            pass
        return self._convert(self._absorb(value))

    def _absorb(self, value: Any) -> Any:
        return _absorb(value, self._info) if self._structs else value

    def _convert(self, value: Any) -> T:
        try:
            return msgspec.convert(value, self.type)  # type: ignore[no-any-return]
        except UnicodeEncodeError as exc:  # a lone surrogate where a tag or literal is due
            raise msgspec.ValidationError(f"invalid string: {exc.reason}") from None


@cache
def decoder(type_: Any) -> Decoder[Any]:
    """The cached JSON decoder for ``type_`` (built once per type)."""
    return Decoder(type_)


def parse_json(data: bytes | str) -> Any:
    """Untyped JSON (lone surrogate escapes included) as builtins; msgspec's errors."""
    return _parse(data)


def _name(type_: object) -> str:
    return str(getattr(type_, "__name__", type_))


def _located(exc: msgspec.MsgspecError, what: str) -> ValidationError:
    text = str(exc)
    match = _PATH.search(text)
    cause = exc.__cause__
    if isinstance(cause, ValidationError) and cause.path:
        # a located refusal of a __post_init__: its path continues the struct's
        inner = str(cause).removesuffix(f" (at {cause.path})")
        outer = match.group(1) if match else "$"
        return ValidationError(f"invalid {what}: {inner}", path=outer + cause.path[1:])
    if match:
        return ValidationError(f"invalid {what}: {text[: match.start()]}", path=match.group(1))
    return ValidationError(f"invalid {what}: {text}", path="$")


def decode(data: bytes | str, type_: type[T], *, what: str | None = None) -> T:
    """Decode untrusted JSON into ``type_``.

    Raises :class:`~zidane_actors.errors.ValidationError` naming the bad field's path.
    """
    try:
        result: T = decoder(cast(Hashable, type_)).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise _located(exc, what or _name(type_)) from None
    except RecursionError:
        raise too_deep(what or _name(type_)) from None
    return result


def convert(obj: object, type_: type[T], *, what: str | None = None) -> T:
    """Convert untrusted builtins (dicts, lists…) into ``type_``, with located errors."""
    try:
        result: T = decoder(cast(Hashable, type_)).convert(obj)
    except msgspec.ValidationError as exc:
        raise _located(exc, what or _name(type_)) from None
    except RecursionError:
        raise too_deep(what or _name(type_)) from None
    return result


def convert_or_none(obj: object, type_: type[T]) -> T | None:
    """``obj`` as ``type_`` when it is an object of that shape, else ``None``: for a
    metadata entry any writer may have touched, where a malformed one counts as absent."""
    if not isinstance(obj, Mapping):
        return None
    try:
        return convert(obj, type_)
    except ValidationError:
        return None


def too_deep(what: str) -> ValidationError:
    """The error for a document nested past what the parser recurses through."""
    return ValidationError(
        f"invalid {what}: nested deeper than {MAX_JSON_DEPTH} arrays/objects (MAX_JSON_DEPTH)",
        path="$",
    )


def to_builtins(value: object) -> Any:
    """A model value as plain JSON-ready builtins (camelCase keys, unknown fields kept)."""
    try:
        return msgspec.to_builtins(value, enc_hook=_no_extra)
    except _HasExtra:
        return _plain(value)
