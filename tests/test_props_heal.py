"""Property: closing interrupted tool calls is pure, idempotent, complete, and persist-safe."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import close_interrupted_tool_calls
from zidane_actors.model import SessionTurn, TextBlock, ToolCallBlock, ToolResultBlock
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
