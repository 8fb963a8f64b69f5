"""Search indexing in the background: what writes queue is indexed in small steps.

Writes only queue their turns for the search index (cheap appends); an indexed
store runs its steps (:func:`start_indexer`) for as long as it is open, so the queue
stays short and a search rarely has much left to index (it still indexes what is
left first: it sees every stored turn). Each step is one short transaction, so a
writer never waits long behind indexing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from ..errors import StoreClosedError

__all__ = ["INDEX_STEP_SECONDS", "start_indexer"]

INDEX_STEP_SECONDS: Final = 0.01
"""The most time one indexing step spends computing words before it commits."""

_IDLE_SECONDS: Final = 0.2
"""How long the indexer waits before it looks again at an empty queue."""

_YIELD_SECONDS: Final = 0.001
"""How long the indexer first waits before it looks again at a store with callers waiting;
each further look while they still wait waits twice as long, up to :data:`_YIELD_MAX_SECONDS`."""

_YIELD_MAX_SECONDS: Final = 0.016
"""The longest wait between two looks at a store with callers waiting: under a steady load
the indexer looks about 60 times a second instead of 1 000, and still finds a pause at most
16 ms (about one indexing step) after it began."""

_YIELD_LIMIT_SECONDS: Final = 1.0
"""The longest the indexer yields in a row: under a load that never pauses, it still
steps once a second, so the queue cannot grow without end."""

_log = logging.getLogger("zidane_actors.stores")


def start_indexer(
    name: str, step: Callable[[], Awaitable[bool]], busy: Callable[[], bool]
) -> trio.CancelScope:
    """Start :func:`_index_in_background` (a trio system task: a store may be opened in
    one task and closed in another); cancel the answered scope to stop it. It stops by
    itself once the store is closed."""
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await _index_in_background(step, busy)

    trio.lowlevel.spawn_system_task(run, name=name)
    return scope


async def _index_in_background(
    step: Callable[[], Awaitable[bool]], busy: Callable[[], bool]
) -> None:
    """Run ``step`` (index queued rows in one short transaction: whether rows are left)
    until the store closes; callers go first while ``busy()``, for at most
    :data:`_YIELD_LIMIT_SECONDS` in a row.

    A failing step (the database unavailable) is logged once, until one succeeds
    again; the next search indexes what is left itself.
    """
    failing = False
    backoff = _YIELD_SECONDS
    yielding_since: float | None = None
    while True:
        if busy():
            now = trio.current_time()
            if yielding_since is None:
                yielding_since = now
            if now - yielding_since < _YIELD_LIMIT_SECONDS:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, _YIELD_MAX_SECONDS)
                continue
        backoff = _YIELD_SECONDS
        yielding_since = None
        try:
            more = await step()
        except StoreClosedError:
            return
        except Exception as exc:  # a search indexes what is left itself
            if not failing:
                _log.warning("search indexing in the background failed, retrying: %s", exc)
            failing, more = True, False
        else:
            failing = False
        await trio.sleep(0 if more else _IDLE_SECONDS)
