"""Hypothesis properties of the converters and the pairing repairs.

What the round trips preserve (neutral → provider → neutral), precisely:

- Anthropic: every message exactly, for tool ids matching ``^[a-zA-Z0-9_-]+$``,
  non-blank text and Anthropic reasoning that carries a signature or
  redacted data; except ``ToolResultBlock.name`` (no wire field) and the
  media type of plain-text files (always ``text/plain`` on the wire).
- Chat Completions: per message, after this normalisation: reasoning is
  dropped; assistant text comes before its tool calls; a user message's
  tool results come first (one ``tool`` message each), keep only their text
  parts, lose ``isError``/``name``; their images and files follow, ahead of
  the message's own parts; plain-text files become text. Messages left
  empty vanish and adjacent same-role messages merge.
- Responses: the conversation after dropping non-OpenAI reasoning,
  ``isError``/``name`` of results and turning plain-text files into text;
  adjacent same-role messages merge.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_wire_sdk import (
    check_anthropic,
    check_anthropic_request,
    check_chat,
    check_responses_item,
    plain,
)

from zidane_actors import model
from zidane_actors.errors import ValidationError
from zidane_actors.model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionContentBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.wire import (
    anthropic_tool_id_map,
    auto_detect_and_convert,
    drop_invalid_tool_pairings,
    ensure_tool_result_pairing,
    from_anthropic,
    from_openai,
    from_openai_responses,
    to_anthropic,
    to_anthropic_request,
    to_openai,
    to_openai_request,
    to_openai_responses,
    to_wire_messages,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------ strategies of valid neutral values

B64 = string.ascii_letters + string.digits + "+/"
ANTHROPIC_ID = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
text_str = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
b64 = st.text(B64, min_size=4, max_size=16)
url = st.from_regex(r"https://[a-z]{1,8}\.test/[a-z0-9]{0,8}", fullmatch=True)
name = st.none() | st.text(string.ascii_letters + ".", min_size=1, max_size=10)

json_scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8)
json_value = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
tool_input = st.dictionaries(st.text(max_size=6), json_value, max_size=3)

text_block = st.builds(TextBlock, text_str)
image_block = st.builds(
    ImageBlock,
    media_type=st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
    data=b64,
) | st.builds(ImageBlock, url=url)
pdf_block = st.builds(FileBlock, media_type=st.just("application/pdf"), data=b64, name=name)
file_block = (
    pdf_block
    | st.builds(FileBlock, text=text_str, name=name)
    | st.builds(FileBlock, url=url, name=name)
)


def result_block(ids: st.SearchStrategy[str], files: st.SearchStrategy[FileBlock]) -> Any:
    parts = st.lists(text_block | image_block | files, max_size=3).map(tuple)
    return st.builds(
        ToolResultBlock,
        call_id=ids,
        output=text_str | parts,
        is_error=st.booleans(),
        name=name,
    )


def call_block(ids: st.SearchStrategy[str]) -> Any:
    return st.builds(
        ToolCallBlock,
        id=ids,
        name=st.text(string.ascii_letters, min_size=1, max_size=6),
        input=tool_input,
    )


anthropic_reasoning = st.builds(
    ReasoningBlock, text=st.text(max_size=10), provider=st.just("anthropic"), signature=b64
) | st.builds(ReasoningBlock, provider=st.just("anthropic"), redacted_data=b64)
openai_reasoning = st.builds(
    ReasoningBlock,
    text=st.text(max_size=10),
    provider=st.just("openai"),
    signature=b64,
    id=ANTHROPIC_ID,
)
any_reasoning = (
    anthropic_reasoning | openai_reasoning | st.builds(ReasoningBlock, text=st.text(max_size=5))
)


def message(role: str, blocks: Any) -> Any:
    return st.lists(blocks, min_size=1, max_size=5).map(
        lambda bs: SessionMessage(role=role, content=tuple(bs))  # type: ignore[arg-type]
    )


def conversation(user_blocks: Any, assistant_blocks: Any) -> Any:
    system = message("system", text_block)
    pair = st.tuples(message("user", user_blocks), message("assistant", assistant_blocks))
    return st.tuples(st.lists(system, max_size=1), st.lists(pair, min_size=1, max_size=3)).map(
        lambda t: [*t[0], *(m for p in t[1] for m in p)]
    )


# ------------------------------------------------------------ normalisers (what each trip keeps)


def merge_adjacent(messages: Sequence[SessionMessage]) -> list[SessionMessage]:
    out: list[SessionMessage] = []
    for m in messages:
        if not m.content:
            continue
        if out and out[-1].role == m.role:
            out[-1] = SessionMessage(role=m.role, content=out[-1].content + m.content)
        else:
            out.append(m)
    return out


def _plain_text_file(block: SessionContentBlock) -> SessionContentBlock:
    if isinstance(block, FileBlock) and block.text is not None:
        return TextBlock(block.text)
    return block


def _bare_result(block: ToolResultBlock, output: Any) -> ToolResultBlock:
    return ToolResultBlock(call_id=block.call_id, output=output)


def anthropic_kept(m: SessionMessage) -> SessionMessage:
    blocks: list[SessionContentBlock] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            b = ToolResultBlock(
                call_id=b.call_id,
                output=b.output
                if isinstance(b.output, str)
                else tuple(_anth_file(p) for p in b.output),
                is_error=b.is_error or None,
            )
        blocks.append(_anth_file(b))
    return SessionMessage(role=m.role, content=tuple(blocks))


def _anth_file(b: Any) -> Any:
    if isinstance(b, FileBlock) and b.text is not None:
        return FileBlock(text=b.text, name=b.name)
    return b


def chat_kept(m: SessionMessage) -> SessionMessage:
    if m.role == "assistant":
        texts = [b for b in m.content if isinstance(b, TextBlock)]
        calls = [b for b in m.content if isinstance(b, ToolCallBlock)]
        return SessionMessage(role="assistant", content=(*texts, *calls))
    if m.role == "system":
        return m
    results: list[SessionContentBlock] = []
    moved: list[SessionContentBlock] = []
    own: list[SessionContentBlock] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            if isinstance(b.output, str):
                results.append(_bare_result(b, b.output))
            else:
                text_parts = tuple(p for p in b.output if isinstance(p, TextBlock))
                results.append(_bare_result(b, text_parts or ""))
                moved.extend(_plain_text_file(p) for p in b.output if not isinstance(p, TextBlock))
        else:
            own.append(_plain_text_file(b))
    return SessionMessage(role="user", content=(*results, *moved, *own))


def responses_kept(m: SessionMessage) -> SessionMessage:
    blocks: list[SessionContentBlock] = []
    for b in m.content:
        if isinstance(b, ReasoningBlock):
            continue  # strategies only give OpenAI reasoning to the assistant; checked below
        if isinstance(b, ToolResultBlock):
            output = (
                b.output
                if isinstance(b.output, str)
                else tuple(_plain_text_file(p) for p in b.output)
            )
            blocks.append(_bare_result(b, output))
        else:
            blocks.append(_plain_text_file(b))
    return SessionMessage(role=m.role, content=tuple(blocks))


# ---------------------------------------------------------------- round trips


@SETTINGS
@given(
    conversation(
        text_block | image_block | file_block | result_block(ANTHROPIC_ID, file_block),
        text_block | call_block(ANTHROPIC_ID) | anthropic_reasoning,
    )
)
def test_anthropic_round_trip(messages: list[SessionMessage]) -> None:
    for m in messages:
        if m.role == "system":
            continue
        wire = to_anthropic(m)
        check_anthropic(wire)
        assert from_anthropic(wire) == anthropic_kept(m)
    check_anthropic_request(to_anthropic_request(messages))


@SETTINGS
@given(
    conversation(
        text_block
        | image_block
        | pdf_block
        | st.builds(FileBlock, text=text_str)
        | result_block(st.text(min_size=1, max_size=6), pdf_block),
        text_block | call_block(st.text(min_size=1, max_size=6)) | any_reasoning,
    )
)
def test_chat_completions_round_trip(messages: list[SessionMessage]) -> None:
    back: list[SessionMessage] = []
    for m in messages:
        for wire in to_openai(m):
            check_chat(wire)
            back.append(from_openai(wire))
    assert merge_adjacent(back) == merge_adjacent([chat_kept(m) for m in messages])


@SETTINGS
@given(
    conversation(
        text_block
        | image_block
        | file_block
        | result_block(st.text(min_size=1, max_size=6), file_block),
        text_block | call_block(st.text(min_size=1, max_size=6)) | openai_reasoning,
    )
)
def test_responses_round_trip(messages: list[SessionMessage]) -> None:
    items = to_openai_responses(messages)
    for item in items:
        check_responses_item(item)
    back = plain(from_openai_responses(items))
    expected = merge_adjacent([responses_kept(m) for m in messages])
    without_reasoning = [
        SessionMessage(
            role=m.role, content=tuple(b for b in m.content if not isinstance(b, ReasoningBlock))
        )
        for m in back
    ]
    assert merge_adjacent(without_reasoning) == expected
    sent = [b for m in messages for b in m.content if isinstance(b, ReasoningBlock)]
    got = [b for m in back for b in m.content if isinstance(b, ReasoningBlock)]
    assert len(got) == sum(1 for i in items if i["type"] == "reasoning")
    assert all(b in sent for b in got)
    for k, item in enumerate(items):  # a reasoning item is followed by the item it belongs to
        if item["type"] == "reasoning":
            rest = [i for i in items[k + 1 :] if i["type"] != "reasoning"]
            assert rest
            assert rest[0]["type"] == "function_call" or rest[0].get("role") == "assistant"


@SETTINGS
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True))
def test_anthropic_id_remap_is_valid_consistent_and_collision_free(ids: list[str]) -> None:
    messages = [
        SessionMessage(role="assistant", content=tuple(ToolCallBlock(id=i, name="f") for i in ids)),
        SessionMessage(
            role="user", content=tuple(ToolResultBlock(call_id=i, output="r") for i in ids)
        ),
    ]
    request = to_anthropic_request(messages)
    check_anthropic_request(request)
    calls = [b["id"] for b in request["messages"][0]["content"]]
    results = [b["tool_use_id"] for b in request["messages"][1]["content"]]
    assert calls == results
    assert len(set(calls)) == len(ids)
    assert anthropic_tool_id_map(messages) == anthropic_tool_id_map(messages[::-1])


# ---------------------------------------------------------------- repairs: pure, idempotent, sound

SMALL_ID = st.sampled_from(["a", "b", "c", "d"])
CACHE = {"provider": "anthropic", "set": {"/cache_control": {"type": "ephemeral", "ttl": "1h"}}}
native_block = st.sampled_from(
    [
        NativeBlock(
            provider="anthropic",
            data={
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": [
                    {
                        "type": "web_search_result",
                        "title": "T",
                        "url": "https://a.test",
                        "encrypted_content": "E",
                    }
                ],
            },
        ),
        NativeBlock(provider="openai-chat", data={"audio": {"id": "audio_1"}}),
        NativeBlock(provider="openai-responses", data={"type": "item_reference", "id": "msg_1"}),
    ]
)
fuzz_block = (
    text_block
    | st.builds(TextBlock, st.just(" "))
    | st.builds(TextBlock, text_str, provider_data=st.just(CACHE))
    | call_block(SMALL_ID)
    | st.builds(ToolResultBlock, call_id=SMALL_ID, output=text_str)
    | st.builds(ToolResultBlock, call_id=SMALL_ID, output=text_str, provider_data=st.just(CACHE))
    | any_reasoning
    | native_block
)
fuzz_turn = st.builds(
    SessionTurn,
    id=st.just("t"),
    role=st.sampled_from(["user", "assistant", "assistant", "user", "system", "command"]),
    content=st.lists(fuzz_block, max_size=4).map(tuple),
    created_at=st.just(0),
    run_id=st.sampled_from([None, "r1", "r2"]),
)
fuzz_turns = st.lists(fuzz_turn, max_size=8)
fuzz_messages = st.lists(
    st.builds(
        SessionMessage,
        role=st.sampled_from(["user", "assistant", "system"]),
        content=st.lists(fuzz_block, max_size=4).map(tuple),
    ),
    max_size=8,
)


def assert_pairing_ok(messages: Sequence[SessionMessage]) -> None:
    """Independent check of what providers demand of tool calls and results."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        calls = [b.id for b in m.content if isinstance(b, ToolCallBlock)]
        results = [b.call_id for b in m.content if isinstance(b, ToolResultBlock)]
        if calls:
            assert m.role == "assistant", f"tool call outside an assistant message at {i}"
            assert not seen & set(calls) and len(set(calls)) == len(calls), (
                f"duplicate call id at {i}"
            )
            seen |= set(calls)
            assert i + 1 < len(messages) and messages[i + 1].role == "user", f"no results after {i}"
            lead = [
                b.call_id
                for b in messages[i + 1].content[: len(calls)]
                if isinstance(b, ToolResultBlock)
            ]
            assert lead == calls, f"results after {i} are not the calls, first, in order"
        if results:
            assert m.role == "user", f"tool result outside a user message at {i}"
            prev = messages[i - 1] if i else None
            prev_calls = (
                [b.id for b in prev.content if isinstance(b, ToolCallBlock)] if prev else []
            )
            assert results == prev_calls, f"results at {i} do not answer the calls before them"


def _frozen(values: Sequence[Any]) -> bytes:
    return model.encode(list(values))


@SETTINGS
@given(fuzz_messages)
def test_ensure_pairing_pure_idempotent_sound(messages: list[SessionMessage]) -> None:
    before = _frozen(messages)
    out = ensure_tool_result_pairing(messages)
    assert _frozen(messages) == before
    assert_pairing_ok(out)
    assert all(m.content for m in out)  # nothing a provider refuses as empty
    repairs: list[Any] = []
    assert ensure_tool_result_pairing(out, on_repair=repairs.append) == out
    assert repairs == []


@SETTINGS
@given(fuzz_turns, st.random_module())
async def test_to_wire_messages_always_pairs(turns: list[SessionTurn], _: Any) -> None:
    before = _frozen(turns)
    out = await to_wire_messages(turns, provider="anthropic")
    assert _frozen(turns) == before
    assert_pairing_ok(out)
    assert all(m.content for m in out)
    assert not out or out[-1].role == "user"
    assert await to_wire_messages(out, provider="anthropic") == out
    request = to_anthropic_request(out)
    check_anthropic_request(request)
    for payload in to_openai_request(out):
        check_chat(payload)
    for item in to_openai_responses(out):
        check_responses_item(item)


def assert_healed(turns: Sequence[SessionTurn], lane: Callable[[str | None], str | None]) -> None:
    """Independent check of the heal's postconditions (its table, read as invariants)."""
    calls_in_lane: dict[str | None, set[str]] = {}
    last_calls: dict[str | None, set[str]] = {}
    for i, t in enumerate(turns):
        key = lane(t.run_id)
        seen = calls_in_lane.setdefault(key, set())
        results = [b.call_id for b in t.content if isinstance(b, ToolResultBlock)]
        assert len(results) == len(set(results)), f"duplicate result in turn {i}"
        assert set(results) <= last_calls.get(key, set()), f"orphan result in turn {i}"
        calls = [b.id for b in t.content if isinstance(b, ToolCallBlock)]
        assert len(calls) == len(set(calls)) and not seen & set(calls), f"duplicate call at {i}"
        seen |= set(calls)
        if t.role == "assistant":
            last_calls[key] = set(calls)


def _is_subsequence(small: Sequence[Any], big: Sequence[Any]) -> bool:
    it = iter(big)
    return all(any(x is y for y in it) for x in small)


@SETTINGS
@given(fuzz_turns, st.booleans())
def test_drop_invalid_pairings_idempotent_and_drop_only(
    turns: list[SessionTurn], widen: bool
) -> None:
    turns = [msgspec.structs.replace(t, id=f"t{i}") for i, t in enumerate(turns)]
    lane: Callable[[str | None], str] | None = (lambda r: "main") if widen else None
    before = _frozen(turns)
    drops: list[Any] = []
    out = drop_invalid_tool_pairings(turns, lane_for_run=lane, on_drop=drops.append)
    assert _frozen(turns) == before
    assert (out is turns) == (not drops)
    assert drop_invalid_tool_pairings(out, lane_for_run=lane) is out
    assert_healed(out, lane or (lambda r: r))
    # deletions only: turns keep their order, each keeps a subsequence of its own blocks
    by_id = {t.id: t for t in turns}
    assert [t.id for t in out] == [t.id for t in turns if t.id in {o.id for o in out}]
    for t in out:
        assert _is_subsequence(t.content, by_id[t.id].content)
        assert t.role == by_id[t.id].role and t.run_id == by_id[t.id].run_id
    dropped_turns = {d.index for d in drops if d.kind == "empty-turn"}
    assert len(out) == len(turns) - len(dropped_turns)
    assert all(0 <= d.index < len(turns) for d in drops)


# ------------------------------------------------ arbitrary JSON never escapes as a foreign error

arbitrary_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
TYPES = st.sampled_from(
    [
        "text",
        "image",
        "document",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "image_url",
        "file",
        "input_audio",
        "refusal",
        "input_text",
        "input_image",
        "input_file",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
        "base64",
        "url",
    ]
)
KEYS = st.sampled_from(
    [
        "type",
        "text",
        "source",
        "media_type",
        "data",
        "url",
        "id",
        "name",
        "input",
        "tool_use_id",
        "content",
        "is_error",
        "thinking",
        "signature",
        "image_url",
        "file",
        "file_data",
        "filename",
        "tool_calls",
        "function",
        "arguments",
        "call_id",
        "output",
        "summary",
        "encrypted_content",
        "role",
        "tool_call_id",
        "title",
        "image_url",
        "file_url",
    ]
)
shaped_json = st.recursive(
    arbitrary_json | TYPES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(KEYS, inner, max_size=5)
        | st.builds(lambda t, d: {**d, "type": t}, TYPES, st.dictionaries(KEYS, inner, max_size=4))
    ),
    max_leaves=25,
)
wire_message = st.builds(
    lambda role, content, extra: {**extra, "role": role, "content": content},
    st.sampled_from(["user", "assistant", "system", "developer", "tool", "bot"]),
    shaped_json,
    st.dictionaries(KEYS, shaped_json, max_size=3),
)


def _value_or_validation_error(fn: Callable[[Any], Any], value: Any) -> None:
    try:
        out = fn(value)
    except ValidationError:
        return
    for m in out if isinstance(out, list) else [out]:
        assert isinstance(m, SessionMessage)
        assert model.convert(model.to_builtins(m), SessionMessage) == m  # a valid model value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_json | wire_message)
def test_fuzzed_wire_input(value: Any) -> None:
    _value_or_validation_error(from_anthropic, value)
    _value_or_validation_error(from_openai, value)
    _value_or_validation_error(auto_detect_and_convert, value)
    _value_or_validation_error(from_openai_responses, value)
    _value_or_validation_error(from_openai_responses, [value])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_json | shaped_json)
def test_fuzzed_turn_json(value: Any) -> None:
    text = json.dumps(value)
    try:
        turn = model.decode(text, SessionTurn)
    except ValidationError:
        return
    assert isinstance(turn, SessionTurn)
    assert msgspec.json.decode(model.encode(turn)) is not None
