"""A bounded, safe rendering of any value for an error message.

An error message that ``repr``s an untrusted input can blow up while it is
built (a list nested 3,000 deep raises ``RecursionError``, an ``int`` of
5,000 digits ``ValueError``, a user's ``__repr__`` anything) or grow without
bound (a megabyte of text echoed back). :func:`preview` never raises and
never returns more than about :data:`PREVIEW_MAX_CHARS` characters.
"""

from __future__ import annotations

import reprlib
from itertools import islice
from typing import Final

import msgspec

__all__ = ["PREVIEW_MAX_CHARS", "preview"]

PREVIEW_MAX_CHARS: Final = 80
"""About the longest text :func:`preview` renders of a value (its type name aside)."""

_INT_MAX_BITS: Final = 128


class _Repr(reprlib.Repr):
    """``reprlib`` with small limits, no sorting of big containers and guarded instances."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdeque = 4
        self.maxdict = self.maxset = self.maxfrozenset = 4
        self.maxstring = 40
        self.maxlong = 40
        self.maxother = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _INT_MAX_BITS:  # repr of a huge int is slow, then refused
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in islice(x.items(), self.maxdict)
        ]
        if len(x) > self.maxdict:
            items.append("...")
        return "{" + ", ".join(items) + "}"

    def _unsorted(
        self, x: set[object] | frozenset[object], level: int, left: str, right: str
    ) -> str:
        if level <= 0:
            return f"{left}...{right}"
        items = [self.repr1(item, level - 1) for item in islice(x, self.maxset)]
        if len(x) > self.maxset:
            items.append("...")
        return left + ", ".join(items) + right

    def repr_set(self, x: set[object], level: int) -> str:
        return self._unsorted(x, level, "{", "}") if x else "set()"

    def repr_frozenset(self, x: frozenset[object], level: int) -> str:
        return self._unsorted(x, level, "frozenset({", "})") if x else "frozenset()"

    def repr_instance(self, x: object, level: int) -> str:
        if isinstance(x, msgspec.Struct):  # its repr walks every field, however deep
            return f"{type(x).__name__}(...)"
        return super().repr_instance(x, level)  # guarded: a failing __repr__ is named


_REPR: Final = _Repr()


def _clip(text: str) -> str:
    return text if len(text) <= PREVIEW_MAX_CHARS else text[: PREVIEW_MAX_CHARS - 1] + "…"


def _text(head: str, length: int) -> str:
    """The ``repr`` of text whose first characters are ``head``, at most ~PREVIEW_MAX_CHARS long.

    Escapes (``\\x00``, ``\\ud800``) count: the longest prefix whose ``repr`` fits is shown.
    """
    whole = str.__repr__(head)
    if length <= PREVIEW_MAX_CHARS and len(whole) <= PREVIEW_MAX_CHARS + 2:
        return whole
    low, high = 0, min(len(head), PREVIEW_MAX_CHARS)
    while low < high:  # the longest prefix whose repr fits
        mid = (low + high + 1) // 2
        if len(str.__repr__(head[:mid])) <= PREVIEW_MAX_CHARS + 2:
            low = mid
        else:
            high = mid - 1
    clipped = str.__repr__(head[:low])
    return f"{clipped[:-1]}…{clipped[-1]} ({length} chars)"


def preview(value: object) -> str:
    """``value`` rendered for an error message: bounded, printable, never raising.

    Text is its ``repr``, clipped to about :data:`PREVIEW_MAX_CHARS`
    characters, escapes counted (with its length when clipped); ``None``, booleans, numbers their
    ``repr``; any other value a clipped ``reprlib`` rendering followed by its
    type, ``[[[...]]] (a list)``. Short text reads as ``repr`` would write it,
    ``'foo'``.
    """
    kind = type(value)
    if kind is str and len(value) <= PREVIEW_MAX_CHARS:  # type: ignore[arg-type]
        text = repr(value)
        if len(text) <= PREVIEW_MAX_CHARS + 2:
            return text
    try:
        if isinstance(value, str):  # a subclass (an enum's member) as its text
            return _text(str(value[: PREVIEW_MAX_CHARS + 1]), len(value))
        if value is None or kind is bool or kind is float:
            return repr(value)
        if kind is int:
            return _REPR.repr(value)
        return f"{_clip(_REPR.repr(value))} (a {kind.__name__})"
    except Exception:  # RecursionError, a __len__ or __getitem__ that fails…
        return f"a {kind.__name__}"
