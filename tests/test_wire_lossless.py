"""Lossless provider messages: every SDK param shape round-trips, every output is accepted.

The strategies come from the SDKs' TypedDicts (tests/sdk_strategies.py).
Same-provider: ``to_X(from_X(m)) == m`` as JSON values, also after the
neutral message went through the persisted JSON codec. Cross-provider: the
output validates against the target SDK type.
"""

from __future__ import annotations

import string
from typing import Any

import anthropic.types
import pytest
from anthropic.types import MessageParam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from sdk_strategies import from_type
from test_wire_sdk import check_anthropic, check_anthropic_request, check_chat, check_responses_item

from zidane_actors.model import (
    ImageBlock,
    ReasoningBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    decode,
    encode,
)
from zidane_actors.wire import (
    OPENAI_TOOL_ID_MAX_LENGTH,
    RAW_ARGUMENTS_KEY,
    REFUSAL_FALLBACK_TEXT,
    WireDowngrade,
    auto_detect_and_convert,
    from_anthropic,
    from_anthropic_request,
    from_openai,
    from_openai_request,
    from_openai_responses,
    to_anthropic,
    to_anthropic_request,
    to_openai,
    to_openai_request,
    to_openai_responses,
    to_wire_messages,
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
    kind = item.get("type") or ("message" if "role" in item else "")
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


# ---------------------------------------------------------------- documented shapes, one per class

_PDF = "JVBERi0xLjQK"
_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kg"  # 1x1
_CACHE_1H = {"type": "ephemeral", "ttl": "1h"}

ANTHROPIC_DOCUMENTED: list[dict[str, Any]] = [
    {"role": "user", "content": "Hello, Claude"},
    {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": _CACHE_1H}]},
    {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": "the grass is green",
                "citations": [
                    {
                        "type": "char_location",
                        "cited_text": "The grass is green.",
                        "document_index": 0,
                        "document_title": "Example Document",
                        "start_char_index": 0,
                        "end_char_index": 20,
                    }
                ],
            }
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": _PDF},
                "title": "Report",
                "context": "Quarterly numbers",
                "citations": {"enabled": True},
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "document",
                "source": {
                    "type": "text",
                    "media_type": "text/plain",
                    "data": "The grass is green.",
                },
                "title": None,
            },
            {
                "type": "document",
                "source": {
                    "type": "content",
                    "content": [
                        {"type": "text", "text": "First chunk"},
                        {"type": "text", "text": "2"},
                    ],
                },
            },
            {
                "type": "document",
                "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"},
            },
            {
                "type": "image",
                "source": {"type": "file", "file_id": "file_011CPMxVD3fHLUhvTqtsQA5w"},
            },
            {"type": "text", "text": "Summarise these."},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "search_result",
                "source": "https://docs.company.com/api-reference",
                "title": "API Reference",
                "content": [{"type": "text", "text": "All requests need an API key."}],
                "citations": {"enabled": True},
            },
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [
                    {
                        "type": "search_result",
                        "source": "https://kb.test/a",
                        "title": "A",
                        "content": [{"type": "text", "text": "a"}],
                    }
                ],
            },
            {"type": "tool_result", "tool_use_id": "toolu_02"},
            {"type": "tool_result", "tool_use_id": "toolu_03", "content": "ok", "is_error": False},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I'll search for that."},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
                "name": "web_search",
                "input": {"query": "claude shannon birth date"},
            },
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
                "content": [
                    {
                        "type": "web_search_result",
                        "url": "https://en.wikipedia.org/wiki/Claude_Shannon",
                        "title": "Claude Shannon - Wikipedia",
                        "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
                        "page_age": "April 30, 2025",
                    }
                ],
            },
            {
                "type": "text",
                "text": "Claude Shannon was born on April 30, 1916",
                "citations": [
                    {
                        "type": "web_search_result_location",
                        "url": "https://en.wikipedia.org/wiki/Claude_Shannon",
                        "title": "Claude Shannon - Wikipedia",
                        "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm",
                        "cited_text": "Claude Elwood Shannon (April 30, 1916 – February 24, 2001)",
                    }
                ],
            },
        ],
    },
    {
        "role": "assistant",
        "content": [
            {
                "type": "server_tool_use",
                "id": "srvtoolu_02",
                "name": "web_fetch",
                "input": {"url": "https://example.com/article"},
            },
            {
                "type": "web_fetch_tool_result",
                "tool_use_id": "srvtoolu_02",
                "content": {
                    "type": "web_fetch_result",
                    "url": "https://example.com/article",
                    "content": {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "Full text"},
                        "title": "Article",
                        "citations": {"enabled": True},
                    },
                    "retrieved_at": "2025-08-25T10:30:00Z",
                },
            },
            {
                "type": "server_tool_use",
                "id": "srvtoolu_03",
                "name": "code_execution",
                "input": {"code": "print(1)"},
            },
            {
                "type": "code_execution_tool_result",
                "tool_use_id": "srvtoolu_03",
                "content": {
                    "type": "code_execution_result",
                    "stdout": "1\n",
                    "stderr": "",
                    "return_code": 0,
                    "content": [],
                },
            },
            {
                "type": "bash_code_execution_tool_result",
                "tool_use_id": "srvtoolu_04",
                "content": {
                    "type": "bash_code_execution_tool_result_error",
                    "error_code": "unavailable",
                },
            },
        ],
    },
    {"role": "user", "content": [{"type": "container_upload", "file_id": "file_abc"}]},
    {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "Let me check.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJw",
            },
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA"},
                "cache_control": {"type": "ephemeral", "ttl": "5m"},
            },
        ],
    },
    {"role": "system", "content": "From now on, answer in French."},
]

CHAT_DOCUMENTED: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are a helpful assistant.", "name": "policy"},
    {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
    {"role": "user", "content": "Hello!", "name": "alice"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What's in this image?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://upload.test/a.jpg", "detail": "low"},
            },
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_PNG}"}},
            {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
            {
                "type": "file",
                "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{_PDF}"},
            },
            {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
        ],
    },
    {"role": "assistant", "content": None, "refusal": "I'm sorry, I cannot help with that."},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't do that."}]},
    {"role": "assistant", "audio": {"id": "audio_abc123"}},
    {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_time", "arguments": "{}"},
    },
    {"role": "function", "name": "get_time", "content": "12:00"},
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_7", "type": "custom", "custom": {"name": "code_exec", "input": "print(1)"}}
        ],
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"location": "Boston, MA"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc123", "content": [{"type": "text", "text": "72F"}]},
    {"role": "assistant", "content": "9.11 < 9.8", "reasoning_content": "Compare decimals..."},
    {"role": "assistant", "content": "Hi", "refusal": None, "audio": None, "function_call": None},
]

RESPONSES_DOCUMENTED: list[list[dict[str, Any]]] = [
    [
        {"role": "developer", "content": "Talk like a pirate."},
        {"role": "user", "content": "Are semicolons optional in JavaScript?"},
    ],
    [
        {
            "type": "reasoning",
            "id": "rs_6820f383d7c08191846711c5df8233bc0ac5ba57aafcbac7",
            "summary": [
                {"type": "summary_text", "text": "**Planning**\n\nFirst step."},
                {"type": "summary_text", "text": "**Checking**\n\nSecond step."},
            ],
            "content": [{"type": "reasoning_text", "text": "raw chain"}],
            "encrypted_content": "gAAAAABoISQ24OyVRYbkYfukHkaGrCm",
            "status": "completed",
        },
        {
            "type": "function_call",
            "id": "fc_12345xyz",
            "call_id": "call_12345xyz",
            "name": "get_weather",
            "arguments": '{"location":"Paris, France"}',
            "status": "completed",
        },
        {
            "type": "function_call_output",
            "call_id": "call_12345xyz",
            "output": "15C",
            "id": "fco_1",
        },
        {
            "type": "message",
            "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c95c1f5c",
            "role": "assistant",
            "status": "completed",
            "phase": "final_answer",
            "content": [
                {"type": "output_text", "text": "It is 15C in Paris.", "annotations": []},
                {"type": "refusal", "refusal": "I won't guess tomorrow."},
            ],
        },
    ],
    [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what's in this image and file?"},
                {"type": "input_image", "file_id": "file-Ge1dJjvVSt1xP3eX8b1CB9", "detail": "auto"},
                {"type": "input_file", "file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"},
            ],
        }
    ],
    [
        {
            "type": "web_search_call",
            "id": "ws_67c9fa0502748190b7dd390736892e100be649c1a5ff9609",
            "status": "completed",
            "action": {"type": "search", "query": "positive news today"},
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Good news.", "annotations": []}],
        },
    ],
]


# Every key of a response ``Message`` but role and content: what the API adds around a message.
_ENVELOPE_KEYS = sorted(set(anthropic.types.Message.model_fields) - {"role", "content"})
_envelope_value = (
    st.none()
    | st.text(max_size=8)
    | st.integers(0, 10**6)
    | st.dictionaries(
        st.sampled_from(["input_tokens", "output_tokens", "service_tier"]), st.integers(0, 10**6)
    )
)


@SETTINGS
@given(
    anthropic_message,
    st.dictionaries(st.sampled_from(_ENVELOPE_KEYS), _envelope_value, min_size=1),
)
def test_anthropic_response_envelope_is_kept_and_never_sent(
    m: dict[str, Any], envelope: dict[str, Any]
) -> None:
    """A response ``Message`` stored as a message: its request part comes back exactly, the
    envelope (id, model, usage…) stays in providerData and is never written to a request."""
    message = stored(from_anthropic({**envelope, **m}))
    assert to_anthropic(message) == m  # exactly the MessageParam: nothing of the envelope
    assert message.provider_data is not None
    assert message.provider_data["response"] == envelope


def test_documented_anthropic_response_is_a_valid_request_message() -> None:
    response = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "text", "text": "Let me search.", "citations": None},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_01",
                "name": "web_search",
                "input": {"query": "weather"},
            },
        ],
        "stop_reason": "pause_turn",
        "stop_sequence": None,
        "container": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 6,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "server_tool_use": {"web_search_requests": 1},
            "service_tier": "standard",
        },
    }
    message = stored(from_anthropic(response))
    out = to_anthropic(message)
    assert out == {"role": "assistant", "content": response["content"]}
    check_anthropic(out)
    assert message.provider_data is not None
    assert message.provider_data["response"]["usage"] == response["usage"]


@pytest.mark.parametrize("m", ANTHROPIC_DOCUMENTED)
def test_documented_anthropic_round_trips(m: dict[str, Any]) -> None:
    assert to_anthropic(stored(from_anthropic(m))) == m
    _check_all([from_anthropic(m)], "anthropic")


def test_documented_anthropic_request_round_trips() -> None:
    for system in (
        "Be terse.",
        [{"type": "text", "text": "Be terse.", "cache_control": _CACHE_1H}],
    ):
        request = {
            "system": system,
            "messages": [
                *ANTHROPIC_DOCUMENTED[:2],
                ANTHROPIC_DOCUMENTED[-1],
                {"role": "user", "content": "x"},
            ],
        }
        messages = [stored(m) for m in from_anthropic_request(request)]
        assert to_anthropic_request(messages) == request
    entry_first = {
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    }
    assert to_anthropic_request(from_anthropic_request(entry_first)) == entry_first


@pytest.mark.parametrize("m", CHAT_DOCUMENTED)
def test_documented_chat_round_trips(m: dict[str, Any]) -> None:
    assert to_openai(stored(from_openai(m))) == [m]
    assert to_openai_request(from_openai_request([m])) == [m]
    if "reasoning_content" not in m:
        check_chat(m)
    _check_all([from_openai(m)], "chat")


@pytest.mark.parametrize("items", RESPONSES_DOCUMENTED)
def test_documented_responses_round_trip(items: list[dict[str, Any]]) -> None:
    assert to_openai_responses([stored(m) for m in from_openai_responses(items)]) == items
    for item in items:
        check_responses_item(item)
    _check_all(from_openai_responses(items), "responses")


@pytest.mark.parametrize(
    "payload",
    [*ANTHROPIC_DOCUMENTED, *CHAT_DOCUMENTED, *[items[0] for items in RESPONSES_DOCUMENTED]],
)
def test_auto_detect_reads_every_documented_shape(payload: dict[str, Any]) -> None:
    assert auto_detect_and_convert(payload).content is not None


# ---------------------------------------------------------------- cross-provider rules


def _assistant(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="assistant", content=tuple(blocks))


def _user(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="user", content=tuple(blocks))


@SETTINGS
@given(
    st.lists(
        st.text(string.ascii_letters + "_:.-", min_size=1, max_size=70).map(lambda s: "x" * 35 + s),
        min_size=1,
        max_size=5,
        unique=True,
    )
)
def test_openai_tool_ids_are_short_consistent_deterministic_unique(ids: list[str]) -> None:
    messages = [
        _assistant(*(ToolCallBlock(id=i, name="f") for i in ids)),
        _user(*(ToolResultBlock(call_id=i, output="r") for i in ids)),
    ]
    chat = to_openai_request(messages)
    calls = [c["id"] for c in chat[0]["tool_calls"]]
    assert [m["tool_call_id"] for m in chat[1:]] == calls
    assert all(len(c) <= OPENAI_TOOL_ID_MAX_LENGTH for c in calls)
    assert len(set(calls)) == len(ids)
    assert [c for c, i in zip(calls, ids, strict=True) if len(i) <= 40] == [
        i for i in ids if len(i) <= 40
    ]
    items = to_openai_responses(messages)
    assert [i["call_id"] for i in items if i["type"] == "function_call"] == calls
    assert [i["call_id"] for i in items if i["type"] == "function_call_output"] == calls
    assert to_openai_request(messages[::-1])[0]["tool_call_id"] == calls[0]  # same map either way


def test_image_media_type_comes_from_the_bytes() -> None:
    image = ImageBlock(media_type="image/jpeg", data=_PNG)
    anthropic = to_anthropic(_user(image))
    assert anthropic["content"][0]["source"]["media_type"] == "image/png"
    chat = to_openai(_user(image))
    assert chat[0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    responses = to_openai_responses([_user(image)])
    assert responses[0]["content"][0]["image_url"].startswith("data:image/png;base64,")
    wire = {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": _PNG}}
        ],
    }
    assert to_anthropic(from_anthropic(wire))["content"][0]["source"]["media_type"] == "image/png"
    check_anthropic(to_anthropic(from_anthropic(wire)))


def test_reasoning_item_always_has_its_follower() -> None:
    reasoning = ReasoningBlock(text="s", provider="openai", signature="enc", id="rs_1")
    reports: list[WireDowngrade] = []
    items = to_openai_responses(
        [_user(TextBlock("q")), _assistant(reasoning, TextBlock("  ")), _user(TextBlock("n"))],
        on_downgrade=reports.append,
    )
    assert [i["type"] for i in items] == ["message", "message"]
    assert reports == [WireDowngrade(1, "$", "dropped", "reasoning")]
    kept = to_openai_responses([_assistant(reasoning, TextBlock("answer"))])
    assert [i["type"] for i in kept] == ["reasoning", "message"]


def test_refusals_become_non_empty_text_elsewhere() -> None:
    refusal = from_openai({"role": "assistant", "content": None, "refusal": "I can't help."})
    blank = from_openai({"role": "assistant", "content": [{"type": "refusal", "refusal": ""}]})
    request = to_anthropic_request([_user(TextBlock("q")), refusal, _user(TextBlock("q")), blank])
    texts = [m["content"] for m in request["messages"] if m["role"] == "assistant"]
    assert texts == [
        [{"type": "text", "text": "I can't help."}],
        [{"type": "text", "text": REFUSAL_FALLBACK_TEXT}],
    ]
    items = to_openai_responses([refusal])
    assert items == [{"type": "message", "role": "assistant", "content": "I can't help."}]
    check_anthropic_request(request)


def test_audio_only_assistant_message_is_kept_for_chat_and_reported_elsewhere() -> None:
    audio = {"role": "assistant", "audio": {"id": "audio_abc123"}}
    conversation = [
        _user(TextBlock("Say hi")),
        from_openai(audio),
        _user(TextBlock("Again")),
    ]
    assert to_openai_request(conversation)[1] == audio
    reports: list[WireDowngrade] = []
    request = to_anthropic_request(conversation, on_downgrade=reports.append)
    assert [m["role"] for m in request["messages"]] == ["user", "user"]
    assert reports == [WireDowngrade(1, "$.content[0]", "dropped", "audio")]
    check_anthropic_request(request)
    responses_reports: list[WireDowngrade] = []
    to_openai_responses(conversation, on_downgrade=responses_reports.append)
    assert responses_reports == reports


def test_reserved_raw_key_never_collides_with_real_input() -> None:
    real = from_anthropic(
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"_raw": "hello"}}
            ],
        }
    )
    assert to_openai(real)[0]["tool_calls"][0]["function"]["arguments"] == '{"_raw":"hello"}'
    assert to_openai_responses([real])[0]["arguments"] == '{"_raw":"hello"}'
    broken = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
        ],
    }
    neutral = from_openai(broken)
    assert to_openai(neutral) == [broken]  # the same provider gets its text back
    tool_use = to_anthropic(neutral)["content"][0]
    assert tool_use["input"] == {RAW_ARGUMENTS_KEY: "{oops"}  # another one gets an object


def test_anthropic_server_tools_are_downgraded_to_their_text() -> None:
    search = from_anthropic(ANTHROPIC_DOCUMENTED[5])
    reports: list[WireDowngrade] = []
    chat = to_openai_request([_user(TextBlock("When?")), search], on_downgrade=reports.append)
    text = "\n".join(part["text"] for part in chat[1]["content"])
    assert "Claude Shannon - Wikipedia (https://en.wikipedia.org/wiki/Claude_Shannon)" in text
    assert "Claude Shannon was born on April 30, 1916" in text
    assert [(r.kind, r.block_type) for r in reports] == [
        ("converted", "server_tool_use"),
        ("converted", "web_search_tool_result"),
    ]
    for payload in chat:
        check_chat(payload)
    items = to_openai_responses([_user(TextBlock("When?")), search])
    assert all(i["role"] in ("user", "assistant") for i in items)
    fetch = to_openai(from_anthropic(ANTHROPIC_DOCUMENTED[6]))
    fetched = "\n".join(part["text"] for part in fetch[0]["content"])
    assert "Fetched https://example.com/article:\nFull text" in fetched
    assert "Code execution (return code 0)\nstdout:\n1" in fetched


# ---------------------------------------------------------------- our own outputs read back exactly

any_conversation = st.one_of(
    anthropic_message.map(lambda m: [from_anthropic(m)]),
    chat_message.map(lambda m: [from_openai(m)]),
    responses_items.map(from_openai_responses),
)


@SETTINGS
@given(any_conversation)
def test_outputs_read_back_exactly(messages: list[SessionMessage]) -> None:
    """Whatever a converter sends, its own reader takes back to the same payload."""
    request = to_anthropic_request(messages)
    assert to_anthropic_request(from_anthropic_request(request)) == request
    chat = to_openai_request(messages)
    assert to_openai_request(from_openai_request(chat)) == chat
    items = to_openai_responses(messages)
    assert to_openai_responses(from_openai_responses(items)) == items


def test_final_assistant_prefill_has_no_trailing_whitespace() -> None:
    prefill = [_user(TextBlock("Name a colour.")), _assistant(TextBlock("The colour is "))]
    request = to_anthropic_request(prefill)
    assert request["messages"][-1]["content"] == [{"type": "text", "text": "The colour is"}]
    assert prefill[-1].content == (TextBlock("The colour is "),)  # the input is untouched


async def test_stored_turns_give_the_provider_its_payload_back() -> None:
    wire = ANTHROPIC_DOCUMENTED[5]  # a web search turn: server tool blocks, citations
    message = from_anthropic(wire)
    turn = SessionTurn(
        id="t1",
        role="assistant",
        content=message.content,
        created_at=0,
        provider_data=message.provider_data,
    )
    question = SessionTurn(id="t0", role="user", content=(TextBlock("When?"),), created_at=0)
    plain_reply = from_anthropic({"role": "assistant", "content": "Sure."})
    assert plain_reply.provider_data == {"provider": "anthropic", "form": "string"}
    reply = SessionTurn(
        id="t2",
        role="assistant",
        content=plain_reply.content,
        created_at=0,
        provider_data=plain_reply.provider_data,
    )
    stored_turns = decode(encode([question, turn, question, reply]), list[SessionTurn])
    messages = await to_wire_messages(stored_turns)
    sent = to_anthropic_request(messages)["messages"]
    assert sent[1] == wire
    assert sent[3] == {"role": "assistant", "content": "Sure."}


def test_chat_file_ids_reach_responses_as_file_ids() -> None:
    chat = {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-6F2ks"}}]}
    items = to_openai_responses([from_openai(chat)])
    assert items == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_file", "file_id": "file-6F2ks"}],
        }
    ]
    check_responses_item(items[0])
