"""OpenTelemetry in: GenAI spans recorded as run records by ``ZidaneSpanProcessor``.

pydantic-ai runs instrumented through its own OpenTelemetry support (TestModel
and FunctionModel, no network), and raw spans as any framework would emit
them. No pydantic-ai adapter code is involved.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from opentelemetry import baggage, context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.test import TestModel

from zidane_actors.actors import SessionHost
from zidane_actors.integrations import otel
from zidane_actors.integrations._shared import CALL_TIMES_KEY
from zidane_actors.integrations.otel import ZidaneSpanProcessor
from zidane_actors.model import SessionRun
from zidane_actors.portal import SyncHost, start_host


@pytest.fixture
def host() -> Iterator[SyncHost]:
    with start_host("memory:") as opened:
        yield opened


def traced(processor: ZidaneSpanProcessor) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider


def adder(provider: TracerProvider) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(TestModel(), name="adder")
    agent.instrument = InstrumentationSettings(tracer_provider=provider)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return agent


async def list_ids(trio_host: SessionHost) -> list[str]:
    return await trio_host.store.list()


def only_run(host: SyncHost, session_id: str) -> SessionRun:
    session = host.load_session(session_id)
    assert session is not None
    (run,) = session.runs
    return run


def test_a_pydantic_ai_run_is_a_run_record_of_its_session(host: SyncHost) -> None:
    processor = ZidaneSpanProcessor(host=host)
    result = adder(traced(processor)).run_sync("add 1 and 2", conversation_id="chat-1")
    assert processor.force_flush()
    run = only_run(host, "chat-1")
    usage = result.usage
    assert run.id == result.run_id
    assert run.status == "completed" and run.error is None
    assert run.agent is not None and run.agent.id == "adder"
    assert run.options is not None and run.options.model == "test"
    assert (run.tokens_in, run.tokens_out) == (usage.input_tokens, usage.output_tokens)
    assert run.turns == 2 and run.turn_usage is not None
    assert [u.model for u in run.turn_usage] == ["test", "test"]
    assert run.prompt == "add 1 and 2"
    assert run.ended_at is not None and run.ended_at >= run.started_at
    assert run.depth == 0 and run.parent_run_id is None
    # Each model and tool call at its own span's start, for its own length.
    assert run.extra_fields is not None
    calls = run.extra_fields[CALL_TIMES_KEY]
    assert [(c["kind"], c["name"]) for c in calls] == [
        ("model", "test"),
        ("tool", "add"),
        ("model", "test"),
    ]
    assert all(run.started_at <= c["startedAt"] <= run.ended_at for c in calls)
    assert calls[1]["startedAt"] >= calls[0]["startedAt"] + int(calls[0]["durationMs"])
    session = host.load_session("chat-1")
    assert session is not None and session.agent_id == "adder"
    assert session.turns == ()  # runs only: the history is the application's to store
    stats = processor.statistics()
    assert (stats.runs, stats.errors, stats.dropped, stats.unnamed) == (1, 0, 0, 0)
    processor.shutdown()


def test_a_failing_run_is_recorded_as_failed_with_its_error(host: SyncHost) -> None:
    processor = ZidaneSpanProcessor(host=host)

    def down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model down: 429 too many requests")

    agent: Agent[None, str] = Agent(FunctionModel(down), name="bad")
    agent.instrument = InstrumentationSettings(tracer_provider=traced(processor))
    with pytest.raises(RuntimeError):
        agent.run_sync("hi", conversation_id="chat-2")
    assert processor.force_flush()
    run = only_run(host, "chat-2")
    assert run.status == "error"
    assert run.error == "RuntimeError: model down: 429 too many requests"
    assert run.error_detail is not None and run.error_detail.code == "RuntimeError"
    assert run.error_detail.message == "model down: 429 too many requests"
    assert run.agent is not None and run.agent.id == "bad"
    assert run.ended_at is not None
    processor.shutdown()


def test_a_run_is_recorded_running_while_it_runs(host: SyncHost) -> None:
    processor = ZidaneSpanProcessor(host=host)
    seen: list[SessionRun] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert processor.force_flush()  # the start is written before the run ends
        seen.append(only_run(host, "chat-3"))
        return ModelResponse(parts=[TextPart("ok")])

    agent: Agent[None, str] = Agent(FunctionModel(model), name="slow")
    agent.instrument = InstrumentationSettings(tracer_provider=traced(processor))
    agent.run_sync("wait", conversation_id="chat-3")
    assert processor.force_flush()
    (during,) = seen
    assert during.status == "running" and during.ended_at is None
    after = only_run(host, "chat-3")
    assert after.status == "completed" and after.id == during.id
    processor.shutdown()


def test_raw_genai_spans_named_by_baggage_with_a_sub_agent(host: SyncHost) -> None:
    """A framework that sets no conversation id: the application names the session."""
    processor = ZidaneSpanProcessor(host=host)
    tracer = traced(processor).get_tracer("any-framework")
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", "chat-4"))
    try:
        with tracer.start_as_current_span(
            "invoke_agent planner",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"},
        ):
            with (
                tracer.start_as_current_span("step"),
                tracer.start_as_current_span(
                    "chat m1",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "m1",
                        "gen_ai.usage.input_tokens": 10,
                        "gen_ai.usage.output_tokens": 3,
                    },
                ),
            ):
                pass
            with tracer.start_as_current_span(
                "invoke_agent helper",
                attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"},
            ):
                with tracer.start_as_current_span(
                    "execute_tool search",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                    },
                ) as tool:
                    tool.set_status(Status(StatusCode.ERROR, "ValueError: no index"))
                    tool.set_attribute("error.type", "ValueError")
                with tracer.start_as_current_span(
                    "chat m2",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.response.model": "m2",
                        "gen_ai.usage.input_tokens": 7,
                        "gen_ai.usage.output_tokens": 2,
                    },
                ):
                    pass
    finally:
        context.detach(token)
    assert processor.force_flush()
    session = host.load_session("chat-4")
    assert session is not None and session.agent_id == "planner"
    runs = {r.agent.id if r.agent else None: r for r in session.runs}
    planner, helper = runs["planner"], runs["helper"]
    assert (planner.tokens_in, planner.tokens_out, planner.turns) == (10, 3, 1)
    assert (helper.tokens_in, helper.tokens_out, helper.turns) == (7, 2, 1)
    assert helper.parent_run_id == planner.id and helper.depth == 1
    assert planner.options is not None and planner.options.model == "m1"
    assert helper.status == planner.status == "completed"  # the tool failed, the run went on
    processor.shutdown()


def test_spans_no_session_names_are_counted_not_written(host: SyncHost) -> None:
    processor = ZidaneSpanProcessor(host=host)
    tracer = traced(processor).get_tracer("any-framework")
    with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
        pass
    with tracer.start_as_current_span(
        "chat",
        attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "../etc/passwd"},
    ):
        pass
    with tracer.start_as_current_span("http"):  # not a GenAI span: not even looked at
        pass
    assert processor.force_flush()
    stats = processor.statistics()
    assert (stats.unnamed, stats.runs, stats.spans, stats.errors) == (2, 0, 2, 0)
    assert host.call(list_ids, host.trio_host) == []
    processor.shutdown()


def test_a_closed_host_is_counted_never_raised_into_the_application() -> None:
    host = start_host("memory:")
    processor = ZidaneSpanProcessor(host=host)
    host.close()
    tracer = traced(processor).get_tracer("any-framework")
    with tracer.start_as_current_span(
        "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c"}
    ):
        pass  # neither the start nor the end raises here
    assert processor.force_flush()
    assert processor.statistics().errors == 2  # the running record and the whole one
    processor.shutdown()
    processor.shutdown()  # idempotent


def test_a_full_queue_drops_and_counts(host: SyncHost, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()

    async def stuck(trio_host: SessionHost, session_id: str, run: SessionRun) -> None:
        entered.set()
        await trio.to_thread.run_sync(release.wait)

    monkeypatch.setattr(otel, "record_run", stuck)
    processor = ZidaneSpanProcessor(host=host, max_queue=1)
    tracer = traced(processor).get_tracer("any-framework")
    named = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c"}
    with tracer.start_as_current_span("chat", attributes=named):
        assert entered.wait(10)  # the worker holds the start; the queue is empty
    # the end waits in the queue; this second span's start and end find it full
    with tracer.start_as_current_span("chat", attributes=named):
        pass
    assert processor.statistics().dropped == 2
    release.set()
    assert processor.force_flush()
    assert processor.statistics().runs == 1
    processor.shutdown()


def test_a_store_url_processor_writes_and_shutdown_flushes(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'otel.db'}"
    processor = ZidaneSpanProcessor(url)
    provider = traced(processor)
    adder(provider).run_sync("add", conversation_id="chat-5")
    provider.shutdown()  # the provider shuts its processors down: queued spans are written
    with start_host(url) as host:
        run = only_run(host, "chat-5")
        assert run.status == "completed" and run.agent is not None and run.agent.id == "adder"


def test_instrument_true_with_the_global_provider(tmp_path: Path) -> None:
    """As an application does it: a global provider and ``instrument=True`` (a fresh process)."""
    url = f"sqlite:{tmp_path / 'global.db'}"
    code = textwrap.dedent(
        f"""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from pydantic_ai import Agent
        from pydantic_ai.models.test import TestModel
        from zidane_actors.integrations.otel import ZidaneSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(ZidaneSpanProcessor({url!r}))
        trace.set_tracer_provider(provider)
        Agent.instrument_all(True)
        Agent(TestModel(), name="helper").run_sync("hello", conversation_id="chat-6")
        """  # and the process exits, the provider not shut down: the processor flushes
    )
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True)
    with start_host(url) as host:
        run = only_run(host, "chat-6")
    assert run.status == "completed" and run.agent is not None and run.agent.id == "helper"
    assert run.options is not None and run.options.model == "test"
    assert run.tokens_in is not None and run.tokens_in > 0
