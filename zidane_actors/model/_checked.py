"""Turns checked once: validated and encoded where they are written, stored from those bytes.

A session checks the turns of an append on its caller's thread; a store
would check them again (and encode and decode them back) on its own.
:func:`checked_turns` does the whole check once and hands the store a
:class:`CheckedTurns`: the turns, each with the exact JSON the check
accepted. A store that knows the carrier (``type(x) is CheckedTurns``,
never ``isinstance``) writes those bytes; any other sequence, a slice or a
copy of one is a plain tuple and validated as before. So a dict mutated
inside a turn after the check cannot reach the store unchecked: the store
writes what was checked. The turns it carries are decoded from those bytes:
what a session keeps in memory is what the store holds (a dict given as a
content block is read back as its block), in copies nobody else holds. They
are not frozen here: a session freezes what it hands out
(:class:`~zidane_actors.model._frozen.FrozenView`) when a caller reads it, so
a write nobody reads back (a door's) pays for no frozen copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, TypeVar

import msgspec

from ..errors import ValidationError
from ._codec import decode, decoder, encode, encode_checked
from ._depth import nests_at_most
from ._ids import validate_id
from ._json import MAX_JSON_DEPTH, check_model
from ._shape import check_shape
from ._turn_ids import check_unique_turn_ids
from ._types import SessionTurn

__all__ = ["CheckedTurns", "check_turns", "check_values", "checked_turns"]

T = TypeVar("T")

_KEY: Final = object()
_TURN: Final = decoder(SessionTurn)


class CheckedTurns(tuple[SessionTurn, ...]):
    """Turns that pass every check a store applies, with ``bodies[i]`` the JSON of turn ``i``.

    Built only by :func:`checked_turns`. Slices, concatenations and copies
    are plain tuples (the bodies could not follow them).
    """

    bodies: tuple[bytes, ...]

    def __new__(
        cls, turns: tuple[SessionTurn, ...], bodies: tuple[bytes, ...], key: object
    ) -> CheckedTurns:
        if key is not _KEY:
            raise TypeError("CheckedTurns is built by checked_turns() only")
        self = super().__new__(cls, turns)
        self.bodies = bodies
        return self

    def __reduce__(self) -> tuple[type[tuple[SessionTurn, ...]], tuple[tuple[SessionTurn, ...]]]:
        return tuple, (tuple(self),)


def check_values(
    values: Iterable[T], type_: type[T], field: str, *, walk: bool = True
) -> tuple[T, ...]:
    """``values`` as a tuple of ``type_`` values JSON carries exactly.

    Raises :class:`ValidationError` located under ``$.<field>``. With
    ``walk=False`` only the container and the values' types are checked.
    """
    kind = type(values)
    if (kind is not tuple and kind is not list) and (  # the ABC checks for other iterables only
        isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable)
    ):
        raise ValidationError(
            f"{field} must be an iterable of {type_.__name__}, got {kind.__name__}",
            path=f"$.{field}",
        )
    checked = tuple(values)
    for i, value in enumerate(checked):
        if not isinstance(value, type_):
            raise ValidationError(
                f"expected a {type_.__name__}, got {type(value).__name__}", path=f"$.{field}[{i}]"
            )
    if walk:
        # Declared types first (a struct built with content=None is not walked by
        # check_model, and would fail deep inside): a dict may stand for a block.
        check_shape(checked, type_, what=field, path=f"$.{field}", loose=True)  # type: ignore[arg-type]
        check_model(checked, what=field, path=f"$.{field}")
    return checked


def check_turns(turns: Iterable[SessionTurn]) -> tuple[SessionTurn, ...]:
    """``turns`` as a tuple of ``SessionTurn`` JSON carries exactly, with distinct ids.

    Raises :class:`ValidationError` located under ``$.turns``.
    """
    checked = check_values(turns, SessionTurn, "turns")
    check_unique_turn_ids(checked, path="$.turns")
    return checked


def checked_turns(turns: Iterable[SessionTurn]) -> tuple[SessionTurn, ...]:
    """:func:`check_turns`, then a :class:`CheckedTurns` when a store would accept every turn.

    A turn a store refuses (an unsafe id, a constraint only decoding
    enforces) leaves a plain tuple: the store then raises its own located
    error, exactly as without the carrier.

    The encoding and decoding back the carrier needs also answer most of the
    check: a turn whose copy read back from its JSON equals it, whose JSON
    nests at most :data:`MAX_JSON_DEPTH` deep (proven from the bytes outside
    its text, :func:`~zidane_actors.model._depth.nests_at_most`, else by fewer
    brackets than that) and with no unknown fields, holds nothing JSON would change
    (``NaN``, ``bytes``, a set, a non-string key or a model value in a
    free-form field all read back different), so its walk is skipped. Any
    other turn gets the whole check, with its located error.
    """
    given = check_values(turns, SessionTurn, "turns", walk=False)
    bodies = []
    copies = []
    try:
        for turn in given:
            body = encode_checked(turn)  # a NaN reads back as None: the comparison refuses it
            copy = _TURN.decode(body)
            if (
                turn.extra_fields is not None
                or (
                    not nests_at_most(copy, len(body), MAX_JSON_DEPTH)
                    and body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH
                )
                or copy != turn
            ):
                break
            bodies.append(body)
            copies.append(copy)
        else:
            if len(given) > 1:
                check_unique_turn_ids(given, path="$.turns")
            for turn in given:
                validate_id(turn.id)
            return CheckedTurns(tuple(copies), tuple(bodies), _KEY)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.MsgspecError):
        pass
    return _checked_walked(given)


def _checked_walked(given: tuple[SessionTurn, ...]) -> tuple[SessionTurn, ...]:
    """:func:`checked_turns` with the whole check of every value walked."""
    checked = check_turns(given)
    for i, turn in enumerate(checked):
        if not all(isinstance(block, msgspec.Struct) for block in turn.content):
            # Blocks given as dicts: what the store reads back is the blocks, or a refusal.
            try:
                decode(encode(turn), SessionTurn, what=f"turn {i}")
            except ValidationError as exc:
                where = f"$.turns[{i}]{(exc.path or '$')[1:]}"
                raise ValidationError(str(exc).split(" (at ")[0], path=where) from None
    bodies = []
    copies = []
    try:
        for turn in checked:
            validate_id(turn.id)
            body = encode_checked(turn)  # checked above
            copies.append(_TURN.decode(body))
            bodies.append(body)
    except (TypeError, ValueError, OverflowError, msgspec.MsgspecError):  # the store says why
        return checked
    return CheckedTurns(tuple(copies), tuple(bodies), _KEY)
