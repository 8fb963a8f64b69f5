"""Sync and asyncio handles over a :class:`Portal`, generated from one description.

``_SessionAPI`` and ``_HostAPI`` below are that description: one line per
public member of the trio :class:`Session` and :class:`SessionHost`, saying
how it crosses to the trio thread. Each line is a descriptor built from the
trio member itself, so the handles have its parameters (and its types, for
the type checker) and cannot drift from it; the door (blocking or asyncio)
is the handle class's:

* ``_Read``: a snapshot read in the caller's thread, no round trip (state the
  session actor replaces whole, so a read sees one consistent version).
* ``_Local``: a plain function of the session run in the caller's thread (a read).
* ``_Call``: a coroutine method, run on a worker task in the trio loop; blocking
  on a ``SyncSession``, a coroutine on an ``AsyncSession``.
* ``_CallSoon``: a plain method run in the trio loop, without a task.
* ``_Subscribe``: a listener subscription, posted without waiting; the
  unsubscribe it answers is posted too (calls from one thread run in order).
* ``_Opens`` / ``_MaybeOpens``: a host call whose ``Session`` answer comes
  back as a handle of the caller's door.

Members with no bridge are in ``TRIO_ONLY`` with the reason; a test checks
that every public member of the trio API is one or the other.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from types import MethodType, TracebackType
from typing import (
    Any,
    ClassVar,
    Concatenate,
    Final,
    Generic,
    ParamSpec,
    Self,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from ..actors import (
    Session,
    SessionHost,
    delete_extension_session_state,
    get_extension_session_state,
    open_session_host,
    set_extension_session_state,
)
from ..actors._host import CrashHook
from ..errors import ActorClosed, ActorCrashed
from ..stores import SessionStore
from ..stores._url import open_store_url
from ._thread import HostOpener, Portal, wait_future

__all__ = [
    "TRIO_ONLY",
    "AsyncHost",
    "AsyncSession",
    "StoreSpec",
    "SyncHost",
    "SyncSession",
    "open_host_async",
    "start_host",
]

Obj = TypeVar("Obj")
P = ParamSpec("P")
T = TypeVar("T")

StoreSpec = str | Callable[[], AbstractAsyncContextManager[SessionStore]]
"""A store URL (``sqlite:PATH``, ``memory:``, ``file:DIR``, ``postgres://…``,
``http(s)://…``) or a zero-argument opener run inside the portal's trio loop."""


class _HostOptions(TypedDict, total=False):
    """What a portal passes on to :func:`open_session_host` (its defaults where absent)."""

    max_live_sessions: int
    idle_seconds: float
    on_crash: CrashHook | None
    mailbox_size: int
    store_mailbox_size: int


def host_opener(store: StoreSpec, **options: Unpack[_HostOptions]) -> HostOpener:
    """The opener a :class:`Portal` runs: the store, then a host over it."""
    if not isinstance(store, str) and not callable(store):
        raise TypeError("store must be a store URL or a zero-argument store opener")

    @asynccontextmanager
    async def open_host() -> AsyncIterator[SessionHost]:
        opened = open_store_url(store) if isinstance(store, str) else store()
        async with (
            opened as session_store,
            open_session_host(session_store, **options) as host,
        ):
            yield host

    return open_host


# -- how a member crosses ------------------------------------------------------------------


class _Handle:
    """What every handle holds: its portal and (for sessions) its trio object."""

    __slots__ = ("_portal",)
    _asyncio: ClassVar[bool]

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    @property
    def _target(self) -> Any:
        raise NotImplementedError


def _like(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` with ``fn``'s name, docs and signature (``inspect`` follows ``__wrapped__``)."""
    return functools.update_wrapper(wrapper, fn)


def _frozen_positions(
    fn: Callable[..., Any], names: tuple[str, ...]
) -> tuple[tuple[int, str], ...]:
    params = list(inspect.signature(fn).parameters)[1:]
    return tuple((params.index(name), name) for name in names)


def _freeze(
    frozen: tuple[tuple[int, str], ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Iterables taken in the caller's thread: the trio side never runs the caller's iterator."""
    for position, name in frozen:
        if position < len(args):
            args = (*args[:position], tuple(args[position]), *args[position + 1 :])
        elif name in kwargs:
            kwargs[name] = tuple(kwargs[name])
    return args, kwargs


class _Read(Generic[Obj, T]):
    """A property of the trio object, read in the caller's thread."""

    __slots__ = ("_get",)

    def __init__(self, prop: Callable[[Obj], T]) -> None:
        get = prop.fget if isinstance(prop, property) else prop
        assert get is not None
        self._get: Callable[[Any], T] = get

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: _Handle, owner: type[Any]) -> T: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        if obj is None:
            return self
        return self._get(obj._target)


class _Local(Generic[Obj, P, T]):
    """A plain function of the trio object, run in the caller's thread (a read)."""

    __slots__ = ("_local",)

    def __init__(self, fn: Callable[Concatenate[Obj, P], T]) -> None:
        def local(handle: _Handle, /, *args: Any, **kwargs: Any) -> Any:
            return fn(handle._target, *args, **kwargs)

        self._local = _like(local, fn)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: _Handle, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        return self if obj is None else MethodType(self._local, obj)


class _Crossing:
    """Both doors of one member: a blocking function and a coroutine function."""

    __slots__ = ("_blocking", "_coroutine")

    _blocking: Callable[..., Any]
    _coroutine: Callable[..., Any]

    def _bind(self, obj: _Handle | None) -> Any:
        if obj is None:
            return self
        return MethodType(self._coroutine if obj._asyncio else self._blocking, obj)


class _Call(_Crossing, Generic[Obj, P, T]):
    """A coroutine method run on a worker in the trio loop."""

    __slots__ = ()

    def __init__(
        self,
        fn: Callable[Concatenate[Obj, P], Awaitable[T]],
        *,
        inline: bool = False,
        freeze: tuple[str, ...] = (),
    ) -> None:
        frozen = _frozen_positions(fn, freeze)

        def blocking(handle: _Handle, /, *args: Any, **kwargs: Any) -> Any:
            if frozen:
                args, kwargs = _freeze(frozen, args, kwargs)
            call = handle._portal._call_blocking
            return call(fn, (handle._target, *args), kwargs, inline=inline)

        async def coroutine(handle: _Handle, /, *args: Any, **kwargs: Any) -> Any:
            if frozen:
                args, kwargs = _freeze(frozen, args, kwargs)
            call = handle._portal._call_async
            return await call(fn, (handle._target, *args), kwargs, inline=inline)

        self._blocking = _like(blocking, fn)
        self._coroutine = _like(coroutine, fn)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: SyncSession | SyncHost, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, obj: AsyncSession | AsyncHost, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        return self._bind(obj)


class _CallSoon(_Call[Obj, P, T]):
    """A plain method run in the trio loop, in the drain that picks it up (no task)."""

    __slots__ = ()

    def __init__(self, fn: Callable[Concatenate[Obj, P], T]) -> None:
        super().__init__(fn, inline=True)  # type: ignore[arg-type]


class _Subscribe(Generic[Obj, P]):
    """A listener subscription, posted without waiting; so is its unsubscribe.

    The listener runs in the portal's trio thread.
    """

    __slots__ = ("_subscribe",)

    def __init__(self, fn: Callable[Concatenate[Obj, P], Callable[[], None]]) -> None:
        def subscribe(handle: _Handle, /, *args: Any, **kwargs: Any) -> Callable[[], None]:
            portal, target = handle._portal, handle._target
            subscribed: list[Callable[[], None]] = []

            def run() -> None:
                subscribed.append(fn(target, *args, **kwargs))

            def unsubscribe_in_loop() -> None:
                while subscribed:
                    subscribed.pop()()

            def unsubscribe() -> None:
                with suppress(ActorClosed, ActorCrashed):  # closed: nothing is called any more
                    portal.post(unsubscribe_in_loop)

            portal.post(run)
            return unsubscribe

        self._subscribe = _like(subscribe, fn)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: _Handle, owner: type[Any]) -> Callable[P, Callable[[], None]]: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        return self if obj is None else MethodType(self._subscribe, obj)


class _Opens(_Crossing, Generic[P]):
    """A host call answering a ``Session``, handed back as a handle of the caller's door."""

    __slots__ = ()

    def __init__(
        self, fn: Callable[Concatenate[SessionHost, P], Awaitable[Session | None]]
    ) -> None:
        def blocking(host: _Handle, /, *args: Any, **kwargs: Any) -> Any:
            portal = host._portal
            session = portal._call_blocking(fn, (host._target, *args), kwargs, inline=False)
            return None if session is None else SyncSession(portal, session)

        async def coroutine(host: _Handle, /, *args: Any, **kwargs: Any) -> Any:
            portal = host._portal
            session = await portal._call_async(fn, (host._target, *args), kwargs, inline=False)
            return None if session is None else AsyncSession(portal, session)

        self._blocking = _like(blocking, fn)
        self._coroutine = _like(coroutine, fn)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: SyncHost, owner: type[Any]) -> Callable[P, SyncSession]: ...
    @overload
    def __get__(
        self, obj: AsyncHost, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, AsyncSession]]: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        return self._bind(obj)


class _MaybeOpens(_Opens[P]):
    """:class:`_Opens` for a call that may answer ``None``."""

    __slots__ = ()

    @overload  # type: ignore[override]
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: SyncHost, owner: type[Any]) -> Callable[P, SyncSession | None]: ...
    @overload
    def __get__(
        self, obj: AsyncHost, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, AsyncSession | None]]: ...
    def __get__(self, obj: _Handle | None, owner: type[Any]) -> Any:
        return self._bind(obj)


# -- the one description -------------------------------------------------------------------

TRIO_ONLY: Final[Mapping[str, str]] = {
    **{
        f"{name}_nowait": "answers a trio Reply; a handle's call is queued without a task "
        "already (from asyncio, wrap it in a task to go on without waiting)"
        for name in (
            "append_turns",
            "set_meta",
            "start_run",
            "complete_run",
            "abort_run",
            "error_run",
            "update_run",
            "update_status",
            "set_turns",
            "set_runs",
            "set_agent_id",
        )
    },
    "actor_for": "the runner protocol sessions use inside the trio loop",
    "direct_store": "the runner protocol sessions use inside the trio loop",
    "crashed": "the runner protocol sessions use inside the trio loop",
}
"""Public members of ``Session``/``SessionHost`` the handles do not have, and why."""


class _SessionAPI(_Handle):
    """Every member of :class:`~zidane_actors.actors.Session`, for both doors.

    Listeners (``on_meta``, ``on_saved``) and callbacks (``to_messages``'s)
    run in the portal's trio thread.
    """

    __slots__ = ("_session",)

    def __init__(self, portal: Portal, session: Session) -> None:
        super().__init__(portal)
        self._session = session

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._session.id!r}>"

    @property
    def _target(self) -> Session:
        return self._session

    @property
    def trio_session(self) -> Session:
        """The trio handle (only usable from inside the portal's loop, e.g. via ``call``)."""
        return self._session

    id = _Read(Session.id)
    agent_id = _Read(Session.agent_id)
    created_at = _Read(Session.created_at)
    updated_at = _Read(Session.updated_at)
    status = _Read(Session.status)
    metadata = _Read(Session.metadata)
    turns = _Read(Session.turns)
    runs = _Read(Session.runs)
    rev = _Read(Session.rev)
    branches = _Read(Session.branches)
    project_root = _Read(Session.project_root)
    is_empty = _Read(Session.is_empty)
    store = _Read(Session.store)  # the host's store actor: a trio object
    to_json = _Local(Session.to_json)

    on_meta = _Subscribe(Session.on_meta)
    on_saved = _Subscribe(Session.on_saved)

    append_turns = _Call(Session.append_turns, freeze=("turns",))
    save = _Call(Session.save)
    save_meta_keys = _Call(Session.save_meta_keys, freeze=("keys",))
    set_meta = _Call(Session.set_meta)
    start_run = _Call(Session.start_run)
    complete_run = _Call(Session.complete_run)
    abort_run = _Call(Session.abort_run)
    error_run = _Call(Session.error_run)
    update_run = _Call(Session.update_run)
    update_status = _Call(Session.update_status)
    set_turns = _Call(Session.set_turns, freeze=("turns",))
    set_runs = _Call(Session.set_runs, freeze=("runs",))
    set_agent_id = _Call(Session.set_agent_id)
    generate_turn_id = _Call(Session.generate_turn_id)
    add_artifact = _Call(Session.add_artifact)
    list_artifacts = _Call(Session.list_artifacts)
    heal_interrupted_tool_calls = _Call(Session.heal_interrupted_tool_calls)
    mutate_history = _Call(Session.mutate_history)  # ``mutate`` runs in the trio thread
    compact = _Call(Session.compact, freeze=("summary",))
    branch = _Call(Session.branch)
    restore_branch = _Call(Session.restore_branch)
    to_messages = _Call(Session.to_messages)

    # The extension-state functions, as methods (the session is the handle's).
    get_extension_state = _Local(get_extension_session_state)
    set_extension_state = _Call(set_extension_session_state)
    delete_extension_state = _Call(delete_extension_session_state)


class _HostAPI(_Handle):
    """Every member of :class:`~zidane_actors.actors.SessionHost`, for both doors."""

    __slots__ = ()

    @property
    def _target(self) -> SessionHost:
        host = self._portal._host
        if host is None:
            raise self._portal._closed_error()
        return host

    @property
    def trio_host(self) -> SessionHost:
        """The trio host (only usable from inside the portal's loop, e.g. via ``call``)."""
        return self._portal.host

    store = _Read(SessionHost.store)  # the store actor: a trio object
    statistics = _CallSoon(SessionHost.statistics)
    check_open = _CallSoon(SessionHost.check_open)
    create_session = _Opens(SessionHost.create_session)
    load_session = _MaybeOpens(SessionHost.load_session)
    fork_session = _Opens(SessionHost.fork_session)
    load_model_view = _Call(SessionHost.load_model_view)
    delete_session = _Call(SessionHost.delete_session)


# -- the two doors ---------------------------------------------------------------------------


class SyncSession(_SessionAPI):
    """A :class:`~zidane_actors.actors.Session` for blocking code; see :func:`start_host`."""

    __slots__ = ()
    _asyncio = False


class AsyncSession(_SessionAPI):
    """A :class:`~zidane_actors.actors.Session` for asyncio code; see :func:`open_host_async`.

    A cancelled call is either withdrawn before the trio side accepted it
    (never applied) or, once accepted, awaited to its verdict before
    ``CancelledError`` is raised (applied). ``asyncio.shield`` it to keep
    the verdict.
    """

    __slots__ = ()
    _asyncio = True


def _raise_unreported_crash(portal: Portal) -> None:
    crash = portal.unreported_crash()
    if crash is not None:
        raise ActorCrashed("the portal's trio thread crashed") from crash


class ClosesOnExit:
    """``with`` for an object with a blocking ``close()``: leaving the block calls it."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncHost(_HostAPI, ClosesOnExit):
    """A :class:`~zidane_actors.actors.SessionHost` for blocking code, from :func:`start_host`.

    A context manager: leaving it (or :meth:`close`) closes the host and the store.
    """

    __slots__ = ()
    _asyncio = False

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the portal's trio loop (e.g. ``host.call(store.list)``
        with ``store = host.trio_host.store``) and block until it is done."""
        return self._portal.call(fn, *args)

    def close(self) -> None:
        """Close the host and the store and end the trio thread (idempotent).

        Raises :class:`ActorCrashed` when the trio thread crashed and no
        call reported it yet.
        """
        if self._portal.in_portal_thread():
            raise RuntimeError("a portal cannot be closed from its own trio thread")
        self._portal.close().result()
        _raise_unreported_crash(self._portal)


class AsyncHost(_HostAPI):
    """A :class:`~zidane_actors.actors.SessionHost` for asyncio code (:func:`open_host_async`)."""

    __slots__ = ()
    _asyncio = True

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the portal's trio loop, awaited without blocking."""
        return await self._portal.call_async(fn, *args)

    async def aclose(self) -> None:
        """Close the host and the store and end the trio thread (idempotent).

        Waits for the close even when cancelled, then re-raises the cancel.
        Raises :class:`ActorCrashed` when the trio thread crashed and no call
        reported it yet.
        """
        await _close_async(self._portal)
        _raise_unreported_crash(self._portal)


async def _close_async(portal: Portal) -> None:
    stopped = portal.close()
    cancelled: asyncio.CancelledError | None = None
    while not stopped.done():
        try:
            await wait_future(stopped)
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        raise cancelled


def start_host(
    store: StoreSpec,
    *,
    max_live_sessions: int = 10_000,
    idle_seconds: float = 300.0,
    on_crash: CrashHook | None = None,
    mailbox_size: int = 64,
    store_mailbox_size: int = 1024,
) -> SyncHost:
    """Open ``store`` and a session host on a trio loop in a background thread.

    Blocks until the host is open (an opening error, such as a bad store
    URL's :class:`ValidationError`, is raised here). Use it as a context
    manager, or call :meth:`SyncHost.close`. ``on_crash`` runs in the
    portal's trio thread.
    """
    portal = Portal(
        host_opener(
            store,
            max_live_sessions=max_live_sessions,
            idle_seconds=idle_seconds,
            on_crash=on_crash,
            mailbox_size=mailbox_size,
            store_mailbox_size=store_mailbox_size,
        )
    )
    portal.start().result()
    return SyncHost(portal)


@asynccontextmanager
async def open_host_async(
    store: StoreSpec,
    *,
    max_live_sessions: int = 10_000,
    idle_seconds: float = 300.0,
    on_crash: CrashHook | None = None,
    mailbox_size: int = 64,
    store_mailbox_size: int = 1024,
) -> AsyncIterator[AsyncHost]:
    """``async with open_host_async(url) as host``: :func:`start_host` for asyncio code.

    Opening and closing are awaited without blocking the asyncio loop; a
    cancel while opening closes what was opened before it propagates.
    """
    portal = Portal(
        host_opener(
            store,
            max_live_sessions=max_live_sessions,
            idle_seconds=idle_seconds,
            on_crash=on_crash,
            mailbox_size=mailbox_size,
            store_mailbox_size=store_mailbox_size,
        )
    )
    host = AsyncHost(portal)
    try:
        await wait_future(portal.start())
    except BaseException:
        await _close_async(portal)
        raise
    try:
        yield host
    finally:
        await host.aclose()
