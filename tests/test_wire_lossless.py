"""Lossless provider messages: every SDK param shape round-trips, every output is accepted.

The strategies come from the SDKs' TypedDicts (tests/sdk_strategies.py).
Same-provider: ``to_X(from_X(m)) == m`` as JSON values, also after the
neutral message went through the persisted JSON codec. Cross-provider: the
output validates against the target SDK type.
"""

from __future__ import annotations

from typing import Any

from anthropic.types import MessageParam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from sdk_strategies import from_type
from test_wire_sdk import check_anthropic, check_chat, check_responses_item

from zidane_actors.model import SessionMessage, decode, encode
from zidane_actors.wire import (
    from_anthropic,
    from_openai,
    from_openai_responses,
    to_anthropic,
    to_anthropic_request,
    to_openai,
    to_openai_request,
    to_openai_responses,
)

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

anthropic_message = from_type(MessageParam)
chat_message = from_type(ChatCompletionMessageParam)
responses_items = st.lists(from_type(ResponseInputItemParam), min_size=1, max_size=3)


def stored(message: SessionMessage) -> SessionMessage:
    """``message`` after the persisted JSON codec (what a store gives back)."""
    return decode(encode(message), SessionMessage)


def _belongs(item: dict[str, Any]) -> bool:
    """Whether ``item`` can be the item a reasoning item belongs to (an output item)."""
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return kind.endswith("_call") or kind in ("mcp_list_tools", "mcp_approval_request")


def without_orphan_reasoning(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` less the reasoning items not followed (past other reasoning) by their item."""
    out = []
    for k, item in enumerate(items):
        if item.get("type") == "reasoning":
            rest = [i for i in items[k + 1 :] if i.get("type") != "reasoning"]
            if not rest or not _belongs(rest[0]):
                continue
        out.append(item)
    return out


# ---------------------------------------------------------------- same provider: exact


@SETTINGS
@given(anthropic_message)
def test_anthropic_round_trip_is_exact(m: dict[str, Any]) -> None:
    assert to_anthropic(stored(from_anthropic(m))) == m


@SETTINGS
@given(chat_message)
def test_chat_round_trip_is_exact(m: dict[str, Any]) -> None:
    assert to_openai(stored(from_openai(m))) == [m]


@SETTINGS
@given(responses_items)
def test_responses_round_trip_is_exact(items: list[dict[str, Any]]) -> None:
    back = to_openai_responses([stored(m) for m in from_openai_responses(items)])
    assert back == without_orphan_reasoning(items)


# ---------------------------------------------------------------- cross provider: accepted


def _check_all(messages: list[SessionMessage], source: str) -> None:
    """The other formats' outputs validate (the source's own is the exact round trip above)."""
    if source != "anthropic":
        request = to_anthropic_request(messages)
        for message in request["messages"]:
            check_anthropic(message)
    if source != "chat":
        for payload in to_openai_request(messages):
            check_chat(payload)
    if source != "responses":
        for item in to_openai_responses(messages):
            check_responses_item(item)


@SETTINGS
@given(anthropic_message)
def test_anthropic_messages_are_accepted_everywhere(m: dict[str, Any]) -> None:
    _check_all([from_anthropic(m)], "anthropic")


@SETTINGS
@given(chat_message)
def test_chat_messages_are_accepted_everywhere(m: dict[str, Any]) -> None:
    _check_all([from_openai(m)], "chat")


@SETTINGS
@given(responses_items)
def test_responses_items_are_accepted_everywhere(items: list[dict[str, Any]]) -> None:
    _check_all(from_openai_responses(items), "responses")
