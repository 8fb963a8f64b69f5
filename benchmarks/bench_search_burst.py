"""A burst of appended turns, then a search: writers never wait long behind indexing.

One writer appends ``--turns`` realistic turns (``_realistic.py``, 1-4 KB of JSON,
three per call, over 1000 sessions) through the public store API with default
settings, as fast as the store takes them; the background indexer keeps the search
queue short meanwhile. Printed: the append latencies (p50, p99, max), the indexing
steps (how many, the longest) and the most any append overlapped one (the time a
writer can have waited behind indexing: on SQLite the step holds the one connection,
its commit included; on PostgreSQL the step's computing, on its own connection), how
many turns were still queued when the burst ended, and 10 s after it the latency of
three calls of each search: a rare word (the last turn's own), a common one (every
session holds it), two common words, a one-letter prefix. Then the stores that scan
sessions (memory, file map) answer the same searches over the same turns.

Stores: SQLite (a temporary file) and PostgreSQL (``ZIDANE_TEST_POSTGRES``, as
``tests/_pg.py``; default the local ``test`` database, a fresh schema dropped after).

Run: ``.venv/bin/python benchmarks/bench_search_burst.py [--turns 100000]
[--only sqlite|postgres|scan]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import msgspec
import psycopg
import trio
from _common import DSN, bench_schema
from _realistic import step_turn
from psycopg import sql

from zidane_actors.model import SessionData, SessionSearch, SessionTurn, TextBlock
from zidane_actors.stores import (
    create_file_map_store,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
)
from zidane_actors.stores.postgres import _store as postgres_module
from zidane_actors.stores.sqlite import _meta as sqlite_module

STEPS: list[tuple[float, float]] = []
"""(start, end) of every indexing step, recorded by the wrappers below (in their threads)."""


def timed(step: Callable[..., bool]) -> Callable[..., bool]:
    def run(*args: Any) -> bool:
        start = time.perf_counter()
        try:
            return step(*args)
        finally:
            STEPS.append((start, time.perf_counter()))

    return run


sqlite_module._background_step = timed(sqlite_module._background_step)  # type: ignore[attr-defined]
postgres_module.index_step = timed(postgres_module.index_step)  # type: ignore[attr-defined]

SESSIONS = 1000
MARKER = "zanzibarquokka"


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[tuple[Any, Callable[[], int]]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "burst.db"

        def queued() -> int:
            with sqlite3.connect(path) as conn:
                return int(conn.execute("SELECT count(*) FROM search_pending").fetchone()[0])

        async with open_sqlite_store(path) as store:
            yield store, queued


@asynccontextmanager
async def postgres_store() -> AsyncIterator[tuple[Any, Callable[[], int]]]:
    with bench_schema() as schema:

        def queued() -> int:
            with psycopg.connect(DSN, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                row = conn.execute("SELECT count(*) FROM turns WHERE words IS NULL").fetchone()
                return int(row[0]) if row else 0

        async with open_postgres_store(DSN, schema=schema) as store:
            yield store, queued


def overlaps(spans: list[tuple[float, float]], steps: list[tuple[float, float]]) -> list[float]:
    """For each span (sorted by start), the longest part of it one step covered."""
    found: list[float] = []
    i = 0
    for t0, t1 in spans:
        while i < len(steps) and steps[i][1] < t0:
            i += 1
        most = 0.0
        j = i
        while j < len(steps) and steps[j][0] < t1:
            most = max(most, min(t1, steps[j][1]) - max(t0, steps[j][0]))
            j += 1
        found.append(most)
    return found


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def burst(
    name: str,
    opener: Callable[[], AbstractAsyncContextManager[tuple[Any, Callable[[], int]]]],
    turns: int,
) -> None:
    calls = turns // 3
    async with opener() as (store, queued):
        for s in range(SESSIONS):
            await store.save(SessionData(id=f"s{s}", created_at=1, updated_at=1))
        latencies: list[float] = []
        spans: list[tuple[float, float]] = []
        STEPS.clear()
        started = time.perf_counter()
        for c in range(calls):
            session, step = c % SESSIONS, c // SESSIONS
            batch = [step_turn(session, step * 3 + k) for k in range(3)]
            if c == calls - 1:
                last = SessionTurn(
                    id="last", role="user", created_at=2, content=(TextBlock(f"{MARKER} end"),)
                )
                batch.append(last)
            t0 = time.perf_counter()
            await store.append_turns(f"s{session}", batch)
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            spans.append((t0, t1))
        took = time.perf_counter() - started
        steps = sorted(STEPS)
        longest = max((b - a for a, b in steps), default=0.0)
        behind = overlaps(spans, steps)
        left = await trio.to_thread.run_sync(queued)
        latencies.sort()
        print(
            f"{name}: {calls * 3 + 1} turns in {calls} appends, {took:.1f} s"
            f" ({calls * 3 / took:.0f} turns/s); append p50 {ms(statistics.median(latencies))},"
            f" p99 {ms(latencies[int(len(latencies) * 0.99)])}, max {ms(latencies[-1])};"
            f" {len(steps)} indexing steps, longest {ms(longest)}; an append overlapped"
            f" indexing at most {ms(max(behind, default=0.0))}"
            f" ({sum(b > 0.05 for b in behind)} appends over 50 ms);"
            f" {left} turns queued when the burst ended"
        )
        await trio.sleep(10)
        left = await trio.to_thread.run_sync(queued)
        print(f"{name}: 10 s after the burst ({left} turns queued):")
        await searches(name, store)


QUERIES: Final = (
    ("rare", MARKER),
    ("common", "files"),
    ("two words", "search files"),
    ("one letter", "a"),
)
"""What a search looks for: the last turn's own word (one session), a word every session
holds, two such words, and a one-letter prefix of many words of every session."""


async def searches(name: str, store: Any) -> None:
    """Each of :data:`QUERIES` three times, first call first: the times and the total."""
    for kind, text in QUERIES:
        took: list[float] = []
        for _ in range(3):
            t0 = time.perf_counter()
            page = await store.search_meta(SessionSearch(text=text))
            took.append(time.perf_counter() - t0)
        print(
            f"{name}:   search {kind} {text!r}: {', '.join(ms(t) for t in took)}"
            f" ({page.total} sessions)"
        )


async def scanned(turns: int) -> None:
    """The stores that scan sessions at the same scale: the memory store holding all 1000
    sessions, a file map (it holds one session) one of a tenth of the turns."""
    sessions: dict[int, list[SessionTurn]] = {s: [] for s in range(SESSIONS)}
    for c in range(turns // 3):
        session, step = c % SESSIONS, c // SESSIONS
        sessions[session] += [step_turn(session, step * 3 + k) for k in range(3)]
    sessions[0].append(
        SessionTurn(id="last", role="user", created_at=2, content=(TextBlock(f"{MARKER} end"),))
    )
    datas = [
        SessionData(id=f"s{s}", created_at=1, updated_at=1 + s, turns=tuple(t))
        for s, t in sessions.items()
    ]
    async with open_memory_store() as store:
        for data in datas:
            await store.save(data)
        await searches("memory", store)
    files = _Files()
    store = create_file_map_store(files)
    try:
        big = [t for s in range(SESSIONS // 10) for t in sessions[s]]
        await store.save(SessionData(id="s0", created_at=1, updated_at=1, turns=tuple(big)))
        await searches(f"file map (one session of {len(big)} turns)", store)
    finally:
        await store.aclose()


class _Files:
    """A file map kept in memory (the file-map store's host adapter)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    async def get(self) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return dict(self.files)

    async def save(self, files: dict[str, str]) -> None:
        await trio.lowlevel.checkpoint()
        self.files = dict(files)

    async def delete(self) -> None:
        await trio.lowlevel.checkpoint()
        self.files = {}


async def main(turns: int, only: str | None) -> None:
    msgspec.json.encode(1)
    if only in (None, "sqlite"):
        await burst("sqlite", sqlite_store, turns)
    if only in (None, "postgres"):
        await burst("postgres", postgres_store, turns)
    if only in (None, "scan"):
        await scanned(turns)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--only", choices=("sqlite", "postgres", "scan"))
    args = parser.parse_args()
    trio.run(main, args.turns, args.only)
