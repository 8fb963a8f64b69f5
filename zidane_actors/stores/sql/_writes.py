"""The single writes both SQL stores run as one step each, written once.

Each store names the step of a write method (``_sql_step``), the same one its
batches (``apply_writes``) run, so a write alone and a write in a batch agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...model import (
    JsonValue,
    RunOwner,
    SaveMetaOptions,
    SessionArtifact,
    SessionData,
    SessionRun,
    SessionStatus,
    UpdateRunOptions,
)
from .._protocol import Revision
from ._hooks import SQLHooks

__all__ = ["SQLWrites"]


class SQLWrites(SQLHooks):
    """``update_run`` … ``delete_artifact``: each one step in one write transaction."""

    __slots__ = ()

    def _sql_step(self, method: str) -> Callable[..., Any]:
        """The step applying the write ``method``: ``step(db, *args, **kwargs)``."""
        raise NotImplementedError

    async def update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> Revision:
        """Upsert one run record; an unknown session is a no-op (no ghost header)."""
        step = self._sql_step("update_run")
        result: Revision = await self._sql_write(lambda db: step(db, session_id, run, options))
        return result

    async def update_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        """Set the status (``running`` records ``owner``); unknown ids are a no-op."""
        step = self._sql_step("update_status")
        result: Revision = await self._sql_write(
            lambda db: step(
                db, session_id, status, owner=owner, preserve_updated_at=preserve_updated_at
            )
        )
        return result

    async def delete(self, session_id: str) -> None:
        """Delete a session with its turns, runs, artifacts and send-request ids."""
        step = self._sql_step("delete")
        await self._sql_write(lambda db: step(db, session_id))

    async def save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        """Write the header (``metaKeys`` merge) and upsert the snapshot's runs; turns untouched."""
        step = self._sql_step("save_meta")
        result: Revision = await self._sql_write(
            lambda db: step(db, data, options, expected_rev=expected_rev)
        )
        return result

    async def patch_meta(self, session_id: str, patch: Mapping[str, JsonValue]) -> Revision:
        """Merge ``patch`` into the metadata; status and ``updatedAt`` stay; unknown ids no-op."""
        step = self._sql_step("patch_meta")
        result: Revision = await self._sql_write(lambda db: step(db, session_id, patch))
        return result

    async def upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)`` (``merge_artifact``), evicting past the cap;
        an unknown session answers ``None``."""
        step = self._sql_step("upsert_artifact")
        result: SessionArtifact | None = await self._sql_write(lambda db: step(db, artifact))
        return result

    async def delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        step = self._sql_step("delete_artifact")
        await self._sql_write(lambda db: step(db, session_id, artifact_id))
