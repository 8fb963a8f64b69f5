"""SQLite store benchmarks: every figure is a ratio against a baseline measured in this run.

1. 1000 concurrent sessions appending durable turns through the runtime's
   store actor (group commit, ``max_batch=1024``), vs openai-agents' ``SQLiteSession`` adding
   the same items to a file database (target: >= 20x its items/s). The two run
   in alternating pairs (``PAIRS`` of them, fresh files each time) and the
   median ratio is reported, so a slow spell of the machine hits both sides.
2. Loading a 10k-turn session vs the bare ``msgspec`` decode of the same bytes.
3. ``list_meta`` over 10k sessions vs a bare header ``SELECT`` and vs the
   memory store.
4. A durable append to a session of 10k turns vs to an empty one.

Run: ``.venv/bin/python benchmarks/bench_sqlite.py`` (about forty seconds).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from zidane_actors.actors import open_store_actor
from zidane_actors.model import SessionData, SessionTurn, TextBlock, decoder
from zidane_actors.stores import MemoryStore, StoreWrite, open_sqlite_store

SESSIONS = 1000
TURNS_EACH = 5
MAX_BATCH = 1024  # the store actor's group-commit size: one commit can take every session
TEXT = "A durable turn of a conversation, about one line of text long. " * 2
TARGET = 20.0
PAIRS = 3


def turn(session: int, i: int) -> SessionTurn:
    return SessionTurn(
        id=f"s{session}-t{i}", role="user", content=(TextBlock(text=TEXT),), created_at=1 + i
    )


def header(sid: str, **fields: Any) -> SessionData:
    fields.setdefault("updated_at", 1)
    return SessionData(id=sid, created_at=1, **fields)


async def median_time(fn: Callable[[], Awaitable[object]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- 1. concurrent durable appends -----------------------------------------------------------


async def ours_concurrent(db: Path) -> float:
    async with open_sqlite_store(db, durability="full") as store:
        await store.apply_writes([StoreWrite("save", (header(f"s{i}"),)) for i in range(SESSIONS)])
        async with open_store_actor(store, max_batch=MAX_BATCH) as actor:

            async def one_session(i: int) -> None:
                for t in range(TURNS_EACH):
                    await actor.append_turns(f"s{i}", [turn(i, t)])

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(SESSIONS):
                    nursery.start_soon(one_session, i)
            elapsed = time.perf_counter() - start
            stats = actor.statistics()
        assert len(await store.get_turns("s7")) == TURNS_EACH
    print(
        f"  zidane_actors sqlite (full): {SESSIONS * TURNS_EACH / elapsed:10.0f} items/s"
        f"  ({stats.batches} commits, {stats.avg_batch_size:.1f} writes each)"
    )
    return SESSIONS * TURNS_EACH / elapsed


def agents_concurrent(db: Path) -> float:
    from agents.memory import SQLiteSession

    async def main() -> float:
        sessions = [SQLiteSession(f"s{i}", db) for i in range(SESSIONS)]
        item: Any = {"role": "user", "content": TEXT}

        async def one_session(session: SQLiteSession) -> None:
            for _ in range(TURNS_EACH):
                await session.add_items([item])

        start = time.perf_counter()
        await asyncio.gather(*(one_session(s) for s in sessions))
        elapsed = time.perf_counter() - start
        assert len(await sessions[7].get_items()) == TURNS_EACH
        for session in sessions:
            session.close()
        return elapsed

    elapsed = asyncio.run(main())
    print(f"  openai-agents SQLiteSession: {SESSIONS * TURNS_EACH / elapsed:10.0f} items/s")
    return SESSIONS * TURNS_EACH / elapsed


# -- 2..4 -----------------------------------------------------------------------------------------


async def big_session(tmp: Path) -> None:
    db = tmp / "big.db"
    turns = tuple(turn(0, i) for i in range(10_000))
    async with open_sqlite_store(db, durability="full") as store:
        await store.save(header("big", turns=turns))
        await store.save(header("empty"))
        loaded = await store.load("big")
        assert loaded is not None and loaded.turns == turns

        with sqlite3.connect(db) as conn:
            bodies = [r[0] for r in conn.execute("SELECT body FROM turns ORDER BY seq")]
        array = b"[" + b",".join(bodies) + b"]"
        turns_decoder = decoder(tuple[SessionTurn, ...])

        async def floor() -> None:
            turns_decoder.decode(array)

        load = await median_time(lambda: store.load("big"), 7)
        bare = await median_time(floor, 7)
        print("\n2. load of a 10k-turn session")
        print(f"  store.load: {load * 1e3:7.1f} ms   msgspec decode floor: {bare * 1e3:7.1f} ms")
        print(f"  ratio load / floor: {load / bare:.2f}x")

        print("\n4. durable append (full) at 10k turns vs at 0")
        at_0: list[float] = []
        at_10k: list[float] = []
        for i in range(150):
            for sid, sink in (("empty", at_0), ("big", at_10k)):
                start = time.perf_counter()
                await store.append_turns(sid, [turn(9, 20_000 + i)])
                sink.append(time.perf_counter() - start)
        m0, m10 = statistics.median(at_0), statistics.median(at_10k)
        print(f"  at 0: {m0 * 1e3:.2f} ms   at 10k: {m10 * 1e3:.2f} ms   ratio {m10 / m0:.2f}x")


async def many_sessions(tmp: Path) -> None:
    db = tmp / "many.db"
    memory = MemoryStore()
    async with open_sqlite_store(db, durability="normal") as store:
        for start in range(0, 10_000, 500):
            saves = []
            for i in range(start, start + 500):
                data = header(
                    f"s{i:05d}",
                    updated_at=i,
                    turns=(turn(i, 0), turn(i, 1)),
                    metadata={"title": "t"} if i % 2 else {},
                )
                saves.append(StoreWrite("save", (data,)))
                await memory.save(data)
            await store.apply_writes(saves)
        rows = await store.list_meta()
        assert len(rows) == 10_000 and rows[0].turn_count == 2

        def bare_select() -> None:
            with sqlite3.connect(db) as conn:
                conn.execute(
                    "SELECT id, agent_id, project_root, status, metadata, created_at, updated_at,"
                    " run_owner, rev FROM sessions ORDER BY updated_at DESC, id"
                ).fetchall()

        async def bare() -> None:
            await trio.to_thread.run_sync(bare_select)

        ours = await median_time(store.list_meta, 5)
        floor = await median_time(bare, 5)
        mem = await median_time(memory.list_meta, 5)
    print("\n3. list_meta over 10k sessions (2 turns each)")
    print(
        f"  sqlite list_meta: {ours * 1e3:7.1f} ms   bare header SELECT: {floor * 1e3:7.1f} ms"
        f"   memory store list_meta: {mem * 1e3:7.1f} ms"
    )
    print(f"  ratio vs bare SELECT: {ours / floor:.2f}x   vs memory store: {ours / mem:.2f}x")


async def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        print(f"1. {SESSIONS} concurrent sessions x {TURNS_EACH} durable appends (file database)")
        ratios = []
        for pair in range(PAIRS):
            ours = await ours_concurrent(tmp / f"ours{pair}.db")
            theirs = await trio.to_thread.run_sync(agents_concurrent, tmp / f"agents{pair}.db")
            ratios.append(ours / theirs)
            print(f"  pair {pair + 1}: ratio {ratios[-1]:.1f}x")
        ratio = statistics.median(ratios)
        verdict = "met" if ratio >= TARGET else "NOT met"
        print(f"  median ratio: {ratio:.1f}x (target >= {TARGET:.0f}x: {verdict})")
        await big_session(tmp)
        await many_sessions(tmp)


if __name__ == "__main__":
    trio.run(main)
