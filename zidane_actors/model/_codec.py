"""One JSON encoder and cached decoders for the model, with located errors."""

from __future__ import annotations

import re
from collections.abc import Hashable
from functools import cache
from typing import Any, TypeVar, cast

import msgspec

from ..errors import ValidationError
from ._json import MAX_JSON_DEPTH

__all__ = [
    "convert",
    "decode",
    "decoder",
    "encode",
    "encode_str",
    "to_builtins",
    "too_deep",
]

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_PATH = re.compile(r" - at `(\$[^`]*)`$")


def encode(value: object) -> bytes:
    """Encode a model value (or builtins) as compact JSON bytes."""
    return _ENCODER.encode(value)


def encode_str(value: object) -> str:
    """Encode as a JSON ``str`` (for text columns and JSONL lines)."""
    return _ENCODER.encode(value).decode()


@cache
def decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    """The cached JSON decoder for ``type_`` (built once per type)."""
    return msgspec.json.Decoder(type_)


def _name(type_: object) -> str:
    return str(getattr(type_, "__name__", type_))


def _located(exc: msgspec.MsgspecError, what: str) -> ValidationError:
    text = str(exc)
    match = _PATH.search(text)
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
        return msgspec.convert(obj, type_)
    except msgspec.ValidationError as exc:
        raise _located(exc, what or _name(type_)) from None
    except RecursionError:
        raise too_deep(what or _name(type_)) from None


def too_deep(what: str) -> ValidationError:
    """The error for a document nested past what the parser recurses through."""
    return ValidationError(
        f"invalid {what}: nested deeper than {MAX_JSON_DEPTH} arrays/objects (MAX_JSON_DEPTH)",
        path="$",
    )


def to_builtins(value: object) -> Any:
    """A model value as plain JSON-ready builtins (camelCase keys)."""
    return msgspec.to_builtins(value)
