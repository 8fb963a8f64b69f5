"""The openai-agents door records how each Runner call really ended (issue 37).

A failed call is never left ``running`` (nor shown ``completed`` without
hooks), a tool's exception text is kept, and a streamed run keeps its prompt.
Driven by the SDK's own ``ScriptedModel`` (no network, no mocks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agents import (
    Agent,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage

from zidane_actors.integrations import _agents_runs as _runs
from zidane_actors.integrations._shared import CALL_TIMES_KEY, TRACE_CONTEXT_KEY
from zidane_actors.integrations.openai_agents import TOOL_ERRORS_KEY, ZidaneSession
from zidane_actors.model import SessionData, SessionRun, ToolResultBlock
from zidane_actors.stores import open_sqlite_store

set_tracing_disabled(True)  # nothing leaves the machine


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'agents.db'}"


def read_back(db: str, session_id: str) -> SessionData:
    """The session as stored (no load-time demotion of a run left ``running``)."""

    async def main() -> SessionData:
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            loaded = await store.load(session_id)
            assert loaded is not None
            return loaded

    return trio.run(main)


def only_run(db: str, session_id: str) -> SessionRun:
    (run,) = read_back(db, session_id).runs
    return run


def failing(name: str = "flaky") -> Agent[Any]:
    return Agent(name=name, model=ScriptedModel([RuntimeError("provider down: 429")]))


def test_a_first_model_call_that_raises_inside_with_is_failed_with_its_error(db: str) -> None:
    async def main() -> None:
        async with ZidaneSession("a", store=db) as session:
            await Runner.run(failing(), "Hello?", session=session, hooks=session.hooks)

    with pytest.raises(RuntimeError, match="provider down"):
        asyncio.run(main())
    run = only_run(db, "a")
    assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
    assert run.agent is not None and run.agent.id == "flaky"
    assert run.ended_at is not None and run.prompt == "Hello?"


def test_a_blocking_with_block_too(db: str) -> None:
    with pytest.raises(RuntimeError), ZidaneSession("b", store=db) as session:
        Runner.run_sync(failing(), "Hello?", session=session, hooks=session.hooks)
    run = only_run(db, "b")
    assert run.status == "error" and run.error == "RuntimeError: provider down: 429"


def test_closing_while_the_failed_call_is_still_referenced_closes_its_run(db: str) -> None:
    """The exception (and so the call's context) outlives the session: close settles it."""
    kept: list[BaseException] = []
    session = ZidaneSession("c", store=db)
    try:
        Runner.run_sync(failing(), "Hello?", session=session, hooks=session.hooks)
    except RuntimeError as exc:
        kept.append(exc)
    session.close()
    run = only_run(db, "c")
    assert run.status == "error" and run.error is not None and "model call" in run.error
    assert kept


def test_without_hooks_a_failure_is_never_completed(db: str) -> None:
    session = ZidaneSession("d", store=db)
    with pytest.raises(RuntimeError):
        Runner.run_sync(failing(), "Hello?", session=session)
    session.close()
    run = only_run(db, "d")
    assert run.status == "aborted"
    assert run.error is not None and "outcome is unknown" in run.error


def test_without_hooks_an_answered_call_is_completed(db: str) -> None:
    session = ZidaneSession("e", store=db)
    model = ScriptedModel([[assistant_message("Hi.")]])
    result = Runner.run_sync(Agent(name="plain", model=model), "Hello", session=session)
    session.close()  # the result (and its context) still held: close settles the call
    assert result.final_output == "Hi."
    run = only_run(db, "e")
    assert run.status == "completed" and run.error is None


@function_tool
def broken(city: str) -> str:
    """A tool whose backend is down."""
    raise ConnectionError(f"no forecast for {city}")


def test_a_tool_exception_text_is_kept_with_its_result(db: str) -> None:
    model = ScriptedModel(
        [[function_call("broken", {"city": "Paris"}, call_id="c1")], [assistant_message("Sorry.")]]
    )
    agent = Agent(name="weather", model=model, tools=[broken])
    with ZidaneSession("f", store=db) as session:
        config = RunConfig(tool_error_formatter=session.tool_error_formatter)
        Runner.run_sync(agent, "Weather?", session=session, hooks=session.hooks, run_config=config)
    data = read_back(db, "f")
    (holder,) = [t for t in data.turns if any(isinstance(b, ToolResultBlock) for b in t.content)]
    (result,) = [b for b in holder.content if isinstance(b, ToolResultBlock)]
    assert result.is_error
    assert result.output == "An error occurred while running the tool. Please try again."
    assert holder.metadata == {TOOL_ERRORS_KEY: {"c1": "ConnectionError: no forecast for Paris"}}
    (run,) = data.runs
    assert run.status == "completed"  # the model answered after the failed tool


def test_a_streamed_run_keeps_its_prompt(db: str) -> None:
    async def main() -> None:
        async with ZidaneSession("g", store=db) as session:
            model = ScriptedModel([[assistant_message("Hi.")]])
            streamed = Runner.run_streamed(
                Agent(name="streamer", model=model),
                "Stream me",
                session=session,
                hooks=session.hooks,
            )
            async for _ in streamed.stream_events():
                pass

    asyncio.run(main())
    data = read_back(db, "g")
    (run,) = data.runs
    assert run.prompt == "Stream me" and run.status == "completed"
    assert run.agent is not None and run.agent.id == "streamer" and data.agent_id == "streamer"


# -- the session's own Runner calls, agentId, handoffs, trace context -------------------


def test_a_failure_caught_by_the_caller_keeps_its_text_through_session_run(db: str) -> None:
    """No exception leaves a with block: session.run saw the Runner's own exception."""

    async def main() -> None:
        session = ZidaneSession("h", store=db)
        with pytest.raises(RuntimeError):
            await session.run(failing(), "Hello?")
        data = read_back(db, "h")  # recorded before the exception reached the caller
        (run,) = data.runs
        assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
        assert run.agent is not None and run.agent.id == "flaky"
        assert data.agent_id == "flaky"
        await session.aclose()

    asyncio.run(main())


@function_tool(failure_error_function=None)
def fatal(city: str) -> str:
    """A tool whose failure ends the run."""
    raise ConnectionError(f"no forecast for {city}")


def test_a_tool_failure_that_ends_the_call_through_run_sync(db: str) -> None:
    model = ScriptedModel(
        [
            ModelStep(
                [function_call("fatal", {"city": "Oslo"}, call_id="c1")],
                usage=Usage(requests=1, input_tokens=30, output_tokens=4, total_tokens=34),
            )
        ]
    )
    session = ZidaneSession("i", store=db)
    with pytest.raises(Exception) as raised:
        session.run_sync(Agent(name="weather", model=model, tools=[fatal]), "Weather?")
    data = read_back(db, "i")
    session.close()
    (run,) = data.runs
    assert run.status == "error" and run.error is not None
    assert run.error == f"{type(raised.value).__name__}: {raised.value}"
    assert "no forecast for Oslo" in run.error
    assert (run.tokens_in, run.tokens_out) == (30, 4)
    assert data.agent_id == "weather"


def test_a_streamed_failure_keeps_its_text(db: str) -> None:
    async def main() -> None:
        async with ZidaneSession("j", store=db) as session:
            streamed = session.run_streamed(failing("streamer"), "Stream me")
            with pytest.raises(RuntimeError):
                async for _ in streamed.stream_events():
                    pass
            # The caller handled it: nothing leaves the with block.

    asyncio.run(main())
    run = only_run(db, "j")
    assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
    assert run.prompt == "Stream me" and run.agent is not None and run.agent.id == "streamer"


def test_a_handoff_is_a_child_run_of_the_agent_it_went_to(db: str) -> None:
    step = Usage(requests=1, input_tokens=50, output_tokens=5, total_tokens=55)
    expert = Agent(
        name="expert",
        model=ScriptedModel([ModelStep([assistant_message("Take an umbrella.")], usage=step)]),
    )
    triage = Agent(
        name="triage",
        model=ScriptedModel(
            [ModelStep([function_call("transfer_to_expert", {}, call_id="h1")], usage=step)]
        ),
        handoffs=[expert],
    )
    with ZidaneSession("k", store=db) as session:
        result = session.run_sync(triage, "Umbrella?")
    assert result.final_output == "Take an umbrella."
    data = read_back(db, "k")
    parent, child = data.runs
    assert parent.agent is not None and parent.agent.id == "triage"
    assert child.agent is not None and child.agent.id == "expert"
    assert child.parent_run_id == parent.id and child.parent_call_id == "h1"
    assert child.depth == 1 and parent.status == child.status == "completed"
    assert (parent.tokens_in, child.tokens_in) == (50, 50)
    assert data.agent_id == "triage"
    # Each turn names its agent through its run.
    answer = data.turns[-1]
    assert answer.role == "assistant" and answer.run_id == child.id


def test_a_session_with_an_agent_id_keeps_it(db: str) -> None:
    async def main() -> None:
        async with open_sqlite_store(db.removeprefix("sqlite:")) as store:
            host_data = SessionData(id="l", created_at=1, updated_at=1, agent_id="mine")
            await store.save(host_data)

    trio.run(main)
    model = ScriptedModel([[assistant_message("Hi.")]])
    with ZidaneSession("l", store=db) as session:
        session.run_sync(Agent(name="plain", model=model), "Hello")
    assert read_back(db, "l").agent_id == "mine"


def test_a_run_begun_in_an_opentelemetry_span_keeps_its_trace_context(db: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    model = ScriptedModel([[assistant_message("Hi.")]])
    with ZidaneSession("m", store=db) as session, tracer.start_as_current_span("request") as span:
        session.run_sync(Agent(name="plain", model=model), "Hello")
    context = span.get_span_context()
    run = only_run(db, "m")
    assert run.extra_fields is not None
    assert run.extra_fields[TRACE_CONTEXT_KEY] == {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
    }


# -- a plain Runner call, seen through the SDK's tracing (on, nothing exported) -----------


@pytest.fixture
def tracing() -> Iterator[None]:
    """The SDK's tracing on, with the session's processor as its only one."""
    set_trace_processors([_runs.failures()])
    set_tracing_disabled(False)
    try:
        yield
    finally:
        set_tracing_disabled(True)


def stored_when(db: str, session_id: str, done: Callable[[SessionData], bool]) -> SessionData:
    """The session once an asynchronous write made ``done`` true (bounded wait)."""
    deadline = time.monotonic() + 10
    while True:
        data = read_back(db, session_id)
        if done(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.01)


def ended(data: SessionData) -> bool:
    return bool(data.runs) and all(r.status != "running" for r in data.runs)


def ended_and_named(data: SessionData) -> bool:
    """The runs ended and the session named after their agent (a header write of its own,
    right after the runs')."""
    return ended(data) and data.agent_id is not None


def test_a_plain_runner_failure_is_recorded_when_it_happens(db: str, tracing: None) -> None:
    """No hooks, no with block, no session.run: the run ends as the Runner raises."""
    session = ZidaneSession("n", store=db)
    try:
        with pytest.raises(RuntimeError):
            Runner.run_sync(failing(), "Hello?", session=session)
        data = stored_when(db, "n", ended_and_named)  # the session is still open
        (run,) = data.runs
        assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
        assert run.agent is not None and run.agent.id == "flaky"
        assert run.prompt == "Hello?" and run.ended_at is not None
        assert data.agent_id == "flaky"
    finally:
        session.close()
    assert only_run(db, "n").error == "RuntimeError: provider down: 429"  # close kept it


def test_a_plain_runner_success_without_hooks_is_completed_at_once(db: str, tracing: None) -> None:
    session = ZidaneSession("o", store=db)
    try:
        model = ScriptedModel([[assistant_message("Hi.")]])
        Runner.run_sync(Agent(name="plain", model=model), "Hello", session=session)
        run = stored_when(db, "o", ended).runs[0]
        assert run.status == "completed" and run.error is None
        assert run.agent is not None and run.agent.id == "plain"
    finally:
        session.close()


def test_a_plain_tool_failure_ending_the_call_keeps_its_text(db: str, tracing: None) -> None:
    model = ScriptedModel([[function_call("fatal", {"city": "Oslo"}, call_id="c1")]])
    session = ZidaneSession("p", store=db)
    try:
        with pytest.raises(Exception) as raised:
            Runner.run_sync(
                Agent(name="weather", model=model, tools=[fatal]), "Weather?", session=session
            )
        (run,) = stored_when(db, "p", ended).runs
        assert run.status == "error"
        assert run.error == f"{type(raised.value).__name__}: {raised.value}"
        assert "no forecast for Oslo" in run.error
    finally:
        session.close()


def test_the_hooks_time_each_model_and_tool_call(db: str) -> None:
    model = ScriptedModel(
        [[function_call("broken", {"city": "Paris"}, call_id="c1")], [assistant_message("Sorry.")]]
    )
    with ZidaneSession("q", store=db) as session:
        session.run_sync(Agent(name="weather", model=model, tools=[broken]), "Weather?")
    run = only_run(db, "q")
    assert run.extra_fields is not None
    calls = run.extra_fields[CALL_TIMES_KEY]
    assert [(c["kind"], c["name"], c.get("callId"), c.get("failed")) for c in calls] == [
        ("model", "weather", None, None),
        ("tool", "broken", "c1", True),
        ("model", "weather", None, None),
    ]
    assert all(c["durationMs"] >= 0 for c in calls)
    starts = [c["startedAt"] for c in calls]
    assert starts == sorted(starts) and run.started_at <= starts[0]
    assert run.ended_at is not None and starts[-1] <= run.ended_at


def test_without_hooks_the_trace_times_each_tool_call(db: str, tracing: None) -> None:
    model = ScriptedModel(
        [[function_call("broken", {"city": "Paris"}, call_id="c1")], [assistant_message("Sorry.")]]
    )
    session = ZidaneSession("r", store=db)
    try:
        Runner.run_sync(Agent(name="weather", model=model, tools=[broken]), "Hi", session=session)
        (run,) = stored_when(db, "r", ended).runs
        assert run.status == "completed" and run.extra_fields is not None
        (call,) = run.extra_fields[CALL_TIMES_KEY]
        assert (call["kind"], call["name"], call["failed"]) == ("tool", "broken", True)
        assert run.started_at <= call["startedAt"] and call["durationMs"] >= 0
    finally:
        session.close()


def test_a_plain_streamed_failure_is_recorded_when_it_happens(db: str, tracing: None) -> None:
    async def main() -> ZidaneSession:
        session = ZidaneSession("s", store=db)
        streamed = Runner.run_streamed(failing("streamer"), "Stream me", session=session)
        with pytest.raises(RuntimeError):
            async for _ in streamed.stream_events():
                pass
        return session

    session = asyncio.run(main())
    try:
        data = stored_when(db, "s", ended_and_named)
        (run,) = data.runs
        assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
        assert run.prompt == "Stream me" and run.agent is not None and run.agent.id == "streamer"
        assert data.agent_id == "streamer"
    finally:
        session.close()
