"""Properties of the session fast paths: direct appends and inline memory-only commands.

Concurrent callers of ONE session mix appends (straight to the store actor
when the session is idle), memory-only commands (applied inline when idle),
store writes that need the actor, and ``*_nowait`` forms, under random
cancellation. Whatever path each call takes: memory and store see the same
turns in the same order, each caller's accepted appends keep its order, a
cancelled call is applied everywhere or nowhere, and a reload equals memory.
"""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import Session, open_session_host
from zidane_actors.model import SessionTurn, TextBlock, demote_stale_running_status
from zidane_actors.stores import create_memory_store

steps = st.tuples(
    st.sampled_from(["append", "append_nowait", "meta", "meta_nowait", "status", "save"]),
    st.sampled_from([None, None, 0.0, 0.0001, 0.001]),  # the call's deadline (None: none)
    st.integers(0, 2),  # checkpoints before the step
)
plans = st.lists(st.lists(steps, min_size=1, max_size=10), min_size=1, max_size=4)


def turn(tid: str) -> SessionTurn:
    return SessionTurn(id=tid, role="user", content=(TextBlock(text=tid),), created_at=1)


async def caller(
    session: Session, who: int, plan: list[tuple[str, float | None, int]], log: dict[str, Any]
) -> None:
    for step, (kind, deadline, pauses) in enumerate(plan):
        for _ in range(pauses):
            await trio.lowlevel.checkpoint()
        tid = f"c{who}-{step}"
        with trio.move_on_after(deadline if deadline is not None else 10.0):
            if kind == "append":
                log["sent"].append(tid)
                await session.append_turns([turn(tid)])
                log["acked"].append(tid)
            elif kind == "append_nowait":
                try:
                    reply = session.append_turns_nowait([turn(tid)])
                except trio.WouldBlock:
                    continue
                log["sent"].append(tid)
                with trio.CancelScope(shield=True):
                    await reply.wait()
                log["acked"].append(tid)
            elif kind == "meta":
                await session.set_meta(f"c{who}", step)
            elif kind == "meta_nowait":
                try:
                    reply = session.set_meta_nowait(f"c{who}", step)
                except trio.WouldBlock:
                    continue
                with trio.CancelScope(shield=True):
                    await reply.wait()
            elif kind == "status":
                await session.update_status("completed" if step % 2 else "idle")
            else:
                await session.save()


@settings(max_examples=100)
@given(
    plan_list=plans,
    mailbox_size=st.integers(1, 3),
    store_mailbox_size=st.integers(1, 4),
    _random=st.random_module(),
)
async def test_fast_paths_keep_memory_and_store_in_one_order(
    plan_list: list[list[tuple[str, float | None, int]]],
    mailbox_size: int,
    store_mailbox_size: int,
    _random: object,
) -> None:
    store = create_memory_store()
    log: dict[str, Any] = {"sent": [], "acked": []}
    async with open_session_host(
        store, mailbox_size=mailbox_size, store_mailbox_size=store_mailbox_size
    ) as host:
        session = await host.create_session(id="s")
        with trio.fail_after(30):  # a lost wake-up would hang here, not pass
            async with trio.open_nursery() as nursery:
                for who, plan in enumerate(plan_list):
                    nursery.start_soon(caller, session, who, plan, log)
        await session.save()
        memory_ids = [t.id for t in session.turns]
        # Every acknowledged append is in memory; nothing is there that was never sent.
        assert set(log["acked"]) <= set(memory_ids) <= set(log["sent"])
        # One order: memory's turns are the store's, in the same order.
        stored = await store.load("s")
        assert stored is not None and stored.turns == session.turns
        # Each caller's appends keep its order.
        for who in range(len(plan_list)):
            mine = [tid for tid in memory_ids if tid.startswith(f"c{who}-")]
            assert mine == sorted(mine, key=lambda tid: int(tid.split("-")[1]))
        assert session._idle()  # nothing queued or in flight once every caller returned
    async with open_session_host(store) as other:
        reloaded = await other.load_session("s")
        assert reloaded is not None
        assert reloaded.to_json() == demote_stale_running_status(session.to_json())
