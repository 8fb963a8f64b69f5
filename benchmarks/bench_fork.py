"""Fork benchmark: forking a 10,000-turn session on the SQL stores, against copying it.

The source holds 10,000 realistic turns (1-4 KB of JSON each, ``_realistic.py``: about
25 MB). Each round forks it twice on the same store, in alternating order:

- native: ``store.fork_session`` (the fork shares the source's rows: a header, its
  runs and one link row);
- copy: the generic rule every other store uses (``stores._forks.fork_into``: the
  source read in one snapshot, :func:`~zidane_actors.model.fork_document`, a save of
  the whole document), the cost of an export and import;
- for scale, a one-row write (``patch_meta``): what any commit costs there.

SQLite runs twice: with its default durability ``"full"`` (each commit waits for an
fsync, which is then most of a fork's time) and with ``"normal"`` (no fsync per
commit: what the fork itself costs). PostgreSQL runs with its default
``synchronous_commit``. The forks are deleted between rounds, outside the timing. Medians of the
rounds are printed per store, with the ratio. Run:
``.venv/bin/python benchmarks/bench_fork.py`` (PostgreSQL at 127.0.0.1:5432, database
``test``, or ``ZIDANE_TEST_POSTGRES``; skipped when it does not answer; about a minute).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

sys.path.insert(0, str(Path(__file__).parent))
from _realistic import step_turn, turn_size

from zidane_actors.model import SessionData, SessionSearch
from zidane_actors.stores import open_postgres_store, open_sqlite_store
from zidane_actors.stores._forks import fork_into
from zidane_actors.stores.sqlite import Durability

DSN = os.environ.get("ZIDANE_TEST_POSTGRES") or "host=127.0.0.1 port=5432 user=postgres dbname=test"
TURNS, ROUNDS, CHUNK = 10_000, 7, 500


def sqlite_store(durability: Durability) -> Callable[[], AbstractAsyncContextManager[Any]]:
    @asynccontextmanager
    async def opened() -> AsyncIterator[Any]:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_sqlite_store(Path(tmp) / "fork.db", durability=durability) as store:
                yield store

    return opened


@asynccontextmanager
async def postgres_store() -> AsyncIterator[Any]:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        async with open_postgres_store(DSN, schema=schema) as store:
            yield store
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def _timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


async def measure(
    opener: Callable[[], AbstractAsyncContextManager[Any]],
) -> tuple[float, float, float]:
    """Median ms of a native fork, of a copy of the 10,000-turn session, and of a one-row
    write (``patch_meta``: what any commit costs on that store)."""
    async with opener() as store:
        await store.save(SessionData(id="src", created_at=1, updated_at=1))
        for start in range(0, TURNS, CHUNK):
            await store.append_turns("src", [step_turn(0, i) for i in range(start, start + CHUNK)])
        native: list[float] = []
        copied: list[float] = []
        floor: list[float] = []
        for r in range(ROUNDS):

            async def fork(new: str = f"n{r}") -> None:
                await store.fork_session("src", new, at=None, created_at=5_000)

            async def copy(new: str = f"c{r}") -> None:
                await fork_into(store, store, "src", new, at=None, created_at=5_000)

            async def touch(r: int = r) -> None:
                await store.patch_meta("src", {"round": r})

            order = [(fork, native), (copy, copied), (touch, floor)]
            for fn, into in order if r % 2 == 0 else reversed(order):
                # Every turn indexed for search first (a search indexes what the background
                # has not), so no background indexing step (of a copy's turns) is timed.
                await store.search_meta(SessionSearch(text="durable"))
                into.append(await _timed(fn))
            fork_data = await store.load(f"n{r}")
            assert fork_data is not None and len(fork_data.turns) == TURNS
            await store.delete(f"n{r}")
            await store.delete(f"c{r}")
        return statistics.median(native), statistics.median(copied), statistics.median(floor)


async def _postgres_answers() -> bool:
    try:
        with psycopg.connect(DSN, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


async def main() -> None:
    size = sum(turn_size(step_turn(0, i)) for i in range(TURNS))
    print(f"forking a {TURNS}-turn session ({size / 1e6:.1f} MB of turns), {ROUNDS} rounds")
    stores: list[tuple[str, Callable[[], AbstractAsyncContextManager[Any]]]] = [
        ('sqlite, durability="full"', sqlite_store("full")),
        ('sqlite, durability="normal"', sqlite_store("normal")),
    ]
    if await _postgres_answers():
        stores.append(("postgres", postgres_store))
    else:
        print("postgres: not answering at", DSN, "(skipped)")
    for name, opener in stores:
        fork_ms, copy_ms, floor_ms = await measure(opener)
        print(f"\n{name}")
        print(f"  native fork: {fork_ms:9.2f} ms (median)")
        print(f"  copy:        {copy_ms:9.2f} ms (median)")
        print(f"  one-row write (patch_meta), for scale: {floor_ms:.2f} ms")
        print(f"  copy / native fork: {copy_ms / fork_ms:.0f}x")


if __name__ == "__main__":
    trio.run(main)
