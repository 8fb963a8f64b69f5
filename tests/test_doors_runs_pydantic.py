"""pydantic-ai runs stored as they ended through ``run_agent`` (issue 37).

First-call failure, tool failure, streamed run, and delegation (pydantic-ai's
handoff: an agent a tool runs with the caller's ``usage``). Driven by
pydantic-ai's FunctionModel and TestModel (no network, no mocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from zidane_actors.integrations._shared import TRACE_CONTEXT_KEY
from zidane_actors.integrations.otel import ZidaneSpanProcessor
from zidane_actors.integrations.pydantic_ai import run_agent, run_agent_sync
from zidane_actors.model import SessionRun
from zidane_actors.portal import open_host_async, start_host


def down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise RuntimeError("provider down: 429")


def call_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(
            parts=[ToolCallPart("forecast", {"city": "Oslo"}, tool_call_id="c1")],
            usage=RequestUsage(input_tokens=30, output_tokens=4),
        )
    return ModelResponse(parts=[TextPart("unused")])


def weather_agent() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(call_then_answer), name="weather")

    @agent.tool_plain
    def forecast(city: str) -> str:
        """The forecast of a city (its backend is down)."""
        raise ConnectionError(f"no forecast for {city}")

    return agent


def only(runs: tuple[SessionRun, ...] | list[SessionRun]) -> SessionRun:
    (run,) = runs
    return run


def test_a_first_model_call_that_raises_is_stored_as_an_error(tmp_path: Path) -> None:
    with start_host(f"sqlite:{tmp_path / 'p.db'}") as host:
        session = host.create_session(id="a")
        with pytest.raises(RuntimeError):
            run_agent_sync(session, Agent(FunctionModel(down), name="flaky"), "Hello?")
        run = only(session.runs)
        assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
        assert run.agent is not None and run.agent.id == "flaky" and run.prompt == "Hello?"
        assert session.agent_id == "flaky"
        assert [t.role for t in session.turns] == ["user"]
    with start_host(f"sqlite:{tmp_path / 'p.db'}") as host:
        stored = host.load_session("a")
        assert stored is not None and stored.agent_id == "flaky"
        assert only(stored.runs).status == "error"


def test_a_tool_that_raises_is_stored_with_its_text_and_tokens() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            session = await host.create_session(id="b")
            with pytest.raises(ConnectionError):
                await run_agent(session, weather_agent(), "Weather?")
            run = only(session.runs)
            assert run.status == "error" and run.error == "ConnectionError: no forecast for Oslo"
            assert (run.tokens_in, run.tokens_out) == (30, 4)
            assert run.agent is not None and run.agent.id == "weather"
            assert session.agent_id == "weather"

    asyncio.run(main())


def test_a_streamed_run_is_completed_with_its_tokens() -> None:
    seen: list[Any] = []

    async def handler(_: Any, events: AsyncIterable[Any]) -> None:
        async for event in events:
            seen.append(event)

    async def main() -> None:
        async with open_host_async("memory:") as host:
            session = await host.create_session(id="c")
            agent: Agent[None, str] = Agent(TestModel(custom_output_text="Hi."), name="streamer")
            result = await run_agent(session, agent, "Stream me", event_stream_handler=handler)
            assert result.output == "Hi."
            run = only(session.runs)
            assert run.status == "completed" and run.prompt == "Stream me"
            assert run.tokens_in and run.tokens_out and run.tokens_out > 0
            assert run.agent is not None and run.agent.id == "streamer"

    asyncio.run(main())
    assert seen  # the model's answer was streamed


def test_a_session_with_an_agent_id_keeps_it() -> None:
    with start_host("memory:") as host:
        session = host.create_session(id="d", agent_id="mine")
        run_agent_sync(session, Agent(TestModel(), name="other"), "Hello")
        assert session.agent_id == "mine"
        assert only(session.runs).agent is not None


def test_a_run_stored_in_an_opentelemetry_span_keeps_its_trace_context() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with start_host("memory:") as host, tracer.start_as_current_span("request") as span:
        session = host.create_session(id="e")
        run_agent_sync(session, Agent(TestModel(), name="plain"), "Hello")
        run = only(session.runs)
    context = span.get_span_context()
    assert run.extra_fields is not None
    assert run.extra_fields[TRACE_CONTEXT_KEY] == {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
    }


# -- delegation -----------------------------------------------------------------------


def delegation(expert_model: FunctionModel) -> tuple[Agent[None, str], Agent[None, str]]:
    """``router`` asks ``expert`` through a tool, passing its usage (pydantic-ai's delegation)."""
    expert: Agent[None, str] = Agent(expert_model, name="expert")

    def route(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            call = ToolCallPart("ask_expert", {"question": "Umbrella?"}, tool_call_id="d1")
            return ModelResponse(parts=[call], usage=RequestUsage(input_tokens=30, output_tokens=4))
        text = TextPart("The expert says: take an umbrella.")
        return ModelResponse(parts=[text], usage=RequestUsage(input_tokens=40, output_tokens=8))

    router: Agent[None, str] = Agent(FunctionModel(route), name="router")

    @router.tool
    async def ask_expert(ctx: RunContext[None], question: str) -> str:
        """Ask the expert."""
        return (await expert.run(question, usage=ctx.usage)).output

    return router, expert


def advises(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    text = TextPart("Take an umbrella.")
    return ModelResponse(parts=[text], usage=RequestUsage(input_tokens=50, output_tokens=5))


def test_a_delegating_run_is_stored_with_its_own_calls() -> None:
    router, _ = delegation(FunctionModel(advises))
    with start_host("memory:") as host:
        session = host.create_session(id="f")
        result = run_agent_sync(session, router, "Umbrella?")
        run = only(session.runs)
        assert run.status == "completed" and run.error is None
        assert run.agent is not None and run.agent.id == "router"
        # The record holds the router's own model calls; the usage it passed on also
        # counted the expert's (seen as the expert's own run through OpenTelemetry, below).
        assert (run.tokens_in, run.tokens_out) == (70, 12)
        assert (result.usage.input_tokens, result.usage.output_tokens) == (120, 17)
        assert session.agent_id == "router"
        assert [t.role for t in session.turns] == ["user", "assistant", "user", "assistant"]


def test_a_delegate_that_fails_fails_its_caller_with_its_text() -> None:
    router, _ = delegation(FunctionModel(down))
    with start_host("memory:") as host:
        session = host.create_session(id="g")
        with pytest.raises(RuntimeError):
            run_agent_sync(session, router, "Umbrella?")
        run = only(session.runs)
        assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
        assert run.agent is not None and run.agent.id == "router"
        assert (run.tokens_in, run.tokens_out) == (30, 4)
        assert session.agent_id == "router"


def test_a_delegate_is_a_child_run_through_opentelemetry() -> None:
    """No adapter code: the processor sees the expert's run inside the router's."""
    from opentelemetry.sdk.trace import TracerProvider
    from pydantic_ai.models.instrumented import InstrumentationSettings

    router, expert = delegation(FunctionModel(advises))
    with start_host("memory:") as host:
        processor = ZidaneSpanProcessor(host=host)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        for agent in (router, expert):
            agent.instrument = InstrumentationSettings(tracer_provider=provider)
        router.run_sync("Umbrella?", conversation_id="chat-d")
        assert processor.force_flush()
        session = host.load_session("chat-d")
        assert session is not None
        parent, child = sorted(session.runs, key=lambda r: r.depth or 0)
        assert parent.agent is not None and parent.agent.id == "router"
        assert child.agent is not None and child.agent.id == "expert"
        assert child.parent_run_id == parent.id and child.depth == 1
        assert parent.status == child.status == "completed"
        assert (parent.tokens_in, parent.tokens_out, child.tokens_in, child.tokens_out) == (
            70,
            12,
            50,
            5,
        )
        assert session.agent_id == "router"
        listed = host.call(lambda: host.trio_host.store.list())
        assert listed == ["chat-d"]  # no session of the expert's own
        processor.shutdown()


def test_the_timeline_of_a_stored_run_is_pydantic_ais_own_message_times() -> None:
    """No callTimes: the turns keep pydantic-ai's timestamps, which time each call."""
    from pydantic_ai.messages import ModelRequest

    from zidane_actors.server._ui_runs import run_spans

    agent: Agent[None, str] = Agent(TestModel(), name="adder")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    with start_host("memory:") as host:
        session = host.create_session(id="h")
        result = run_agent_sync(session, agent, "add 1 and 2")
        run = only(session.runs)
        spans = run_spans(run, session.turns)
    ms = [int(m.timestamp.timestamp() * 1000) for m in result.new_messages()]
    kinds = [type(m) for m in result.new_messages()]
    assert kinds == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    assert [(s.kind, s.start, s.end) for s in spans] == [
        ("model", ms[0], ms[1]),  # the request made, its response
        ("tool", ms[1], ms[2]),  # the call asked for, the return sent back
        ("model", ms[2], ms[3]),
    ]
