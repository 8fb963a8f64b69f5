"""OpenTelemetry out: session operations as spans for the application's tracer provider,
checked with the SDK's in-memory exporter; and the library without OpenTelemetry at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from zidane_actors.actors import _trace, open_session_host
from zidane_actors.errors import ConflictError
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import create_memory_store


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The application's provider, as ``trace.set_tracer_provider`` would make it global."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exported
    monkeypatch.undo()
    _trace.refresh()  # later tests run untraced again


def turn(text: str) -> SessionTurn:
    return SessionTurn(id=f"t-{text}", role="user", content=(TextBlock(text),), created_at=1)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_an_append_through_a_host_emits_a_span(exporter: InMemorySpanExporter) -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session(id="chat-1")
        await session.append_turns([turn("a"), turn("b")])
        await session.append_turns(iter([turn("c")]))  # not sized: no count, still a span
        await session.save()
        assert await host.load_session("chat-1") is session
        assert await host.load_session("nobody") is None
    first, second = named(exporter, "session.append_turns")
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.conversation.id"] == "chat-1"
    assert first.attributes["zidane.store.kind"] == "memory"
    assert first.attributes["zidane.turns.appended"] == 2
    assert first.attributes["zidane.session.turns"] == 2
    assert "zidane.turns.appended" not in second.attributes
    assert second.attributes["zidane.session.turns"] == 3
    assert first.status.status_code is trace.StatusCode.UNSET
    (save,) = named(exporter, "session.save")
    assert save.attributes is not None and save.attributes["gen_ai.conversation.id"] == "chat-1"
    found, missing = named(exporter, "session_host.load_session")
    assert found.attributes is not None and found.attributes["zidane.session.turns"] == 3
    assert missing.attributes is not None and missing.attributes["zidane.session.found"] is False
    (create,) = named(exporter, "session_host.create_session")
    assert create.attributes is not None and create.attributes["gen_ai.conversation.id"] == "chat-1"


async def test_a_failed_operation_is_an_error_span(exporter: InMemorySpanExporter) -> None:
    async with open_session_host(create_memory_store()) as host:
        await host.create_session(id="chat-2")
        with pytest.raises(ConflictError):
            await host.create_session(id="chat-2")
    _, failed = named(exporter, "session_host.create_session")
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "ConflictError"
    assert [e.name for e in failed.events] == ["exception"]


async def test_without_a_provider_nothing_is_traced() -> None:
    async with open_session_host(create_memory_store()) as host:
        assert _trace._tracer is None  # looked for once, when the host opened
        session = await host.create_session(id="chat-3")
        await session.append_turns([turn("a")])
        await trio.lowlevel.checkpoint()


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_the_global_provider_traces_the_portal_path() -> None:
    out = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from zidane_actors.model import SessionTurn, TextBlock
        from zidane_actors.portal import start_host

        exported = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exported))
        trace.set_tracer_provider(provider)
        with start_host("memory:") as host:
            session = host.create_session(id="chat-4")
            session.append_turns([SessionTurn("t", "user", (TextBlock("hi"),), 1)])
        for span in exported.get_finished_spans():
            print(span.name, span.attributes["gen_ai.conversation.id"])
        """
    )
    assert out.splitlines() == [
        "session_host.create_session chat-4",
        "session.append_turns chat-4",
    ]


def test_the_library_works_without_opentelemetry() -> None:
    out = run_python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: any import of it fails
        import zidane_actors, zidane_actors.integrations
        from zidane_actors.model import SessionTurn, TextBlock
        from zidane_actors.portal import start_host

        with start_host("memory:") as host:
            session = host.create_session(id="chat-5")
            session.append_turns([SessionTurn("t", "user", (TextBlock("hi"),), 1)])
            session.save()
            print(len(host.load_session("chat-5").turns))
        try:
            import zidane_actors.integrations.otel
        except ImportError:
            print("the otel integration needs opentelemetry")
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert out.splitlines() == [
        "1",
        "the otel integration needs opentelemetry",
        "['opentelemetry']",
    ]
