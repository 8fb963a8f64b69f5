"""PostgreSQL store benchmark: concurrent durable appends, as a ratio to the SQLite store.

Both stores run the same workload in this run, with durable commits (SQLite
``durability="full"``, PostgreSQL's default ``synchronous_commit``):

1. 500 concurrent sessions appending 4 turns each through the runtime's
   store actor (group commit: many sessions' appends in one transaction).
2. 50 concurrent writers calling ``append_turns`` directly (one transaction
   per append, no batching).

SQLite is the baseline (the memory store when the SQLite store is missing,
said in the output).

3. ``load`` of a 10k-turn session of realistic turns (``_realistic.py``, as
   ``bench_sqlite.py`` 3): this process's CPU (the server's work is not in it)
   against the bare msgspec decode of the same bytes, alternating, medians;
   the wall time beside it.

Run: ``.venv/bin/python benchmarks/bench_postgres.py [--only append] [--only load]``
(PostgreSQL at 127.0.0.1:5432, database ``test``, or ``ZIDANE_TEST_POSTGRES``; about 30 s).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import msgspec
import trio
from _common import postgres_store
from _realistic import step_turn
from bench_sqlite import BIG, print_load_ratio

from zidane_actors.actors import open_store_actor
from zidane_actors.model import SessionData, SessionTurn, TextBlock, decoder
from zidane_actors.stores import StoreWrite

SESSIONS, TURNS_EACH, MAX_BATCH = 500, 4, 1024
WRITERS, APPENDS_EACH = 50, 20
TEXT = "A durable turn of a conversation, about one line of text long. " * 2

Opener = Callable[[], AbstractAsyncContextManager[Any]]


def turn(owner: int, i: int) -> SessionTurn:
    return SessionTurn(
        id=f"o{owner}-t{i}", role="user", content=(TextBlock(text=TEXT),), created_at=1 + i
    )


def header(sid: str) -> SessionData:
    return SessionData(id=sid, created_at=1, updated_at=1)


def baseline_opener(tmp: Path) -> tuple[str, Opener]:
    try:
        from zidane_actors.stores import open_sqlite_store
    except ImportError:
        from zidane_actors.stores import open_memory_store

        print("(the SQLite store is missing: the baseline is the memory store)")
        return "memory", open_memory_store
    counter = iter(range(1_000_000))
    return "sqlite (full)", lambda: open_sqlite_store(
        tmp / f"bench{next(counter)}.db", durability="full"
    )


async def grouped(open_store: Opener) -> float:
    """Turns/s of many sessions appending through the store actor (group commit)."""
    async with open_store() as store:
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
        assert len(await store.get_turns("s7")) == TURNS_EACH
    return SESSIONS * TURNS_EACH / elapsed


async def direct(open_store: Opener) -> float:
    """Turns/s of concurrent writers calling ``append_turns`` (a transaction each)."""
    async with open_store() as store:
        for w in range(WRITERS):
            await store.save(header(f"w{w}"))

        async def writer(w: int) -> None:
            for i in range(APPENDS_EACH):
                await store.append_turns(f"w{w}", [turn(w, i)])

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(WRITERS):
                nursery.start_soon(writer, w)
        elapsed = time.perf_counter() - start
        assert len(await store.get_turns("w3")) == APPENDS_EACH
    return WRITERS * APPENDS_EACH / elapsed


async def big_load() -> None:
    """``load`` of a 10k-turn session against the bare decode of its JSON (CPU, then wall)."""
    turns = tuple(step_turn(0, i) for i in range(BIG))
    array = msgspec.json.encode(turns)
    turns_decoder = decoder(tuple[SessionTurn, ...])
    async with postgres_store() as store:
        await store.save(SessionData(id="big", created_at=1, updated_at=1, turns=turns))
        loaded = await store.load("big")
        assert loaded is not None and loaded.turns == turns

        async def floor() -> None:
            turns_decoder.decode(array)

        async def load() -> None:
            await store.load("big")

        print(f"\n3. load of a {BIG}-turn session ({len(array) / 1e6:.1f} MB of JSON)")
        await print_load_ratio(load, floor)
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            await load()
            walls.append(time.perf_counter() - start)
    print(f"   store.load wall (server included): {statistics.median(walls) * 1e3:7.1f} ms")


async def appends() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name, baseline = baseline_opener(Path(tmp))
        for title, scenario in (
            (f"{SESSIONS} sessions x {TURNS_EACH} turns through the store actor", grouped),
            (f"{WRITERS} writers x {APPENDS_EACH} direct append_turns calls", direct),
        ):
            base = await scenario(baseline)
            ours = await scenario(postgres_store)
            print(f"\n{title}")
            print(f"  {name:>16}: {base:10.0f} turns/s")
            print(f"  {'postgres':>16}: {ours:10.0f} turns/s")
            print(f"  ratio postgres / {name}: {ours / base:.2f}x")


async def main(only: set[str]) -> None:
    if not only or "append" in only:
        await appends()
    if not only or "load" in only:
        await big_load()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=["append", "load"],
        help="run only these parts (repeatable)",
    )
    trio.run(main, set(parser.parse_args().only))
