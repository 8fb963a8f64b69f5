"""The pydantic-ai message shapes ``messages_to_turns`` stores without converting back.

Messages are drawn with every field :data:`PROVEN_FIELDS` names set to odd
values (unicode, NUL, lone surrogates, empty strings, any UTC instant and
duration, huge counts, nested JSON arguments with big and odd numbers);
each must be proven and come back from its lean turns as the same message,
dumped by pydantic-ai as the same JSON values.
"""

from __future__ import annotations

import datetime
import typing
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    FinishReason,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from zidane_actors.integrations._pydantic_ai_shapes import proven
from zidane_actors.integrations.pydantic_ai import _turns_of, messages_to_turns, turns_to_messages
from zidane_actors.model import has_lone_surrogate

ODD = st.sampled_from(["", " ", "\x00", "\ud800", "a\udfff", "é🙂", "null", "{}", "0"])
TEXT = st.text(max_size=12) | ODD
MAYBE = st.none() | TEXT
UTC = st.datetimes(timezones=st.just(datetime.UTC))
COUNT = st.integers(0, 2**63 - 1)
NUMBER = (
    st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([2**63, 1e308, -0.0, 0.1])
)
KEY = TEXT.filter(lambda key: not has_lone_surrogate(key))  # pydantic replaces those
JSON = st.recursive(
    st.none() | st.booleans() | NUMBER | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEY, inner, max_size=3),
    max_leaves=8,
)
ARGS = st.dictionaries(KEY, JSON, max_size=3) | TEXT

request_part = st.one_of(
    st.builds(UserPromptPart, content=TEXT, timestamp=UTC),
    st.builds(SystemPromptPart, content=TEXT, timestamp=UTC),
    st.builds(ToolReturnPart, tool_name=TEXT, content=TEXT, tool_call_id=TEXT, timestamp=UTC),
)
response_part = st.one_of(
    st.builds(TextPart, content=TEXT),
    st.builds(ToolCallPart, tool_name=TEXT, args=ARGS, tool_call_id=TEXT),
)
usage = st.builds(
    RequestUsage,
    input_tokens=COUNT,
    output_tokens=COUNT,
    cache_read_tokens=COUNT,
    cache_write_tokens=COUNT,
)
request = st.builds(
    ModelRequest,
    parts=st.lists(request_part, max_size=4),
    timestamp=st.none() | UTC,
    instructions=MAYBE,
    run_id=MAYBE,
    conversation_id=MAYBE,
)
response = st.builds(
    ModelResponse,
    parts=st.lists(response_part, max_size=4),
    usage=usage,
    model_name=MAYBE,
    model_id=MAYBE,
    timestamp=UTC,
    request_timestamp=st.none() | UTC,
    duration=st.none() | st.timedeltas(),
    provider_name=MAYBE,
    provider_response_id=MAYBE,
    finish_reason=st.none() | st.sampled_from(typing.get_args(FinishReason)),
    run_id=MAYBE,
    conversation_id=MAYBE,
)


@settings(max_examples=300)
@given(request | response)
def test_proven_messages_come_back_from_their_lean_turns(message: Any) -> None:
    assert proven(message)
    back = turns_to_messages(_turns_of(message, None, lean=True))
    assert back == [message]
    dump = ModelMessagesTypeAdapter.dump_python
    assert dump(back, mode="json") == dump([message], mode="json")
    assert turns_to_messages(messages_to_turns([message])) == [message]


def test_other_shapes_are_not_proven() -> None:
    stamp = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    plain = ModelRequest(parts=[UserPromptPart("hi", timestamp=stamp)])
    assert proven(plain)
    other_zone = datetime.timezone(datetime.timedelta(hours=2))
    for message in (
        ModelRequest(parts=[UserPromptPart("hi", timestamp=stamp.astimezone(other_zone))]),
        ModelRequest(parts=[UserPromptPart(["hi"], timestamp=stamp)]),
        ModelRequest(parts=[UserPromptPart("hi", timestamp=stamp)], metadata={"k": 1}),
        ModelRequest(parts=[ToolReturnPart("t", {"a": 1}, timestamp=stamp)]),
        ModelResponse(parts=[ToolCallPart("t", {1: "a"})], timestamp=stamp),  # type: ignore[dict-item]
        ModelResponse(parts=[ToolCallPart("t", {"a": float("nan")})], timestamp=stamp),
        ModelResponse(parts=[ToolCallPart("t", {"\ud800": 1})], timestamp=stamp),
        ModelResponse(parts=[TextPart("a", id="x")], timestamp=stamp),
    ):
        assert not proven(message)
