"""Fork benchmark: forking a 10,000-turn session on the SQL stores, against copying it.

The source holds 10,000 realistic turns (1-4 KB of JSON each, ``_realistic.py``: about
25 MB) in 100 runs of 100 turns. Each round forks it on the same store, in alternating
order:

- native: ``store.fork_session`` (the fork shares the source's rows: a header, its
  runs and one link row);
- native at=: the same through turn 5,000 (the runs only the left-out turns belong to
  are found by index, without reading those turns);
- copy: the generic rule every other store uses (``stores._forks.fork_into``: the
  source read in one snapshot, :func:`~zidane_actors.model.fork_document`, a save of
  the whole document), the cost of an export and import;
- for scale, a one-row write (``patch_meta``): what any commit costs there.

Then ``list_forks`` (what the session browser asks on every session page and poll) is
timed on a store of 100,000 sessions, one in 1,000 of them a fork of the source (by its
``forkedFrom`` metadata: forks made by the generic rule), against a ``get_meta``.

SQLite runs twice: with its default durability ``"full"`` (each commit waits for an
fsync, which is then most of a fork's time) and with ``"normal"`` (no fsync per
commit: what the fork itself costs). PostgreSQL runs with its default
``synchronous_commit``. The forks are deleted between rounds, outside the timing. Medians of the
rounds are printed per store, with the ratio. Run:
``.venv/bin/python benchmarks/bench_fork.py`` (PostgreSQL at 127.0.0.1:5432, database
``test``, or ``ZIDANE_TEST_POSTGRES``; skipped when it does not answer; a few minutes).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
from _common import DSN, postgres_answers, postgres_store, sqlite_store
from _realistic import step_turn, turn_size
from msgspec.structs import replace

from zidane_actors.model import SessionData, SessionRun, SessionSearch
from zidane_actors.stores import StoreWrite
from zidane_actors.stores._forks import fork_into

TURNS, ROUNDS, CHUNK, RUN_TURNS = 10_000, 7, 500, 100
SESSIONS, FORK_EVERY = 100_000, 1_000


async def _timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


def _turn(i: int) -> Any:
    return replace(step_turn(0, i), run_id=f"run{i // RUN_TURNS}")


async def measure(
    opener: Callable[[], AbstractAsyncContextManager[Any]],
) -> dict[str, float]:
    """Median ms of a native fork (whole and at turn 5,000), of a copy of the 10,000-turn
    session, and of a one-row write (``patch_meta``: what any commit costs on that store)."""
    async with opener() as store:
        runs = tuple(
            SessionRun(id=f"run{r}", prompt="p", status="completed", started_at=1)
            for r in range(TURNS // RUN_TURNS)
        )
        await store.save(SessionData(id="src", created_at=1, updated_at=1, runs=runs))
        for start in range(0, TURNS, CHUNK):
            await store.append_turns("src", [_turn(i) for i in range(start, start + CHUNK)])
        middle = _turn(TURNS // 2 - 1).id
        times: dict[str, list[float]] = {"native": [], "at": [], "copy": [], "floor": []}
        for r in range(ROUNDS):

            async def fork(new: str = f"n{r}") -> None:
                await store.fork_session("src", new, at=None, created_at=5_000)

            async def fork_at(new: str = f"a{r}") -> None:
                await store.fork_session("src", new, at=middle, created_at=5_000)

            async def copy(new: str = f"c{r}") -> None:
                await fork_into(store, store, "src", new, at=None, created_at=5_000)

            async def touch(r: int = r) -> None:
                await store.patch_meta("src", {"round": r})

            order = [(fork, "native"), (fork_at, "at"), (copy, "copy"), (touch, "floor")]
            for fn, key in order if r % 2 == 0 else reversed(order):
                # Every turn indexed for search first (a search indexes what the background
                # has not), so no background indexing step (of a copy's turns) is timed.
                await store.search_meta(SessionSearch(text="durable"))
                times[key].append(await _timed(fn))
            whole, half = await store.load(f"n{r}"), await store.load(f"a{r}")
            assert whole is not None and len(whole.turns) == TURNS and whole.runs == runs
            assert half is not None and len(half.turns) == TURNS // 2
            assert half.runs == runs[: TURNS // 2 // RUN_TURNS]
            for prefix in "nac":
                await store.delete(f"{prefix}{r}")
        return {key: statistics.median(values) for key, values in times.items()}


async def measure_list_forks(
    opener: Callable[[], AbstractAsyncContextManager[Any]],
) -> tuple[float, float]:
    """Median ms of ``list_forks`` and of a ``get_meta`` on a store of 100,000 sessions."""
    async with opener() as store:
        origin = {"forkedFrom": {"sessionId": "s0000000", "turnId": None, "forkedAt": 1}}
        for base in range(0, SESSIONS, 2_000):
            await store.apply_writes(
                [
                    StoreWrite(
                        "save",
                        (
                            SessionData(
                                id=f"s{i:07d}",
                                created_at=1,
                                updated_at=1,
                                metadata=origin if i and i % FORK_EVERY == 0 else {},
                            ),
                        ),
                    )
                    for i in range(base, min(base + 2_000, SESSIONS))
                ]
            )
        listed: list[float] = []
        meta: list[float] = []
        for _ in range(ROUNDS):
            forks = await store.list_forks("s0000000")
            assert len(forks) == SESSIONS // FORK_EVERY - 1
            listed.append(await _timed(lambda: store.list_forks("s0000000")))
            meta.append(await _timed(lambda: store.get_meta("s0050000")))
        return statistics.median(listed), statistics.median(meta)


async def main() -> None:
    size = sum(turn_size(step_turn(0, i)) for i in range(TURNS))
    print(f"forking a {TURNS}-turn session ({size / 1e6:.1f} MB of turns), {ROUNDS} rounds")
    stores: list[tuple[str, Callable[[], AbstractAsyncContextManager[Any]]]] = [
        ('sqlite, durability="full"', partial(sqlite_store, durability="full")),
        ('sqlite, durability="normal"', partial(sqlite_store, durability="normal")),
    ]
    if postgres_answers():
        stores.append(("postgres", postgres_store))
    else:
        print("postgres: not answering at", DSN, "(skipped)")
    for name, opener in stores:
        ms = await measure(opener)
        listed, meta = await measure_list_forks(opener)
        print(f"\n{name}")
        print(f"  native fork:        {ms['native']:9.2f} ms (median)")
        print(f"  native fork at=:    {ms['at']:9.2f} ms (median; through turn {TURNS // 2:,})")
        print(f"  copy:               {ms['copy']:9.2f} ms (median)")
        print(f"  one-row write (patch_meta), for scale: {ms['floor']:.2f} ms")
        print(f"  copy / native fork: {ms['copy'] / ms['native']:.0f}x")
        print(
            f"  list_forks, {SESSIONS:,} sessions: {listed:.2f} ms (median;"
            f" get_meta {meta:.2f} ms, {listed / meta:.1f}x)"
        )


if __name__ == "__main__":
    trio.run(main)
