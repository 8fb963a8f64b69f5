"""The openai-agents door records how each Runner call really ended (issue 37).

A failed call is never left ``running`` (nor shown ``completed`` without
hooks), a tool's exception text is kept, and a streamed run keeps its prompt.
Driven by the SDK's own ``ScriptedModel`` (no network, no mocks).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import trio
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

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
    run = only_run(db, "g")
    assert run.prompt == "Stream me" and run.status == "completed"
