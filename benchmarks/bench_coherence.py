"""Many hosts, one truth: what coherence costs, and how soon PostgreSQL notifications land.

Two hosts over one PostgreSQL schema, each through its own store object:

1. Notification delay: host B holds a session (its store opened with
   ``listen=True``); host A appends a turn. Measured: from A's append being
   acknowledged until B's memory shows the turn, without B calling
   ``load_session``. Baseline: A's acknowledged append itself (same run).
2. The cached load: ``load_session`` of a held session (one ``rev`` read)
   against a fresh load of the same session (the whole document), 100 turns.
3. What ``NOTIFY`` costs writers: single durable appends per second with the
   notify trigger installed, against a schema without it.

Run: ``.venv/bin/python benchmarks/bench_coherence.py`` (PostgreSQL at
127.0.0.1:5432, database ``test``, or ``ZIDANE_TEST_POSTGRES``; about 20 s).
"""

from __future__ import annotations

import statistics
import time

import trio
from _common import DSN, bench_schema

from zidane_actors.actors import open_session_host
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import open_postgres_store

ROUNDS = 200
LOADS = 300
APPENDS = 400
TEXT = "A turn of a conversation, about one line of text long. " * 4


def turn(turn_id: str) -> SessionTurn:
    return SessionTurn(id=turn_id, role="user", content=(TextBlock(text=TEXT),), created_at=1)


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=10)
    return statistics.median(samples), cuts[-1]


async def notification_delay() -> None:
    with bench_schema() as name:
        async with (
            open_postgres_store(DSN, schema=name) as sa,
            open_postgres_store(DSN, schema=name, listen=True) as sb,
            open_session_host(sa) as ha,
            open_session_host(sb) as hb,
        ):
            a = await ha.create_session(id="s")
            held = await hb.load_session("s")
            assert held is not None
            acked: list[float] = []
            delays: list[float] = []
            for i in range(ROUNDS):
                start = time.perf_counter()
                await a.append_turns([turn(f"t{i}")])
                done = time.perf_counter()
                acked.append(done - start)
                while len(held.turns) <= i:  # spun: the delay is what is measured
                    await trio.lowlevel.checkpoint()
                delays.append(time.perf_counter() - done)
            p50, p90 = quantiles(delays)
            b50, b90 = quantiles(acked)
            print(
                f"notification delay (ack -> other host's memory): p50 {p50 * 1e3:.2f} ms, "
                f"p90 {p90 * 1e3:.2f} ms; the append itself: p50 {b50 * 1e3:.2f} ms, "
                f"p90 {b90 * 1e3:.2f} ms; ratio p50 {p50 / b50:.2f}x"
            )


async def cached_load() -> None:
    with bench_schema() as name:
        async with open_postgres_store(DSN, schema=name) as store, open_session_host(store) as h:
            session = await h.create_session(id="s")
            await session.append_turns([turn(f"t{i}") for i in range(100)])
            cached: list[float] = []
            for _ in range(LOADS):
                start = time.perf_counter()
                assert await h.load_session("s") is session
                cached.append(time.perf_counter() - start)
            fresh: list[float] = []
            for _ in range(LOADS):
                start = time.perf_counter()
                assert await store.load_versioned("s") is not None
                fresh.append(time.perf_counter() - start)
            c50, _ = quantiles(cached)
            f50, _ = quantiles(fresh)
            print(
                f"cached load_session (rev check): p50 {c50 * 1e6:.0f} us; a full load of "
                f"the 100-turn session: p50 {f50 * 1e6:.0f} us; ratio {c50 / f50:.2f}x"
            )


async def notify_cost() -> None:
    rates: dict[bool, float] = {}
    for listen in (False, True, False, True):
        with bench_schema() as name:
            async with open_postgres_store(DSN, schema=name, listen=listen) as store:
                await store.save(SessionData(id="s", created_at=1, updated_at=1))
                start = time.perf_counter()
                for i in range(APPENDS):
                    await store.append_turns("s", [turn(f"t{i}")])
                rate = APPENDS / (time.perf_counter() - start)
                rates[listen] = max(rates.get(listen, 0.0), rate)  # best of two rounds
    print(
        f"durable single appends/s: {rates[False]:.0f} without the notify trigger, "
        f"{rates[True]:.0f} with it; ratio {rates[True] / rates[False]:.2f}x"
    )


async def main() -> None:
    await notification_delay()
    await cached_load()
    await notify_cost()


if __name__ == "__main__":
    trio.run(main)
