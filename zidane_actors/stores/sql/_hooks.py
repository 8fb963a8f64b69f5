"""What a SQL store gives the shared methods of :mod:`..sql`: its dialect and transactions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from ._dialect import Dialect

__all__ = ["SQLHooks"]

T = TypeVar("T")


class SQLHooks:
    """The store's side of the shared methods.

    Each step is a function of a cursor-like ``db`` (``db.execute(sql, params)``
    answers rows and ``rowcount``) that the store runs in one transaction.
    """

    __slots__ = ()

    _dialect: ClassVar[Dialect]

    async def _sql_read(self, op: Callable[[Any], T]) -> T:
        """``op`` in one read transaction."""
        raise NotImplementedError

    async def _sql_write(self, op: Callable[[Any], T], *, idempotent: bool = True) -> T:
        """``op`` in one write transaction (``idempotent``: safe to run again if unanswered)."""
        raise NotImplementedError
