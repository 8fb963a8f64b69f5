"""Turn ids are unique per session: the rule every store and the runtime apply.

- A write of a whole history (``save``, ``set_turns``, ``mutate_history``)
  or one append repeating an id within itself is a :class:`ValidationError`.
- Appending a turn whose id is stored already with identical content is a
  no-op for that turn (a retried append); with other content it is a
  :class:`ConflictError` naming the id, and nothing of the append is written.

"Identical" means the same JSON document up to object key order
(:func:`same_turn`), so a retry that re-encoded a dict in another order is
still a retry, while ``1`` and ``1.0`` or ``true`` differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from ..errors import ConflictError, ValidationError
from ._codec import to_builtins
from ._preview import preview
from ._types import SessionTurn

__all__ = ["check_unique_turn_ids", "fresh_turns", "same_turn"]

_CANONICAL: Final = msgspec.json.Encoder(order="sorted", enc_hook=dict)


def check_unique_turn_ids(turns: Sequence[SessionTurn], *, path: str = "$.turns") -> None:
    """Raise :class:`ValidationError` at the first turn repeating an earlier id."""
    seen: set[str] = set()
    for i, turn in enumerate(turns):
        if turn.id in seen:
            raise ValidationError(
                f"turn id {preview(turn.id)} appears more than once in one write",
                path=f"{path}[{i}].id",
            )
        seen.add(turn.id)


def same_turn(a: SessionTurn, b: SessionTurn) -> bool:
    """Whether two turns are the same JSON document (object key order aside)."""
    return same_json(a, b)


def same_json(a: object, b: object) -> bool:
    """Whether two values are the same JSON document (object key order aside): ``==``
    takes ``1``, ``1.0`` and ``True`` (or ``0.0`` and ``-0.0``) as equal, JSON does not."""
    if a is b:
        return True
    try:
        return _CANONICAL.encode(a) == _CANONICAL.encode(b)
    except UnicodeEncodeError:  # a lone surrogate: compare the documents key-sorted
        return _sorted(a) == _sorted(b)


def _sorted(value: object) -> str:
    return json.dumps(to_builtins(value), sort_keys=True, separators=(",", ":"))


def fresh_turns(
    session_id: str, turns: Sequence[SessionTurn], stored: Mapping[str, SessionTurn]
) -> tuple[SessionTurn, ...]:
    """The turns of an append still to write, in order.

    ``stored`` maps the ids of ``turns`` already stored (it may hold others)
    to the stored turns. A stored identical turn is dropped (a retry); a
    stored different one raises :class:`ConflictError`; an id repeated within
    ``turns`` raises :class:`ValidationError`.
    """
    if len(turns) > 1:
        check_unique_turn_ids(turns)
    # Usually no id is held (a retry is rare): then every turn is fresh.
    for turn in turns:
        if turn.id in stored:
            break
    else:
        return tuple(turns)
    fresh = []
    for turn in turns:
        held = stored.get(turn.id)
        if held is None:
            fresh.append(turn)
        elif not same_turn(held, turn):
            raise ConflictError(
                f"session {preview(session_id)} already holds"
                f" turn {preview(turn.id)} with other content"
            )
    return tuple(fresh)
