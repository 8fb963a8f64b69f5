"""``mutate_history`` and ``mutate_turns``, written once for both SQL stores."""

from __future__ import annotations

from ...model import validate_id
from .._protocol import HistoryMutation, MutateResult, Revision, RevisionSink, TurnsMutation
from .._validate import turns_only, warn_mutate_turns
from ._hooks import SQLHooks

__all__ = ["SQLHistoryEdits"]


class SQLHistoryEdits(SQLHooks):
    """History rewrites: the store gives one step, :meth:`_sql_mutate`."""

    __slots__ = ()

    async def _sql_mutate(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        runs_too: bool,
        expected_rev: int | None,
    ) -> tuple[MutateResult, Revision]:
        """Read the history, ``mutate`` it and write back what changed, in one transaction
        (only while the stored ``rev`` is ``expected_rev``, when given); runs only if
        ``runs_too``. Answers the result and the revision it moved."""
        raise NotImplementedError

    async def mutate_history(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Read, edit (``mutate`` runs in the store's thread) and write back in one transaction.

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        validate_id(session_id)
        result, revision = await self._sql_mutate(
            session_id, mutate, runs_too=True, expected_rev=expected_rev
        )
        if on_revision is not None and revision.before:
            on_revision(revision)
        return result

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

        validate_id(session_id)
        result, revision = await self._sql_mutate(
            session_id, turns_only(mutate), runs_too=False, expected_rev=expected_rev
        )
        if on_revision is not None and revision.before:
            on_revision(revision)
        return result
