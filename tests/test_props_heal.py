"""Properties of the heal: pure, idempotent, complete, persist-safe; its fast path is exact."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import outcome
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import Session, close_interrupted_tool_calls, open_session_host
from zidane_actors.actors._commands import _Heal
from zidane_actors.model import (
    SessionData,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.stores import create_memory_store
from zidane_actors.wire import drop_invalid_tool_pairings


@st.composite
def histories(draw: st.DrawFn) -> tuple[SessionTurn, ...]:
    """Assistant turns with tool calls, followed (or not) by some of their results."""
    turns: list[SessionTurn] = []
    for i in range(draw(st.integers(0, 6))):
        run_id = draw(st.sampled_from([None, "r1", "r2"]))
        turns.append(
            SessionTurn(
                id=f"u{i}",
                role="user",
                content=(TextBlock(text="go"),),
                created_at=i,
                run_id=run_id,
            )
        )
        calls = [
            ToolCallBlock(id=f"c{i}-{k}", name=f"tool{k}") for k in range(draw(st.integers(0, 3)))
        ]
        if not calls:
            continue
        turns.append(
            SessionTurn(
                id=f"a{i}", role="assistant", content=tuple(calls), created_at=i, run_id=run_id
            )
        )
        answered = [c for c in calls if draw(st.booleans())]
        if answered:
            results = tuple(ToolResultBlock(call_id=c.id, output="ok") for c in answered)
            turns.append(
                SessionTurn(id=f"t{i}", role="user", content=results, created_at=i, run_id=run_id)
            )
    return tuple(turns)


@settings(max_examples=80)
@given(turns=histories())
def test_heal_is_pure_idempotent_and_complete(turns: tuple[SessionTurn, ...]) -> None:
    before = copy.deepcopy(turns)
    healed = close_interrupted_tool_calls(turns)
    assert turns == before  # pure
    calls = {b.id for t in turns for b in t.content if isinstance(b, ToolCallBlock)}
    answered = {b.call_id for t in turns for b in t.content if isinstance(b, ToolResultBlock)}
    if calls <= answered:
        assert healed is None
        return
    assert healed is not None
    assert close_interrupted_tool_calls(healed) is None  # idempotent
    closed = {b.call_id for t in healed for b in t.content if isinstance(b, ToolResultBlock)}
    assert calls <= closed  # complete
    assert [t.id for t in turns] == [t.id for t in healed if not t.id.endswith(".interrupted")]
    assert len({t.id for t in healed}) == len(healed)
    # persist-safe: the load-time pairing heal keeps every synthetic result
    assert drop_invalid_tool_pairings(healed) is healed


async def heal_once(
    turns: tuple[SessionTurn, ...], *, via_actor: bool, in_flight: bool, cancelled: bool
) -> tuple[Any, ...]:
    """Heal a stored session (public call, or forced through the actor); what it left."""
    store = create_memory_store()
    await store.save(SessionData(id="s", created_at=1, updated_at=1, turns=turns))
    async with open_session_host(store, clock=lambda: 7) as host:
        session = await host.load_session("s")
        assert isinstance(session, Session)
        if in_flight:  # an open call appended just before: still in flight at the heal
            call = ToolCallBlock(id="pc", name="tool")
            late = SessionTurn(id="p", role="assistant", content=(call,), created_at=2)
            appended = session.append_turns_nowait([late])
        heal = session._call(_Heal()) if via_actor else session.heal_interrupted_tool_calls()
        with trio.CancelScope() as scope:
            if cancelled:
                scope.cancel()
            verdict = await outcome.acapture(lambda: heal)
        if in_flight:
            await appended.wait()
        started = host.statistics().started
        memory = session.to_json()
    stored = await store.load("s")
    assert stored is not None
    # The store stamps ``updated_at`` from its own clock.
    return verdict, memory, msgspec.structs.replace(stored, updated_at=0), started


@settings(max_examples=60)
@given(turns=histories(), in_flight=st.booleans(), cancelled=st.booleans())
async def test_a_heal_with_nothing_to_heal_is_answered_without_the_actor_exactly(
    turns: tuple[SessionTurn, ...], in_flight: bool, cancelled: bool
) -> None:
    # With nothing queued or in flight and no call open, the heal is answered by the
    # caller: the same verdict (or cancellation), memory and store as through the actor.
    fast = await heal_once(turns, via_actor=False, in_flight=in_flight, cancelled=cancelled)
    slow = await heal_once(turns, via_actor=True, in_flight=in_flight, cancelled=cancelled)
    assert type(fast[0]) is type(slow[0])
    if isinstance(fast[0], outcome.Value):
        assert fast[0].value == slow[0].value
    else:
        assert isinstance(fast[0].error, trio.Cancelled)
        assert isinstance(slow[0].error, trio.Cancelled)
    assert fast[1:3] == slow[1:3]
    nothing_to_heal = close_interrupted_tool_calls(turns) is None and not in_flight
    assert (fast[3] == 0) == nothing_to_heal  # no actor started for it
