"""Properties of the lone caller's path: a worker thread's job run in the trio thread.

A worker thread runs a job asked to run ``here`` in the trio thread when it
is idle with nothing queued. Concurrent callers mix such jobs with queued
ones under random deadlines and pauses. Whatever the mix: a job runs at most
once, exactly when its caller got its result, in submission order; never two
at the same time (in either thread); only an asked one runs here; nothing is
left waiting.
"""

from __future__ import annotations

import threading
import time

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.errors import StoreClosedError
from zidane_actors.stores._thread import start_worker_thread

job_steps = st.tuples(
    st.sampled_from([None, 0.0, 0.00005, 0.0002]),  # the call's deadline (None: none)
    st.integers(0, 2),  # checkpoints before the call
    st.booleans(),  # whether the job holds its thread a little
    st.booleans(),  # asked to run here
)
job_plans = st.lists(st.lists(job_steps, min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(plans=job_plans)
async def test_jobs_run_here_or_in_the_thread_once_in_submission_order(
    plans: list[list[tuple[float | None, int, bool, bool]]],
) -> None:
    worker = await start_worker_thread(
        "prop worker", list, lambda _: None, lambda: StoreClosedError("closed")
    )
    submitted: list[tuple[int, int]] = []
    answered: list[tuple[int, int]] = []
    running: list[tuple[int, int]] = []  # at most one job at a time, whichever thread
    trio_thread = threading.get_ident()
    ran_here: set[tuple[int, int]] = set()

    async def caller(who: int, plan: list[tuple[float | None, int, bool, bool]]) -> None:
        for step, (deadline, pauses, slow, here) in enumerate(plan):
            for _ in range(pauses):
                await trio.lowlevel.checkpoint()
            jid = (who, step)

            def job(ran: list[tuple[int, int]], jid: tuple[int, int] = jid, slow: bool = slow):
                running.append(jid)
                assert len(running) == 1
                if slow:
                    time.sleep(0.0001)
                if threading.get_ident() == trio_thread:
                    ran_here.add(jid)
                ran.append(jid)
                running.remove(jid)
                return jid

            with trio.move_on_after(10.0 if deadline is None else deadline):
                submitted.append(jid)
                got = await worker.run(job, here=job if here else None)
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
        asked_here = {
            (w, s) for w, plan in enumerate(plans) for s, step in enumerate(plan) if step[3]
        }
        assert ran_here <= asked_here
        assert worker.jobs_waiting == 0 and not worker._signalled and not worker._busy
        assert await worker.run(len, here=len) == len(ran)  # idle: runs here
    finally:
        await worker.aclose()
