"""OpenTelemetry out: spans and metrics of session operations for the application's providers.

Nothing here imports OpenTelemetry. Whether to trace and to measure is
decided once, when a host opens (or at the first traced call without a
host): tracing only when the application already imported
``opentelemetry.trace`` and set a tracer provider, metrics only when it
imported ``opentelemetry.metrics`` and set a meter provider (neither the
API's default proxy nor its no-op one). Otherwise every traced method costs
one test of a module global on top of its own work.

Each span carries ``gen_ai.conversation.id`` (the session id, as the GenAI
semantic conventions name a conversation), ``zidane.store.kind``
(``sqlite``, ``memory``, ``postgres``, ``remote``, ``filemap``, …), the
session's turn count after the operation and, for an append, the turns it
appended; a failed operation records its exception, ``error.type`` and an
error status.

The metrics, each with ``zidane.store.kind`` and ``zidane.operation``
(``append_turns``, ``save``, ``update_run``, ``create_session``, …):
``zidane.session.operation.duration`` (s; ``error.type`` when it failed),
``zidane.session.append.turns`` (turns per sized append),
``zidane.session.conflicts`` (``ConflictError``/``StaleSessionError``
raised, with ``error.type``) and ``zidane.store.errors`` (any other
``StoreError`` raised, with ``error.type``); and, from the host's store actor,
``zidane.store.batch.size`` (writes per ``apply_writes`` call, with the
store kind alone).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Coroutine, Sized
from typing import Any, Final, TypeVar, cast

from ..errors import ConflictError, StoreError

__all__ = ["batched", "host_op", "refresh", "session_op"]

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])

_UNKNOWN: Final[Any] = object()
_on: Any = _UNKNOWN  # True: tracing or measuring; False: neither; or not looked for yet
_tracer: Any = None  # the application's tracer, or None
_metrics: _Metrics | None = None  # the instruments of the application's meter, or None
_kinds: dict[type, str] = {}


_INSTRUMENTS: Final = (
    # attribute, instrument kind, name, unit, description
    (
        "duration",
        "histogram",
        "zidane.session.operation.duration",
        "s",
        "Duration of session and session-host operations.",
    ),
    (
        "turns",
        "histogram",
        "zidane.session.append.turns",
        "{turn}",
        "Turns appended by one append_turns call.",
    ),
    (
        "conflicts",
        "counter",
        "zidane.session.conflicts",
        "{conflict}",
        "Operations refused by a conflict (a stale session, a taken id).",
    ),
    (
        "errors",
        "counter",
        "zidane.store.errors",
        "{error}",
        "Operations failed by a store error other than a conflict.",
    ),
    (
        "batch",
        "histogram",
        "zidane.store.batch.size",
        "{write}",
        "Writes the host's store actor sent in one apply_writes call.",
    ),
)


class _Metrics:
    """The instruments of :data:`_INSTRUMENTS`, made once from the application's meter."""

    duration: Any
    turns: Any
    conflicts: Any
    errors: Any
    batch: Any

    def __init__(self, meter: Any) -> None:
        for attribute, kind, name, unit, description in _INSTRUMENTS:
            make = getattr(meter, f"create_{kind}")
            setattr(self, attribute, make(name, unit=unit, description=description))


def refresh() -> bool:
    """Look for the application's tracer and meter providers (when a host opens).

    Answer whether either is set, so traced methods do more than call through.
    """
    global _on, _tracer, _metrics
    trace: Any = sys.modules.get("opentelemetry.trace")
    _tracer = None
    if trace is not None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            _tracer = provider.get_tracer("zidane_actors")
    metrics: Any = sys.modules.get("opentelemetry.metrics")
    _metrics = None
    if metrics is not None:
        provider = metrics.get_meter_provider()
        # The API's default proxy and its no-op provider live in the API package itself.
        if not type(provider).__module__.startswith("opentelemetry.metrics"):
            _metrics = _Metrics(provider.get_meter("zidane_actors"))
    on = _on = _tracer is not None or _metrics is not None
    return on


def batched(store: object, writes: int) -> None:
    """Record one ``apply_writes`` call of ``writes`` writes (the store actor's group commit)."""
    if _metrics is not None:
        _metrics.batch.record(writes, {"zidane.store.kind": _store_kind(store)})


def _store_kind(store: object) -> str:
    """``sqlite`` for an ``SQLiteStore`` (through the host's store actor), and so on."""
    inner = getattr(store, "_store", store)
    kind = _kinds.get(type(inner))
    if kind is None:
        name = type(inner).__name__.removesuffix("Store").lower()
        kind = _kinds[type(inner)] = name or "store"
    return kind


async def _traced(
    tracer: Any,
    name: str,
    attributes: dict[str, Any],
    call: Coroutine[Any, Any, Any],
    after: Callable[[Any], dict[str, Any]],
) -> Any:
    trace = sys.modules["opentelemetry.trace"]
    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            result = await call
        except Exception as exc:
            span.record_exception(exc)
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        span.set_attributes(after(result))
        return result


async def _observed(
    operation: str,
    span_name: str,
    attributes: dict[str, Any],
    call: Coroutine[Any, Any, Any],
    after: Callable[[Any], dict[str, Any]],
) -> Any:
    """Await ``call`` in a span when tracing, and record its metrics when measuring."""
    metrics, tracer = _metrics, _tracer
    if metrics is None:
        return await _traced(tracer, span_name, attributes, call, after)
    labels = {"zidane.store.kind": attributes["zidane.store.kind"], "zidane.operation": operation}
    start = time.perf_counter()
    try:
        if tracer is None:
            result = await call
        else:
            result = await _traced(tracer, span_name, attributes, call, after)
    except Exception as exc:
        failed = {**labels, "error.type": type(exc).__qualname__}
        metrics.duration.record(time.perf_counter() - start, failed)
        if isinstance(exc, ConflictError):
            metrics.conflicts.add(1, failed)
        elif isinstance(exc, StoreError):
            metrics.errors.add(1, failed)
        raise
    metrics.duration.record(time.perf_counter() - start, labels)
    appended = attributes.get("zidane.turns.appended")
    if appended is not None:
        metrics.turns.record(appended, labels)
    return result


def _op(
    operation: str,
    span_name: str,
    before: Callable[[Any, tuple[Any, ...], dict[str, Any]], dict[str, Any]],
    after: Callable[[Any, Any], dict[str, Any]],
) -> Callable[[F], F]:
    """Trace and measure a coroutine method: ``before`` names the call, ``after`` its end."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not (_on if _on is not _UNKNOWN else refresh()):
                return await fn(self, *args, **kwargs)
            attributes = before(self, args, kwargs)
            call = fn(self, *args, **kwargs)
            return await _observed(
                operation, span_name, attributes, call, lambda result: after(self, result)
            )

        return cast(F, traced)

    return wrap


def session_op(name: str) -> Callable[[F], F]:
    """Trace a coroutine method of ``Session`` as the span ``session.<name>``; measure it."""

    def before(session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.conversation.id": session.id,
            "zidane.store.kind": _store_kind(session.store),
        }
        turns = args[0] if args and name == "append_turns" else kwargs.get("turns")
        if isinstance(turns, Sized):
            attributes["zidane.turns.appended"] = len(turns)
        return attributes

    def after(session: Any, _: Any) -> dict[str, Any]:
        return {"zidane.session.turns": len(session.turns)}

    return _op(name, f"session.{name}", before, after)


def host_op(name: str) -> Callable[[F], F]:
    """Trace a coroutine method of ``SessionHost`` taking a session id (positional or ``id``)."""

    def before(host: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        attributes: dict[str, Any] = {"zidane.store.kind": _store_kind(host.store)}
        session_id = args[0] if args else kwargs.get("id")
        if isinstance(session_id, str):
            attributes["gen_ai.conversation.id"] = session_id
        return attributes

    after = {"delete_session": _nothing, "load_model_view": _viewed}.get(name, _found)
    return _op(name, f"session_host.{name}", before, after)


def _nothing(_host: Any, _: Any) -> dict[str, Any]:
    return {}


def _viewed(_host: Any, turns: Any) -> dict[str, Any]:
    return {"zidane.session.found": turns is not None}


def _found(_host: Any, session: Any) -> dict[str, Any]:
    if session is None:
        return {"zidane.session.found": False}
    turns = getattr(session, "turns", None)
    return {
        "gen_ai.conversation.id": session.id,
        "zidane.session.turns": len(turns) if turns is not None else 0,
    }
