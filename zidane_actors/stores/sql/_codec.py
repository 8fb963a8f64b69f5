"""Row codecs both SQL stores share."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar, cast

import msgspec

from ...errors import CorruptDataError
from ...model import decoder

__all__ = ["decode_row"]

T = TypeVar("T")


def decode_row(raw: bytes | str | None, type_: type[T], table: str, key: str) -> T:
    """A JSON column's value as ``type_``; a row that does not decode is ``CorruptDataError``."""
    if raw is None:
        raise CorruptDataError(f"{table} row {key} has no value where JSON was expected")
    try:
        value: T = decoder(cast(Hashable, type_)).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise CorruptDataError(f"{table} row {key} does not decode: {reason}") from None
    return value
