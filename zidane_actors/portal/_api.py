"""Sync and asyncio handles over a :class:`Portal`: the host and the ``Session`` API.

Each handle type has one honest signature per method: the sync one blocks
its thread, the asyncio one is a coroutine that never blocks its loop. Both
forward to the same trio objects in the portal's thread; reads are snapshots
taken without a round trip (state only the session actor replaces, whole).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

from ..actors import HostStatistics, RunStats, Session, SessionHost, open_session_host
from ..actors._host import CrashHook
from ..errors import ActorCrashed
from ..model import (
    AppendTurnsOptions,
    JsonValue,
    RunErrorDetail,
    SessionArtifact,
    SessionArtifactInput,
    SessionData,
    SessionMessage,
    SessionRun,
    SessionRunAgent,
    SessionStatus,
    SessionTurn,
    UpdateRunOptions,
)
from ..stores import SessionStore
from ..stores._url import open_store_url
from ._thread import HostOpener, Portal, wait_future

__all__ = [
    "AsyncHost",
    "AsyncSession",
    "StoreSpec",
    "SyncHost",
    "SyncSession",
    "open_host_async",
    "start_host",
]

T = TypeVar("T")

StoreSpec = str | Callable[[], AbstractAsyncContextManager[SessionStore]]
"""A store URL (``sqlite:PATH``, ``memory:``, ``file:DIR``, ``postgres://…``,
``http(s)://…``) or a zero-argument opener run inside the portal's trio loop."""


def host_opener(
    store: StoreSpec,
    *,
    max_live_sessions: int = 10_000,
    idle_seconds: float = 300.0,
    on_crash: CrashHook | None = None,
    mailbox_size: int = 64,
    store_mailbox_size: int = 1024,
) -> HostOpener:
    """The opener a :class:`Portal` runs: the store, then a host over it."""
    if not isinstance(store, str) and not callable(store):
        raise TypeError("store must be a store URL or a zero-argument store opener")

    @asynccontextmanager
    async def open_host() -> AsyncIterator[SessionHost]:
        opened = open_store_url(store) if isinstance(store, str) else store()
        async with (
            opened as session_store,
            open_session_host(
                session_store,
                max_live_sessions=max_live_sessions,
                idle_seconds=idle_seconds,
                on_crash=on_crash,
                mailbox_size=mailbox_size,
                store_mailbox_size=store_mailbox_size,
            ) as host,
        ):
            yield host

    return open_host


class _SessionReads:
    """The synchronous snapshot reads both session handle types share."""

    def __init__(self, portal: Portal, session: Session) -> None:
        self._portal = portal
        self._session = session

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._session.id!r}>"

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def agent_id(self) -> str | None:
        return self._session.agent_id

    @property
    def created_at(self) -> int:
        return self._session.created_at

    @property
    def updated_at(self) -> int:
        return self._session.updated_at

    @property
    def status(self) -> SessionStatus:
        return self._session.status

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._session.metadata

    @property
    def turns(self) -> tuple[SessionTurn, ...]:
        return self._session.turns

    @property
    def runs(self) -> tuple[SessionRun, ...]:
        return self._session.runs

    @property
    def project_root(self) -> str | None:
        return self._session.project_root

    @property
    def is_empty(self) -> bool:
        return self._session.is_empty

    def to_json(self) -> SessionData:
        return self._session.to_json()

    @property
    def trio_session(self) -> Session:
        """The trio handle (only usable from inside the portal's loop, e.g. via ``call``)."""
        return self._session


class SyncSession(_SessionReads):
    """A :class:`~zidane_actors.actors.Session` for blocking code; see :func:`start_host`."""

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def append_turns(
        self, turns: Iterable[SessionTurn], options: AppendTurnsOptions | None = None
    ) -> None:
        self._call(self._session.append_turns, tuple(turns), options)

    def save(self) -> None:
        self._call(self._session.save)

    def save_meta_keys(self, keys: Iterable[str]) -> None:
        self._call(self._session.save_meta_keys, tuple(keys))

    def set_meta(self, key: str, value: Any, *, touch: bool = True) -> None:
        self._call(self._session.set_meta, key, value, touch=touch)

    def start_run(
        self,
        run_id: str,
        prompt: str | None = None,
        *,
        agent: SessionRunAgent | None = None,
        depth: int | None = None,
        label: str | None = None,
        parent_call_id: str | None = None,
        parent_run_id: str | None = None,
        resumed_from_run_id: str | None = None,
    ) -> SessionRun:
        return self._call(
            self._session.start_run,
            run_id,
            prompt,
            agent=agent,
            depth=depth,
            label=label,
            parent_call_id=parent_call_id,
            parent_run_id=parent_run_id,
            resumed_from_run_id=resumed_from_run_id,
        )

    def complete_run(self, run_id: str, stats: RunStats) -> SessionRun:
        return self._call(self._session.complete_run, run_id, stats)

    def abort_run(self, run_id: str, stats: RunStats | None = None) -> SessionRun:
        return self._call(self._session.abort_run, run_id, stats)

    def error_run(
        self,
        run_id: str,
        error: str,
        stats: RunStats | None = None,
        detail: RunErrorDetail | None = None,
    ) -> SessionRun:
        return self._call(self._session.error_run, run_id, error, stats, detail)

    def update_run(self, run: SessionRun, options: UpdateRunOptions | None = None) -> None:
        self._call(self._session.update_run, run, options)

    def update_status(self, status: SessionStatus) -> None:
        self._call(self._session.update_status, status)

    def set_turns(self, turns: Iterable[SessionTurn]) -> None:
        self._call(self._session.set_turns, tuple(turns))

    def set_runs(self, runs: Iterable[SessionRun]) -> None:
        self._call(self._session.set_runs, tuple(runs))

    def set_agent_id(self, agent_id: str) -> None:
        self._call(self._session.set_agent_id, agent_id)

    def generate_turn_id(self) -> str:
        return self._call(self._session.generate_turn_id)

    def add_artifact(
        self,
        input: SessionArtifactInput,
        *,
        run_id: str | None = None,
        turn_id: str | None = None,
    ) -> SessionArtifact | None:
        return self._call(self._session.add_artifact, input, run_id=run_id, turn_id=turn_id)

    def list_artifacts(
        self, kind: str | None = None, since: int | None = None, limit: int | None = None
    ) -> tuple[SessionArtifact, ...]:
        return self._call(self._session.list_artifacts, kind, since, limit)

    def heal_interrupted_tool_calls(self) -> bool:
        return self._call(self._session.heal_interrupted_tool_calls)

    def to_messages(self, *, provider: str | None = None) -> list[SessionMessage]:
        return self._call(self._session.to_messages, provider=provider)


class AsyncSession(_SessionReads):
    """A :class:`~zidane_actors.actors.Session` for asyncio code; see :func:`open_host_async`.

    A cancelled call is either withdrawn before the trio side accepted it
    (never applied) or, once accepted, awaited to its verdict before
    ``CancelledError`` is raised (applied). ``asyncio.shield`` it to keep
    the verdict.
    """

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await self._portal.call_async(functools.partial(fn, *args, **kwargs))

    async def append_turns(
        self, turns: Iterable[SessionTurn], options: AppendTurnsOptions | None = None
    ) -> None:
        await self._call(self._session.append_turns, tuple(turns), options)

    async def save(self) -> None:
        await self._call(self._session.save)

    async def save_meta_keys(self, keys: Iterable[str]) -> None:
        await self._call(self._session.save_meta_keys, tuple(keys))

    async def set_meta(self, key: str, value: Any, *, touch: bool = True) -> None:
        await self._call(self._session.set_meta, key, value, touch=touch)

    async def start_run(
        self,
        run_id: str,
        prompt: str | None = None,
        *,
        agent: SessionRunAgent | None = None,
        depth: int | None = None,
        label: str | None = None,
        parent_call_id: str | None = None,
        parent_run_id: str | None = None,
        resumed_from_run_id: str | None = None,
    ) -> SessionRun:
        return await self._call(
            self._session.start_run,
            run_id,
            prompt,
            agent=agent,
            depth=depth,
            label=label,
            parent_call_id=parent_call_id,
            parent_run_id=parent_run_id,
            resumed_from_run_id=resumed_from_run_id,
        )

    async def complete_run(self, run_id: str, stats: RunStats) -> SessionRun:
        return await self._call(self._session.complete_run, run_id, stats)

    async def abort_run(self, run_id: str, stats: RunStats | None = None) -> SessionRun:
        return await self._call(self._session.abort_run, run_id, stats)

    async def error_run(
        self,
        run_id: str,
        error: str,
        stats: RunStats | None = None,
        detail: RunErrorDetail | None = None,
    ) -> SessionRun:
        return await self._call(self._session.error_run, run_id, error, stats, detail)

    async def update_run(self, run: SessionRun, options: UpdateRunOptions | None = None) -> None:
        await self._call(self._session.update_run, run, options)

    async def update_status(self, status: SessionStatus) -> None:
        await self._call(self._session.update_status, status)

    async def set_turns(self, turns: Iterable[SessionTurn]) -> None:
        await self._call(self._session.set_turns, tuple(turns))

    async def set_runs(self, runs: Iterable[SessionRun]) -> None:
        await self._call(self._session.set_runs, tuple(runs))

    async def set_agent_id(self, agent_id: str) -> None:
        await self._call(self._session.set_agent_id, agent_id)

    async def generate_turn_id(self) -> str:
        return await self._call(self._session.generate_turn_id)

    async def add_artifact(
        self,
        input: SessionArtifactInput,
        *,
        run_id: str | None = None,
        turn_id: str | None = None,
    ) -> SessionArtifact | None:
        return await self._call(self._session.add_artifact, input, run_id=run_id, turn_id=turn_id)

    async def list_artifacts(
        self, kind: str | None = None, since: int | None = None, limit: int | None = None
    ) -> tuple[SessionArtifact, ...]:
        return await self._call(self._session.list_artifacts, kind, since, limit)

    async def heal_interrupted_tool_calls(self) -> bool:
        return await self._call(self._session.heal_interrupted_tool_calls)

    async def to_messages(self, *, provider: str | None = None) -> list[SessionMessage]:
        return await self._call(self._session.to_messages, provider=provider)


def _raise_unreported_crash(portal: Portal) -> None:
    crash = portal.unreported_crash()
    if crash is not None:
        raise ActorCrashed("the portal's trio thread crashed") from crash


class SyncHost:
    """A :class:`~zidane_actors.actors.SessionHost` for blocking code, from :func:`start_host`.

    A context manager: leaving it (or :meth:`close`) closes the host and the store.
    """

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create_session(
        self,
        *,
        id: str | None = None,
        agent_id: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        project_root: str | None = None,
    ) -> SyncSession:
        create = functools.partial(
            _host_create,
            self._portal,
            id=id,
            agent_id=agent_id,
            metadata=metadata,
            project_root=project_root,
        )
        return SyncSession(self._portal, self._portal.call(create))

    def load_session(self, session_id: str, *, persist_heal: bool = True) -> SyncSession | None:
        session = self._portal.call(_host_load, self._portal, session_id, persist_heal)
        return None if session is None else SyncSession(self._portal, session)

    def statistics(self) -> HostStatistics:
        return self._portal.call(_host_statistics, self._portal)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the portal's trio loop (e.g. ``host.call(store.list)``
        with ``store = host.trio_host.store``) and block until it is done."""
        return self._portal.call(fn, *args)

    @property
    def trio_host(self) -> SessionHost:
        """The trio host (only usable from inside the portal's loop, e.g. via :meth:`call`)."""
        return self._portal.host

    def close(self) -> None:
        """Close the host and the store and end the trio thread (idempotent).

        Raises :class:`ActorCrashed` when the trio thread crashed and no
        call reported it yet.
        """
        if self._portal.in_portal_thread():
            raise RuntimeError("a portal cannot be closed from its own trio thread")
        self._portal.close().result()
        _raise_unreported_crash(self._portal)


class AsyncHost:
    """A :class:`~zidane_actors.actors.SessionHost` for asyncio code (:func:`open_host_async`)."""

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    async def create_session(
        self,
        *,
        id: str | None = None,
        agent_id: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        project_root: str | None = None,
    ) -> AsyncSession:
        create = functools.partial(
            _host_create,
            self._portal,
            id=id,
            agent_id=agent_id,
            metadata=metadata,
            project_root=project_root,
        )
        return AsyncSession(self._portal, await self._portal.call_async(create))

    async def load_session(
        self, session_id: str, *, persist_heal: bool = True
    ) -> AsyncSession | None:
        session = await self._portal.call_async(_host_load, self._portal, session_id, persist_heal)
        return None if session is None else AsyncSession(self._portal, session)

    async def statistics(self) -> HostStatistics:
        return await self._portal.call_async(_host_statistics, self._portal)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the portal's trio loop, awaited without blocking."""
        return await self._portal.call_async(fn, *args)

    @property
    def trio_host(self) -> SessionHost:
        """The trio host (only usable from inside the portal's loop, e.g. via :meth:`call`)."""
        return self._portal.host

    async def aclose(self) -> None:
        """Close the host and the store and end the trio thread (idempotent).

        Waits for the close even when cancelled, then re-raises the cancel.
        Raises :class:`ActorCrashed` when the trio thread crashed and no call
        reported it yet.
        """
        await _close_async(self._portal)
        _raise_unreported_crash(self._portal)


async def _host_create(
    portal: Portal,
    *,
    id: str | None,
    agent_id: str | None,
    metadata: Mapping[str, JsonValue] | None,
    project_root: str | None,
) -> Session:
    return await portal.host.create_session(
        id=id, agent_id=agent_id, metadata=metadata, project_root=project_root
    )


async def _host_load(portal: Portal, session_id: str, persist_heal: bool) -> Session | None:
    return await portal.host.load_session(session_id, persist_heal=persist_heal)


async def _host_statistics(portal: Portal) -> HostStatistics:
    return portal.host.statistics()


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
