"""pydantic-ai histories kept in zidane sessions, driven by pydantic-ai's TestModel and
FunctionModel (no network, no mocks of pydantic-ai)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from odd_values import any_text, any_value
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from zidane_actors.errors import ValidationError
from zidane_actors.integrations.pydantic_ai import (
    append_messages,
    append_messages_sync,
    message_history,
    messages_to_turns,
    turns_to_messages,
)
from zidane_actors.model import (
    ImageBlock,
    ReasoningBlock,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    decode,
    encode,
)
from zidane_actors.portal import open_host_async, start_host

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def adder() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(TestModel())

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return agent


def user_prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    ]


def recall(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that answers with every user prompt it was shown, in order."""
    del info
    return ModelResponse(parts=[TextPart(" | ".join(user_prompts(messages)))])


def neutral(block: Any) -> Any:
    """``block`` without what pydantic-ai keeps beside the neutral fields."""
    return msgspec.structs.replace(block, provider_data=None)


def bare(turn: SessionTurn) -> SessionTurn:
    """``turn`` as other code would write it: neutral content only."""
    return SessionTurn(turn.id, turn.role, tuple(map(neutral, turn.content)), turn.created_at)


def dumped(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def assert_pairs(turns: tuple[SessionTurn, ...]) -> None:
    """Every tool call is answered in the user turn right after its assistant turn."""
    for i, turn in enumerate(turns):
        calls = [b.id for b in turn.content if isinstance(b, ToolCallBlock)]
        if calls:
            results = [b.call_id for b in turns[i + 1].content if isinstance(b, ToolResultBlock)]
            assert turns[i + 1].role == "user" and results == calls


def test_a_conversation_resumed_from_the_store_continues(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'pyd.db'}"
    with start_host(url) as host:
        session = host.create_session(id="chat")
        first = adder().run_sync("add please", message_history=message_history(session))
        append_messages_sync(session, first.new_messages())
        assert_pairs(session.turns)
        kinds = [type(b).__name__ for t in session.turns for b in t.content]
        assert kinds == ["TextBlock", "ToolCallBlock", "ToolResultBlock", "TextBlock"]

    with start_host(url) as host:  # a new process' view: everything from the store
        session = host.load_session("chat")
        assert session is not None
        history = message_history(session)
        assert history == first.all_messages()  # exactly, timestamps and all
        second = Agent(FunctionModel(recall)).run_sync("and now?", message_history=history)
        assert second.output == "add please | and now?"
        append_messages_sync(session, second.new_messages())
        assert len(session.turns) == 6


def test_asyncio_helpers_and_tool_pairing() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            session = await host.create_session()
            for prompt in ("one", "two"):
                result = await adder().run(prompt, message_history=message_history(session))
                await append_messages(session, result.new_messages())
            assert_pairs(session.turns)
            final = await Agent(FunctionModel(recall)).run(
                "three", message_history=message_history(session)
            )
            assert final.output == "one | two | three"

    asyncio.run(main())


def test_thinking_images_and_returns_convert_both_ways() -> None:
    messages: list[ModelMessage] = [
        ModelRequest(
            parts=[
                UserPromptPart(
                    [
                        "What is in these?",
                        ImageUrl(url="https://example.com/cat.png"),
                        BinaryContent(data=PNG, media_type="image/png"),
                    ]
                )
            ]
        ),
        ModelResponse(
            parts=[
                ThinkingPart("Two images.", signature="sig", provider_name="anthropic"),
                ToolCallPart("look", {"index": 1}, tool_call_id="call_1"),
            ]
        ),
        ModelRequest(parts=[ToolReturnPart("look", "a cat", tool_call_id="call_1")]),
        ModelResponse(parts=[TextPart("A cat, twice.")]),
    ]
    turns = messages_to_turns(messages)
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert neutral(turns[0].content[1]) == ImageBlock(url="https://example.com/cat.png")
    image = turns[0].content[2]
    assert isinstance(image, ImageBlock) and image.media_type == "image/png" and image.data
    assert neutral(turns[1].content[0]) == ReasoningBlock(
        text="Two images.", provider="anthropic", signature="sig"
    )
    (result,) = turns[2].content
    assert neutral(result) == ToolResultBlock(call_id="call_1", output="a cat", name="look")
    # Exact as pydantic-ai itself serialises a history.
    assert dumped(turns_to_messages(turns)) == dumped(messages)

    # Without the kept copies (turns another writer made), the parts come back
    # from the neutral content.
    rebuilt = turns_to_messages([bare(t) for t in turns])
    assert [type(m) for m in rebuilt] == [type(m) for m in messages]
    prompt = rebuilt[0].parts[0]
    assert isinstance(prompt, UserPromptPart) and not isinstance(prompt.content, str)
    assert prompt.content[0] == "What is in these?"
    binary = prompt.content[2]
    assert isinstance(binary, BinaryContent) and binary.data == PNG and binary.is_image
    call = rebuilt[1].parts[1]
    assert isinstance(call, ToolCallPart) and call.args_as_dict() == {"index": 1}
    back = rebuilt[2].parts[0]
    assert isinstance(back, ToolReturnPart) and back.tool_call_id == "call_1"
    assert bare(messages_to_turns(rebuilt)[2]).content == bare(turns[2]).content


def test_a_turn_changed_elsewhere_is_read_from_its_content() -> None:
    (turn,) = messages_to_turns([ModelResponse(parts=[TextPart("original")])])
    edited = SessionTurn(
        turn.id, turn.role, (TextBlock("edited"),), turn.created_at, metadata=turn.metadata
    )
    (message,) = turns_to_messages([edited])
    assert isinstance(message, ModelResponse) and message.parts == [TextPart("edited")]


def test_neutral_history_written_by_other_code_drives_a_run() -> None:
    turns = [
        SessionTurn("t1", "user", (TextBlock("hi"),), 1),
        SessionTurn("t2", "assistant", (ToolCallBlock("c1", "lookup", {"q": "x"}),), 2),
        SessionTurn("t3", "user", (ToolResultBlock(call_id="c1", output="found"),), 3),
        SessionTurn("t4", "assistant", (TextBlock("done"),), 4),
    ]
    seen: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(messages)
        return ModelResponse(parts=[TextPart("ok")])

    result = Agent(FunctionModel(model)).run_sync("next", message_history=turns_to_messages(turns))
    assert result.output == "ok"
    returns = [p for m in seen for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_call_id, r.content) for r in returns] == [("c1", "found")]


# -- runs, errors and what pydantic-ai keeps -----------------------------------


def retrying_agent() -> Agent[None, str]:
    """Searches twice (the first is refused with ModelRetry), answers, and is asked once to
    answer again by its output validator."""
    from pydantic_ai import ModelRetry
    from pydantic_ai.usage import RequestUsage

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answered = sum(isinstance(m, ModelResponse) for m in messages)
        usage = RequestUsage(input_tokens=100 + answered, output_tokens=10)
        if answered == 0:
            parts: list[Any] = [
                ThinkingPart("look it up"),
                ToolCallPart("search", {"query": "vague"}, tool_call_id="c1"),
            ]
        elif answered == 1:
            parts = [ToolCallPart("search", {"query": "precise"}, tool_call_id="c2")]
        elif answered == 2:
            parts = [TextPart("draft")]
        else:
            parts = [TextPart("Found it.")]
        return ModelResponse(parts=parts, usage=usage)

    agent: Agent[None, str] = Agent(FunctionModel(model), system_prompt="Answer from the notes.")

    @agent.tool_plain
    def search(query: str) -> str:
        """Search the notes."""
        if query == "vague":
            raise ModelRetry("too vague: name the note")
        return "note 7"

    @agent.output_validator
    def final(output: str) -> str:
        if output == "draft":
            raise ModelRetry("not a draft, please")
        return output

    return agent


def test_a_run_with_a_retry_is_recorded_with_its_errors(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'runs.db'}"
    with start_host(url) as host:
        session = host.create_session(id="retry")
        result = retrying_agent().run_sync("What does the note say?")
        append_messages_sync(session, result.new_messages(), agent="notes")
        assert result.output == "Found it."

    with start_host(url) as host:
        session = host.load_session("retry")
        assert session is not None
        assert message_history(session) == result.all_messages()  # exactly
        turns, (run,) = session.turns, session.runs

    assert run.id == result.run_id and run.status == "completed"
    assert run.agent is not None and run.agent.id == "notes"
    assert run.prompt == "What does the note say?"
    assert (run.tokens_in, run.tokens_out, run.turns) == (100 + 101 + 102 + 103, 40, 4)
    assert run.options is not None and run.options.model == "function:model:"
    assert all(t.run_id == run.id for t in turns)
    assert [t.usage.input for t in turns if t.usage is not None] == [100, 101, 102, 103]
    assert run.ended_at is not None and run.started_at <= run.ended_at

    # The system prompt is a system turn; the refused search is an error result; the
    # validator's feedback is visible text.
    assert turns[0].role == "system"
    assert [b.text for b in turns[0].content if isinstance(b, TextBlock)] == [
        "Answer from the notes."
    ]
    results = [b for t in turns for b in t.content if isinstance(b, ToolResultBlock)]
    assert [(r.call_id, r.is_error, r.output) for r in results] == [
        ("c1", True, "too vague: name the note"),
        ("c2", None, "note 7"),  # a success carries no isError
    ]
    feedback = [
        b.text
        for t in turns
        if t.role == "user"
        for b in t.content
        if isinstance(b, TextBlock) and "draft" in b.text
    ]
    assert feedback and all(text.strip() for text in feedback)
    # Stored once: about pydantic-ai's own JSON of the same messages.
    stored = sum(len(msgspec.json.encode(t)) for t in turns)
    assert stored < 1.5 * len(dumped(result.new_messages()))


def test_a_deprecated_retry_prompt_part_comes_back_as_itself() -> None:
    import warnings

    from pydantic_ai.messages import RetryPromptPart

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old: list[ModelMessage] = [
            ModelResponse(parts=[ToolCallPart("look", {"i": 1}, tool_call_id="c1")]),
            ModelRequest(
                parts=[
                    RetryPromptPart("bad index", tool_name="look", tool_call_id="c1"),
                    RetryPromptPart("answer in French"),
                ]
            ),
        ]
    turns = messages_to_turns(old)
    back = turns_to_messages(turns)
    assert back == old
    assert all(type(p) is RetryPromptPart for p in back[1].parts)
    result, feedback = turns[1].content
    assert isinstance(result, ToolResultBlock) and result.is_error
    assert isinstance(feedback, TextBlock) and "answer in French" in feedback.text


def test_turns_with_a_message_copy_from_earlier_versions_still_read_back() -> None:
    message = ModelResponse(parts=[TextPart("kept")], model_name="m1")
    copy = ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    turn = SessionTurn(
        "t1", "assistant", (TextBlock("kept"),), 1, metadata={"pydanticAiMessage": copy}
    )
    assert turns_to_messages([turn]) == [message]


def test_an_unknown_model_has_no_cost_and_a_caller_price_gives_one() -> None:
    from pydantic_ai.usage import RequestUsage

    message = ModelResponse(
        parts=[TextPart("x")], usage=RequestUsage(input_tokens=1000, output_tokens=100)
    )
    (free,) = messages_to_turns([message])
    assert free.usage is not None and free.usage.cost is None
    (priced,) = messages_to_turns([message], price=lambda u: u.input * 1e-6)
    assert priced.usage is not None and priced.usage.cost == pytest.approx(0.001)


def test_a_message_the_kept_parts_would_not_give_back_is_stored_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zidane_actors.integrations import pydantic_ai

    monkeypatch.setattr(pydantic_ai, "_parts", lambda turn: None)  # as if a part were lost
    # A part id: not a shape proven to come back, so it is converted back and compared.
    message = ModelResponse(parts=[TextPart("whole", id="p1")], model_name="m1")
    (turn,) = messages_to_turns([message])
    assert turn.metadata is not None and "pydanticAiMessage" in turn.metadata
    assert turns_to_messages([turn]) == [message]


ODD = "a\x00b\ud800c\udfff"  # NUL and lone surrogates: Python strings and JSON escapes keep them


def test_nul_and_lone_surrogates_in_values_read_back_exactly(tmp_path: Path) -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content=ODD)]),
        ModelResponse(
            parts=[
                TextPart(content=ODD),
                ToolCallPart(tool_name="f", args={"q": ODD, "list": [ODD]}, tool_call_id="c1"),
                ToolCallPart(tool_name="g", args='{"q": "\\ud800"}', tool_call_id="c2"),
            ]
        ),
    ]
    with start_host(f"sqlite:{tmp_path / 'odd.db'}") as host:
        append_messages_sync(host.create_session(id="odd"), messages)
        loaded = host.load_session("odd")
        assert loaded is not None and message_history(loaded) == messages


NOT_EXACT: dict[str, tuple[ModelMessage, str]] = {
    "NaN in tool args": (
        ModelResponse(parts=[ToolCallPart(tool_name="f", args={"x": float("nan")})]),
        "$[1].parts[0].args.x",
    ),
    "infinity returned": (
        ModelRequest(parts=[ToolReturnPart(tool_name="f", content=float("inf"))]),
        "$[1].parts[0].content",
    ),
    "a lone surrogate in a key": (
        ModelResponse(parts=[ToolCallPart(tool_name="f", args={"q\ud800": 1})]),
        '$[1].parts[0].args["q\\ud800"]',
    ),
    "a lone surrogate pydantic-ai cannot send": (
        ModelRequest(parts=[ToolReturnPart(tool_name="f", content={"r": ODD})]),
        "$[1]",
    ),
}


@pytest.mark.parametrize("case", list(NOT_EXACT))
def test_a_message_its_json_would_alter_is_refused_at_its_place_and_nothing_is_stored(
    tmp_path: Path, case: str
) -> None:
    # pydantic's JSON form writes NaN and infinities as null and a key's lone surrogate as
    # U+FFFD (and pydantic-ai cannot write a lone surrogate in a tool's return at all).
    message, place = NOT_EXACT[case]
    first = ModelRequest(parts=[UserPromptPart(content="hi")])
    with start_host(f"sqlite:{tmp_path / 'refused.db'}") as host:
        session = host.create_session(id="refused")
        with pytest.raises(ValidationError) as caught:
            append_messages_sync(session, [first, message])
        assert caught.value.path == place
        assert session.turns == () and session.runs == ()
        loaded = host.load_session("refused")
        assert loaded is not None and loaded.turns == ()


@settings(max_examples=80)
@given(key=any_text, value=any_value)
@example(key="q\ud800", value=1)
@example(key="q", value=[float("inf"), "\ud800\x00"])
@example(key="q", value=[])
def test_any_tool_value_reads_back_exactly_or_is_refused(key: str, value: Any) -> None:
    messages: list[ModelMessage] = [
        ModelResponse(parts=[ToolCallPart(tool_name="f", args={key: value}, tool_call_id="c")]),
        ModelRequest(parts=[ToolReturnPart(tool_name="f", content=value, tool_call_id="c")]),
    ]
    for message in messages:
        try:
            turns = messages_to_turns([message])
        except ValidationError as exc:
            assert exc.path is not None and exc.path.startswith("$[0]")
            continue
        stored = decode(encode(turns), list[SessionTurn])  # as a store writes and reads them
        back = ModelMessagesTypeAdapter.dump_python(turns_to_messages(stored))
        assert back == ModelMessagesTypeAdapter.dump_python([message])


@pytest.mark.parametrize("content", [[], [1, 2], ["a", "b"], [{"x": 1}], {"k": [1]}, 3, None])
def test_a_tool_return_of_any_json_shape_reads_back_exactly(content: Any, tmp_path: Path) -> None:
    # A list returned by a tool is the tool's value, not a multi-part user prompt.
    messages: list[ModelMessage] = [
        ModelResponse(parts=[ToolCallPart(tool_name="search", args={}, tool_call_id="c1")]),
        ModelRequest(
            parts=[ToolReturnPart(tool_name="search", content=content, tool_call_id="c1")]
        ),
    ]
    with start_host(f"sqlite:{tmp_path / 'returns.db'}") as host:
        append_messages_sync(host.create_session(id="returns"), messages)
        loaded = host.load_session("returns")
        assert loaded is not None and message_history(loaded) == messages


def _parts_strategy() -> Any:
    from pydantic_ai.messages import RetryPromptPart, SystemPromptPart

    text = any_text
    ids = st.text("abc_-1", min_size=1, max_size=4)
    user_item = st.one_of(
        text,
        st.builds(ImageUrl, url=st.sampled_from(["https://e.x/a.png", "https://e.x/b.jpg"])),
        st.builds(BinaryContent, data=st.binary(max_size=6), media_type=st.just("image/png")),
    )
    request_parts = st.one_of(
        st.builds(UserPromptPart, content=text | st.lists(user_item, max_size=3)),
        st.builds(SystemPromptPart, content=text),
        st.builds(ToolReturnPart, tool_name=ids, content=any_value, tool_call_id=ids),
        st.builds(RetryPromptPart, content=text, tool_name=st.none() | ids, tool_call_id=ids),
    )
    response_parts = st.one_of(
        st.builds(TextPart, content=text),
        st.builds(
            ToolCallPart,
            tool_name=ids,
            args=st.dictionaries(any_text, any_value, max_size=2) | st.none() | text,
            tool_call_id=ids,
        ),
        st.builds(
            ThinkingPart,
            content=text,
            signature=st.none() | text,
            provider_name=st.none() | st.just("anthropic"),
        ),
    )
    request = st.builds(ModelRequest, parts=st.lists(request_parts, min_size=1, max_size=3))
    response = st.builds(
        ModelResponse,
        parts=st.lists(response_parts, min_size=1, max_size=3),
        model_name=st.none() | text,
        provider_details=st.none() | st.dictionaries(any_text, any_value, max_size=2),
    )
    return st.lists(request | response, min_size=1, max_size=3)


@pytest.mark.filterwarnings("ignore:`RetryPromptPart` is deprecated")
@settings(max_examples=80)
@given(messages=_parts_strategy())
@example(
    messages=[
        ModelRequest(
            parts=[ToolReturnPart(tool_name="f", content=[1, "\ud800"], tool_call_id="c")]
        ),
        ModelResponse(parts=[TextPart(content="\x00\udfff")], provider_details={"k": 2**70}),
    ]
)
def test_any_history_reads_back_exactly_or_is_refused(messages: list[ModelMessage]) -> None:
    # Whatever parts and values pydantic-ai holds, a history is stored as it dumps, or
    # refused with the place of what could not be kept.
    try:
        turns = messages_to_turns(messages)
    except ValidationError as exc:
        assert exc.path is not None and exc.path.startswith("$[")
        return
    stored = decode(encode(turns), list[SessionTurn])  # as a store writes and reads them
    back = ModelMessagesTypeAdapter.dump_python(turns_to_messages(stored))
    assert back == ModelMessagesTypeAdapter.dump_python(messages)


def test_a_history_read_from_a_session_is_the_callers_to_change(tmp_path: Path) -> None:
    # Tool args and returns are free-form: the history holds fresh copies, never values of
    # the session's frozen memory (which refuse changes), and changing them changes nothing
    # stored. Also for turns other code wrote (rebuilt from their neutral content).
    messages: list[ModelMessage] = [
        ModelResponse(
            parts=[ToolCallPart(tool_name="f", args={"q": [1, {"a": [2]}]}, tool_call_id="c")],
            provider_details={"x": [1]},
        ),
        ModelRequest(parts=[ToolReturnPart(tool_name="f", content={"r": [1]}, tool_call_id="c")]),
    ]
    with start_host(f"sqlite:{tmp_path / 'own.db'}") as host:
        session = host.create_session(id="own")
        append_messages_sync(session, messages)
        session.append_turns(
            [
                SessionTurn(
                    id="bare",
                    role="assistant",
                    content=(ToolCallBlock(id="c2", name="g", input={"k": [1]}),),
                    created_at=1,
                )
            ]
        )
        loaded = host.load_session("own")
        assert loaded is not None
        history = message_history(loaded)
        call, returned, bare = history[0].parts[0], history[1].parts[0], history[2].parts[0]
        assert isinstance(call, ToolCallPart) and isinstance(bare, ToolCallPart)
        assert isinstance(returned, ToolReturnPart) and isinstance(history[0], ModelResponse)
        cast_args: Any = call.args
        cast_args["q"][1]["a"].append(3)
        returned.content["r"].append(2)
        details: Any = history[0].provider_details
        details["x"].append(2)
        bare_args: Any = bare.args
        bare_args["k"].append(2)
        assert message_history(loaded)[:2] == messages


@pytest.mark.parametrize("data", ["héllo", "not base64!!", "aGk", "aGk=!!"])
def test_stored_media_data_that_is_not_base64_is_refused_located(data: str) -> None:
    """pydantic-ai holds an image's bytes: data that is not base64 text (non-ASCII, outside
    the alphabet, unpadded) is refused at its place, never decoded leniently or raised as a
    bare ``ValueError``: on turns written here and on turns other code wrote alike."""
    (turn,) = messages_to_turns(
        [ModelRequest(parts=[UserPromptPart(["look", BinaryContent(PNG, media_type="image/png")])])]
    )
    image = turn.content[1]
    assert isinstance(image, ImageBlock)
    damaged = msgspec.structs.replace(
        turn, content=(turn.content[0], msgspec.structs.replace(image, data=data))
    )
    first = SessionTurn("t0", "user", (TextBlock("hi"),), 1)
    for candidate in (damaged, bare(damaged)):
        with pytest.raises(ValidationError) as info:
            turns_to_messages([first, candidate])
        assert info.value.path == "$[1].content[1].data"


def test_a_damaged_kept_message_is_refused_located() -> None:
    (turn,) = messages_to_turns([ModelRequest(parts=[UserPromptPart("hi")])])
    (block,) = turn.content
    assert block.provider_data is not None
    part = {**block.provider_data["part"], "timestamp": "not a time"}
    damaged = msgspec.structs.replace(
        turn,
        content=(
            msgspec.structs.replace(block, provider_data={**block.provider_data, "part": part}),
        ),
    )
    with pytest.raises(ValidationError, match="timestamp") as info:
        turns_to_messages([damaged])
    assert info.value.path == "$[0]"
