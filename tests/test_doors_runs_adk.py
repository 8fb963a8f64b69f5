"""google-adk invocations recorded as run records, and the state shown with its keys (issue 37).

Driven by ADK's own Runner over a scripted ``BaseLlm`` (no network, no mocks of ADK).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import trio

pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")

from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools import ToolContext
from google.genai import types

from zidane_actors.integrations._shared import CALL_TIMES_KEY
from zidane_actors.integrations.adk import ZidaneSessionService
from zidane_actors.model import SessionData, SessionRun, ToolCallBlock
from zidane_actors.stores import open_sqlite_store


class Scripted(BaseLlm):
    """Answers each call with the next script entry; an exception entry is raised."""

    model: str = "scripted-1"
    script: list[Any]
    stream_parts: bool = False
    requests: list[LlmRequest] = pydantic.Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        self.requests.append(llm_request)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if stream and self.stream_parts:
            text = step.content.parts[0].text
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(text=text[:3])]),
                partial=True,
            )
        yield step


def usage(prompt: int, out: int) -> types.GenerateContentResponseUsageMetadata:
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt, candidates_token_count=out, total_token_count=prompt + out
    )


def call(name: str, **args: Any) -> LlmResponse:
    return LlmResponse(
        content=types.Content(
            role="model", parts=[types.Part(function_call=types.FunctionCall(name=name, args=args))]
        ),
        usage_metadata=usage(100, 10),
        model_version="scripted-1",
    )


def answer(text: str) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=text)]),
        usage_metadata=usage(120, 5),
        model_version="scripted-1",
    )


def weather(city: str, tool_context: ToolContext) -> dict[str, str]:
    """The weather in a city (remembers the city in the session state)."""
    tool_context.state["city"] = city
    tool_context.state["sky"] = "sunny"
    return {"city": city, "sky": "sunny"}


def broken(city: str) -> dict[str, str]:
    """A tool whose backend is down."""
    raise ConnectionError(f"no forecast for {city}")


async def weather_runner(
    service: ZidaneSessionService, agent: LlmAgent, *, plugin: bool
) -> tuple[Runner, Any]:
    """A runner of the weather app over ``service`` (its run plugin or not), and a new session."""
    runner = Runner(
        app_name="weather",
        agent=agent,
        session_service=service,
        plugins=[service.plugin] if plugin else [],
    )
    return runner, await service.create_session(app_name="weather", user_id="ada")


def drive(
    url: str,
    agent: LlmAgent,
    prompts: list[str],
    *,
    plugin: bool = True,
    streaming: bool = False,
) -> tuple[str, list[BaseException]]:
    """Run ``prompts`` one invocation each; the ADK session id and the errors raised."""
    failures: list[BaseException] = []

    async def main() -> str:
        async with ZidaneSessionService(store=url) as service:
            runner, session = await weather_runner(service, agent, plugin=plugin)
            config = RunConfig(streaming_mode=StreamingMode.SSE if streaming else None)
            for prompt in prompts:
                message = types.Content(role="user", parts=[types.Part(text=prompt)])
                try:
                    async for _ in runner.run_async(
                        user_id="ada", session_id=session.id, new_message=message, run_config=config
                    ):
                        pass
                except Exception as exc:
                    failures.append(exc)
            await runner.close()
            return session.id

    return asyncio.run(main()), failures


def stored(url: str, sid: str) -> SessionData:
    """The ADK session as its zidane store holds it."""

    async def main() -> SessionData:
        async with open_sqlite_store(url.removeprefix("sqlite:")) as store:
            loaded = await store.load(f"adk:weather:ada:{sid}")
            assert loaded is not None
            return loaded

    return trio.run(main)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'adk.db'}"


def test_an_invocation_is_a_run_with_agent_model_tokens_and_the_state_keys(url: str) -> None:
    model = Scripted(script=[call("weather", city="Paris"), answer("Sunny in Paris.")])
    agent = LlmAgent(name="forecaster", model=model, tools=[weather])
    sid, failures = drive(url, agent, ["Weather in Paris?"])
    assert failures == []
    data = stored(url, sid)
    (run,) = data.runs
    assert run.status == "completed" and run.error is None and run.prompt == "Weather in Paris?"
    assert run.agent is not None and run.agent.id == "forecaster"
    assert (run.tokens_in, run.tokens_out, run.turns) == (220, 15, 3)
    assert run.options is not None and run.options.model == "scripted-1"
    assert all(t.run_id == run.id for t in data.turns)
    assert data.metadata["adkState"] == {"city": "Paris", "sky": "sunny"}
    assert data.agent_id == "forecaster"  # the framework's agent, not the app


def test_sessions_named_after_their_agent_are_still_listed_by_app(url: str) -> None:
    """agentId is the root agent once it spoke (the app name before): list_sessions finds both."""
    model = Scripted(script=[answer("Hi.")])
    sid, _ = drive(url, LlmAgent(name="greeter", model=model), ["Hello"])

    async def main() -> tuple[set[str], set[str]]:
        async with ZidaneSessionService(store=url) as service:
            fresh = await service.create_session(app_name="weather", user_id="ada")
            listed = await service.list_sessions(app_name="weather", user_id="ada")
            other = await service.list_sessions(app_name="greeter", user_id="ada")
            assert other.sessions == []
            return {s.id for s in listed.sessions}, {sid, fresh.id}

    listed, wanted = asyncio.run(main())
    assert listed == wanted
    assert stored(url, sid).agent_id == "greeter"


def test_a_first_model_call_that_raises_is_an_error_with_its_text(url: str) -> None:
    agent = LlmAgent(name="flaky", model=Scripted(script=[RuntimeError("provider down: 429")]))
    sid, failures = drive(url, agent, ["Hello?"])
    assert [str(f) for f in failures] == ["provider down: 429"]
    data = stored(url, sid)
    (run,) = data.runs
    assert run.status == "error" and run.error == "RuntimeError: provider down: 429"
    assert run.prompt == "Hello?" and run.ended_at is not None
    assert run.agent is not None and run.agent.id == "flaky" and data.agent_id == "flaky"


def test_a_failure_is_an_error_event_the_service_records_without_the_plugin(url: str) -> None:
    model = Scripted(script=[call("broken", city="Paris"), answer("Hi.")])
    agent = LlmAgent(name="forecaster", model=model, tools=[broken])
    sid, failures = drive(url, agent, ["Weather?", "Again?"], plugin=False)
    assert len(failures) == 1
    first, second = stored(url, sid).runs
    assert first.status == "error" and first.error == "ConnectionError: no forecast for Paris"
    assert second.status == "completed" and second.prompt == "Again?"


@pytest.mark.parametrize("plugin", [True, False])
def test_an_invocation_left_early_is_never_left_running(url: str, plugin: bool) -> None:
    """The caller stops reading mid-invocation: the plugin ends it, else the next one does."""
    model = Scripted(script=[call("weather", city="Paris"), answer("x"), answer("Hi.")])
    agent = LlmAgent(name="forecaster", model=model, tools=[weather])

    async def main() -> str:
        async with ZidaneSessionService(store=url) as service:
            runner, session = await weather_runner(service, agent, plugin=plugin)
            for prompt in ("Weather?", "Hi?"):
                message = types.Content(role="user", parts=[types.Part(text=prompt)])
                events = runner.run_async(user_id="ada", session_id=session.id, new_message=message)
                async for _ in events:
                    if prompt == "Weather?":
                        break  # left after the model's tool call
                await events.aclose()
                if prompt == "Weather?":
                    (left,) = stored(url, session.id).runs
                    assert left.status == ("aborted" if plugin else "running")
            await runner.close()
            return session.id

    sid = asyncio.run(main())
    first, second = stored(url, sid).runs
    assert first.status == "aborted" and first.error is not None
    assert second.status == "completed"


def test_a_tool_that_raises_is_an_error_with_its_text(url: str) -> None:
    model = Scripted(script=[call("broken", city="Paris"), answer("unused")])
    agent = LlmAgent(name="forecaster", model=model, tools=[broken])
    sid, failures = drive(url, agent, ["Weather?"])
    assert len(failures) == 1
    data = stored(url, sid)
    (run,) = data.runs
    assert run.status == "error" and run.error == "ConnectionError: no forecast for Paris"
    assert (run.tokens_in, run.tokens_out) == (100, 10)
    assert run.agent is not None and run.agent.id == "forecaster"
    assert data.agent_id == "forecaster"


def test_an_error_event_ends_its_run_with_its_code_and_message(url: str) -> None:
    refused = LlmResponse(error_code="SAFETY", error_message="blocked by policy")
    agent = LlmAgent(name="careful", model=Scripted(script=[refused]))
    sid, _ = drive(url, agent, ["Something risky"])
    (run,) = stored(url, sid).runs
    assert run.status == "error" and run.error == "SAFETY: blocked by policy"


def test_a_streamed_invocation_stores_its_final_event_only(url: str) -> None:
    model = Scripted(script=[answer("Sunny everywhere.")], stream_parts=True)
    agent = LlmAgent(name="streamer", model=model)
    sid, failures = drive(url, agent, ["Weather?"], streaming=True)
    assert failures == []
    data = stored(url, sid)
    (run,) = data.runs
    assert run.status == "completed" and (run.tokens_in, run.tokens_out) == (120, 5)
    assert [t.role for t in data.turns] == ["user", "assistant"]
    assert run.agent is not None and run.agent.id == "streamer" and data.agent_id == "streamer"


def test_a_transfer_is_a_run_of_the_agent_it_went_to(url: str) -> None:
    expert = LlmAgent(
        name="expert", model=Scripted(script=[answer("Take an umbrella.")]), description="advice"
    )
    root = LlmAgent(
        name="triage",
        model=Scripted(script=[call("transfer_to_agent", agent_name="expert")]),
        sub_agents=[expert],
    )
    sid, failures = drive(url, root, ["Umbrella?"])
    assert failures == []
    data = stored(url, sid)
    by_agent: dict[str, SessionRun] = {r.agent.id: r for r in data.runs if r.agent is not None}
    assert set(by_agent) == {"triage", "expert"}
    parent, child = by_agent["triage"], by_agent["expert"]
    assert child.parent_run_id == parent.id and child.depth is None
    assert parent.status == child.status == "completed"
    assert (child.tokens_in, child.tokens_out) == (120, 5)
    # Each turn names its agent: the run it belongs to.
    authors = {t.run_id for t in data.turns if t.role == "assistant"}
    assert authors == {parent.id, child.id}
    runs = {r.id: r for r in data.runs}
    for turn in data.turns:
        event = turn.metadata["adkEvent"] if turn.metadata else {}
        if event.get("author") not in (None, "user"):
            run = runs[turn.run_id]
            assert run.agent is not None and run.agent.id == event["author"]
    assert data.agent_id == "triage"  # the root agent


def test_each_model_and_tool_call_is_timed_from_the_event_timestamps(url: str) -> None:
    model = Scripted(script=[call("weather", city="Paris"), answer("Sunny in Paris.")])
    sid, _ = drive(url, LlmAgent(name="forecaster", model=model, tools=[weather]), ["Paris?"])
    data = stored(url, sid)
    (run,) = data.runs
    assert run.extra_fields is not None
    calls = run.extra_fields[CALL_TIMES_KEY]
    assert [(c["kind"], c["name"], c.get("failed")) for c in calls] == [
        ("model", "scripted-1", None),
        ("tool", "weather", None),
        ("model", "scripted-1", None),
    ]
    first, tool, second = calls
    assert second["startedAt"] >= tool["startedAt"] + tool["durationMs"]
    call_id = next(b.id for t in data.turns for b in t.content if isinstance(b, ToolCallBlock))
    assert tool["callId"] == call_id
    # A model call begins at its event's stamp; its tools begin once it answered.
    assert first["startedAt"] == data.turns[1].created_at
    assert tool["startedAt"] == int(first["startedAt"] + first["durationMs"])
    assert tool["startedAt"] + tool["durationMs"] == data.turns[2].created_at
    assert all(c["durationMs"] >= 0 for c in calls) and run.ended_at is not None
