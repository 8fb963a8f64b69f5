"""Strict validation of wire payloads against the official SDKs' request types.

The SDK request types are TypedDicts: pydantic ignores unknown keys and
validates ``Iterable`` fields lazily. ``check_*`` therefore validates in
strict mode, drains every lazy iterator, and demands that the validated
value equals the payload, so an extra key, a wrong union member or a bad
nested item all fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec
import pydantic
import pytest
from anthropic.types import MessageParam, TextBlockParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam

from zidane_actors.model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.wire import (
    to_anthropic,
    to_anthropic_request,
    to_openai,
    to_openai_request,
    to_openai_responses,
)

_ANTHROPIC = pydantic.TypeAdapter(MessageParam)
_ANTHROPIC_SYSTEM = pydantic.TypeAdapter(str | Iterable[TextBlockParam])
_CHAT = pydantic.TypeAdapter(ChatCompletionMessageParam)
_RESPONSES = pydantic.TypeAdapter(ResponseInputItemParam)


def _drain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_drain(v) for v in value]
    if value is None or isinstance(value, str | bytes | int | float | bool):
        return value
    if isinstance(value, pydantic.BaseModel):  # a response model the param union also accepts
        return _drain(value.model_dump(exclude_unset=True, by_alias=True))
    if hasattr(value, "__iter__"):  # pydantic's lazy ValidatorIterator
        return [_drain(v) for v in value]
    return value


def _check(adapter: pydantic.TypeAdapter[Any], payload: Any) -> None:
    validated = _drain(adapter.validate_python(payload, strict=True))
    assert validated == _drain(payload), f"SDK type dropped or changed fields of {payload!r}"


def check_anthropic(payload: dict[str, Any]) -> None:
    """``payload`` is exactly an ``anthropic.types.MessageParam`` (user, assistant or system)."""
    assert payload["role"] in ("user", "assistant", "system")
    _check(_ANTHROPIC, payload)


def check_anthropic_request(request: dict[str, Any]) -> None:
    """``{"system"?, "messages"}`` as ``messages.create`` takes them."""
    assert set(request) <= {"system", "messages"}
    if "system" in request:
        _check(_ANTHROPIC_SYSTEM, request["system"])
    for message in request["messages"]:
        check_anthropic(message)


def check_chat(payload: dict[str, Any]) -> None:
    """``payload`` is exactly an ``openai.types.chat.ChatCompletionMessageParam``."""
    _check(_CHAT, payload)


def check_responses_item(payload: dict[str, Any]) -> None:
    """``payload`` is exactly an ``openai.types.responses.ResponseInputItemParam``."""
    _check(_RESPONSES, payload)


# ---------------------------------------------------------------- the checker itself is strict

_WRONG_ANTHROPIC = [
    {"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]},
    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "A"}}]},
    {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpg", "data": "A"}}
        ],
    },
    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]},
    {"role": "tool", "content": "x"},
]
_WRONG_CHAT = [
    {
        "role": "tool",
        "tool_call_id": "a",
        "content": [{"type": "image_url", "image_url": {"url": "u"}}],
    },
    {
        "role": "assistant",
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f"}}],
    },
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
        ],
    },
    {"role": "user", "content": [{"type": "image_url", "url": "u"}]},
]
_WRONG_RESPONSES = [
    {"type": "function_call", "call_id": "a", "name": "f", "arguments": {}},
    {"type": "function_call_output", "call_id": "a", "output": [{"type": "text", "text": "x"}]},
    {"type": "reasoning", "summary": [], "encrypted_content": "e"},
    {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
]


@pytest.mark.parametrize("payload", _WRONG_ANTHROPIC)
def test_checker_rejects_wrong_anthropic(payload: dict[str, Any]) -> None:
    with pytest.raises((pydantic.ValidationError, AssertionError)):
        check_anthropic(payload)


@pytest.mark.parametrize("payload", _WRONG_CHAT)
def test_checker_rejects_wrong_chat(payload: dict[str, Any]) -> None:
    with pytest.raises((pydantic.ValidationError, AssertionError)):
        check_chat(payload)


@pytest.mark.parametrize("payload", _WRONG_RESPONSES)
def test_checker_rejects_wrong_responses(payload: dict[str, Any]) -> None:
    with pytest.raises((pydantic.ValidationError, AssertionError)):
        check_responses_item(payload)


# ---------------------------------------------------------------- every block kind validates

_PNG = "iVBORw0KGgo="
_PDF = "JVBERi0xLjQK"

CONVERSATION = (
    SessionMessage(role="system", content=(TextBlock("You are terse."),)),
    SessionMessage(
        role="user",
        content=(
            TextBlock("Look at these."),
            ImageBlock(media_type="image/jpg", data=_PNG),
            ImageBlock(url="https://example.com/cat.png"),
            FileBlock(media_type="application/pdf", data=_PDF, name="report.pdf"),
            FileBlock(text="plain notes", name="notes.txt"),
        ),
    ),
    SessionMessage(
        role="assistant",
        content=(
            ReasoningBlock(text="thinking…", provider="anthropic", signature="sig-a"),
            ReasoningBlock(provider="anthropic", redacted_data="opaque"),
            ReasoningBlock(text="summary", provider="openai", signature="enc", id="rs_1"),
            TextBlock("Calling tools."),
            TextBlock("   "),
            ToolCallBlock(id="call_1", name="read", input={"path": "a.txt"}),
            ToolCallBlock(id="call:2", name="shot", input={"_raw": "not json"}),
        ),
    ),
    SessionMessage(
        role="user",
        content=(
            ToolResultBlock(call_id="call_1", output="contents"),
            ToolResultBlock(
                call_id="call:2",
                output=(TextBlock("here"), ImageBlock(media_type="image/png", data=_PNG)),
                is_error=True,
            ),
            TextBlock("Thanks"),
        ),
    ),
)


def test_anthropic_payloads_validate() -> None:
    for message in CONVERSATION[1:]:
        check_anthropic(to_anthropic(message))
    check_anthropic_request(to_anthropic_request(CONVERSATION))


def test_chat_payloads_validate() -> None:
    chat_safe = [
        m
        if m.role != "user"
        else SessionMessage(
            role="user",
            content=tuple(b for b in m.content if not (isinstance(b, FileBlock) and b.url)),
        )
        for m in CONVERSATION
    ]
    for message in chat_safe:
        for payload in to_openai(message):
            check_chat(payload)
    roles: tuple[Literal["system", "developer"], ...] = ("system", "developer")
    for role in roles:
        request = to_openai_request(chat_safe, system_role=role)
        assert request[0]["role"] == role
        for payload in request:
            check_chat(payload)


def test_responses_payloads_validate() -> None:
    items = to_openai_responses(CONVERSATION)
    assert {i["type"] for i in items} == {
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
    }
    for item in items:
        check_responses_item(item)


def plain(value: Any) -> Any:
    """``value`` (messages, blocks, lists of them) without any ``providerData``.

    What a reader that ignores provider data sees: the neutral content.
    """
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, NativeBlock):
        return value
    if isinstance(value, ToolResultBlock) and not isinstance(value.output, str):
        value = msgspec.structs.replace(value, output=plain(value.output))
    if isinstance(value, SessionMessage):
        value = msgspec.structs.replace(value, content=plain(value.content))
    if getattr(value, "provider_data", None) is not None:
        value = msgspec.structs.replace(value, provider_data=None)
    return value
