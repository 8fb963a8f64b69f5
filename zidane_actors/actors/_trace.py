"""OpenTelemetry out: spans of session operations for the application's tracer provider.

Nothing here imports OpenTelemetry. Whether to trace is decided once, when a
host opens (or at the first traced call without a host): only when the
application already imported ``opentelemetry.trace`` and set a tracer
provider (not the API's default proxy or no-op one). Otherwise every traced
method costs one test of a module global on top of its own work.

Each span carries ``gen_ai.conversation.id`` (the session id, as the GenAI
semantic conventions name a conversation), ``zidane.store.kind``
(``sqlite``, ``memory``, ``postgres``, ``remote``, ``filemap``, …), the
session's turn count after the operation and, for an append, the turns it
appended; a failed operation records its exception, ``error.type`` and an
error status.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Coroutine, Sized
from typing import Any, Final, TypeVar, cast

__all__ = ["host_op", "refresh", "session_op"]

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])

_UNKNOWN: Final[Any] = object()
_tracer: Any = _UNKNOWN  # the application's tracer, None (off), or not looked for yet
_kinds: dict[type, str] = {}


def refresh() -> Any:
    """Look for the application's tracer provider (when a host opens); answer the tracer."""
    global _tracer
    trace: Any = sys.modules.get("opentelemetry.trace")
    _tracer = None
    if trace is not None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            _tracer = provider.get_tracer("zidane_actors")
    return _tracer


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


def _op(
    span_name: str,
    before: Callable[[Any, tuple[Any, ...], dict[str, Any]], dict[str, Any]],
    after: Callable[[Any, Any], dict[str, Any]],
) -> Callable[[F], F]:
    """Trace a coroutine method as ``span_name``: ``before`` names the call, ``after`` its end."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            tracer = _tracer if _tracer is not _UNKNOWN else refresh()
            if tracer is None:
                return await fn(self, *args, **kwargs)
            attributes = before(self, args, kwargs)
            call = fn(self, *args, **kwargs)
            return await _traced(
                tracer, span_name, attributes, call, lambda result: after(self, result)
            )

        return cast(F, traced)

    return wrap


def session_op(name: str) -> Callable[[F], F]:
    """Trace a coroutine method of ``Session`` as the span ``session.<name>``."""

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

    return _op(f"session.{name}", before, after)


def host_op(name: str) -> Callable[[F], F]:
    """Trace a coroutine method of ``SessionHost`` taking a session id (positional or ``id``)."""

    def before(host: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        attributes: dict[str, Any] = {"zidane.store.kind": _store_kind(host.store)}
        session_id = args[0] if args else kwargs.get("id")
        if isinstance(session_id, str):
            attributes["gen_ai.conversation.id"] = session_id
        return attributes

    return _op(f"session_host.{name}", before, _found if name != "delete_session" else _nothing)


def _nothing(_host: Any, _: Any) -> dict[str, Any]:
    return {}


def _found(_host: Any, session: Any) -> dict[str, Any]:
    if session is None:
        return {"zidane.session.found": False}
    turns = getattr(session, "turns", None)
    return {
        "gen_ai.conversation.id": session.id,
        "zidane.session.turns": len(turns) if turns is not None else 0,
    }
