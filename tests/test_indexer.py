"""The background indexer's pacing: it yields to waiting callers, looking again after
waits that double while they keep waiting (1 ms up to 16 ms), and right away once a step
ran. Time is trio's mock clock, so the waits are exact."""

from __future__ import annotations

import trio
import trio.testing

from zidane_actors.stores._indexer import start_indexer


async def test_the_indexer_backs_off_while_callers_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = autojump_clock
    start = clock.current_time()
    looks: list[float] = []
    steps: list[float] = []
    busy_until = [9]  # busy for the first nine looks, then after each step for two more

    def busy() -> bool:
        looks.append(round((clock.current_time() - start) * 1000, 3))
        busy_until[0] -= 1
        return busy_until[0] >= 0

    async def step() -> bool:
        steps.append(looks[-1])
        busy_until[0] = 2 if len(steps) < 2 else 1_000
        return True  # rows left: look again at once

    scope = start_indexer("test indexer", step, busy)
    await trio.sleep(1)
    scope.cancel()
    # Waits of 1, 2, 4, 8, 16, 16, 16, 16, 16 ms, a step, then 1 and 2 ms again.
    assert looks[:13] == [0, 1, 3, 7, 15, 31, 47, 63, 79, 95, 95, 96, 98]
    assert steps == [95, 98]


async def test_the_indexer_steps_under_a_load_that_never_pauses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Callers always waiting: the indexer yields at most a second in a row, then steps."""
    clock = autojump_clock
    start = clock.current_time()
    steps: list[float] = []

    async def step() -> bool:
        steps.append(clock.current_time() - start)
        return False  # nothing left: the next look after the idle wait

    scope = start_indexer("test indexer", step, lambda: True)
    await trio.sleep(3.5)
    scope.cancel()
    assert len(steps) == 3
    assert all(b - a >= 1.0 for a, b in zip([0.0, *steps], steps, strict=False))
