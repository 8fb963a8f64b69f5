"""Properties of the worker thread under random cancellation.

Concurrent callers submit jobs with random deadlines, so some are withdrawn
while queued and some are cancelled after the thread took them; a lone
caller is answered through the worker's socket, the others through the trio
token; some jobs may run in the trio thread itself (``here=``) when nothing
else waits, some are asked to run there at once (``run_nowait``, the thread
as the fallback). Whatever the mix: a job runs at most once, exactly when its
caller got its result; jobs run in submission order, never two at once;
nothing is left waiting.
"""

from __future__ import annotations

import time

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.errors import StoreClosedError
from zidane_actors.stores._thread import start_worker_thread

steps = st.tuples(
    st.sampled_from([None, 0.0, 0.00005, 0.0002]),  # the call's deadline (None: none)
    st.integers(0, 2),  # checkpoints before the call
    st.booleans(),  # whether the job holds the thread a little
    st.sampled_from(["thread", "here", "nowait"]),  # where it may run
)
plans = st.lists(st.lists(steps, min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(plans=plans)
async def test_each_job_runs_once_in_submission_order_or_never(
    plans: list[list[tuple[float | None, int, bool, str]]],
) -> None:
    worker = await start_worker_thread(
        "prop worker", list, lambda _: None, lambda: StoreClosedError("closed")
    )
    submitted: list[tuple[int, int]] = []
    answered: list[tuple[int, int]] = []
    running: list[tuple[int, int]] = []  # the job holding the resource now

    async def caller(who: int, plan: list[tuple[float | None, int, bool, str]]) -> None:
        for step, (deadline, pauses, slow, where) in enumerate(plan):
            for _ in range(pauses):
                await trio.lowlevel.checkpoint()
            jid = (who, step)

            def job(ran: list[tuple[int, int]], jid: tuple[int, int] = jid, slow: bool = slow):
                assert not running, f"{jid} ran while {running} held the resource"
                running.append(jid)
                if slow:
                    time.sleep(0.0001)
                ran.append(jid)
                running.remove(jid)
                return jid

            with trio.move_on_after(10.0 if deadline is None else deadline):
                submitted.append(jid)
                if where == "nowait":
                    try:
                        got = worker.run_nowait(job)
                    except trio.WouldBlock:
                        got = await worker.run(job, here=job)
                else:
                    got = await worker.run(job, here=job if where == "here" else None)
                assert got == jid
                answered.append(jid)

    try:
        async with trio.open_nursery() as nursery:
            for who, plan in enumerate(plans):
                nursery.start_soon(caller, who, plan)
        ran = await worker.run(list)
        assert len(set(ran)) == len(ran)
        assert sorted(ran) == sorted(answered)
        assert ran == [jid for jid in submitted if jid in set(ran)]
        assert worker.jobs_waiting == 0 and not worker._signalled
        assert await worker.run(len) == len(ran)
    finally:
        await worker.aclose()
