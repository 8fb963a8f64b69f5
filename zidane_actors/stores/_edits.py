"""``mutate_history`` and its deprecated turns-only form, written once for every store.

A store gives one step, :meth:`HistoryEdits._edit_history`: read the history,
``mutate`` it and write back what changed, atomically. The public methods
around it (the id check, the deprecation, ``on_revision``) are the same for
every store, so they live here.
"""

from __future__ import annotations

from ..errors import ValidationError
from ..model import SessionHistory, validate_id
from ._protocol import HistoryMutation, MutateResult, Revision, RevisionSink, TurnsMutation
from ._validate import turns_only, warn_mutate_turns

__all__ = ["HistoryEdits", "TurnsEdits"]


class HistoryEdits:
    """``mutate_history`` over the store's :meth:`_edit_history` step."""

    __slots__ = ()

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision | None]:
        """Read the history, ``mutate`` it and write back what changed, atomically (only
        while the stored ``rev`` is ``expected_rev``, when given); runs only if
        ``runs_too``. Answers the result and the revision it moved (``None``: unknown)."""
        raise NotImplementedError

    async def mutate_history(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Read, edit and write back turns and runs atomically; ``mutate`` raising writes
        nothing and propagates.

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        return await self._edit(session_id, mutate, True, expected_rev, on_revision)

    async def _edit(
        self,
        session_id: str,
        mutate: HistoryMutation,
        runs_too: bool,
        expected_rev: int | None,
        on_revision: RevisionSink | None,
    ) -> MutateResult:
        validate_id(session_id)
        result, revision = await self._edit_history(
            session_id, _checked_edit(mutate), runs_too, expected_rev
        )
        if on_revision is not None and revision is not None and revision.before:
            on_revision(revision)
        return result


class TurnsEdits(HistoryEdits):
    """:class:`HistoryEdits` with the deprecated ``mutate_turns`` (runs untouched)."""

    __slots__ = ()

    async def mutate_turns(
        self,
        session_id: str,
        mutate: TurnsMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Deprecated turns-only form of :meth:`mutate_history` (runs untouched)."""
        warn_mutate_turns()
        return await self._edit(session_id, turns_only(mutate), False, expected_rev, on_revision)


def _checked_edit(mutate: HistoryMutation) -> HistoryMutation:
    """``mutate``, its answer checked: a :class:`SessionHistory` or ``None`` (no change)."""

    def edit(history: SessionHistory) -> SessionHistory | None:
        result = mutate(history)
        if result is not None and not isinstance(result, SessionHistory):
            raise ValidationError(
                "a history mutation must return a SessionHistory or None, "
                f"got {type(result).__name__}"
            )
        return result

    return edit
