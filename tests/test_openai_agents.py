"""ZidaneSession under the real openai-agents Runner, with its own ScriptedModel.

No network, no mocks of openai-agents: ``agents.testing.ScriptedModel`` is
the SDK's deterministic model. The second half ports, written from scratch,
the behaviours openai-agents' own SQLiteSession tests check.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.memory import Session as AgentsSession
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call
from hypothesis import example, given, settings
from hypothesis import strategies as st
from odd_values import any_json, any_text

from zidane_actors.actors import load_session
from zidane_actors.errors import ActorClosed, InvalidNameError, ValidationError, WireFormatError
from zidane_actors.integrations import _shared
from zidane_actors.integrations.openai_agents import ZidaneSession
from zidane_actors.model import (
    NativeBlock,
    SessionData,
    SessionHistory,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.stores import open_sqlite_store
from zidane_actors.wire import to_anthropic_request, to_wire_messages

set_tracing_disabled(True)  # nothing leaves the machine

SessionFactory = Callable[..., ZidaneSession]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'agents.db'}"


@pytest.fixture
def make(db: str) -> Iterator[SessionFactory]:
    opened: list[ZidaneSession] = []

    def factory(session_id: str = "conv", **kwargs: Any) -> ZidaneSession:
        kwargs.setdefault("store", db)
        session = ZidaneSession(session_id, **kwargs)
        opened.append(session)
        return session

    yield factory
    for session in opened:
        session.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def read_back(db: str, session_id: str) -> SessionData | None:
    async def main() -> SessionData | None:
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            loaded = await load_session(store, session_id)
            return None if loaded is None else loaded.to_json()

    return trio.run(main)


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def broken(city: str) -> str:
    """A tool whose backend is down."""
    raise ConnectionError(f"no forecast for {city}")


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


# -- the Runner ----------------------------------------------------------------


def test_runner_remembers_across_runs_and_replays_items_exactly(make: SessionFactory) -> None:
    model = ScriptedModel([[assistant_message("Noted: green.")], [assistant_message("Green.")]])
    agent = Agent(name="assistant", model=model)
    session = make()

    async def main() -> None:
        first = await Runner.run(agent, "My favourite colour is green.", session=session)
        assert first.final_output == "Noted: green."
        second = await Runner.run(agent, "What is my favourite colour?", session=session)
        assert second.final_output == "Green."

    run(main())
    assert len(model.calls) == 2
    replayed = model.calls[1].input
    # The second call sees the first exchange exactly as the Runner produced it.
    answer = assistant_message("Noted: green.").model_dump(exclude_unset=True)
    assert replayed[:-1] == [*model.calls[0].input, answer]
    assert replayed[-1]["content"] == "What is my favourite colour?"
    assert len(run(session.get_items())) == 4


def test_run_sync_with_tool_calls_stores_ordinary_zidane_data(
    make: SessionFactory, db: str
) -> None:
    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Paris"}, call_id="call_1")],
            [assistant_message("It is sunny in Paris.")],
        ]
    )
    agent = Agent(name="assistant", model=model, tools=[weather])
    session = make("weather-1")
    result = Runner.run_sync(agent, "Weather in Paris?", session=session)
    assert result.final_output == "It is sunny in Paris."
    # The model's second call got the call and its output, paired.
    second = model.calls[1].input
    kinds = [item.get("type") for item in second]
    assert kinds[-2:] == ["function_call", "function_call_output"]
    assert second[-1]["call_id"] == "call_1" and second[-1]["output"] == "sunny in Paris"

    data = read_back(db, "weather-1")
    assert data is not None
    roles = [t.role for t in data.turns]
    assert roles == ["user", "assistant", "user", "assistant"]
    (question,) = data.turns[0].content
    assert isinstance(question, TextBlock) and question.text == "Weather in Paris?"
    (call,) = data.turns[1].content
    assert isinstance(call, ToolCallBlock) and call.input == {"city": "Paris"}
    (output,) = data.turns[2].content
    assert isinstance(output, ToolResultBlock) and output.call_id == "call_1"
    (answer,) = data.turns[3].content
    assert isinstance(answer, TextBlock) and answer.text == "It is sunny in Paris."

    async def for_anthropic() -> dict[str, Any]:
        return to_anthropic_request(await to_wire_messages(data.turns, provider="anthropic"))

    request = trio.run(for_anthropic)
    roles = [m["role"] for m in request["messages"]]
    assert roles[:4] == ["user", "assistant", "user", "assistant"]


def test_reasoning_items_are_replayed_exactly(make: SessionFactory) -> None:
    from openai.types.responses import ResponseReasoningItem
    from openai.types.responses.response_reasoning_item import Summary

    reasoning = ResponseReasoningItem(
        id="rs_1",
        type="reasoning",
        summary=[Summary(text="Thinking about colours.", type="summary_text")],
        encrypted_content="opaque-blob",
    )
    model = ScriptedModel(
        [[reasoning, assistant_message("Green.")], [assistant_message("Still green.")]]
    )
    agent = Agent(name="assistant", model=model)
    session = make()
    Runner.run_sync(agent, "Colour?", session=session)
    Runner.run_sync(agent, "Again?", session=session)
    replayed = model.calls[1].input
    assert replayed[1] == reasoning.model_dump(exclude_unset=True)
    assert replayed[1]["encrypted_content"] == "opaque-blob"


def test_run_streamed_saves_the_streamed_items(make: SessionFactory) -> None:
    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Oslo"}, call_id="call_9")],
            [assistant_message("Sunny in Oslo.")],
        ]
    )
    agent = Agent(name="assistant", model=model, tools=[weather])
    session = make()

    async def main() -> str:
        streamed = Runner.run_streamed(agent, "Oslo?", session=session)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    assert run(main()) == "Sunny in Oslo."
    items = run(session.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_concurrent_runs_on_distinct_sessions_share_one_portal(make: SessionFactory) -> None:
    sessions = [make(f"user-{i}") for i in range(6)]
    assert len({id(s._shared) for s in sessions}) == 1

    async def one(i: int, session: ZidaneSession) -> None:
        model = ScriptedModel(
            [[assistant_message(f"hello {i}")], [assistant_message(f"again {i}")]]
        )
        agent = Agent(name="assistant", model=model)
        await Runner.run(agent, f"I am {i}", session=session)
        await Runner.run(agent, "Who am I?", session=session)
        assert model.calls[1].input[0]["content"] == f"I am {i}"

    async def main() -> None:
        await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))

    run(main())
    for i, session in enumerate(sessions):
        items = run(session.get_items())
        assert len(items) == 4
        assert items[0]["content"] == f"I am {i}"
        assert items[-1]["content"][0]["text"] == f"again {i}"


def test_pop_item_lets_a_user_correct_the_last_question(make: SessionFactory) -> None:
    model = ScriptedModel([[assistant_message("4")], [assistant_message("6")]])
    agent = Agent(name="math", model=model)
    session = make()
    Runner.run_sync(agent, "2 + 2?", session=session)

    async def correct() -> None:
        answer = await session.pop_item()
        question = await session.pop_item()
        assert answer is not None and answer["content"][0]["text"] == "4"
        assert question == msg("user", "2 + 2?")

    run(correct())
    Runner.run_sync(agent, "3 + 3?", session=session)
    assert model.calls[1].input == [msg("user", "3 + 3?")]


def test_session_settings_limit_bounds_what_the_runner_replays(make: SessionFactory) -> None:
    model = ScriptedModel([[assistant_message(f"a{i}")] for i in range(3)])
    agent = Agent(name="assistant", model=model)
    session = make(session_settings=SessionSettings(limit=2))
    for i in range(3):
        Runner.run_sync(agent, f"q{i}", session=session)
    # Two stored items (q1, a1) plus the new question.
    assert [i.get("content") for i in model.calls[2].input][::2] == ["q1", "q2"]


# -- the Session protocol, as openai-agents' SQLiteSession tests check it -------


def test_is_an_agents_session(make: SessionFactory) -> None:
    session = make()
    assert isinstance(session, AgentsSession)
    assert session.session_id == "conv"
    assert session.session_settings == SessionSettings()


def test_empty_session_answers_nothing(make: SessionFactory, db: str) -> None:
    session = make("never-written")
    assert run(session.get_items()) == []
    assert run(session.get_items(3)) == []
    assert run(session.pop_item()) is None
    run(session.clear_session())
    assert read_back(db, "never-written") is None  # reads never create a session


def test_add_and_get_round_trip_exactly(make: SessionFactory) -> None:
    items: list[Any] = [
        msg("user", "Hello"),
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi!", "annotations": [], "logprobs": []}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "lookup",
            "arguments": '{"q": "x"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "and this picture?"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
            ],
        },
        {"role": "developer", "content": "Be brief."},
    ]
    session = make()
    run(session.add_items(items))
    assert run(session.get_items()) == items
    assert json.dumps(run(session.get_items())) == json.dumps(items)


def test_items_survive_a_new_instance_and_a_new_process_portal(
    make: SessionFactory, db: str
) -> None:
    first = make("persist")
    run(first.add_items([msg("user", "one"), msg("assistant", "two")]))
    first.close()
    assert not any(s.url.endswith("agents.db") for s in _shared._portals.values())
    again = make("persist")
    assert run(again.get_items()) == [msg("user", "one"), msg("assistant", "two")]


def test_get_items_limit_answers_the_newest_in_order(make: SessionFactory) -> None:
    session = make()
    items = [msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(7)]
    run(session.add_items(items))
    assert run(session.get_items(3)) == items[-3:]
    assert run(session.get_items(1)) == items[-1:]
    assert run(session.get_items(100)) == items
    assert run(session.get_items(0)) == []
    assert run(session.get_items(-1)) == items  # SQLite's LIMIT -1, as upstream
    limited = make("conv", session_settings={"limit": 2})
    assert run(limited.get_items()) == items[-2:]
    assert run(limited.get_items(4)) == items[-4:]  # an explicit limit wins


def test_limit_counts_items_inside_merged_turns(make: SessionFactory) -> None:
    session = make()
    items: list[Any] = [
        msg("user", "a"),
        msg("user", "b"),
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
    ]
    run(session.add_items(items))
    for n in range(len(items) + 1):
        assert run(session.get_items(n)) == (items[-n:] if n else [])


def test_one_response_split_over_calls_still_pairs_after_a_reload(
    make: SessionFactory, db: str
) -> None:
    session = make("split")
    calls: list[Any] = [
        {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        for i in (1, 2)
    ]
    outputs: list[Any] = [
        {"type": "function_call_output", "call_id": f"c{i}", "output": str(i)} for i in (1, 2)
    ]
    run(session.add_items([msg("user", "go")]))
    run(session.add_items(calls[:1]))
    run(session.add_items(calls[1:]))
    run(session.add_items(outputs))
    expected = [msg("user", "go"), *calls, *outputs]
    assert run(session.get_items()) == expected
    # A load heals tool pairings: both results must still find their calls.
    data = read_back(db, "split")
    assert data is not None
    assert [t.role for t in data.turns] == ["user", "assistant", "user"]
    assert len(data.turns[2].content) == 2
    session.close()
    assert run(make("split").get_items()) == expected


def test_pop_item_removes_items_newest_first_down_to_empty(make: SessionFactory) -> None:
    session = make()
    items: list[Any] = [
        msg("user", "a"),
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        msg("assistant", "done"),
    ]
    run(session.add_items(items))
    for n in range(len(items), 0, -1):
        assert run(session.pop_item()) == items[n - 1]
        assert run(session.get_items()) == items[: n - 1]
    assert run(session.pop_item()) is None


def test_pop_item_is_durable(make: SessionFactory, db: str) -> None:
    session = make("durable")
    run(session.add_items([msg("user", "a"), msg("assistant", "b")]))
    run(session.pop_item())
    data = read_back(db, "durable")
    assert data is not None and [t.role for t in data.turns] == ["user"]
    (block,) = data.turns[0].content
    assert isinstance(block, TextBlock) and block.text == "a"
    assert run(session.get_items()) == [msg("user", "a")]


def test_sessions_are_isolated_and_pop_touches_one(make: SessionFactory) -> None:
    one, two = make("one"), make("two")
    run(one.add_items([msg("user", "for one")]))
    run(two.add_items([msg("user", "for two"), msg("assistant", "reply two")]))
    assert run(one.pop_item()) == msg("user", "for one")
    assert run(one.get_items()) == []
    assert run(two.get_items()) == [msg("user", "for two"), msg("assistant", "reply two")]


def test_clear_session_then_add_again(make: SessionFactory, db: str) -> None:
    session = make("cleared")
    run(session.add_items([msg("user", "a"), msg("assistant", "b")]))
    run(session.clear_session())
    assert run(session.get_items()) == []
    data = read_back(db, "cleared")
    assert data is not None and data.turns == ()  # the zidane session stays, empty
    run(session.add_items([msg("user", "c")]))
    assert run(session.get_items()) == [msg("user", "c")]


def test_unicode_and_hostile_text_round_trip(make: SessionFactory) -> None:
    texts = ["héllo wörld 👋 你好", "'); DROP TABLE turns; --", "line\nbreak\ttab\u0000nul", " "]
    items = [msg("user", t) for t in texts]
    session = make()
    run(session.add_items(items))
    assert run(session.get_items()) == items


def test_concurrent_add_items_keep_every_call_whole(make: SessionFactory) -> None:
    session = make()
    batches = [[msg("user", f"{b}-{i}") for i in range(3)] for b in range(8)]

    async def main() -> None:
        await asyncio.gather(*(session.add_items(batch) for batch in batches))

    run(main())
    got = [i["content"] for i in run(session.get_items())]
    assert sorted(got) == sorted(i["content"] for b in batches for i in b)
    for batch in batches:
        start = got.index(batch[0]["content"])
        assert got[start : start + 3] == [i["content"] for i in batch]


def test_empty_add_is_a_no_op(make: SessionFactory, db: str) -> None:
    session = make("nothing")
    run(session.add_items([]))
    assert run(session.get_items()) == []  # the store is open (no two first openers race)
    assert read_back(db, "nothing") is None


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "function_call", "name": "f", "arguments": "{}"},  # no call_id
        {"role": "user", "content": 5},
        {"type": "web_search_call", "id": "ws_1", "score": float("nan")},  # not JSON
        "not an item",
    ],
)
def test_an_item_the_converters_cannot_carry_is_refused_whole(
    make: SessionFactory, bad: Any
) -> None:
    session = make()
    with pytest.raises(WireFormatError, match=r"\$\[1\]"):
        run(session.add_items([msg("user", "ok"), bad]))
    assert run(session.get_items()) == []


def test_provider_native_items_round_trip_as_native_blocks(make: SessionFactory, db: str) -> None:
    search: dict[str, Any] = {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "weather Paris"},
    }
    items: list[Any] = [
        msg("user", "Weather in Paris?"),
        search,
        {"type": "item_reference", "id": "msg_0"},
        {"type": "some_future_item", "payload": {"n": 1, "x": 1.5}},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Sunny."}],
        },
    ]
    session = make("native")
    run(session.add_items(items))
    assert json.dumps(run(session.get_items())) == json.dumps(items)
    data = read_back(db, "native")
    assert data is not None
    assert [t.role for t in data.turns] == ["user", "assistant"]
    kinds = [type(b).__name__ for b in data.turns[1].content]
    assert kinds == ["NativeBlock", "NativeBlock", "NativeBlock", "TextBlock"]
    assert data.turns[1].content[0] == NativeBlock("openai-responses", search)
    assert run(session.pop_item()) == items[-1]
    assert json.dumps(run(session.get_items())) == json.dumps(items[:-1])


def test_items_are_stored_once_with_only_the_key_order_that_differs(
    make: SessionFactory, db: str
) -> None:
    # Items in the order openai-agents writes them come back from the content alone.
    sdk_order: list[Any] = [
        {"content": "Hello", "role": "user"},
        {"arguments": '{"a": 1}', "call_id": "c1", "name": "f", "type": "function_call"},
        {"call_id": "c1", "output": "1", "type": "function_call_output"},
    ]
    session = make("plain")
    run(session.add_items(sdk_order))
    data = read_back(db, "plain")
    assert data is not None and all(t.metadata is None for t in data.turns)
    assert json.dumps(run(session.get_items())) == json.dumps(sdk_order)
    # Another order keeps only that order (no copy of the item), and comes back as sent.
    reordered: list[Any] = [
        {"role": "user", "content": [{"text": "Hi", "type": "input_text"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"text": "Yo", "type": "output_text"}],
        },
    ]
    run(session.add_items(reordered))
    data = read_back(db, "plain")
    assert data is not None
    assert data.turns[-2].metadata == {"openaiOrder": {"0": {"k": ["role", "content"]}}}
    assert data.turns[-1].metadata == {"openaiOrder": {"0": {"k": ["type", "role", "content"]}}}
    assert json.dumps(run(session.get_items(2))) == json.dumps(reordered)


def test_turns_stored_with_an_item_copy_still_read_back_exactly(
    make: SessionFactory, db: str
) -> None:
    # Earlier versions kept each turn's items whole under metadata.openaiItems.
    from zidane_actors.model import SessionTurn
    from zidane_actors.wire import from_openai_responses

    items: list[Any] = [{"content": "Hi", "role": "user", "type": "message"}]
    (message,) = from_openai_responses(items)
    old = SessionTurn(
        id="t1", role="user", content=message.content, created_at=1, metadata={"openaiItems": items}
    )

    async def write() -> None:
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            await store.save(SessionData(id="old", created_at=1, updated_at=1, turns=(old,)))

    trio.run(write)
    assert json.dumps(run(make("old").get_items())) == json.dumps(items)


def test_popping_the_follower_of_a_reasoning_item_keeps_the_reasoning(
    make: SessionFactory,
) -> None:
    items: list[Any] = [
        msg("user", "go"),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    session = make()
    run(session.add_items(items))
    assert run(session.pop_item()) == items[-1]
    assert json.dumps(run(session.get_items())) == json.dumps(items[:-1])


def test_unsafe_session_ids_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        ZidaneSession("../escape", store="memory:")


def test_a_closed_session_refuses_calls_and_the_last_close_stops_the_portal(
    make: SessionFactory,
) -> None:
    one, two = make("one"), make("two")
    shared = one._shared
    assert shared is not None and shared is two._shared
    run(one.add_items([msg("user", "x")]))
    one.close()
    calls = [one.get_items, one.pop_item, one.clear_session]
    calls += [lambda: one.add_items([msg("user", "y")]), lambda: one.add_items([])]
    for call in calls:  # an empty add_items too: the check comes before any shortcut
        with pytest.raises(ActorClosed):
            run(call())
    with pytest.raises(RuntimeError, match="closed"):  # as a closed SQLiteSession answers
        run(one.add_items([]))
    assert run(two.get_items()) == []  # the portal lives on for the other session
    run(two.aclose())
    assert shared.portal.stopped.done()


def test_a_bad_store_url_fails_the_first_call_with_a_validation_error() -> None:
    from zidane_actors.errors import ValidationError

    session = ZidaneSession("x", store="nosuch:store")
    try:
        with pytest.raises(ValidationError, match="unknown store URL"):
            run(session.get_items())
    finally:
        session.close()


# -- runs, agents and usage ----------------------------------------------------


def reasoning_item(text: str, item_id: str) -> Any:
    from openai.types.responses import ResponseReasoningItem
    from openai.types.responses.response_reasoning_item import Summary

    return ResponseReasoningItem(
        id=item_id, type="reasoning", summary=[Summary(text=text, type="summary_text")]
    )


def step(output: list[Any], tokens_in: int, tokens_out: int) -> Any:
    from agents.testing import ModelStep
    from agents.usage import Usage

    usage = Usage(
        requests=1,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        total_tokens=tokens_in + tokens_out,
    )
    return ModelStep(output=output, usage=usage)


def triage_to_billing(*, failing: bool = False) -> Agent[Any]:
    """A triage agent that checks the weather, then hands off to billing, which answers.

    ``failing``: billing also calls a tool that raises (call ``c3``).
    """
    broken_call = [function_call("broken", {"city": "Lyon"}, call_id="c3")] if failing else []
    billing = Agent(
        name="billing",
        tools=[weather, broken],
        model=ScriptedModel(
            [
                step(
                    [
                        reasoning_item("check Paris", "rs_2"),
                        function_call("weather", {"city": "Paris"}, call_id="c2"),
                        *broken_call,
                    ],
                    50,
                    7,
                ),
                step([assistant_message("Billing says: sunny.")], 60, 5),
            ]
        ),
    )
    return Agent(
        name="triage",
        tools=[weather],
        handoffs=[billing],
        model=ScriptedModel(
            [
                step(
                    [
                        reasoning_item("route", "rs_1"),
                        function_call("weather", {"city": "Oslo"}, call_id="c1"),
                    ],
                    10,
                    3,
                ),
                step([function_call("transfer_to_billing", {}, call_id="h1")], 20, 4),
            ]
        ),
    )


def until(db: str, session_id: str, ready: Callable[[SessionData], bool]) -> SessionData:
    """The stored session once ``ready`` holds (run records closed from another thread)."""
    import gc
    import time

    async def stored() -> SessionData | None:
        # The store's own record: a load would show a run still being closed as
        # "aborted" (a loaded session demotes every "running" run).
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            return await store.load(session_id)

    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        data = trio.run(stored)
        if data is not None and ready(data):
            return data
        assert time.monotonic() < deadline, f"never ready: {data}"
        time.sleep(0.02)


def test_a_runner_call_with_a_handoff_is_recorded_as_a_run_tree(
    make: SessionFactory, db: str
) -> None:
    session = make("tree")
    result = Runner.run_sync(triage_to_billing(), "Weather?", session=session, hooks=session.hooks)
    assert result.final_output == "Billing says: sunny." and result.last_agent.name == "billing"

    data = read_back(db, "tree")
    assert data is not None
    root, child = sorted(data.runs, key=lambda r: r.depth or 0)
    assert root.agent is not None and root.agent.id == "triage"
    assert child.agent is not None and child.agent.id == "billing"
    assert (child.parent_run_id, child.parent_call_id, child.depth) == (root.id, "h1", 1)
    assert root.status == child.status == "completed"
    assert root.prompt == child.prompt == "Weather?"
    assert root.ended_at is not None and child.ended_at is not None
    assert (root.tokens_in, root.tokens_out, root.turns) == (30, 7, 2)
    assert (child.tokens_in, child.tokens_out, child.turns) == (110, 12, 2)
    # Every turn names its run; each assistant turn carries its response's usage.
    by_run = {run.id: run.agent.id for run in data.runs if run.agent is not None}
    owners = [(t.role, by_run[t.run_id or ""]) for t in data.turns]
    assert owners == [
        ("user", "triage"),
        ("assistant", "triage"),
        ("user", "triage"),
        ("assistant", "triage"),  # the handoff call is triage's answer
        ("user", "triage"),
        ("assistant", "billing"),
        ("user", "billing"),
        ("assistant", "billing"),
    ]
    usages = [(t.usage.input, t.usage.output) for t in data.turns if t.usage is not None]
    assert usages == [(10, 3), (20, 4), (50, 7), (60, 5)]
    assert [u.turn_id for u in child.turn_usage or ()] == [
        t.id for t in data.turns if t.role == "assistant" and t.run_id == child.id
    ]
    # The items are what the Runner wrote, exactly (the SDK's own session keeps the same).
    from agents.memory import SQLiteSession

    peer = SQLiteSession("tree")
    Runner.run_sync(triage_to_billing(), "Weather?", session=peer)
    assert json.dumps(run(session.get_items())) == json.dumps(run(peer.get_items()))
    peer.close()


def test_a_caller_price_gives_each_response_and_run_a_cost(make: SessionFactory, db: str) -> None:
    session = make("priced", price=lambda usage: usage.input * 0.001 + usage.output * 0.002)
    Runner.run_sync(triage_to_billing(), "Weather?", session=session, hooks=session.hooks)
    data = read_back(db, "priced")
    assert data is not None
    costs = {run.agent.id: run.cost for run in data.runs if run.agent is not None}
    assert costs == {"triage": pytest.approx(0.044), "billing": pytest.approx(0.134)}
    assert all(t.usage.cost is not None for t in data.turns if t.usage is not None)


def test_a_failing_model_call_closes_its_run_as_an_error(make: SessionFactory, db: str) -> None:
    agent = Agent(name="flaky", model=ScriptedModel([RuntimeError("provider down")]))
    session = make("failing")
    with pytest.raises(RuntimeError, match="provider down"):
        Runner.run_sync(agent, "Hello?", session=session, hooks=session.hooks)
    data = until(db, "failing", lambda d: bool(d.runs) and d.runs[0].status != "running")
    (failed,) = data.runs
    assert failed.status == "error" and failed.agent is not None and failed.agent.id == "flaky"
    assert failed.error is not None and "model call" in failed.error
    assert [t.run_id for t in data.turns] == [failed.id]  # the question is kept, in its run


def test_without_hooks_each_runner_call_is_still_a_run(make: SessionFactory, db: str) -> None:
    model = ScriptedModel([step([assistant_message("Hi.")], 12, 2)])
    session = make("bare")
    Runner.run_sync(Agent(name="plain", model=model), "Hello", session=session)
    data = until(db, "bare", lambda d: bool(d.runs) and d.runs[0].status != "running")
    (recorded,) = data.runs
    assert recorded.agent is None and recorded.prompt == "Hello"
    assert (recorded.status, recorded.tokens_in, recorded.tokens_out) == ("completed", 12, 2)
    assert all(t.run_id == recorded.id for t in data.turns)


def test_a_session_deleted_by_another_writer_is_created_again(
    make: SessionFactory, db: str
) -> None:
    # A session deleted in the store meanwhile is not written to through the handle
    # this worker holds, but created again.
    session = make("gone")
    run(session.add_items([msg("user", "first")]))

    async def delete() -> None:
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            await store.delete("gone")

    trio.run(delete)
    run(session.add_items([msg("user", "second")]))
    assert run(session.get_items()) == [msg("user", "second")]
    data = read_back(db, "gone")
    assert data is not None and len(data.turns) == 1


def test_items_another_process_added_meanwhile_stay_in_store_order(
    make: SessionFactory, db: str
) -> None:
    # This worker holds the session open; another process appends between its calls.
    # Every kind of next call (a user item, a tool output, an assistant item that may
    # merge into the last stored turn) lands after the other's items, and this worker
    # reads them all back in the store's order.
    session = make("shared")
    run(session.add_items([msg("user", "q1")]))
    expected = [msg("user", "q1")]
    others = [
        [msg("assistant", "from the other process")],
        [{"arguments": "{}", "call_id": "o1", "name": "f", "type": "function_call"}],
        [msg("user", "the other asks")],
    ]
    mine = [
        [msg("user", "q2")],
        [{"call_id": "o1", "output": "done", "type": "function_call_output"}],
        [msg("assistant", "mine")],
    ]
    for theirs, ours in zip(others, mine, strict=True):
        code = (
            "import asyncio, json, sys\n"
            "from zidane_actors.integrations.openai_agents import ZidaneSession\n"
            "async def main():\n"
            "    async with ZidaneSession('shared', store=sys.argv[1]) as s:\n"
            "        await s.add_items(json.loads(sys.argv[2]))\n"
            "asyncio.run(main())\n"
        )
        subprocess.run([sys.executable, "-c", code, db, json.dumps(theirs)], check=True)
        run(session.add_items(ours))
        expected += theirs + ours
    assert json.dumps(run(session.get_items())) == json.dumps(expected)
    _shared.close_all()
    assert json.dumps(run(make("shared").get_items())) == json.dumps(expected)


def test_items_added_outside_a_runner_have_no_run(make: SessionFactory, db: str) -> None:
    session = make("manual")
    run(session.add_items([msg("user", "hi")]))
    data = read_back(db, "manual")
    assert data is not None and data.runs == () and data.turns[0].run_id is None


def test_get_items_with_a_limit_reads_only_the_newest_turns(make: SessionFactory) -> None:
    items: list[Any] = []
    for i in range(30):
        items += [
            {"content": f"q{i}", "role": "user"},
            {"arguments": "{}", "call_id": f"c{i}", "name": "f", "type": "function_call"},
            {"call_id": f"c{i}", "output": f"{i}", "type": "function_call_output"},
        ]
    writer = make("long")
    run(writer.add_items(items))
    writer.close()
    _shared.close_all()
    reader = make("long")  # a new portal: the session is not open in this process
    assert json.dumps(run(reader.get_items(4))) == json.dumps(items[-4:])
    assert json.dumps(run(reader.get_items(0))) == "[]"
    assert reader._shared is not None
    assert reader._shared.portal.host.statistics().started == 0  # never loaded whole
    assert json.dumps(run(reader.get_items())) == json.dumps(items)
    assert json.dumps(run(reader.get_items(7))) == json.dumps(items[-7:])


def test_a_streamed_run_is_recorded_like_the_others(make: SessionFactory, db: str) -> None:
    session = make("streamed")

    async def main() -> str:
        streamed = Runner.run_streamed(
            triage_to_billing(), "Weather?", session=session, hooks=session.hooks
        )
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    assert run(main()) == "Billing says: sunny."
    data = read_back(db, "streamed")
    assert data is not None
    agents = sorted((r.agent.id, r.status) for r in data.runs if r.agent is not None)
    assert agents == [("billing", "completed"), ("triage", "completed")]
    assert sum(r.tokens_in or 0 for r in data.runs) == 140


def test_repeated_get_items_answer_fresh_copies_that_follow_every_change(
    make: SessionFactory, db: str
) -> None:
    """An open session answers a repeated get_items from the JSON of the items it last
    converted: every answer is a fresh copy (changing one changes no later answer), a
    turn another writer changed is converted again, and only answered turns are kept."""
    items: list[Any] = [
        msg("user", "q1"),
        {"arguments": '{"a": [1, 2.5]}', "call_id": "c1", "name": "f", "type": "function_call"},
        {"call_id": "c1", "output": "1", "type": "function_call_output"},
        msg("user", "q2"),
    ]
    session = make()
    run(session.add_items(items))
    for _ in range(3):
        answer = run(session.get_items())
        assert json.dumps(answer) == json.dumps(items)
        answer[0]["content"] = "changed"
        answer[1]["arguments"] = "{}"
        answer.append(msg("user", "extra"))

    async def edit_elsewhere() -> None:  # another connection rewrites the first turn
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:

            def first_text(history: SessionHistory) -> SessionHistory:
                (block,) = history.turns[0].content
                block = msgspec.structs.replace(block, text="q0")
                first = msgspec.structs.replace(history.turns[0], content=(block,))
                return msgspec.structs.replace(history, turns=(first, *history.turns[1:]))

            assert await store.mutate_history("conv", first_text) == "ok"

    trio.run(edit_elsewhere)
    assert json.dumps(run(session.get_items())) == json.dumps([msg("user", "q0"), *items[1:]])
    assert run(session.pop_item()) == items[-1]
    assert json.dumps(run(session.get_items(1))) == json.dumps([items[-2]])
    assert len(session._items_json) == 1  # the turns of the last answer only
    assert json.dumps(run(session.get_items())) == json.dumps([msg("user", "q0"), *items[1:-1]])


def failing_tools() -> Agent[Any]:
    """One response calls a tool that works, one that raises and one that does not exist."""
    return Agent(
        name="forecaster",
        tools=[weather, broken],
        model=ScriptedModel(
            [
                step(
                    [
                        function_call("weather", {"city": "Oslo"}, call_id="ok1"),
                        function_call("broken", {"city": "Rome"}, call_id="bad1"),
                        function_call("no_such_tool", {}, call_id="bad2"),
                    ],
                    10,
                    3,
                ),
                step([assistant_message("Oslo is sunny; Rome is unknown.")], 20, 4),
            ]
        ),
    )


def error_marks(data: SessionData) -> dict[str, bool | None]:
    return {
        block.call_id: block.is_error
        for turn in data.turns
        for block in turn.content
        if isinstance(block, ToolResultBlock)
    }


def marking(formatter: Callable[..., Any]) -> Any:
    """A ``RunConfig`` that reports tool failures to ``formatter`` (an unknown tool included)."""
    from agents import RunConfig

    return RunConfig(
        tool_error_formatter=formatter, tool_not_found_behavior="return_error_to_model"
    )


def test_failed_tool_results_are_marked_and_their_items_stay_exact(
    make: SessionFactory, db: str
) -> None:
    from agents import RunConfig
    from agents.memory import SQLiteSession

    session = make("marks")
    result = Runner.run_sync(
        failing_tools(),
        "Weather?",
        session=session,
        hooks=session.hooks,
        run_config=marking(session.tool_error_formatter),
    )
    assert result.final_output == "Oslo is sunny; Rome is unknown."
    data = read_back(db, "marks")
    assert data is not None
    assert error_marks(data) == {"ok1": None, "bad1": True, "bad2": True}
    # The model saw the SDK's own messages, and the items are the SDK session's, exactly.
    peer = SQLiteSession("marks")
    plain = RunConfig(tool_not_found_behavior="return_error_to_model")
    Runner.run_sync(failing_tools(), "Weather?", session=peer, run_config=plain)
    assert json.dumps(run(session.get_items())) == json.dumps(run(peer.get_items()))
    peer.close()
    # Taking the last item off the results' turn keeps the marks of the others.
    run(session.pop_item())
    run(session.pop_item())
    data = read_back(db, "marks")
    assert data is not None and error_marks(data) == {"ok1": None, "bad1": True}


def test_a_formatter_of_your_own_can_record_the_failure_and_answer_its_text(
    make: SessionFactory, db: str
) -> None:
    from agents import ToolErrorFormatterArgs

    session = make("own")

    def formatter(args: ToolErrorFormatterArgs[Any]) -> str:
        session.tool_error_formatter(args)
        return f"{args.tool_name} failed, try later"

    Runner.run_sync(failing_tools(), "Weather?", session=session, run_config=marking(formatter))
    data = read_back(db, "own")
    assert data is not None and error_marks(data) == {"ok1": None, "bad1": True, "bad2": True}
    outputs = {i.get("call_id"): i.get("output") for i in run(session.get_items())}
    assert outputs["bad1"] == "broken failed, try later"


@function_tool(timeout=0.01)
async def slow(city: str) -> str:
    """A tool that never answers in time."""
    await asyncio.sleep(30)
    return f"late for {city}"


def test_with_the_hooks_alone_a_raised_or_timed_out_tool_is_marked(
    make: SessionFactory, db: str
) -> None:
    model = ScriptedModel(
        [
            step(
                [
                    function_call("weather", {"city": "Oslo"}, call_id="ok1"),
                    function_call("broken", {"city": "Rome"}, call_id="bad1"),
                    function_call("slow", {"city": "Lima"}, call_id="late1"),
                ],
                10,
                3,
            ),
            step([assistant_message("Done.")], 20, 4),
        ]
    )
    agent = Agent(name="forecaster", tools=[weather, broken, slow], model=model)
    session = make("hooked")
    Runner.run_sync(agent, "Weather?", session=session, hooks=session.hooks)
    data = read_back(db, "hooked")
    assert data is not None
    assert error_marks(data) == {"ok1": None, "bad1": True, "late1": True}


def test_a_marked_result_in_a_turn_that_keeps_its_items_whole_reads_back_exactly(
    make: SessionFactory, db: str
) -> None:
    long_id = "call_" + "x" * 60  # over the converters' 40: the turn keeps its items whole
    model = ScriptedModel(
        [
            step([function_call("broken", {"city": "Rome"}, call_id=long_id)], 10, 3),
            step([assistant_message("Unknown.")], 20, 4),
        ]
    )
    session = make("whole")
    agent = Agent(name="forecaster", tools=[broken], model=model)
    Runner.run_sync(agent, "Weather?", session=session, hooks=session.hooks)
    data = read_back(db, "whole")
    assert data is not None and error_marks(data) == {long_id: True}
    assert any("openaiItems" in (t.metadata or {}) for t in data.turns)
    from agents.memory import SQLiteSession

    peer = SQLiteSession("whole")
    again = ScriptedModel(
        [
            step([function_call("broken", {"city": "Rome"}, call_id=long_id)], 10, 3),
            step([assistant_message("Unknown.")], 20, 4),
        ]
    )
    Runner.run_sync(Agent(name="forecaster", tools=[broken], model=again), "Weather?", session=peer)
    assert json.dumps(run(session.get_items())) == json.dumps(run(peer.get_items()))
    peer.close()


@function_tool(needs_approval=True)
def delete_all(path: str) -> str:
    """Deletes everything under a path."""
    return f"deleted {path}"


def test_a_rejected_approval_is_marked_when_the_run_resumes(make: SessionFactory, db: str) -> None:
    from agents import RunConfig

    model = ScriptedModel(
        [
            [function_call("delete_all", {"path": "/"}, call_id="d1")],
            [assistant_message("Nothing was deleted.")],
        ]
    )
    agent = Agent(name="ops", tools=[delete_all], model=model)
    session = make("approval")
    config = RunConfig(tool_error_formatter=session.tool_error_formatter)

    async def main() -> Any:
        first = await Runner.run(
            agent, "Clean up", session=session, hooks=session.hooks, run_config=config
        )
        state = first.to_state()
        for interruption in first.interruptions:
            state.reject(interruption)
        return await Runner.run(
            agent, state, session=session, hooks=session.hooks, run_config=config
        )

    assert run(main()).final_output == "Nothing was deleted."
    data = read_back(db, "approval")
    assert data is not None and error_marks(data) == {"d1": True}


def test_hooks_passed_to_a_run_of_another_session_leave_this_one_untouched(
    make: SessionFactory, db: str
) -> None:
    # The hooks and the formatter see every event of the run they are passed to; only
    # the session that stores its items records it. This one is never even created.
    mine, other = make("mine"), make("other")
    config = marking(mine.tool_error_formatter)
    result = Runner.run_sync(
        failing_tools(), "Weather?", session=other, hooks=mine.hooks, run_config=config
    )
    assert result.final_output == "Oslo is sunny; Rome is unknown."
    del result
    # The run is closed once its context is collected: by then this one's end was seen too.
    data = until(db, "other", lambda d: bool(d.runs) and d.runs[0].status != "running")
    assert error_marks(data) == {"ok1": None, "bad1": None, "bad2": None}  # not its hooks
    assert run(mine.get_items()) == []
    assert read_back(db, "mine") is None


def test_nul_and_lone_surrogates_read_back_exactly_as_sqlite_session(make: SessionFactory) -> None:
    # Python strings and JSON escapes keep them; openai-agents' own session keeps them too.
    from agents.memory import SQLiteSession

    odd = "a\x00b\ud800c\udfff"
    items: list[Any] = [
        {"role": "user", "content": odd},
        {"role": "user", "content": [{"type": "input_text", "text": odd}], "note\ud800": odd},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "f",
            "arguments": json.dumps({"q": odd}),
        },
        {"type": "function_call_output", "call_id": "c1", "output": odd},
    ]
    session, peer = make("odd"), SQLiteSession("odd")
    run(session.add_items(items))
    run(peer.add_items(items))
    assert run(session.get_items()) == items == run(peer.get_items())
    assert run(session.get_items(2)) == items[2:]
    peer.close()


_IDS = st.text("abc_-1", min_size=1, max_size=4)


def _items() -> Any:
    """Responses input items as the SDK writes them, with values of every JSON kind."""
    part = st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text"]), "text": any_text},
        optional={"annotations": st.just([]), "x-extra": any_json},
    )
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer"]),
            "content": any_text | st.lists(part, min_size=1, max_size=2),
        },
        optional={"type": st.just("message"), "id": _IDS, "status": st.just("completed")},
    )
    call = st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": _IDS,
            "name": _IDS,
            "arguments": any_text | any_json.map(json.dumps),
        },
        optional={"id": _IDS, "status": st.just("completed"), "x-extra": any_json},
    )
    output = st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _IDS, "output": any_text},
        optional={"id": _IDS},
    )
    native = st.fixed_dictionaries(
        {"type": st.sampled_from(["web_search_call", "item_reference", "x_future"]), "id": _IDS},
        optional={"data": any_json},
    )
    summary = st.fixed_dictionaries({"type": st.just("summary_text"), "text": any_text})
    reasoning = st.fixed_dictionaries(
        {"type": st.just("reasoning"), "id": _IDS, "summary": st.lists(summary, max_size=2)},
        optional={"encrypted_content": any_text, "status": st.just("completed")},
    )
    other_part = st.fixed_dictionaries(
        {"type": st.just("input_image"), "detail": st.sampled_from(["auto", "low"])},
        optional={"image_url": st.just("https://e.x/a.png"), "file_id": _IDS},
    ) | st.fixed_dictionaries({"type": st.just("refusal"), "refusal": any_text})
    rich = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant"]),
            "content": st.lists(other_part, min_size=1, max_size=2),
        },
        optional={"type": st.just("message")},
    )
    return st.lists(message | call | output | native | reasoning | rich, min_size=1, max_size=4)


def _frozen_inside(value: Any) -> bool:
    from zidane_actors.model._frozen import FrozenDict, FrozenList

    if isinstance(value, FrozenDict | FrozenList):
        return True
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    return any(_frozen_inside(child) for child in children)


@settings(max_examples=60)
@given(batches=st.lists(_items(), min_size=1, max_size=3))
@example(
    batches=[
        [
            {"role": "user", "content": "a\ud800\x00"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"q": "\\ud800"}'},
            {"type": "function_call_output", "call_id": "c", "output": "\udfff", "x": 1},
            {"type": "x_future", "id": "n", "data": {"k\udfff": [1.5, None]}},
        ]
    ]
)
@example(
    batches=[[{"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "0"}]}]]
)
@example(batches=[[{"type": "reasoning", "id": "r", "summary": []}]])
@example(
    batches=[
        [
            {"role": "user", "content": "0"},
            {"role": "user", "content": [{"type": "refusal", "refusal": ""}], "type": "message"},
        ]
    ]
)
def test_any_items_read_back_as_added_or_are_refused(batches: list[list[Any]]) -> None:
    # Each add_items call stores its items whole or nothing; get_items answers exactly what
    # was kept (every call, and the newest ones alone), as fresh changeable copies.
    from zidane_actors.model import new_id

    async def main() -> None:
        async with ZidaneSession(new_id(), store="memory:") as session:
            kept: list[Any] = []
            for items in batches:
                try:
                    await session.add_items(items)
                except ValidationError as exc:
                    assert exc.path is not None and exc.path.startswith("$")
                    continue
                kept += items
            for _ in range(2):  # the second answer comes from the session's memo
                got = await session.get_items()
                assert json.dumps(got) == json.dumps(kept)
                assert not _frozen_inside(got)
            for n in (1, 2):
                assert json.dumps(await session.get_items(n)) == json.dumps(kept[-n:])

    run(main())
