"""Host memory and eviction: bytes per known idle session, and touching sessions past the cap.

1. Memory per known idle session: ``tracemalloc`` growth while a host loads
   N sessions (a short header each, no turns) that the caller keeps, then
   after a ``set_meta`` on each, after an ``update_status`` on each (a store
   write of an idle session: straight to the store actor), then after a
   command that needs the session's actor (``set_meta_nowait``: the
   ``*_nowait`` forms always go through it) on each, with
   ``max_live_sessions`` at N / 100 so most actors are evicted again.
   Target: <= 1 KB per session, and an evicted session keeps no actor.
2. Touching 100k sessions one after the other with ``max_live_sessions``
   10,000, four times: with ``set_meta`` (memory only: applied inline, no
   actor), with ``update_status`` (a store write: straight to the store
   actor, no actor), with ``set_meta_nowait`` (every touch starts an actor
   and, past the cap, evicts the least recently used one), then with
   ``heal_interrupted_tool_calls`` (nothing to heal: answered inline, no
   actor). Target: 100k touches <= 10 s of CPU here, and touches past the
   cap cost what the first 10k cost (O(1) per touch).

Run: ``.venv/bin/python benchmarks/bench_host.py [--sessions N] [--touches N]``.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio

from zidane_actors.actors import open_session_host
from zidane_actors.model import SessionData
from zidane_actors.stores import (
    MemoryStore,
    SessionStore,
    StoreWrite,
    create_memory_store,
    open_sqlite_store,
)

MEMORY_TARGET = 1024  # bytes per known idle session
TOUCH_TARGET = 10.0  # seconds for 100k touches


def header(i: int) -> SessionData:
    return SessionData(id=f"s{i:06d}", created_at=1, updated_at=1)


async def populated(count: int) -> MemoryStore:
    store = create_memory_store()
    await store.apply_writes([StoreWrite("save", (header(i),)) for i in range(count)])
    return store


async def memory(count: int) -> None:
    print(f"1. memory per known idle session ({count} sessions kept by the caller)")
    # An SQLite store keeps its data outside the Python heap, so tracemalloc sees
    # only what the host and the sessions hold.
    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "m.db", durability="off") as store:
            await store.apply_writes([StoreWrite("save", (header(i),)) for i in range(count)])
            await memory_on(store, count)


async def memory_on(store: SessionStore, count: int) -> None:
    async with open_session_host(store, max_live_sessions=max(1, count // 100)) as host:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        sessions = [await host.load_session(f"s{i:06d}") for i in range(count)]
        gc.collect()
        loaded = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            assert session is not None
            await session.set_meta("k", 1)
        gc.collect()
        meta = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            assert session is not None
            await session.update_status("completed")  # straight to the store actor
        gc.collect()
        status = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            assert session is not None
            await session.set_meta_nowait("k", 2).wait()  # starts an actor; most are evicted
        gc.collect()
        touched = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        stats = host.statistics()
        with_actor = sum(1 for s in sessions if s is not None and s._actor is not None)
    per_loaded = (loaded - before) / count
    per_meta = (meta - before) / count
    per_status = (status - before) / count
    per_touched = (touched - before) / count
    worst = max(per_loaded, per_meta, per_status, per_touched)
    verdict = "met" if worst <= MEMORY_TARGET else "NOT met"
    print(f"   loaded, never mutated:        {per_loaded:7.0f} B/session")
    print(f"   after a set_meta each:        {per_meta:7.0f} B/session")
    print(f"   after an update_status each:  {per_status:7.0f} B/session")
    print(
        f"   after an actor start each:    {per_touched:7.0f} B/session"
        f"  (live actors {stats.live_actors}, evictions {stats.evictions},"
        f" handles still holding an actor {with_actor})"
    )
    print(f"   target <= {MEMORY_TARGET} B/session: {verdict}")


async def touches(count: int, cap: int, how: str) -> None:
    store = await populated(count)
    print(f"\n2. touching {count} sessions with {how}, max_live_sessions={cap}")
    async with open_session_host(store, max_live_sessions=cap) as host:
        sessions = [await host.load_session(f"s{i:06d}") for i in range(count)]
        laps: list[float] = []  # CPU time: steadier than wall time on a shared machine
        wall = time.perf_counter()
        lap = time.process_time()
        for i, session in enumerate(sessions):
            assert session is not None
            if how == "set_meta":
                await session.set_meta("k", i)
            elif how == "update_status":
                await session.update_status("completed")
            elif how == "set_meta_nowait":
                await session.set_meta_nowait("k", i).wait()
            else:
                await session.heal_interrupted_tool_calls()
            if (i + 1) % cap == 0:
                now = time.process_time()
                laps.append(now - lap)
                gc.collect()  # outside the laps: a full collection's cost grows with the heap
                lap = time.process_time()
        total = sum(laps) + (time.process_time() - lap)
        wall = time.perf_counter() - wall
        stats = host.statistics()
    verdict = "met" if total * 100_000 / count <= TOUCH_TARGET else "NOT met"  # CPU seconds
    print(
        f"   {total:.2f} s of CPU ({wall:.2f} s wall) in all,"
        f" {total / count * 1e6:.1f} us per touch"
        f"  (started {stats.started}, live {stats.live_actors}, evictions {stats.evictions})"
    )
    if len(laps) > 2:
        print(
            f"   first {cap} (under the cap): {laps[0] * 1e6 / cap:.1f} us/touch;"
            f" next {cap} (just past it): {laps[1] * 1e6 / cap:.1f};"
            f" last {cap}: {laps[-1] * 1e6 / cap:.1f}; last / just past: {laps[-1] / laps[1]:.2f}x"
        )
    print(f"   target 100k touches <= {TOUCH_TARGET:.0f} s: {verdict}")


async def main(sessions: int, count: int, cap: int) -> None:
    await memory(sessions)
    await touches(count, cap, "set_meta")
    await touches(count, cap, "update_status")
    await touches(count, cap, "set_meta_nowait")
    await touches(count, cap, "heal_interrupted_tool_calls")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--touches", type=int, default=100_000)
    parser.add_argument("--cap", type=int, default=10_000)
    args = parser.parse_args()
    trio.run(main, args.sessions, args.touches, args.cap)
