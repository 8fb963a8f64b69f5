"""The nursery every ``open_*`` manager serves its ``async with`` body from.

Below every layer that runs tasks (the stores, the runtime, the doors), so
each imports it downward.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["open_service_nursery"]


@asynccontextmanager
async def open_service_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for the tasks that serve an ``async with`` body (``open_*`` managers).

    Under trio's strict exception groups an error of the body would come out
    wrapped in one group per nursery it crosses, and ``except
    StaleSessionError`` around the block would miss it. When the body's
    error is the only one, it comes out as itself (its own cause and context
    kept); errors of the serving tasks still come in a group.
    """
    raised: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                raised = exc
                raise
    except BaseExceptionGroup as group:
        if raised is None or len(group.exceptions) != 1 or group.exceptions[0] is not raised:
            raise
        context = raised.__context__
        try:
            raise raised  # the body's own error, not one raised while handling
        finally:
            raised.__context__ = context
            del raised
