"""Host memory and eviction: bytes per known idle session, and touching sessions past the cap.

1. Memory per known idle session: ``tracemalloc`` growth while a host loads
   N sessions (a short header each, no turns) that the caller keeps, then
   after a memory-only mutation of each (``set_meta``, which starts an actor)
   with ``max_live_sessions`` at N / 100, so most of them are evicted. Target: <= 1 KB per session,
   and an evicted session keeps no actor.
2. Touching 100k sessions one after the other with ``max_live_sessions``
   10,000: every touch past the cap starts an actor and evicts the least
   recently used one. Target: 100k touches <= 10 s here, and the touches
   past the cap cost about what the first 10k cost (O(1) per touch).

Run: ``.venv/bin/python benchmarks/bench_host.py [--sessions N] [--touches N]``.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import trio

from zidane_actors.actors import open_session_host
from zidane_actors.model import SessionData
from zidane_actors.stores import StoreWrite, create_memory_store

MEMORY_TARGET = 1024  # bytes per known idle session
TOUCH_TARGET = 10.0  # seconds for 100k touches


async def populated(count: int) -> object:
    store = create_memory_store()
    writes = [
        StoreWrite("save", (SessionData(id=f"s{i:06d}", created_at=1, updated_at=1),))
        for i in range(count)
    ]
    await store.apply_writes(writes)
    return store


async def memory(count: int) -> None:
    store = await populated(count)
    print(f"1. memory per known idle session ({count} sessions kept by the caller)")
    async with open_session_host(store, max_live_sessions=max(1, count // 100)) as host:  # type: ignore[arg-type]
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        sessions = [await host.load_session(f"s{i:06d}") for i in range(count)]
        gc.collect()
        loaded = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            assert session is not None
            await session.set_meta("k", 1)  # starts an actor; most are evicted again
        gc.collect()
        touched = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        stats = host.statistics()
        with_actor = sum(1 for s in sessions if s is not None and s._actor is not None)
    per_loaded = (loaded - before) / count
    per_touched = (touched - before) / count
    verdict = "met" if max(per_loaded, per_touched) <= MEMORY_TARGET else "NOT met"
    print(f"   loaded, never mutated: {per_loaded:7.0f} B/session")
    print(
        f"   after a mutation each: {per_touched:7.0f} B/session"
        f"  (live actors {stats.live_actors}, evictions {stats.evictions},"
        f" handles still holding an actor {with_actor})"
    )
    print(f"   target <= {MEMORY_TARGET} B/session: {verdict}")


async def touches(count: int, cap: int) -> None:
    store = await populated(count)
    print(f"\n2. touching {count} sessions with max_live_sessions={cap}")
    async with open_session_host(store, max_live_sessions=cap) as host:  # type: ignore[arg-type]
        sessions = [await host.load_session(f"s{i:06d}") for i in range(count)]
        laps: list[float] = []
        start = lap = time.perf_counter()
        for i, session in enumerate(sessions):
            assert session is not None
            await session.set_meta("k", i)
            if (i + 1) % cap == 0:
                now = time.perf_counter()
                laps.append(now - lap)
                lap = now
        total = time.perf_counter() - start
        stats = host.statistics()
    verdict = "met" if total * 100_000 / count <= TOUCH_TARGET else "NOT met"
    print(
        f"   {total:.2f} s in all, {total / count * 1e6:.1f} us per touch"
        f"  (live {stats.live_actors}, evictions {stats.evictions})"
    )
    if len(laps) > 1:
        print(
            f"   first {cap} (under the cap): {laps[0] * 1e6 / cap:.1f} us/touch;"
            f" last {cap} (past it): {laps[-1] * 1e6 / cap:.1f} us/touch;"
            f" ratio {laps[-1] / laps[0]:.2f}x"
        )
    print(f"   target 100k touches <= {TOUCH_TARGET:.0f} s: {verdict}")


async def main(sessions: int, count: int, cap: int) -> None:
    await memory(sessions)
    await touches(count, cap)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--touches", type=int, default=100_000)
    parser.add_argument("--cap", type=int, default=10_000)
    args = parser.parse_args()
    trio.run(main, args.sessions, args.touches, args.cap)
