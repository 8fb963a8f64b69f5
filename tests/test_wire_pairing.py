"""The wire-time pairing repair, the persist-safe heal and the to_wire_messages pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from zidane_actors.errors import WireFormatError
from zidane_actors.model import (
    FileBlock,
    ImageBlock,
    ReasoningBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.wire import (
    DEFAULT_USER_TAIL_DIRECTIVE,
    SYNTHETIC_TOOL_RESULT_PLACEHOLDER,
    PairingDrop,
    PairingRepair,
    drop_invalid_tool_pairings,
    ensure_ends_with_user_message,
    ensure_tool_result_pairing,
    from_openai_request,
    interrupted_tool_result_output,
    orphaned_tool_result_marker,
    to_anthropic_request,
    to_openai_request,
    to_openai_responses,
    to_wire_messages,
)


def user(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="user", content=tuple(blocks))


def assistant(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="assistant", content=tuple(blocks))


def call(call_id: str, name: str = "f") -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name)


def result(call_id: str, output: str = "ok") -> ToolResultBlock:
    return ToolResultBlock(call_id=call_id, output=output)


def synthetic(call_id: str, name: str = "f") -> ToolResultBlock:
    return ToolResultBlock(
        call_id=call_id, output=interrupted_tool_result_output(name), is_error=True, name=name
    )


def repaired(messages: list[SessionMessage]) -> tuple[list[SessionMessage], list[PairingRepair]]:
    repairs: list[PairingRepair] = []
    out = ensure_tool_result_pairing(messages, on_repair=repairs.append)
    assert ensure_tool_result_pairing(out) == out
    return out, repairs


def test_interrupted_output_wording() -> None:
    text = interrupted_tool_result_output("bash")
    assert text.startswith(SYNTHETIC_TOOL_RESULT_PLACEHOLDER)
    assert '"bash"' in text
    assert "partially run" in text


# ---------------------------------------------------------------- ensure_tool_result_pairing


def test_valid_conversation_is_untouched() -> None:
    messages = [
        user(TextBlock("go")),
        assistant(call("a"), call("b")),
        user(result("a"), result("b"), TextBlock("more")),
        assistant(TextBlock("done")),
    ]
    out, repairs = repaired(messages)
    assert out == messages
    assert all(o is m for o, m in zip(out, messages, strict=True))
    assert repairs == []


def test_mode_orphan_tool_call_gets_synthetic_result() -> None:
    out, repairs = repaired([assistant(call("a", "bash")), user(TextBlock("hi"))])
    assert out == [assistant(call("a", "bash")), user(synthetic("a", "bash"), TextBlock("hi"))]
    assert repairs == [PairingRepair(0, "synthetic-tool-result", "a")]
    # at the tail, or before another assistant message, a user message is inserted
    out, _ = repaired([assistant(call("a")), assistant(TextBlock("x"))])
    assert out == [assistant(call("a")), user(synthetic("a")), assistant(TextBlock("x"))]


def test_mode_orphan_tool_result_becomes_marker() -> None:
    out, repairs = repaired([user(TextBlock("q")), assistant(TextBlock("a")), user(result("zz"))])
    assert out[-1] == user(TextBlock(orphaned_tool_result_marker("zz")))
    assert out[-1].content[0].text.startswith("[Orphaned tool result removed")  # type: ignore[union-attr]
    assert repairs == [PairingRepair(2, "orphan-tool-result", "zz")]
    # a result before its call is an orphan too
    out, repairs = repaired([user(result("a")), assistant(call("a")), user(result("a"))])
    assert out[0] == user(TextBlock(orphaned_tool_result_marker("a")))
    assert repairs == [PairingRepair(0, "orphan-tool-result", "a")]


def test_mode_duplicate_tool_result_dropped() -> None:
    out, repairs = repaired([assistant(call("a")), user(result("a", "1"), result("a", "2"))])
    assert out == [assistant(call("a")), user(result("a", "1"))]
    assert repairs == [PairingRepair(1, "duplicate-tool-result", "a")]


def test_mode_duplicate_tool_call_stripped() -> None:
    messages = [
        assistant(call("a")),
        user(result("a")),
        assistant(TextBlock("again"), call("a")),
        user(result("a", "second")),
    ]
    out, repairs = repaired(messages)
    assert out == [
        assistant(call("a")),
        user(result("a")),
        assistant(TextBlock("again")),
    ]
    assert repairs == [
        PairingRepair(2, "duplicate-tool-call", "a"),
        PairingRepair(3, "duplicate-tool-result", "a"),
    ]


def test_mode_displaced_result_moved_after_its_call() -> None:
    messages = [
        assistant(call("a")),
        user(TextBlock("interjection")),
        assistant(TextBlock("hm")),
        user(result("a")),
    ]
    out, repairs = repaired(messages)
    assert out == [
        assistant(call("a")),
        user(result("a"), TextBlock("interjection")),
        assistant(TextBlock("hm")),
    ]
    assert repairs == [PairingRepair(3, "displaced-tool-result", "a")]


def test_mode_parallel_results_grouped_in_call_order_before_text() -> None:
    messages = [
        assistant(call("a"), call("b"), call("c")),
        user(TextBlock("note"), result("c"), result("a")),
        user(result("b")),
    ]
    out, repairs = repaired(messages)
    assert out == [
        assistant(call("a"), call("b"), call("c")),
        user(result("a"), result("b"), result("c"), TextBlock("note")),
    ]
    assert {r.kind for r in repairs} == {"displaced-tool-result"}
    assert sorted(r.call_id or "" for r in repairs) == ["a", "b", "c"]


async def test_an_empty_chat_assistant_message_never_reaches_the_wire() -> None:
    # {"role": "assistant", "content": null} without tool calls: the converters keep it
    # (a Chat history round-trips exactly), the send path leaves it out and says so.
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again"},
    ]
    messages = from_openai_request(chat)
    assert to_openai_request(messages) == chat
    repairs: list[PairingRepair] = []
    wire = await to_wire_messages(messages, provider="openai", on_repair=repairs.append)
    assert repairs == [PairingRepair(1, "empty-message")]
    assert to_openai_request(wire) == [chat[0], chat[2]]
    assert all(m["content"] for m in to_anthropic_request(wire)["messages"])
    assert all(item.get("content") != [] for item in to_openai_responses(wire))


def test_pairing_is_pure() -> None:
    messages = [assistant(call("a")), user(TextBlock("x"), result("a"))]
    snapshot = list(messages)
    ensure_tool_result_pairing(messages)
    assert messages == snapshot


# ---------------------------------------------------------------- drop_invalid_tool_pairings


def turn(index: int, role: Any, *blocks: Any, run_id: str | None = "r1") -> SessionTurn:
    return SessionTurn(
        id=f"t{index}",
        role=role,
        content=tuple(blocks),
        created_at=index,
        run_id=run_id,
    )


def healed(turns: list[SessionTurn], **kw: Any) -> tuple[Any, list[PairingDrop]]:
    drops: list[PairingDrop] = []
    out = drop_invalid_tool_pairings(turns, on_drop=drops.append, **kw)
    assert drop_invalid_tool_pairings(out, **kw) is out
    return out, drops


def test_heal_valid_history_returns_same_object() -> None:
    turns = [
        turn(0, "user", TextBlock("go")),
        turn(1, "assistant", call("a")),
        turn(2, "user", result("a")),
    ]
    out, drops = healed(turns)
    assert out is turns
    assert drops == []


def test_heal_orphan_tool_call_is_kept() -> None:
    turns = [turn(0, "user", TextBlock("go")), turn(1, "assistant", call("a"))]
    out, drops = healed(turns)
    assert out is turns and drops == []


def test_heal_duplicate_tool_call_in_lane_and_cascade() -> None:
    turns = [
        turn(0, "assistant", call("a")),
        turn(1, "user", result("a")),
        turn(2, "assistant", call("a")),
        turn(3, "user", result("a")),
    ]
    out, drops = healed(turns)
    assert list(out) == [turns[0], turns[1]]
    assert drops == [
        PairingDrop(2, "duplicate-tool-call", "a"),
        PairingDrop(2, "empty-turn"),
        PairingDrop(3, "orphan-tool-result", "a"),
        PairingDrop(3, "empty-turn"),
    ]


def test_heal_duplicate_within_one_turn() -> None:
    turns = [
        turn(0, "assistant", TextBlock("x"), call("a"), call("a")),
        turn(1, "user", result("a", "1"), result("a", "2")),
    ]
    out, drops = healed(turns)
    assert [t.content for t in out] == [(TextBlock("x"), call("a")), (result("a", "1"),)]
    assert drops == [
        PairingDrop(0, "duplicate-tool-call", "a"),
        PairingDrop(1, "duplicate-tool-result", "a"),
    ]


def test_heal_lanes_default_to_raw_run_id() -> None:
    turns = [
        turn(0, "assistant", call("call_0"), run_id="parent"),
        turn(1, "assistant", call("call_0"), run_id="child"),
        turn(2, "user", result("call_0"), run_id="child"),
        turn(3, "user", result("call_0"), run_id="parent"),
    ]
    out, drops = healed(turns)
    assert out is turns and drops == []
    # widened lanes: both runs share one wire view, so the second call is a duplicate
    out, drops = healed(turns, lane_for_run=lambda run_id: "main")
    # and its results, whose preceding same-lane assistant turn is now t1, cascade away
    assert drops == [
        PairingDrop(1, "duplicate-tool-call", "call_0"),
        PairingDrop(1, "empty-turn"),
        PairingDrop(2, "orphan-tool-result", "call_0"),
        PairingDrop(2, "empty-turn"),
        PairingDrop(3, "orphan-tool-result", "call_0"),
        PairingDrop(3, "empty-turn"),
    ]
    assert [t.id for t in out] == ["t0"]


def test_heal_orphan_result_needs_immediately_preceding_same_lane_assistant() -> None:
    turns = [
        turn(0, "assistant", call("a")),
        turn(1, "assistant", TextBlock("no calls")),
        turn(2, "user", result("a"), TextBlock("keep me")),
    ]
    out, drops = healed(turns)
    assert drops == [PairingDrop(2, "orphan-tool-result", "a")]
    assert out[2].content == (TextBlock("keep me"),)
    assert out[0] is turns[0] and out[1] is turns[1]


def test_heal_reasoning_only_remainder_counts_as_empty() -> None:
    thought = ReasoningBlock(text="t", provider="anthropic", signature="s")
    turns = [
        turn(0, "assistant", call("a")),
        turn(1, "assistant", thought, call("a")),
    ]
    out, drops = healed(turns)
    assert list(out) == [turns[0]]
    assert drops == [PairingDrop(1, "duplicate-tool-call", "a"), PairingDrop(1, "empty-turn")]


def test_heal_keeps_turns_that_were_already_empty() -> None:
    turns = [turn(0, "assistant"), turn(1, "assistant", ReasoningBlock(text="t"))]
    out, _ = healed(turns)
    assert out is turns


def test_heal_works_on_messages_without_run_id() -> None:
    messages = [assistant(call("a")), user(result("b"), TextBlock("t"))]
    drops: list[PairingDrop] = []
    out = drop_invalid_tool_pairings(messages, on_drop=drops.append)
    assert list(out) == [messages[0], user(TextBlock("t"))]
    assert drops == [PairingDrop(1, "orphan-tool-result", "b")]


# ---------------------------------------------------------------- user tail and pipeline


def test_ensure_ends_with_user_message() -> None:
    tail = user(TextBlock(DEFAULT_USER_TAIL_DIRECTIVE))
    assert ensure_ends_with_user_message([assistant(TextBlock("a"))]) == [
        assistant(TextBlock("a")),
        tail,
    ]
    assert ensure_ends_with_user_message([user(TextBlock("q"))]) == [user(TextBlock("q"))]
    assert ensure_ends_with_user_message([]) == []
    assert ensure_ends_with_user_message([assistant(TextBlock("a"))], "Go on.")[-1] == user(
        TextBlock("Go on.")
    )
    with pytest.raises(WireFormatError):
        ensure_ends_with_user_message([], " ")


async def test_to_wire_messages_pipeline() -> None:
    turns = [
        turn(0, "system", TextBlock("persisted system note")),
        turn(1, "user", TextBlock("go"), ImageBlock(ref="blob:1")),
        turn(2, "command", TextBlock("/compact")),
        turn(3, "assistant", call("a")),
        turn(4, "user", ToolResultBlock(call_id="a", output=(FileBlock(ref="blob:2"),))),
        turn(5, "assistant", call("b")),
    ]
    seen: list[str] = []

    async def resolve(block: ImageBlock | FileBlock) -> ImageBlock | FileBlock:
        seen.append(block.ref or "")
        if isinstance(block, ImageBlock):
            return ImageBlock(media_type="image/png", data="AA")
        return FileBlock(media_type="application/pdf", data="JV", name="x.pdf")

    repairs: list[PairingRepair] = []
    out = await to_wire_messages(
        turns, provider="anthropic", resolve_content_ref=resolve, on_repair=repairs.append
    )
    assert seen == ["blob:1", "blob:2"]
    assert out == [
        user(TextBlock("go"), ImageBlock(media_type="image/png", data="AA")),
        assistant(call("a")),
        user(
            ToolResultBlock(
                call_id="a",
                output=(FileBlock(media_type="application/pdf", data="JV", name="x.pdf"),),
            )
        ),
        assistant(call("b")),
        user(synthetic("b")),
    ]
    assert repairs == [PairingRepair(5, "synthetic-tool-result", "b")]
    assert await to_wire_messages(out, provider="anthropic") == out
    assert turns[1].content[1] == ImageBlock(ref="blob:1")


async def test_to_wire_messages_user_tail_only_with_provider() -> None:
    turns = [turn(0, "user", TextBlock("q")), turn(1, "assistant", TextBlock("a"))]
    assert (await to_wire_messages(turns))[-1].role == "assistant"
    tail = await to_wire_messages(turns, provider="openai", user_tail_directive="Next.")
    assert tail[-1] == user(TextBlock("Next."))


async def test_to_wire_messages_unresolved_ref_is_a_clear_error() -> None:
    turns = [turn(0, "user", ToolResultBlock(call_id="a", output=(ImageBlock(ref="blob:9"),)))]
    with pytest.raises(WireFormatError, match="blob:9") as info:
        await to_wire_messages(turns)
    assert info.value.path == "$[0].content[0].output[0]"

    async def lazy(block: ImageBlock | FileBlock) -> ImageBlock | FileBlock:
        return block

    with pytest.raises(WireFormatError, match="unresolved"):
        await to_wire_messages(turns, resolve_content_ref=lazy)
