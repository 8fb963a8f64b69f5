"""The single writes both SQL stores run as one step each, written once.

Each store names the step of a write method (``_sql_step``), the same one its
batches (``apply_writes``) run, so a write alone and a write in a batch agree.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from ...model import SaveMetaOptions, SessionData
from .._protocol import FullSessionStore, Revision, SessionStore
from ._hooks import SQLHooks

__all__ = ["SQLWrites"]

_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def _one_step(method: _Method) -> _Method:
    """The SQL store's ``method``: its step (``_sql_step``) in one write transaction."""
    name = method.__name__

    async def write(self: SQLWrites, *args: Any, **kwargs: Any) -> Any:
        step = self._sql_step(name)
        return await self._sql_write(lambda db: step(db, *args, **kwargs))

    return cast(_Method, functools.wraps(method)(write))


class SQLWrites(SQLHooks):
    """``append_turns`` … ``delete_artifact``: each one step in one write transaction."""

    __slots__ = ()

    def _sql_step(self, method: str) -> Callable[..., Any]:
        """The step applying the write ``method``: ``step(db, *args, **kwargs)``."""
        raise NotImplementedError

    append_turns = _one_step(SessionStore.append_turns)  # PostgreSQL has its own fast path
    update_run = _one_step(SessionStore.update_run)
    update_status = _one_step(SessionStore.update_status)
    delete = _one_step(SessionStore.delete)
    patch_meta = _one_step(FullSessionStore.patch_meta)
    upsert_artifact = _one_step(FullSessionStore.upsert_artifact)
    delete_artifact = _one_step(FullSessionStore.delete_artifact)

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
