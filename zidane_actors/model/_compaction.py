"""Lossless compaction: which turns the model sees once a summary stands for older ones.

A compaction never removes a turn. It appends one *marker*: an ordinary
``command`` turn whose ``metadata["zidaneCompaction"]`` is
``{"through": <turn id>, "summary": [<turn>, ...]}`` (turns as their JSON
documents). It says that the summary turns stand, for the model, for every
turn up to and including ``through``. :func:`model_view` is the one rule that
reads markers; the session's ``to_messages``, the doors and any reader of a
stored document apply it.

The summary travels inside the marker, never as turns of its own, so a
reader that knows nothing of compaction still reads a valid history: every
turn ever written, in order, plus a ``command`` turn, which never reaches the
model. Its model view is the whole conversation (longer, never wrong);
summary turns stored as ordinary turns would reach it next to the very
turns they summarize.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from ..errors import InvalidNameError, ValidationError
from ._checked import check_values
from ._codec import convert_or_none, to_builtins
from ._ids import validate_id
from ._preview import preview
from ._turn_ids import check_unique_turn_ids
from ._types import SessionHistory, SessionTurn, TextBlock

__all__ = [
    "COMPACTION_KEY",
    "Compaction",
    "compaction_marker",
    "compaction_of",
    "latest_compaction",
    "model_view",
    "view_after",
    "with_compaction",
]

COMPACTION_KEY: Final = "zidaneCompaction"
"""The turn metadata key of a compaction marker (on a ``command`` turn)."""


class Compaction(msgspec.Struct, frozen=True):
    """What a marker records: ``summary`` stands for the turns up to and including ``through``."""

    through: str
    summary: tuple[SessionTurn, ...]


def compaction_marker(
    summary: Iterable[SessionTurn], *, through: str, id: str, created_at: int
) -> SessionTurn:
    """The marker turn recording that ``summary`` stands for the turns through ``through``.

    Checks what the marker alone can tell (each summary turn JSON carries
    exactly, distinct summary ids, safe ids), located under ``$.summary`` and
    ``$.through``; whether ``through`` names a turn is :func:`with_compaction`'s.
    """
    turns = check_values(summary, SessionTurn, "summary")
    check_unique_turn_ids(turns, path="$.summary")
    for i, turn in enumerate(turns):
        _check_id(turn.id, "summary turn id", f"$.summary[{i}].id")
    _check_id(through, "through", "$.through")
    count = "1 summary turn stands" if len(turns) == 1 else f"{len(turns)} summary turns stand"
    return SessionTurn(
        id=id,
        role="command",
        content=(TextBlock(f"Compaction: {count} for the turns through {through}."),),
        created_at=created_at,
        metadata={COMPACTION_KEY: {"through": through, "summary": to_builtins(turns)}},
    )


def _check_id(value: object, what: str, path: str) -> None:
    try:
        validate_id(value, what=what)
    except InvalidNameError as exc:
        raise InvalidNameError(str(exc), path=path) from None


def compaction_of(turn: SessionTurn) -> Compaction | None:
    """The compaction ``turn`` records, or ``None`` when it is no marker.

    A marker is a ``command`` turn whose metadata holds :data:`COMPACTION_KEY`
    in the documented shape; any other turn (a value of another shape too) is
    an ordinary turn.
    """
    metadata = turn.metadata
    if turn.role != "command" or metadata is None:
        return None
    return convert_or_none(metadata.get(COMPACTION_KEY), Compaction)


def latest_compaction(turns: Sequence[SessionTurn]) -> tuple[int, int, Compaction] | None:
    """The compaction the model's view starts from: its marker's index, its ``through``'s, itself.

    The latest marker whose ``through`` names a turn before it; ``None`` when
    there is none. A marker whose ``through`` no longer names an earlier turn
    (a history edit removed it) is passed over.
    """
    return _latest(turns)[0]


def _latest(turns: Sequence[SessionTurn]) -> tuple[tuple[int, int, Compaction] | None, bool]:
    """:func:`latest_compaction`, and whether ``turns`` hold any marker (one pass)."""
    positions: dict[str, int] | None = None
    for i in range(len(turns) - 1, -1, -1):
        found = compaction_of(turns[i])
        if found is None:
            continue
        if positions is None:
            positions = {turn.id: k for k, turn in enumerate(turns)}
        k = positions.get(found.through)
        if k is not None and k < i:
            return (i, k, found), True
    return None, positions is not None


def model_view(turns: Sequence[SessionTurn]) -> Sequence[SessionTurn]:
    """The turns the model sees of a history: from its latest compaction on.

    The :func:`latest_compaction`'s summary, then every turn after its
    ``through`` (in stored order, markers left out), wherever ``through`` lies
    against earlier markers (before an earlier one's: the turns that one
    summarized show again, as they are). Without a compaction, the turns
    without markers; without any marker, ``turns`` itself. Pure; pairing
    repairs are the wire's (a tool result after ``through`` whose call was
    summarized is an orphan there, a summarized call without its result an
    interrupted one).
    """
    found, any_marker = _latest(turns)
    if found is not None:
        _, k, compaction = found
        return (*compaction.summary, *(t for t in turns[k + 1 :] if compaction_of(t) is None))
    if not any_marker:
        return turns
    return tuple(t for t in turns if compaction_of(t) is None)


def view_after(compaction: Compaction | None, turns: Iterable[SessionTurn]) -> list[SessionTurn]:
    """:func:`model_view` told its compaction and the stored turns after its ``through``
    (every stored turn when ``None``): the summary, then those turns, markers left out.

    How a store that finds the latest compaction by its own indexes answers
    the view without reading the turns it summarizes.
    """
    kept = [turn for turn in turns if compaction_of(turn) is None]
    return kept if compaction is None else [*compaction.summary, *kept]


def with_compaction(history: SessionHistory, marker: SessionTurn) -> SessionHistory:
    """``history`` with ``marker`` appended, once its ``through`` names one of its turns.

    The compaction's write, as a ``mutate_history`` edit: decided on the
    history the store holds. Raises :class:`ValidationError` at ``$.through``
    when no turn of ``history`` has that id.
    """
    found = compaction_of(marker)
    if found is None:
        raise ValidationError("not a compaction marker", path="$")
    if not any(turn.id == found.through for turn in history.turns):
        raise ValidationError(
            f"through {preview(found.through)} names no turn of the session", path="$.through"
        )
    return SessionHistory((*history.turns, marker), history.runs)
