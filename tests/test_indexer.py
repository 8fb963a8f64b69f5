"""The background indexer's pacing: it yields to waiting callers, and to callers whose
transactions have not paused for 50 ms, looking again after waits that double while they
keep on (1 ms up to 16 ms), and right away once a step ran. Time is trio's mock clock, so
the waits are exact."""

from __future__ import annotations

import itertools

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

    scope = start_indexer("test indexer", step, busy, lambda: 0)
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

    scope = start_indexer("test indexer", step, lambda: True, lambda: 0)
    await trio.sleep(3.5)
    scope.cancel()
    assert len(steps) == 3
    assert all(b - a >= 1.0 for a, b in zip([0.0, *steps], steps, strict=False))


async def test_the_indexer_steps_once_the_callers_transactions_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A caller between two transactions waits for nothing, yet the indexer waits for it:
    it steps once the count of transactions has stayed the same for 50 ms. A count moved
    by the step's own transaction is no caller's."""
    clock = autojump_clock
    start = clock.current_time()
    transactions = [0]
    steps: list[float] = []

    async def step() -> bool:
        steps.append(round((clock.current_time() - start) * 1000, 3))
        transactions[0] += 1  # its own
        return False  # nothing left: the next look after the idle wait (200 ms)

    async def caller() -> None:
        for _ in range(20):  # a transaction every 10 ms, from 0 to 190 ms
            transactions[0] += 1
            await trio.sleep(0.01)

    scope = start_indexer("test indexer", step, lambda: False, lambda: transactions[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await trio.sleep(0.5)
    scope.cancel()
    # A step at once when the store opens (nothing seen yet). The look at 200 ms sees
    # the caller's transactions: quiet from 250 ms on, seen by the look at 263 ms (waits
    # of 1, 2, 4, 8, 16, 16, 16 ms). The look at 463 ms steps at once: the step's own
    # transaction is no caller's.
    assert steps == [0, 263, 463]


async def test_the_indexer_steps_under_transactions_that_never_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Transactions every millisecond: the indexer still steps once a second."""
    clock = autojump_clock
    start = clock.current_time()
    transactions = [0]
    steps: list[float] = []

    async def step() -> bool:
        steps.append(clock.current_time() - start)
        return False

    async def caller() -> None:
        while True:
            transactions[0] += 1
            await trio.sleep(0.001)

    scope = start_indexer("test indexer", step, lambda: False, lambda: transactions[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await trio.sleep(3.5)
        nursery.cancel_scope.cancel()
    scope.cancel()
    assert steps[0] == 0  # when the store opens
    assert len(steps) == 3
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(steps))


async def test_a_queue_a_step_left_is_indexed_between_transactions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A step that left rows (a burst, an import) makes the next go at once, transactions
    or not: only what is queued after the queue was emptied waits for a pause."""
    clock = autojump_clock
    start = clock.current_time()
    transactions = [0]
    steps: list[float] = []

    async def step() -> bool:
        steps.append(clock.current_time() - start)
        return len(steps) < 4  # the fourth step empties the queue

    async def caller() -> None:
        while True:
            transactions[0] += 1
            await trio.sleep(0.001)

    scope = start_indexer("test indexer", step, lambda: False, lambda: transactions[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await trio.sleep(1.5)
        nursery.cancel_scope.cancel()
    scope.cancel()
    assert steps[:4] == [0, 0, 0, 0]
    assert len(steps) == 5
    assert steps[4] >= 1.0  # the transactions never paused: once a second
