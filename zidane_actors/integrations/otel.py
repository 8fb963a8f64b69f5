"""OpenTelemetry in: the GenAI spans of any instrumented framework as zidane run records.

``ZidaneSpanProcessor`` is an OpenTelemetry SDK span processor. Added to the
application's ``TracerProvider``, it records each agent run the spans show
(pydantic-ai with ``instrument=True``, google-adk, any framework emitting the
GenAI semantic conventions) as a ``SessionRun`` of the session its
``gen_ai.conversation.id`` names, created when missing: agent, models,
tokens and cost per model call, start and end, status, and the error's type
and text when the run failed. No framework adapter is involved.

A run is the outermost span carrying ``gen_ai.operation.name`` (or any
``invoke_agent`` span: a nested one is a sub-run with its parent and depth).
Its model calls and tool calls are the GenAI spans beneath it. A run is
written ``running`` when its span starts (when the session is known then)
and in full when it ends. A span without ``gen_ai.conversation.id`` is
named by the baggage entry ``gen_ai.conversation.id`` of its parent
context, so an application whose framework sets no conversation id names
the session itself::

    from opentelemetry import baggage, context
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", "chat-42"))

Runs no session names are counted (``statistics().unnamed``) and dropped.

The application's threads only hand spans to a queue: the writes run in the
processor's own thread through the store's portal, and a full queue or a
failed write is counted, never raised. ``force_flush`` waits for what was
queued; ``shutdown`` (the provider's, or at interpreter exit) flushes, stops
the thread and releases the portal.
Requires ``opentelemetry-sdk`` (the ``otel`` extra).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from typing import Final

import attrs
from opentelemetry import baggage
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from ..portal import AsyncHost, SyncHost
from ..portal._thread import Portal
from . import _shared
from ._otel_runs import (
    CONVERSATION,
    OPERATION,
    OpenRun,
    agent_of,
    record_run,
    run_id_of,
    session_id_of,
)
from ._usage import Price

__all__ = ["DEFAULT_STORE", "SpanProcessorStatistics", "ZidaneSpanProcessor"]

_log = logging.getLogger("zidane_actors.integrations.otel")

DEFAULT_STORE: Final = _shared.DEFAULT_STORE


@attrs.frozen
class SpanProcessorStatistics:
    """What a :class:`ZidaneSpanProcessor` did so far."""

    runs: int
    """Runs written whole (their span ended)."""
    spans: int
    """GenAI spans taken in (runs' own spans, model calls, tool calls)."""
    unnamed: int
    """Runs dropped because no valid session id named them."""
    dropped: int
    """Spans dropped because the queue was full (their runs may stay ``running``)."""
    errors: int
    """Writes the store refused or failures inside the processor (logged)."""
    queued: int


_STOP: Final = object()


@attrs.frozen
class _Flush:
    done: threading.Event = attrs.field(factory=threading.Event)


_Item = tuple[str, OpenRun, ReadableSpan | None] | _Flush | object


class ZidaneSpanProcessor(SpanProcessor):
    """Records GenAI spans as run records of zidane sessions (see the module's docs).

    ``store`` is a store URL as the CLI takes it (processors and integrations
    of one URL share one portal); or pass ``host``, a running
    :class:`~zidane_actors.portal.SyncHost` or
    :class:`~zidane_actors.portal.AsyncHost`, which stays the caller's to
    close. ``price(usage)`` gives a model call's cost in USD (default:
    genai-prices, when it knows the model). At most ``max_queue`` spans wait
    to be written; more are dropped and counted.
    """

    def __init__(
        self,
        store: str | None = None,
        *,
        host: SyncHost | AsyncHost | None = None,
        price: Price | None = None,
        max_queue: int = 10_000,
    ) -> None:
        if store is not None and host is not None:
            raise ValueError("pass a store URL or a host, not both")
        if host is None:
            self._shared: _shared.SharedPortal | None = _shared.acquire(store or DEFAULT_STORE)
            self._portal: Portal = self._shared.portal
        else:
            self._shared, self._portal = None, host._portal
        self._price = price
        self._queue: queue.Queue[_Item] = queue.Queue(max_queue)
        self._open: dict[int, OpenRun] = {}  # span id -> the run it belongs to, while in flight
        self._stopped = False
        self._runs = self._spans = self._unnamed = self._dropped = self._errors = 0
        self._count_lock = threading.Lock()  # drops and errors are counted from any thread
        self._thread = threading.Thread(target=self._work, name="zidane-actors-otel", daemon=True)
        self._thread.start()
        # Flushed at exit before the shared portals close (exit hooks run last first).
        atexit.register(self.shutdown)

    # -- the application's threads ----------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Note the span's run; a run's own span queues its ``running`` record."""
        try:
            parent = span.parent
            run = self._open.get(parent.span_id) if parent is not None else None
            attributes = span.attributes or {}
            operation = attributes.get(OPERATION)
            if operation is None:
                if run is not None:  # a span between a run and its calls
                    self._open[span.context.span_id] = run
                return
            if run is not None and operation != "invoke_agent":
                self._open[span.context.span_id] = run
                return
            named = attributes.get(CONVERSATION) or baggage.get_baggage(
                CONVERSATION, parent_context
            )
            context = span.context
            new = OpenRun(
                id=run_id_of(attributes, context.trace_id, context.span_id),
                span_id=context.span_id,
                started_at=(span.start_time or 0) // 1_000_000,
                # A sub-agent's run (an agent a tool delegated to) is a child run of its
                # parent's session, whatever conversation id its framework made up for it.
                session_id=(run.session_id if run is not None else None) or session_id_of(named),
                trace_id=context.trace_id,
                agent=agent_of(attributes),
                parent=run,
            )
            self._open[context.span_id] = new
            if new.session_id is not None:
                self._put(("start", new, None))
        except Exception:
            self._count("_errors")
            _log.exception("could not take in a span's start")

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a GenAI span for its run (never blocks, never raises)."""
        try:
            context = span.context
            if context is None:
                return
            run = self._open.pop(context.span_id, None)
            if span.attributes is None or OPERATION not in span.attributes:
                return  # not a GenAI span
            if run is None:  # its start showed no GenAI operation: a run by itself
                run = OpenRun(
                    id=run_id_of(span.attributes, context.trace_id, context.span_id),
                    span_id=context.span_id,
                    started_at=(span.start_time or 0) // 1_000_000,
                    session_id=None,
                    trace_id=context.trace_id,
                )
            self._put(("end" if run.span_id == context.span_id else "span", run, span))
        except Exception:
            self._count("_errors")
            _log.exception("could not take in a span's end")

    def _put(self, item: _Item) -> None:
        if self._stopped:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._count("_dropped")

    def _count(self, counter: str) -> None:
        with self._count_lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def statistics(self) -> SpanProcessorStatistics:
        """Counters of runs written, spans taken in, and what was dropped or failed."""
        return SpanProcessorStatistics(
            runs=self._runs,
            spans=self._spans,
            unnamed=self._unnamed,
            dropped=self._dropped,
            errors=self._errors,
            queued=self._queue.qsize(),
        )

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until every span queued before this call is written; ``False`` on timeout."""
        if not self._thread.is_alive():
            return self._queue.empty()
        flush = _Flush()
        try:
            self._queue.put(flush, timeout=timeout_millis / 1000)
        except queue.Full:
            return False
        return flush.done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Flush, stop the processor's thread, and release the store's portal (idempotent)."""
        if self._stopped:
            return
        atexit.unregister(self.shutdown)
        self.force_flush()
        self._stopped = True
        self._queue.put(_STOP)
        self._thread.join()
        shared, self._shared = self._shared, None
        if shared is not None:
            stopped = _shared.release(shared)
            if stopped is not None:
                stopped.result()

    # -- the processor's thread ---------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _Flush):
                item.done.set()
                continue
            try:
                self._take(item)  # type: ignore[arg-type]
            except Exception:
                self._count("_errors")
                _log.exception("could not record a run from its spans")

    def _take(self, item: tuple[str, OpenRun, ReadableSpan | None]) -> None:
        kind, run, span = item
        if span is not None:
            self._spans += 1
            run.fold(span, self._price)
        if kind == "span":
            return
        if run.session_id is None:
            if kind == "end":
                self._unnamed += 1
            return
        record = run.record("running" if span is None else "completed", span)
        if self._shared is not None:
            self._shared.ready.result()  # the portal's store is open (or its error raised)
        self._portal.call(record_run, self._portal.host, run.session_id, record)
        if kind == "end":
            self._runs += 1
