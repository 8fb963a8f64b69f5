"""Conversion cases built from the providers' documented wire shapes."""

from __future__ import annotations

from typing import Any

import pytest
from test_wire_sdk import (
    check_anthropic,
    check_anthropic_request,
    check_chat,
    check_responses_item,
    plain,
)

from zidane_actors.errors import WireFormatError, WireTypeError
from zidane_actors.model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.wire import (
    RAW_ARGUMENTS_KEY,
    WireDowngrade,
    anthropic_tool_id_map,
    auto_detect_and_convert,
    drop_invalid_tool_pairings,
    ensure_tool_result_pairing,
    from_anthropic,
    from_openai,
    from_openai_responses,
    reasoning_wire_action,
    to_anthropic,
    to_anthropic_request,
    to_openai,
    to_openai_request,
    to_openai_responses,
    to_wire_messages,
)


def user(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="user", content=tuple(blocks))


def assistant(*blocks: Any) -> SessionMessage:
    return SessionMessage(role="assistant", content=tuple(blocks))


# ---------------------------------------------------------------- Anthropic


def test_from_anthropic_documented_tool_use_turn() -> None:
    msg = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Let me check.", "signature": "EqQBCgIYAh"},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {"type": "text", "text": "I'll check the weather."},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA"},
            },
        ],
    }
    assert from_anthropic(msg) == assistant(
        ReasoningBlock(text="Let me check.", provider="anthropic", signature="EqQBCgIYAh"),
        ReasoningBlock(provider="anthropic", redacted_data="EmwKAhgBEgy3va3pzix"),
        TextBlock("I'll check the weather."),
        ToolCallBlock(
            id="toolu_01A09q90qw90lq917835lq9",
            name="get_weather",
            input={"location": "San Francisco, CA"},
        ),
    )
    assert to_anthropic(from_anthropic(msg)) == msg


def test_from_anthropic_tool_result_and_media() -> None:
    msg = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [
                    {"type": "text", "text": "15 degrees"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"},
                    },
                ],
                "is_error": False,
            },
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                "title": "a.pdf",
            },
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "hi"},
            },
            {"type": "document", "source": {"type": "url", "url": "https://x.test/b.pdf"}},
            {"type": "text", "text": "What now?", "cache_control": {"type": "ephemeral"}},
        ],
    }
    assert plain(from_anthropic(msg)) == user(
        ToolResultBlock(
            call_id="toolu_1",
            output=(TextBlock("15 degrees"), ImageBlock(media_type="image/jpeg", data="/9j/")),
        ),
        ToolResultBlock(call_id="toolu_2", output="boom", is_error=True),
        ImageBlock(url="https://x.test/a.png"),
        FileBlock(media_type="application/pdf", data="JVBE", name="a.pdf"),
        FileBlock(text="hi"),
        FileBlock(url="https://x.test/b.pdf"),
        TextBlock("What now?"),
    )


def test_from_anthropic_string_content() -> None:
    assert plain(from_anthropic({"role": "user", "content": "Hello"})) == user(TextBlock("Hello"))


@pytest.mark.parametrize(
    ("msg", "path"),
    [
        (
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]},
            "$.content[0].source.media_type",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "$.content[0].text"),
        ({"role": "bot", "content": "x"}, "$.role"),
        ({"role": "user", "content": 3}, "$.content"),
        ({"role": "user", "content": [{"type": 3}]}, "$.content[0].type"),
        (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}],
            },
            "$.content[0].id",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "a", "name": "f", "input": []}],
            },
            "$.content[0].input",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "no"}],
            },
            "$.content[0].is_error",
        ),
    ],
)
def test_from_anthropic_errors_are_located(msg: dict[str, Any], path: str) -> None:
    with pytest.raises(WireFormatError) as info:
        from_anthropic(msg)
    assert info.value.path == path


def test_to_anthropic_rules() -> None:
    out = to_anthropic(
        user(
            TextBlock(""),
            TextBlock(" \n"),
            ImageBlock(media_type="IMAGE/JPG", data="AA"),
            ToolResultBlock(call_id="c", output=(TextBlock(""), TextBlock("ok"))),
        )
    )
    check_anthropic(out)
    assert out["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AA"}},
        {"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "ok"}]},
    ]


def test_to_anthropic_drops_an_image_type_it_cannot_take_and_says_so() -> None:
    reports: list[WireDowngrade] = []
    bmp = ImageBlock(media_type="image/bmp", data="Qk0=")
    result = ToolResultBlock(call_id="c", output=(TextBlock("shot"), bmp))
    converted = to_anthropic_request(
        [
            user(TextBlock("x"), bmp),
            assistant(ToolCallBlock(id="c", name="f")),
            user(result),
        ],
        on_downgrade=reports.append,
    )
    check_anthropic_request(converted)
    assert converted["messages"][0]["content"] == [{"type": "text", "text": "x"}]
    assert converted["messages"][2]["content"][0]["content"] == [{"type": "text", "text": "shot"}]
    assert reports == [
        WireDowngrade(0, "$.content[1]", "dropped", "image"),
        WireDowngrade(2, "$.content[0].output[1]", "dropped", "image"),
    ]


def test_reasoning_dropped_on_the_way_to_another_provider_is_reported() -> None:
    thinking = ReasoningBlock(text="hmm", provider="anthropic", signature="sig")
    deepseek = ReasoningBlock(text="hmm", provider="openai-chat")
    responses = ReasoningBlock(text="hmm", provider="openai-responses", id="rs_1")
    message = assistant(thinking, deepseek, responses, TextBlock("done"))
    for convert, kept in (
        (lambda m, sink: [to_anthropic(m, on_downgrade=sink)], 0),
        (lambda m, sink: to_openai(m, on_downgrade=sink), 1),
        (lambda m, sink: to_openai_responses([m], on_downgrade=sink), 2),
    ):
        reports: list[WireDowngrade] = []
        convert(message, reports.append)
        dropped = [0, 1, 2]
        dropped.remove(kept)
        assert reports == [
            WireDowngrade(0, f"$.content[{j}]", "dropped", "reasoning") for j in dropped
        ]


def test_to_anthropic_rejects_what_it_cannot_send() -> None:
    with pytest.raises(WireFormatError) as info:
        to_anthropic(user(ImageBlock(ref="blob:1")))
    assert info.value.path == "$.content[0].ref"
    reports: list[WireDowngrade] = []
    system = SessionMessage(role="system", content=(TextBlock("s"), ImageBlock(url="u")))
    assert to_anthropic(system, on_downgrade=reports.append) == {
        "role": "system",
        "content": [{"type": "text", "text": "s"}],
    }
    assert reports == [WireDowngrade(0, "$.content[1]", "dropped", "image")]
    with pytest.raises(WireFormatError):
        to_anthropic(user(ToolCallBlock(id="a", name="f")))


def test_anthropic_tool_ids_are_remapped_consistently() -> None:
    messages = [
        assistant(
            ToolCallBlock(id="call.1", name="f"),
            ToolCallBlock(id="call 1", name="f"),
            ToolCallBlock(id="ok_id", name="f"),
        ),
        user(
            ToolResultBlock(call_id="call.1", output="a"),
            ToolResultBlock(call_id="call 1", output="b"),
            ToolResultBlock(call_id="ok_id", output="c"),
        ),
    ]
    request = to_anthropic_request(messages)
    calls = [b["id"] for b in request["messages"][0]["content"]]
    results = [b["tool_use_id"] for b in request["messages"][1]["content"]]
    assert calls == results
    assert calls[2] == "ok_id"
    assert len(set(calls)) == 3
    assert all(c.replace("_", "").replace("-", "").isalnum() for c in calls)
    # deterministic, and the same id in a single message maps the same way
    assert anthropic_tool_id_map(messages) == anthropic_tool_id_map(list(reversed(messages)))
    assert to_anthropic(messages[0])["content"][0]["id"] == calls[0]


def test_anthropic_remap_never_collides_with_existing_ids() -> None:
    taken = anthropic_tool_id_map([assistant(ToolCallBlock(id="a.b", name="f"))])["a.b"]
    messages = [assistant(ToolCallBlock(id="a.b", name="f"), ToolCallBlock(id=taken, name="f"))]
    mapping = anthropic_tool_id_map(messages)
    assert mapping["a.b"] != taken
    assert taken not in mapping


def test_to_anthropic_request_system_and_empty_messages() -> None:
    request = to_anthropic_request(
        [
            SessionMessage(role="system", content=(TextBlock("Be brief."),)),
            user(TextBlock("hi")),
            assistant(ReasoningBlock(text="foreign", provider="openai", signature="x", id="r")),
        ]
    )
    assert request == {
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert "system" not in to_anthropic_request([user(TextBlock("hi"))])
    with pytest.raises(WireFormatError) as info:
        to_anthropic_request([user(TextBlock("x")), user(ImageBlock(ref="r"))])
    assert info.value.path == "$[1].content[0].ref"


def test_reasoning_wire_action() -> None:
    signed = ReasoningBlock(text="t", provider="anthropic", signature="s")
    signature_only = ReasoningBlock(provider="anthropic", signature="s")
    redacted = ReasoningBlock(provider="anthropic", redacted_data="d")
    unsigned = ReasoningBlock(text="t", provider="anthropic")
    openai = ReasoningBlock(text="t", provider="openai", signature="enc", id="rs_1")
    anonymous = ReasoningBlock(text="t", signature="s")
    assert reasoning_wire_action(signed, "anthropic") == "keep"
    assert reasoning_wire_action(signature_only, "anthropic") == "keep"
    assert reasoning_wire_action(redacted, "anthropic") == "keep"
    assert reasoning_wire_action(unsigned, "anthropic") == "drop"
    assert reasoning_wire_action(openai, "anthropic") == "drop"
    assert reasoning_wire_action(anonymous, "anthropic") == "drop"
    assert reasoning_wire_action(openai, "openai") == "keep"
    assert reasoning_wire_action(signed, "openai") == "drop"
    assert (
        reasoning_wire_action(ReasoningBlock(provider="openai", signature="e"), "openai") == "drop"
    )
    out = to_anthropic(assistant(signed, openai, unsigned, signature_only, redacted))
    assert out["content"] == [
        {"type": "thinking", "thinking": "t", "signature": "s"},
        {"type": "thinking", "thinking": "", "signature": "s"},
        {"type": "redacted_thinking", "data": "d"},
    ]
    assert to_openai(assistant(TextBlock("x"), signed)) == [
        {"role": "assistant", "content": [{"type": "text", "text": "x"}]}
    ]


# ---------------------------------------------------------------- OpenAI Chat Completions


def test_from_openai_documented_messages() -> None:
    assert plain(from_openai({"role": "developer", "content": "Be brief."})) == SessionMessage(
        role="system", content=(TextBlock("Be brief."),)
    )
    assert plain(
        from_openai(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://x.test/a.jpg", "detail": "high"},
                    },
                    {"type": "image_url", "image_url": {"url": "data:image/jpg;base64,/9j/"}},
                    {
                        "type": "file",
                        "file": {
                            "filename": "a.pdf",
                            "file_data": "data:application/pdf;base64,JVBE",
                        },
                    },
                ],
            }
        )
    ) == user(
        TextBlock("What is in this image?"),
        ImageBlock(url="https://x.test/a.jpg"),
        ImageBlock(media_type="image/jpeg", data="/9j/"),
        FileBlock(media_type="application/pdf", data="JVBE", name="a.pdf"),
    )
    assert from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'},
                }
            ],
        }
    ) == assistant(ToolCallBlock(id="call_abc", name="get_weather", input={"location": "Paris"}))
    assert from_openai({"role": "tool", "tool_call_id": "call_abc", "content": "15C"}) == user(
        ToolResultBlock(call_id="call_abc", output="15C")
    )
    assert plain(
        from_openai(
            {
                "role": "assistant",
                "refusal": None,
                "content": [{"type": "refusal", "refusal": "No."}],
            }
        )
    ) == assistant(TextBlock("No."))


@pytest.mark.parametrize("arguments", ["", "not json", "[1, 2]", "3", '"s"', "{bad"])
def test_openai_arguments_that_are_not_objects_survive(arguments: str) -> None:
    wire = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ],
    }
    neutral = from_openai(wire)
    call = neutral.content[0]
    assert isinstance(call, ToolCallBlock)
    assert call.input == {RAW_ARGUMENTS_KEY: arguments}
    back = to_openai(neutral)
    assert back[0]["tool_calls"][0]["function"]["arguments"] == arguments
    check_anthropic(to_anthropic(neutral))  # kept as a valid input object


def test_from_openai_keeps_audio_and_file_ids_as_native_blocks() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}
    by_id = {"type": "file", "file": {"file_id": "file-1"}}
    msg = {"role": "user", "content": [audio, by_id]}
    neutral = from_openai(msg)
    assert neutral.content == (
        NativeBlock(provider="openai-chat", data=audio),
        NativeBlock(provider="openai-chat", data=by_id),
    )
    assert to_openai(neutral) == [msg]
    with pytest.raises(WireFormatError):
        from_openai({"role": "tool", "content": "x"})


def test_to_openai_tool_results_are_text_only() -> None:
    out = to_openai(
        user(
            ToolResultBlock(
                call_id="c1",
                output=(TextBlock("see image"), ImageBlock(media_type="image/png", data="AA")),
            ),
            ToolResultBlock(call_id="c2", output="plain"),
            TextBlock("next"),
        )
    )
    for payload in out:
        check_chat(payload)
    assert out == [
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "see image"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "plain"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                {"type": "text", "text": "next"},
            ],
        },
    ]


def test_to_openai_request_system_role() -> None:
    messages = [SessionMessage(role="system", content=(TextBlock("rules"),)), user(TextBlock("hi"))]
    assert to_openai_request(messages)[0] == {
        "role": "system",
        "content": [{"type": "text", "text": "rules"}],
    }
    assert to_openai_request(messages, system_role="developer")[0]["role"] == "developer"
    reports: list[WireDowngrade] = []
    messages = [user(TextBlock("a")), assistant(ImageBlock(url="u"), TextBlock("b"))]
    assert to_openai_request(messages, on_downgrade=reports.append)[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "b"}],
    }
    assert reports == [WireDowngrade(1, "$.content[0]", "dropped", "image")]


# ---------------------------------------------------------------- OpenAI Responses


def test_responses_documented_items() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Need weather."}],
            "encrypted_content": "gAAAA",
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "15C"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "And this?"},
                {"type": "input_image", "detail": "auto", "image_url": "data:image/png;base64,AA"},
                {"type": "input_file", "file_url": "https://x.test/a.pdf"},
            ],
        },
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
        },
    ]
    assert plain(from_openai_responses(items)) == [
        user(TextBlock("What's the weather in Paris?")),
        assistant(
            ReasoningBlock(text="Need weather.", provider="openai", signature="gAAAA", id="rs_1"),
            ToolCallBlock(id="call_1", name="get_weather", input={"city": "Paris"}),
        ),
        user(
            ToolResultBlock(call_id="call_1", output="15C"),
            TextBlock("And this?"),
            ImageBlock(media_type="image/png", data="AA"),
            FileBlock(url="https://x.test/a.pdf"),
        ),
        assistant(TextBlock("Sunny.")),
    ]
    assert to_openai_responses(from_openai_responses(items)) == items
    for item in to_openai_responses(plain(from_openai_responses(items))):
        check_responses_item(item)


def test_responses_errors_are_located() -> None:
    with pytest.raises(WireFormatError) as info:
        from_openai_responses([{"role": "user", "content": "x"}, {"type": 5, "id": "i"}])
    assert info.value.path == "$[1].type"
    reports: list[WireDowngrade] = []
    items = to_openai_responses(
        [user(TextBlock("x")), assistant(ImageBlock(url="u"))], on_downgrade=reports.append
    )
    assert len(items) == 1
    assert reports == [WireDowngrade(1, "$.content[0]", "dropped", "image")]


# ---------------------------------------------------------------- auto-detect


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        ({"role": "user", "content": "hi"}, user(TextBlock("hi"))),
        (
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
            user(ImageBlock(url="u")),
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
            user(ImageBlock(url="u")),
        ),
        (
            {"role": "tool", "tool_call_id": "c", "content": "r"},
            user(ToolResultBlock(call_id="c", output="r")),
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            assistant(ToolCallBlock(id="c", name="f", input={})),
        ),
        ({"role": "user", "content": [{"type": "input_text", "text": "x"}]}, user(TextBlock("x"))),
        ({"role": "assistant", "content": None}, assistant()),
        (
            {"role": "developer", "content": "d"},
            SessionMessage(role="system", content=(TextBlock("d"),)),
        ),
    ],
)
def test_auto_detect(msg: dict[str, Any], expected: SessionMessage) -> None:
    assert plain(auto_detect_and_convert(msg)) == expected


def test_converters_do_not_alias_inputs() -> None:
    wire = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {"nested": {"k": [1]}}}],
    }
    neutral = from_anthropic(wire)
    call = neutral.content[0]
    assert isinstance(call, ToolCallBlock)
    call.input["nested"]["k"].append(2)
    assert wire["content"][0]["input"] == {"nested": {"k": [1]}}  # type: ignore[index]


def test_responses_store_false_replays_no_reasoning_known_only_by_id() -> None:
    stored = ReasoningBlock(text="plan", provider="openai-responses", id="rs_stored")
    encrypted = ReasoningBlock(
        text="plan", provider="openai-responses", id="rs_enc", signature="gAAAA"
    )
    messages = [
        user(TextBlock("hi")),
        assistant(stored, TextBlock("one")),
        user(TextBlock("more")),
        assistant(encrypted, TextBlock("two")),
    ]
    kinds = [item.get("id") for item in to_openai_responses(messages)]
    assert "rs_stored" in kinds and "rs_enc" in kinds
    reports: list[WireDowngrade] = []
    items = to_openai_responses(messages, store=False, on_downgrade=reports.append)
    for item in items:
        check_responses_item(item)
    ids = [item.get("id") for item in items if item.get("type") == "reasoning"]
    assert ids == ["rs_enc"]
    assert reports == [WireDowngrade(1, "$.content[0]", "dropped", "reasoning")]
    assert reasoning_wire_action(stored, "openai", store=False) == "drop"
    assert reasoning_wire_action(encrypted, "openai", store=False) == "keep"


def test_values_nested_too_deep_are_located_errors_in_every_converter() -> None:
    deep: list[Any] = []  # past what json.dumps and msgspec recurse through
    leaf = deep
    for _ in range(5_000):
        leaf.append([])
        leaf = leaf[0]
    server_tool = NativeBlock(
        provider="anthropic",
        data={"type": "server_tool_use", "id": "s", "name": "web_search", "input": {"q": deep}},
    )
    messages = [
        assistant(ToolCallBlock(id="a", name="f", input={"x": deep})),
        assistant(TextBlock("x"), server_tool),
    ]
    converters: list[Any] = [
        to_anthropic,
        to_openai,
        lambda m: to_openai_responses([m]),
        lambda m: to_anthropic_request([m]),
        lambda m: to_openai_request([m]),
    ]
    for convert in converters:
        for message in messages:
            with pytest.raises(WireFormatError) as info:
                convert(message)
            assert "nesting is too deep" in str(info.value)
            assert info.value.path is not None and ".input." in info.value.path


def test_readable_tool_exchanges_are_converted_for_other_providers() -> None:
    mcp = from_anthropic(
        {
            "role": "assistant",
            "content": [
                {
                    "type": "mcp_tool_use",
                    "id": "mcptoolu_1",
                    "name": "search_docs",
                    "server_name": "docs",
                    "input": {"q": "trio"},
                },
                {
                    "type": "mcp_tool_result",
                    "tool_use_id": "mcptoolu_1",
                    "is_error": False,
                    "content": [{"type": "text", "text": "trio is a library"}],
                },
            ],
        }
    )
    reports: list[WireDowngrade] = []
    chat = to_openai(mcp, on_downgrade=reports.append)
    check_chat(chat[0])
    assert chat[0]["content"] == [
        {"type": "text", "text": '[docs.search_docs {"q": "trio"}]'},
        {"type": "text", "text": "MCP tool result:\ntrio is a library"},
    ]
    assert [r.kind for r in reports] == ["converted", "converted"]

    shell = from_openai_responses(
        [
            {
                "type": "local_shell_call",
                "id": "lsh_1",
                "call_id": "call_1",
                "status": "completed",
                "action": {"type": "exec", "command": ["ls", "-la"], "env": {}},
            },
            {"type": "local_shell_call_output", "id": "lsh_1", "output": "README.md"},
            {
                "type": "file_search_call",
                "id": "fs_1",
                "status": "completed",
                "queries": ["deadline"],
                "results": [{"file_id": "file-1", "filename": "plan.md", "text": "Friday"}],
            },
        ]
    )
    reports = []
    request = to_anthropic_request(shell, on_downgrade=reports.append)
    check_anthropic_request(request)
    texts = [block["text"] for message in request["messages"] for block in message["content"]]
    assert texts == [
        "[local shell ls -la]",
        "Local shell output:\nREADME.md",
        "[file search deadline]\n- plan.md: Friday",
    ]
    assert {r.kind for r in reports} == {"converted"}


def test_lone_surrogates_cross_every_converter() -> None:
    """A string JavaScript clipped mid-pair (``"\\ud83d"``) converts; ids shorten; no error."""
    long_id = "call_" + "x" * 70 + "\ud83d"
    messages = [
        SessionMessage(
            role="assistant",
            content=(
                TextBlock("cut \ud83d"),
                ToolCallBlock(id=long_id, name="f", input={"q": "\udc00"}),
            ),
        ),
        SessionMessage(
            role="user", content=(ToolResultBlock(call_id=long_id, output="done \ud800"),)
        ),
    ]
    assert anthropic_tool_id_map(messages)[long_id] != long_id
    anthropic = to_anthropic_request(messages)["messages"]
    assert anthropic[0]["content"][0]["text"] == "cut \ud83d"
    chat = to_openai_request(messages)
    assert to_openai_responses(messages)
    assert from_anthropic(anthropic[0]).content[0] == TextBlock("cut \ud83d")
    assert from_openai(chat[0]).content[0] == TextBlock("cut \ud83d")


# ---------------------------------------------------------------- bounded error messages


def _nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


_DEEP = _nested_list(3_000)


@pytest.mark.parametrize(
    ("convert", "path"),
    [
        (lambda: from_anthropic({"role": _DEEP, "content": []}), "$.role"),
        (lambda: from_openai({"role": _DEEP, "content": "x"}), "$.role"),
        (lambda: from_openai_responses([{"type": "message", "role": _DEEP}]), "$[0].role"),
        (lambda: auto_detect_and_convert({"role": _DEEP, "content": "x"}), None),
        (
            lambda: from_openai({"role": "assistant", "tool_calls": [{"id": "c", "type": _DEEP}]}),
            "$.tool_calls[0].type",
        ),
        (
            lambda: to_anthropic(
                user(TextBlock("x", provider_data={"provider": "anthropic", "unset": [_DEEP]}))
            ),
            "$.providerData",
        ),
    ],
    ids=["anthropic-role", "chat-role", "responses-role", "detect", "tool-call-type", "pointer"],
)
def test_a_deep_value_where_text_is_due_is_refused_with_a_bounded_message(
    convert: Any, path: str | None
) -> None:
    """A value nested 3,000 deep is named by a bounded preview, never ``RecursionError``."""
    with pytest.raises(WireFormatError) as info:
        convert()
    assert "[[[[...]]]] (a list)" in str(info.value)
    assert len(str(info.value)) < 200
    if path is not None:
        assert info.value.path == path


def test_a_long_role_is_clipped_in_the_message() -> None:
    with pytest.raises(WireFormatError) as info:
        from_anthropic({"role": "x" * 1_000_000, "content": []})
    assert "(1000000 chars)" in str(info.value)
    assert len(str(info.value)) < 200


def test_responses_store_false_drops_a_native_reasoning_item_known_only_by_id() -> None:
    """A Responses reasoning item kept whole (a native block) with no ``encrypted_content``
    is dropped and reported under ``store=False``, after its messages as before them."""
    id_only = NativeBlock(
        provider="openai-responses",
        data={"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
    )
    encrypted = NativeBlock(
        provider="openai-responses",
        data={"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAA"},
    )
    messages = [
        user(TextBlock("hi")),
        assistant(TextBlock("one")),
        assistant(id_only, TextBlock("two")),
        assistant(encrypted, TextBlock("three")),
    ]
    kept = [item.get("id") for item in to_openai_responses(messages)]
    assert "rs_1" in kept and "rs_2" in kept
    reports: list[WireDowngrade] = []
    items = to_openai_responses(messages, store=False, on_downgrade=reports.append)
    for item in items:
        check_responses_item(item)
    assert [item.get("id") for item in items if item.get("type") == "reasoning"] == ["rs_2"]
    assert reports == [WireDowngrade(2, "$.content[0]", "dropped", "reasoning")]


@pytest.mark.parametrize("data", ["héllo", "aGk", "//79"])
def test_text_file_data_that_is_not_base64_utf8_is_refused_located(data: str) -> None:
    """Non-ASCII data, bad padding, bytes that are not UTF-8: a located ``WireFormatError``."""
    message = user(FileBlock(media_type="text/plain", data=data))
    with pytest.raises(WireFormatError) as info:
        to_anthropic(message)
    assert info.value.path == "$.content[0].data"


# ---------------------------------------------------------------- wrongly built messages


_WRONGLY_BUILT: list[tuple[str, SessionMessage, str]] = [
    ("content None", SessionMessage(role="user", content=None), "$.content"),  # type: ignore[arg-type]
    ("content text", SessionMessage(role="user", content="hi"), "$.content"),  # type: ignore[arg-type]
    ("block None", SessionMessage(role="user", content=(None,)), "$.content[0]"),  # type: ignore[arg-type]
    ("block dict", user({"type": "text", "text": "x"}), "$.content[0]"),
    ("role", SessionMessage(role="bogus", content=(TextBlock("x"),)), "$.role"),  # type: ignore[arg-type]
    ("text", user(TextBlock(5)), "$.content[0].text"),  # type: ignore[arg-type]
    ("call name", assistant(ToolCallBlock(id="c", name=None)), "$.content[0].name"),  # type: ignore[arg-type]
    ("call input", assistant(ToolCallBlock(id="c", name="f", input=[1])), "$.content[0].input"),  # type: ignore[arg-type]
    (
        "is_error",
        user(ToolResultBlock(call_id="c", output="x", is_error="yes")),  # type: ignore[arg-type]
        "$.content[0].isError",
    ),
    ("output None", user(ToolResultBlock(call_id="c", output=None)), "$.content[0].output"),  # type: ignore[arg-type]
    ("url", user(ImageBlock(url=5)), "$.content[0].url"),  # type: ignore[arg-type]
    (
        "provider data",
        user(TextBlock("x", provider_data="zz")),  # type: ignore[arg-type]
        "$.content[0].providerData",
    ),
]


@pytest.mark.parametrize(
    ("message", "path"),
    [(m, p) for _, m, p in _WRONGLY_BUILT],
    ids=[n for n, _, _ in _WRONGLY_BUILT],
)
def test_a_message_built_with_a_wrong_type_is_refused_located(
    message: SessionMessage, path: str
) -> None:
    """msgspec checks types on decode, never on construction: a converter refuses a wrongly
    built message at the field, instead of a ``TypeError`` deep inside or a silent change
    on the wire (an unknown role sent as ``assistant``, ``isError="yes"`` as ``true``)."""
    for convert in (to_anthropic, to_openai):
        with pytest.raises(WireFormatError) as single:
            convert(message)
        assert single.value.path == path
    listed = f"$[1]{path[1:]}"
    for convert_all in (to_anthropic_request, to_openai_request, to_openai_responses):
        with pytest.raises(WireFormatError) as many:
            convert_all([user(TextBlock("first")), message])
        assert many.value.path == listed
    for read in (ensure_tool_result_pairing, drop_invalid_tool_pairings, anthropic_tool_id_map):
        try:
            read([user(TextBlock("first")), message])
        except WireFormatError as exc:  # the functions that only read say where they failed
            assert exc.path == listed


async def test_to_wire_messages_refuses_a_wrongly_built_turn_located() -> None:
    good = SessionTurn(id="t0", role="user", content=(TextBlock("hi"),), created_at=1)
    wrong = SessionTurn(id="t1", role="user", content=None, created_at=2)  # type: ignore[arg-type]
    with pytest.raises(WireFormatError) as caught:
        await to_wire_messages([good, wrong])
    assert caught.value.path == "$[1].content"


@pytest.mark.parametrize(
    ("item", "where"),
    [
        ({"role": "user", "content": "x", 1: "int key"}, r"key 1 is not a string \(at \$\[0\]\)"),
        ({"role": "user", "content": "x", "m": {"n": {2: "b"}}}, r"\(at \$\[0\]\.m\.n\)"),
        ({"type": "web_search_call", "id": "ws_1", "x": object()}, r"object \(at \$\[0\]\.x\)"),
    ],
)
def test_a_value_or_key_json_cannot_carry_is_a_located_type_error(item: Any, where: str) -> None:
    with pytest.raises(WireTypeError, match=where) as raised:
        from_openai_responses([item])
    assert isinstance(raised.value, WireFormatError) and isinstance(raised.value, TypeError)
