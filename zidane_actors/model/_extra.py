"""Fields a document holds that this version does not know, kept as written.

The reference grows by additive extension: a turn written by a newer zidane
may carry ``parentTurnId``. Such a field is neither refused nor dropped: a
model value keeps it in ``extra_fields``, an :class:`ExtraFields` mapping,
and every encoder writes it back next to the known fields. The JSON a
store holds is the plain document; a version that later types the field
reads it into that field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

__all__ = ["EXTRA_KEY", "ExtraFields", "json_name"]

EXTRA_KEY: Final = "\x7fextra"
"""The key ``extra_fields`` has in msgspec's view of a value; never written to JSON."""

_WORD = re.compile(r"_([a-z0-9])")


def json_name(name: str) -> str:
    """The spec's camelCase key of a field (``created_at`` -> ``createdAt``)."""
    if name == "extra_fields":
        return EXTRA_KEY
    return _WORD.sub(lambda m: m.group(1).upper(), name)


class ExtraFields(Mapping[str, Any]):
    """A read-only mapping of unknown JSON keys to their values, in document order.

    Equal to any mapping with the same items. Built from the fields a decoder
    did not know, or by a caller who wants to write such fields.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any] = ()) -> None:  # type: ignore[assignment]
        self._fields = dict(fields)

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"ExtraFields({self._fields!r})"

    def __reduce__(self) -> tuple[type[ExtraFields], tuple[dict[str, Any]]]:
        return ExtraFields, (self._fields,)
