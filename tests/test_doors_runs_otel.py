"""A run recorded from OpenTelemetry spans links to its trace (``traceContext``, issue 37)."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.test import TestModel

from zidane_actors.integrations._shared import TRACE_CONTEXT_KEY, trace_context
from zidane_actors.integrations.otel import ZidaneSpanProcessor
from zidane_actors.portal import start_host


def test_a_run_recorded_from_spans_names_its_agent_span() -> None:
    exporter = InMemorySpanExporter()
    with start_host("memory:") as host:
        processor = ZidaneSpanProcessor(host=host)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        agent: Agent[None, str] = Agent(TestModel(), name="adder")
        agent.instrument = InstrumentationSettings(tracer_provider=provider)
        agent.run_sync("hello", conversation_id="chat-t")
        assert processor.force_flush()
        session = host.load_session("chat-t")
        assert session is not None
        (run,) = session.runs
        processor.shutdown()
    (span,) = [s for s in exporter.get_finished_spans() if _is_agent_run(s)]
    assert span.context is not None
    assert run.extra_fields is not None
    assert run.extra_fields[TRACE_CONTEXT_KEY] == {
        "traceId": f"{span.context.trace_id:032x}",
        "spanId": f"{span.context.span_id:016x}",
    }


def _is_agent_run(span: ReadableSpan) -> bool:
    return (span.attributes or {}).get("gen_ai.operation.name") == "invoke_agent"


def test_no_active_span_no_trace_context() -> None:
    assert trace_context() is None


def test_without_opentelemetry_imported_nothing_is_imported() -> None:
    code = (
        "import sys\n"
        "from zidane_actors.integrations._shared import trace_context\n"
        "assert trace_context() is None\n"
        "assert not any(m.startswith('opentelemetry') for m in sys.modules), 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
