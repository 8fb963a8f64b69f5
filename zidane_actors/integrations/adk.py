"""google-adk sessions stored as zidane sessions: ``ZidaneSessionService``.

``ZidaneSessionService`` is a ``google.adk.sessions.BaseSessionService`` over
any zidane store URL. Each ADK session is one zidane session whose turns are
its events: readable content (text, reasoning, function calls and responses
as ``tool_call``/``tool_result`` blocks, token usage) for the session
browser and the message converters, with the whole ADK event kept in the
turn's ``metadata.adkEvent`` (ADK's own JSON form), so an event reads back
equal to what was appended. Session-scoped state lives in the session's
metadata; ``app:`` and ``user:`` state, shared across sessions, live in one
zidane session per app and per user; ``temp:`` state is never stored.
Every service and integration of one store URL shares one portal (one trio
thread, one host, one store) per process, and any number of processes may
serve the same sessions: every call checks the store's revision, appends are
refused atomically when another writer took their place, and scope state is
merged by conditional read-modify-writes. Requires the ``adk`` extra.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

from google.adk.agents.invocation_context import InvocationContext
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession

from ..errors import ValidationError
from ..model import RunStatus, new_id, parse_json
from ..portal._thread import wait_future
from . import _shared
from ._adk_events import (
    _event_json,
    _events_of,
    _json_state,
    _readable,
    _session_id,
    _split_state,
)
from ._adk_runs import NO_FINAL
from ._adk_sessions import (
    _Append,
    _append,
    _create,
    _delete,
    _drop_closed_hosts,
    _end_invocation,
    _list,
    _read,
    _user_state,
)
from ._shared import trace_context

__all__ = ["DEFAULT_STORE", "ZidaneSessionService"]

DEFAULT_STORE: Final = _shared.DEFAULT_STORE

T = TypeVar("T")


class ZidaneSessionService(BaseSessionService, _shared.AsyncShare):
    """A google-adk session service kept in a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``postgres://…``, ``http(s)://…``; not ``file:DIR``, which holds a single
    session: :class:`~zidane_actors.errors.ValidationError`). Services and
    integrations of one URL share one portal; :meth:`aclose` (or ``async
    with``) releases this service's share, and the last release closes the
    store. Whatever is left open is closed at interpreter exit.

    As ADK's ``DatabaseSessionService``: ``append_event`` raises
    ``StaleSessionError`` when the session was appended to since it was
    read (by any process), creating an existing id raises
    ``AlreadyExistsError``, and appending to a missing session
    ``SessionNotFoundError``.
    """

    def __init__(self, *, store: str = DEFAULT_STORE) -> None:
        if store.startswith("file:"):
            raise ValidationError(
                "a file: store holds one zidane session; an ADK service keeps one per ADK"
                " session and more for app: and user: state (use sqlite:PATH, postgres://…"
                " or http(s)://…)",
                path="store",
            )
        self.store_url = store
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)
        self._append_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def __repr__(self) -> str:
        return f"ZidaneSessionService(store={self.store_url!r})"

    @property
    def plugin(self) -> BasePlugin:
        """Pass as ``Runner(..., plugins=[service.plugin])`` to record how invocations end.

        The events alone end a run with a final response or an error event;
        an invocation that raises (a model or tool exception) appends no
        event, so only this plugin records its run as ``error`` with the
        exception's type and text, and one that ends with neither as
        ``aborted``.
        """
        return _RunsPlugin(self)

    # -- lifetime ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this service's share of the portal (the last share closes the store)."""
        stopped = self._let_go()
        if stopped is not None:
            await wait_future(stopped)
            _drop_closed_hosts()

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(host, *args)`` in the portal's trio thread.

        The portal hands calls made together to the trio thread in one wave and
        their answers back in one delivery per wave. A call accepted by the
        trio side runs to its verdict even when its caller is cancelled
        meanwhile (then ``CancelledError`` is raised).
        """
        shared = self._open()
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared.portal.host, *args)

    # -- BaseSessionService -----------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        """A new session; ``app:`` and ``user:`` keys of ``state`` go to their scopes."""
        sid = session_id if session_id is not None else new_id()
        app, user, own = _split_state(_json_state(state or {}, "$.state"))
        now = time.time()
        answer = await self._call(_create, app_name, user_id, sid, own, app, user, now)
        if answer is None:
            raise AlreadyExistsError(f"Session with id {sid} already exists.")
        merged, marker = answer
        session = AdkSession(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=parse_json(merged),
            last_update_time=now,
        )
        session._storage_update_marker = marker
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        """The session with its merged state, and its events as ``config`` limits them."""
        recent = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        answer = await self._call(_read, app_name, user_id, session_id, recent, after)
        if answer is None:
            return None
        merged, events, last_update, marker = answer
        session = AdkSession(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=parse_json(merged),
            events=_events_of(events),
            last_update_time=last_update,
        )
        session._storage_update_marker = marker
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (one user's, or every user's), oldest update first, no events."""
        rows = await self._call(_list, app_name, user_id)
        sessions = [
            AdkSession(
                id=sid,
                app_name=app_name,
                user_id=user,
                state=parse_json(merged),
                last_update_time=last_update,
            )
            for sid, user, merged, last_update in rows
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (its ``app:``/``user:`` state stays)."""
        await self._call(_delete, app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, keys without the prefix."""
        state = await self._call(_user_state, app_name, user_id)
        return cast(dict[str, Any], parse_json(state))

    async def append_event(self, session: AdkSession, event: Event) -> Event:
        """Store ``event`` as a turn and apply its state delta, then append it to ``session``.

        A partial event is answered untouched, and so is an event equal to
        one the session stores (same id; ``session`` gets no second copy);
        ``temp:`` state reaches
        ``session.state`` but is never stored. Appends to one session from
        this service are serialized, so parallel branches sharing one
        ``Session`` object never see each other as stale.
        """
        self._open()  # a closed service refuses even an event it would not store
        if event.partial:
            return event
        key = _session_id(session.app_name, session.user_id, session.id)
        lock = self._append_locks.get(key)
        if lock is None:
            lock = self._append_locks[key] = asyncio.Lock()
        async with lock:
            self._apply_temp_state(session, event)
            event = self._trim_temp_delta_state(event)
            data = _event_json(event)
            role, blocks, usage, exact = _readable(data)
            delta = cast(dict[str, Any], data.get("actions", {}).get("stateDelta") or {})
            app, user, own = _split_state(delta)
            last_id = session.events[-1].id if session.events else None
            error = ": ".join(filter(None, (event.error_code, event.error_message))) or None
            final = event.author != "user" and event.is_final_response()
            append = _Append(
                data, exact, role, blocks, usage, own, app, user, final, error, trace_context()
            )
            marker = await self._call(
                _append,
                session.app_name,
                session.user_id,
                session.id,
                append,
                (session._storage_update_marker, session.last_update_time, last_id),
            )
            if marker is None:  # an equal event is stored already: nothing written
                return event
            session._storage_update_marker = marker
            session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)


class _RunsPlugin(BasePlugin):
    """``ZidaneSessionService.plugin``: ends the run records of invocations as they end."""

    def __init__(self, service: ZidaneSessionService) -> None:
        super().__init__(name="zidane_runs")
        self._service = weakref.ref(service)

    async def _end(self, context: InvocationContext, status: RunStatus, error: str | None) -> None:
        service = self._service()
        session = context.session
        if service is None or service._shared is None:
            return
        await service._call(
            _end_invocation,
            session.app_name,
            session.user_id,
            session.id,
            context.invocation_id,
            status,
            error,
            time.time_ns() // 1_000_000,
        )

    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        await self._end(invocation_context, "error", f"{type(error).__name__}: {error}")

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        await self._end(invocation_context, "aborted", NO_FINAL)
