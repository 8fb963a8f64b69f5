"""pydantic-ai runs stored as they ended through ``run_agent`` (issue 37).

Driven by pydantic-ai's FunctionModel and TestModel (no network, no mocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from zidane_actors.integrations._shared import TRACE_CONTEXT_KEY
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
    assert run.extra_fields == {
        TRACE_CONTEXT_KEY: {
            "traceId": f"{context.trace_id:032x}",
            "spanId": f"{context.span_id:016x}",
        }
    }
