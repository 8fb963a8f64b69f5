"""OpenTelemetry out: session operations measured for the application's meter provider,
read back with the SDK's in-memory reader; and nothing measured or imported without one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_otel_out import run_python

from zidane_actors.actors import _trace, open_session_host
from zidane_actors.errors import ConflictError, StaleSessionError, StoreClosedError
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import create_memory_store


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryMetricReader]:
    """The application's provider, as ``metrics.set_meter_provider`` would make it global."""
    read = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[read], shutdown_on_exit=False)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: provider)
    yield read
    monkeypatch.undo()
    _trace.refresh()  # later tests run unmeasured again
    provider.shutdown()


def turn(text: str) -> SessionTurn:
    return SessionTurn(id=f"t-{text}", role="user", content=(TextBlock(text),), created_at=1)


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points of the instrument ``name`` (one per attribute set)."""
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def by_operation(reader: InMemoryMetricReader, name: str) -> dict[str, Any]:
    return {str(p.attributes["zidane.operation"]): p for p in points(reader, name)}


async def test_appends_through_a_host_record_duration_turns_and_batches(
    reader: InMemoryMetricReader,
) -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session(id="chat-1")
        await session.append_turns([turn("a"), turn("b")])
        await session.append_turns([turn("c")])
        await session.append_turns(iter([turn("d")]))  # not sized: timed, no turn count
        await session.save()
    durations = by_operation(reader, "zidane.session.operation.duration")
    assert sorted(durations) == ["append_turns", "create_session", "save"]
    append = durations["append_turns"]
    assert append.count == 3 and append.sum > 0
    assert dict(append.attributes) == {
        "zidane.store.kind": "memory",
        "zidane.operation": "append_turns",
    }
    (turns,) = points(reader, "zidane.session.append.turns")
    assert (turns.count, turns.sum, turns.min, turns.max) == (2, 3, 1, 2)
    assert turns.attributes["zidane.store.kind"] == "memory"
    assert points(reader, "zidane.session.conflicts") == []
    assert points(reader, "zidane.store.errors") == []


async def test_group_commits_record_their_batch_sizes(reader: InMemoryMetricReader) -> None:
    async with open_session_host(create_memory_store()) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(10)]
        async with trio.open_nursery() as nursery:  # writes from many sessions share batches
            for session in sessions:
                nursery.start_soon(session.append_turns, [turn(session.id)])
        stats = host.statistics().store
    (batch,) = points(reader, "zidane.store.batch.size")
    assert dict(batch.attributes) == {"zidane.store.kind": "memory"}
    assert stats.batches > 0
    assert (batch.count, batch.sum) == (stats.batches, stats.batched_writes)


async def test_a_stale_save_counts_a_conflict(reader: InMemoryMetricReader) -> None:
    store = create_memory_store()
    async with open_session_host(store) as ha, open_session_host(store) as hb:
        a = await ha.create_session(id="chat-2")
        await a.save()
        b = await hb.load_session("chat-2")
        assert b is not None
        await b.append_turns([turn("b")])
        await a.set_turns([turn("a")])  # computed from A's stale view
        with pytest.raises(StaleSessionError):
            await a.save()
        with pytest.raises(ConflictError):
            await ha.create_session(id="chat-2")
    conflicts = by_operation(reader, "zidane.session.conflicts")
    assert conflicts["save"].value == 1
    assert conflicts["save"].attributes["error.type"] == "StaleSessionError"
    assert conflicts["create_session"].value == 1
    assert conflicts["create_session"].attributes["error.type"] == "ConflictError"
    assert points(reader, "zidane.store.errors") == []
    failed = [
        p
        for p in points(reader, "zidane.session.operation.duration")
        if "error.type" in p.attributes
    ]
    assert sorted(str(p.attributes["error.type"]) for p in failed) == [
        "ConflictError",
        "StaleSessionError",
    ]


async def test_other_store_errors_are_counted_apart(reader: InMemoryMetricReader) -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="chat-3")
        await store.aclose()
        with pytest.raises(StoreClosedError):
            await session.append_turns([turn("a")])
    (error,) = points(reader, "zidane.store.errors")
    assert error.value == 1
    assert dict(error.attributes) == {
        "zidane.store.kind": "memory",
        "zidane.operation": "append_turns",
        "error.type": "StoreClosedError",
    }
    assert points(reader, "zidane.session.conflicts") == []


async def test_a_provider_not_set_globally_gets_nothing() -> None:
    read = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[read], shutdown_on_exit=False)
    async with open_session_host(create_memory_store()) as host:
        assert _trace._metrics is None  # looked for once, when the host opened: the API proxy
        session = await host.create_session(id="chat-4")
        await session.append_turns([turn("a")])
    assert read.get_metrics_data() is None
    provider.shutdown()


def test_the_global_provider_measures_the_portal_path() -> None:
    out = run_python(
        """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from zidane_actors.model import SessionTurn, TextBlock
        from zidane_actors.portal import start_host

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        with start_host("memory:") as host:
            session = host.create_session(id="chat-5")
            session.append_turns([SessionTurn("t", "user", (TextBlock("hi"),), 1)])
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "zidane.session.append.turns":
                        print(metric.unit, [p.sum for p in metric.data.data_points])
        """
    )
    assert out.splitlines() == ["{turn} [1]"]


def test_without_a_provider_nothing_from_opentelemetry_is_imported() -> None:
    out = run_python(
        """
        import sys
        import zidane_actors, zidane_actors.integrations
        from zidane_actors.actors import _trace
        from zidane_actors.model import SessionTurn, TextBlock
        from zidane_actors.portal import start_host

        with start_host("memory:") as host:
            session = host.create_session(id="chat-6")
            session.append_turns([SessionTurn("t", "user", (TextBlock("hi"),), 1)])
            session.save()
        print(_trace._metrics, _trace._tracer, _trace._on)
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert out.splitlines() == ["None None False", "[]"]


async def test_spans_and_metrics_together(
    reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session(id="chat-7")
        await session.append_turns([turn("a")])
        with pytest.raises(ConflictError):
            await host.create_session(id="chat-7")
    names = [span.name for span in exported.get_finished_spans()]
    assert names == [
        "session_host.create_session",
        "session.append_turns",
        "session_host.create_session",
    ]
    assert by_operation(reader, "zidane.session.append.turns")["append_turns"].sum == 1
    assert by_operation(reader, "zidane.session.conflicts")["create_session"].value == 1
