"""Actor overhead and host throughput, as ratios against baselines measured in the same run.

1. One mutation (a counter increment) per request, N requests from one caller:
   - baseline: a bare memory-channel request/reply round trip;
   - the same mutation under a ``trio.Lock``;
   - the same mutation as an ``Actor.call`` (command + one-shot reply);
   - for scale, ``Session.set_meta`` on a host (a memory-only session mutation).
   Target: the actor within 2x of the bare round trip.
2. S sessions x A appends, all sessions concurrently, through a host on the
   memory store (store actor with group commit), against the same appends
   made directly on a memory store.

Run: ``python benchmarks/bench_actor.py [--requests N] [--sessions S] [--appends A]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from zidane_actors.actors import Actor, Command, open_session_host
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import create_memory_store

ACTOR_TARGET = 2.0


@attrs.frozen(eq=False)
class Increment(Command[int]):
    amount: int


async def bare_channel(requests: int) -> float:
    counter = 0
    request_send, request_receive = trio.open_memory_channel[int](64)
    reply_send, reply_receive = trio.open_memory_channel[int](64)

    async def server() -> None:
        nonlocal counter
        async for amount in request_receive:
            counter += amount
            await reply_send.send(counter)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        start = time.perf_counter()
        for _ in range(requests):
            await request_send.send(1)
            await reply_receive.receive()
        elapsed = time.perf_counter() - start
        await request_send.aclose()
    assert counter == requests
    return elapsed


async def under_lock(requests: int) -> float:
    counter = 0
    lock = trio.Lock()
    start = time.perf_counter()
    for _ in range(requests):
        async with lock:
            counter += 1
    elapsed = time.perf_counter() - start
    assert counter == requests
    return elapsed


async def through_actor(requests: int) -> float:
    counter = 0

    async def handle(command: Increment) -> int:
        nonlocal counter
        counter += command.amount
        return counter

    actor: Actor[Increment] = Actor(handle, mailbox_size=64)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        start = time.perf_counter()
        for _ in range(requests):
            await actor.call(Increment(1))
        elapsed = time.perf_counter() - start
        actor.close()
    assert counter == requests
    return elapsed


async def through_session(requests: int) -> float:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        start = time.perf_counter()
        for i in range(requests):
            await session.set_meta("counter", i)  # a memory-only mutation: no store write
        elapsed = time.perf_counter() - start
    assert session.metadata["counter"] == requests - 1
    return elapsed


def turns_for(session_id: str, appends: int) -> list[SessionTurn]:
    return [
        SessionTurn(
            id=f"{session_id}-{i}",
            role="user" if i % 2 == 0 else "assistant",
            content=(TextBlock(text=f"turn {i} of {session_id}"),),
            created_at=1,
        )
        for i in range(appends)
    ]


async def direct_store(sessions: int, appends: int) -> float:
    store = create_memory_store()
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        await store.save(SessionData(id=sid, created_at=1, updated_at=1))

    async def writer(sid: str) -> None:
        for turn in turns_for(sid, appends):
            await store.append_turns(sid, [turn])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for sid in ids:
            nursery.start_soon(writer, sid)
    return time.perf_counter() - start


async def through_host(sessions: int, appends: int) -> tuple[float, str]:
    store = create_memory_store()
    async with open_session_host(store, max_live_sessions=sessions) as host:
        handles = [await host.create_session(id=f"s{i}") for i in range(sessions)]

        async def writer(index: int) -> None:
            session = handles[index]
            for turn in turns_for(session.id, appends):
                await session.append_turns([turn])

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(sessions):
                nursery.start_soon(writer, index)
        elapsed = time.perf_counter() - start
        stats = host.statistics()
    for session in handles[:: max(1, sessions // 10)]:
        stored = await store.load(session.id)
        assert stored is not None and len(stored.turns) == appends
    detail = (
        f"live actors {stats.live_actors}, store batches {stats.store.batches}, "
        f"avg batch {stats.store.avg_batch_size:.1f} writes"
    )
    return elapsed, detail


async def best_interleaved(
    rounds: int, variants: dict[str, Callable[[], Awaitable[float]]]
) -> dict[str, float]:
    """Best time of each variant over ``rounds`` rounds, variants interleaved in each round
    so that load on a shared machine weighs on all of them alike."""
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, fn in variants.items():
            best[name] = min(best[name], await fn())
    return best


async def main(requests: int, sessions: int, appends: int) -> None:
    print(f"1. one mutation per request, {requests} requests, best of 5 interleaved rounds")
    best = await best_interleaved(
        5,
        {
            "channel": lambda: bare_channel(requests),
            "lock": lambda: under_lock(requests),
            "actor": lambda: through_actor(requests),
            "session": lambda: through_session(requests),
        },
    )
    channel, lock, actor, session = (best[k] for k in ("channel", "lock", "actor", "session"))
    per = 1e6 / requests
    print(f"   bare channel round trip: {channel * per:8.2f} us/request (baseline)")
    print(f"   trio.Lock:               {lock * per:8.2f} us/request  ratio {lock / channel:.2f}x")
    ratio = actor / channel
    verdict = "met" if ratio <= ACTOR_TARGET else "NOT met"
    print(f"   Actor.call:              {actor * per:8.2f} us/request  ratio {ratio:.2f}x")
    print(f"   target actor <= {ACTOR_TARGET:.1f}x bare channel: {verdict}")
    print(
        f"   Session.set_meta (host): {session * per:8.2f} us/request  "
        f"ratio {session / channel:.2f}x (command validation + state copy included)"
    )

    total = sessions * appends
    print(f"2. {sessions} sessions x {appends} appends, concurrently")
    direct = await direct_store(sessions, appends)
    hosted, detail = await through_host(sessions, appends)
    print(f"   memory store directly:   {total / direct:10.0f} turns/s (baseline)")
    print(
        f"   host + actors:           {total / hosted:10.0f} turns/s  "
        f"time ratio {hosted / direct:.2f}x the direct run"
    )
    print(f"   ({detail})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--appends", type=int, default=100)
    args = parser.parse_args()
    trio.run(main, args.requests, args.sessions, args.appends)
