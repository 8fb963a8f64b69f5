"""One portal per store URL for the whole process, shared by the integrations.

``acquire(url)`` answers the running portal for ``url`` (starting it on
first use, without waiting for it) and counts a reference; ``release``
drops one and closes the portal with the last. Portals still referenced at
interpreter exit are closed by an ``atexit`` hook, so their stores are
closed cleanly too.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import functools
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import attrs
import msgspec
import trio

from ..errors import ActorClosed
from ..model import ExtraFields, SessionRun, is_column_text
from ..portal._api import ClosesOnExit, host_opener
from ..portal._thread import Portal, wait_future

if TYPE_CHECKING:
    from ..actors import Session

__all__ = [
    "CALL_TIMES_KEY",
    "DEFAULT_STORE",
    "TRACE_CONTEXT_KEY",
    "AsyncShare",
    "CallTime",
    "SessionLocks",
    "Share",
    "SharedPortal",
    "acquire",
    "agent_of",
    "held",
    "name_agent",
    "release",
    "trace_context",
    "with_calls",
    "with_trace",
]

DEFAULT_STORE: Final = "sqlite:zidane-sessions.db"
"""The store every door opens when given none: the file ``zidane-actors serve`` reads."""

TRACE_CONTEXT_KEY = "traceContext"
"""The run record's key for the OpenTelemetry span it began in: ``{"traceId", "spanId"}``."""

CALL_TIMES_KEY = "callTimes"
"""The run record's key for its model and tool calls' own start and duration (``CallTime``)."""


@attrs.frozen
class CallTime:
    """One model or tool call of a run, timed by its framework (epoch ms, ms)."""

    kind: str  # "model" or "tool"
    name: str
    started_at: int
    duration_ms: float
    call_id: str | None = None
    failed: bool = False

    def json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": self.kind,
            "name": self.name,
            "startedAt": self.started_at,
            "durationMs": round(max(0.0, self.duration_ms), 3),
        }
        if self.call_id is not None:
            out["callId"] = self.call_id
        if self.failed:
            out["failed"] = True
        return out


@attrs.define(eq=False)
class SharedPortal:
    """A running portal, the store URL it serves, and its open handshake."""

    url: str
    portal: Portal
    ready: cf.Future[None]
    refs: int = 0


_lock = threading.RLock()  # a failed start may call back into acquire's hold
_portals: dict[str, SharedPortal] = {}
_atexit_registered = False


def canonical_url(url: str) -> str:
    """Local paths made absolute, so one file gets one portal whatever the spelling."""
    for prefix in ("sqlite:", "file:"):
        if url.startswith(prefix) and not url.startswith(f"{prefix}//") and url != prefix:
            return prefix + os.path.abspath(url.removeprefix(prefix))
    if url.endswith((".db", ".sqlite", ".sqlite3")) and ":" not in url:
        return "sqlite:" + os.path.abspath(url)
    if url == "memory":
        return "memory:"
    return url


def acquire(url: str) -> SharedPortal:
    """The process's portal for ``url``, started when needed; one more reference."""
    global _atexit_registered
    key = canonical_url(url)
    with _lock:
        shared = _portals.get(key)
        if shared is None or shared.portal.stopped.done():
            portal = Portal(host_opener(key), name=f"zidane-actors-portal {key}")
            shared = SharedPortal(key, portal, portal.start())
            _portals[key] = shared
            shared.ready.add_done_callback(functools.partial(_forget_failed, shared))
            if not _atexit_registered:
                atexit.register(close_all)
                _atexit_registered = True
        shared.refs += 1
        return shared


def held(shared: SharedPortal | None, owner: object) -> SharedPortal:
    """``owner``'s share of a portal; ``ActorClosed`` once ``owner`` released it."""
    if shared is None:
        raise ActorClosed(f"{owner!r} is closed")
    return shared


def _forget_failed(shared: SharedPortal, ready: cf.Future[None]) -> None:
    if ready.exception() is not None:
        with _lock:
            if _portals.get(shared.url) is shared:
                del _portals[shared.url]


def release(shared: SharedPortal) -> cf.Future[None] | None:
    """Drop a reference; with the last one the portal closes (answers its ``stopped``)."""
    with _lock:
        shared.refs -= 1
        if shared.refs > 0:
            return None
        if _portals.get(shared.url) is shared:
            del _portals[shared.url]
    return shared.portal.close()


def close_all() -> None:
    """Close every shared portal and wait for their threads (the ``atexit`` hook)."""
    with _lock:
        portals = list(_portals.values())
        _portals.clear()
    for shared in portals:
        shared.portal.close()
    for shared in portals:
        shared.portal.stopped.result()


class AsyncShare:
    """An integration object holding a share of a portal (``_shared``), and ``async with``.

    ``__aexit__`` awaits the subclass's ``aclose``; ``_let_go`` gives the
    share up once, answering the portal's ``stopped`` when it was the last.
    """

    _shared: SharedPortal | None

    if TYPE_CHECKING:

        async def aclose(self) -> None: ...

    def _open(self) -> SharedPortal:
        return held(self._shared, self)

    def _let_go(self) -> cf.Future[None] | None:
        shared, self._shared = self._shared, None
        return None if shared is None else release(shared)

    async def _let_go_async(self) -> None:
        """:meth:`_let_go`, then wait (without blocking the loop) for the portal it closed."""
        stopped = self._let_go()
        if stopped is not None:
            await wait_future(stopped)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Share(AsyncShare, ClosesOnExit):
    """:class:`AsyncShare` with ``with`` too (``__exit__`` calls the subclass's ``close``)."""

    def _let_go_blocking(self) -> None:
        """:meth:`_let_go`, then wait (blocking) for the portal it closed."""
        stopped = self._let_go()
        if stopped is not None:
            stopped.result()


class SessionLocks:
    """A trio lock per session, made on first use and forgotten with the session.

    Only ever called in the trio thread that owns the sessions.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[Session, trio.Lock] = weakref.WeakKeyDictionary()

    def __call__(self, session: Session) -> trio.Lock:
        lock = self._locks.get(session)
        if lock is None:
            lock = self._locks[session] = trio.Lock()
        return lock


def trace_context() -> dict[str, str] | None:
    """The active OpenTelemetry span's ids, as W3C hex (``None`` when there is none).

    Only when the application imported ``opentelemetry.trace``: without it,
    one dictionary lookup.
    """
    trace: Any = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}"}


def _with_extra(run: SessionRun, key: str, value: object) -> SessionRun:
    extra = dict(run.extra_fields or {})
    extra[key] = value
    return msgspec.structs.replace(run, extra_fields=ExtraFields(extra))


def with_trace(run: SessionRun, context: dict[str, str] | None) -> SessionRun:
    """``run`` carrying ``context`` under ``traceContext`` (an additive field of the record)."""
    return run if context is None else _with_extra(run, TRACE_CONTEXT_KEY, context)


def with_calls(run: SessionRun, calls: Sequence[CallTime]) -> SessionRun:
    """``run`` carrying ``calls`` after those it holds, in start order, under ``callTimes``."""
    if not calls:
        return run
    held = run.extra_fields.get(CALL_TIMES_KEY) if run.extra_fields else None
    timed = [*(held if isinstance(held, list) else ()), *(c.json() for c in calls)]
    timed.sort(key=lambda c: c["startedAt"] if isinstance(c, dict) else 0)
    return _with_extra(run, CALL_TIMES_KEY, timed)


def agent_of(runs: Sequence[SessionRun]) -> str | None:
    """The agent a write's runs name: its top-level run's, else the first one's."""
    named = [r for r in runs if r.agent is not None]
    top = next((r for r in named if r.parent_run_id is None), named[0] if named else None)
    return None if top is None or top.agent is None else top.agent.id


async def name_agent(session: Session, agent: str | None) -> None:
    """Give a session with no ``agentId`` the framework's agent as its own (trio side).

    Saved with the header at once; a name no store can keep (empty, a NUL)
    is left out: the label is the framework's, the conversation is stored anyway.
    """
    if not agent or session.agent_id is not None or not is_column_text(agent):
        return
    await session.set_agent_id(agent)
    await session.save_meta_keys(())
