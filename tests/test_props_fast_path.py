"""Properties of the session fast paths: direct store writes and inline memory-only commands.

Concurrent callers of ONE session mix appends and the other store writes
(status, runs, saves: straight to the store actor when the session is idle),
memory-only commands (applied inline when idle), heals (answered inline when
idle with no call open, else through the actor), appends of an open tool call
for them to close, and ``*_nowait`` forms (always through the actor), under
random cancellation.
Whatever path each call takes: memory and store see the same turns in the
same order and the same runs and status, each caller's accepted appends keep
its order, a cancelled call is applied everywhere or nowhere, a run starts
once, and a reload equals memory.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import RunStats, Session, open_session_host
from zidane_actors.errors import ConflictError, ValidationError
from zidane_actors.model import (
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    demote_stale_running_status,
)
from zidane_actors.stores import create_memory_store

steps = st.tuples(
    st.sampled_from(
        [
            "append",
            "append_nowait",
            "meta",
            "meta_nowait",
            "status",
            "status_nowait",
            "start_run",
            "finish_run",
            "update_run",
            "update_run_nowait",
            "save",
            "save_keys",
            "heal",
            "open_call",
        ]
    ),
    st.sampled_from([None, None, 0.0, 0.0001, 0.001]),  # the call's deadline (None: none)
    st.integers(0, 2),  # checkpoints before the step
)
plans = st.lists(st.lists(steps, min_size=1, max_size=10), min_size=1, max_size=4)


def turn(tid: str) -> SessionTurn:
    return SessionTurn(id=tid, role="user", content=(TextBlock(text=tid),), created_at=1)


def run(who: int, step: int) -> SessionRun:
    return SessionRun(id=f"u{who}", prompt=f"{step}", started_at=step, status="running")


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
            elif kind == "status_nowait":
                try:
                    reply = session.update_status_nowait("completed" if step % 2 else "idle")
                except trio.WouldBlock:
                    continue
                with trio.CancelScope(shield=True):
                    await reply.wait()
            elif kind == "start_run":
                try:
                    await session.start_run(f"r{step % 2}", f"{who}")
                    log["started"].append(f"r{step % 2}")
                except ConflictError:  # started already (by any caller)
                    assert any(r.id == f"r{step % 2}" for r in session.runs)
            elif kind == "finish_run":
                with contextlib.suppress(ValidationError):  # not started yet
                    await session.complete_run(f"r{step % 2}", RunStats(who, step, 1))
            elif kind == "update_run":
                await session.update_run(run(who, step))
            elif kind == "update_run_nowait":
                try:
                    reply = session.update_run_nowait(run(who, step))
                except trio.WouldBlock:
                    continue
                with trio.CancelScope(shield=True):
                    await reply.wait()
            elif kind == "save_keys":
                await session.save_meta_keys([f"c{who}"])
            elif kind == "heal":
                await session.heal_interrupted_tool_calls()
            elif kind == "open_call":
                call = ToolCallBlock(id=f"call-{tid}", name="tool")
                log["sent"].append(tid)
                await session.append_turns(
                    [SessionTurn(id=tid, role="assistant", content=(call,), created_at=1)]
                )
                log["acked"].append(tid)
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
    log: dict[str, Any] = {"sent": [], "acked": [], "started": []}
    async with open_session_host(
        store, mailbox_size=mailbox_size, store_mailbox_size=store_mailbox_size
    ) as host:
        session = await host.create_session(id="s")
        with trio.fail_after(30):  # a lost wake-up would hang here, not pass
            async with trio.open_nursery() as nursery:
                for who, plan in enumerate(plan_list):
                    nursery.start_soon(caller, session, who, plan, log)
        # Runs and status as the store holds them, before a save rewrites the header.
        held = await store.load("s")
        assert held is not None
        assert (held.runs, held.status, held.run_owner) == (
            session.runs,
            session.status,
            session._data.run_owner,
        )
        # A run starts once, whichever callers raced to start it.
        assert sorted(log["started"]) == sorted(r.id for r in session.runs if r.id[0] == "r")
        await session.save()
        # The heals' synthetic results aside (checked with the store below).
        memory_ids = [t.id for t in session.turns if not t.id.endswith(".interrupted")]
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
