"""``mutate_history`` and ``mutate_turns`` of both SQL stores: :mod:`.._edits` over one step."""

from __future__ import annotations

from .._edits import TurnsEdits
from .._protocol import HistoryMutation, MutateResult, Revision
from ._hooks import SQLHooks

__all__ = ["SQLHistoryEdits"]


class SQLHistoryEdits(SQLHooks, TurnsEdits):
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

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision]:
        return await self._sql_mutate(
            session_id, mutate, runs_too=runs_too, expected_rev=expected_rev
        )
