"""The model's view of a compacted session costs what its view holds, not its history.

On SQLite and PostgreSQL, two sessions whose model views are the same 20 turns:

- ``long``: 10,000 realistic turns (1-4 KB each, ``_realistic.py``), compacted
  through its turn at index 9,980 (a one-turn summary, then the 19 turns after it);
- ``short``: those 20 turns as a plain session.

Each round loads the model view of both through the default public API
(``SessionHost.load_model_view``, the session not open in the host), in
alternating order; the medians, their ratio (target: under 2x) and the median
of the rounds' own ratios are printed.
For scale, the whole load the view took before (``load`` + ``model_view`` of
the 10,000 turns) is timed a few times too.

Run: ``.venv/bin/python benchmarks/bench_compaction.py`` (PostgreSQL at
127.0.0.1:5432, database ``test``, or ``ZIDANE_TEST_POSTGRES``; skipped when none
answers; about 30 s).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import trio
from _common import postgres_answers, postgres_store, sqlite_store
from _realistic import step_turn

from zidane_actors.actors import SessionHost, open_session_host
from zidane_actors.model import SessionData, model_view
from zidane_actors.stores import SessionStore

TURNS, VIEW, BATCH = 10_000, 20, 500
ROUNDS, WHOLE_ROUNDS = 300, 5


async def build(host: SessionHost) -> tuple[str, str]:
    """The compacted 10,000-turn session and the plain 20-turn one with the same view."""
    store = host.store
    await store.save(SessionData(id="long", created_at=1, updated_at=1))
    for start in range(0, TURNS, BATCH):
        await store.append_turns("long", [step_turn(0, i) for i in range(start, start + BATCH)])
    long = await host.load_session("long")
    assert long is not None
    through = long.turns[TURNS - VIEW].id
    await long.compact([step_turn(1, 0)], through=through)
    view = await host.load_model_view("long")
    assert view is not None and len(view) == VIEW
    await store.save(SessionData(id="short", created_at=1, updated_at=1, turns=tuple(view)))
    return "long", "short"


async def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    await call()  # type: ignore[misc]
    return time.perf_counter() - start


async def measure(
    name: str, opener: Callable[[], AbstractAsyncContextManager[SessionStore]]
) -> None:
    async with opener() as store:
        async with open_session_host(store) as builder:
            long, short = await build(builder)
        async with open_session_host(store) as host:  # neither session open here
            assert await host.load_model_view(long) == await host.load_model_view(short)
            times: dict[str, list[float]] = {long: [], short: []}
            for r in range(ROUNDS):
                order = (long, short) if r % 2 else (short, long)
                for sid in order:
                    times[sid].append(await timed(lambda sid=sid: host.load_model_view(sid)))

            async def whole() -> None:
                data = await store.load(long)
                assert data is not None
                model_view(data.turns)

            wholes = [await timed(whole) for _ in range(WHOLE_ROUNDS)]
    m_long, m_short = (statistics.median(times[s]) * 1e3 for s in (long, short))
    ratio = m_long / m_short
    rounds = statistics.median(x / y for x, y in zip(times[long], times[short], strict=True))
    print(f"\n{name}: load_model_view, medians of {ROUNDS} alternating rounds")
    print(f"  {TURNS:,}-turn session compacted to {VIEW}: {m_long:.3f} ms")
    print(f"  plain {VIEW}-turn session:                {m_short:.3f} ms")
    verdict = "met" if ratio < 2 else "NOT met"
    print(f"  ratio compacted / plain: {ratio:.2f}x (target < 2x: {verdict});", end="")
    print(f" the median of the rounds' own ratios {rounds:.2f}x")
    print(f"  for scale, load + model_view of the whole: {statistics.median(wholes) * 1e3:.1f} ms")


async def main() -> None:
    await measure("SQLite", sqlite_store)
    if postgres_answers():
        await measure("PostgreSQL", postgres_store)
    else:
        print("\nPostgreSQL: skipped (none answers on DSN)")


if __name__ == "__main__":
    trio.run(main)
