"""The session host: one actor per session id per process, evicted when idle.

The host owns a nursery for the session actors and a store actor in front of
the store. Actors start on a session's first mutation and are evicted when
idle (least recently used beyond ``max_live_sessions``, and after
``idle_seconds`` without a command); an evicted session's handle keeps its
state, answers reads, and revives an actor on its next mutation.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .._nursery import open_service_nursery
from ..errors import ActorClosed, ConflictError
from ..model import JsonValue, SessionData, SessionTurn, branches_of, validate_id
from ..stores._forks import fork_session
from ..stores._model_view import read_model_view
from ..stores._protocol import SessionStore, store_capabilities
from ..wire import PairingDrop
from ._actor import Actor
from ._branches import delete_archives, generated_session_id, stored_metadata
from ._build import _loaded_session_data, _new_session_data, _restored_session_data, _run_after
from ._commands import _Refresh, _SessionCommand
from ._session import Session
from ._store_actor import StoreActor, StoreActorStatistics, open_store_actor
from ._trace import host_op, refresh
from ._view import Clock, _wall_clock

__all__ = ["HostStatistics", "SessionHost", "open_session_host"]

_log = logging.getLogger("zidane_actors.host")

CrashHook = Callable[[str, BaseException], None]


@attrs.frozen
class HostStatistics:
    """A snapshot of a host: its actors, their turnover, crashes, and the store actor."""

    live_actors: int
    """Session actors running now."""
    known_sessions: int
    """Sessions some handle still refers to (live or evicted)."""
    started: int
    """Actors started (first start and revivals)."""
    evictions: int
    crashes: int
    store: StoreActorStatistics


@attrs.define
class _PendingLoad:
    done: trio.Event = attrs.field(factory=trio.Event)
    session: Session | None = None


class SessionHost:
    """Creates and loads sessions, running one actor per live session id.

    Build it with :func:`open_session_host`.
    """

    def __init__(
        self,
        store: StoreActor,
        nursery: trio.Nursery,
        *,
        max_live_sessions: int,
        idle_seconds: float,
        on_crash: CrashHook | None,
        mailbox_size: int,
        clock: Clock,
    ) -> None:
        self._store = store
        self._caps = store_capabilities(store)
        self._nursery = nursery
        self._max_live = max_live_sessions
        self._idle_seconds = idle_seconds
        self._on_crash = on_crash
        self._mailbox_size = mailbox_size
        self._clock = clock
        self._sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._live: OrderedDict[str, Session] = OrderedDict()
        self._loading: dict[str, _PendingLoad] = {}
        self._closed = False
        self._started = 0
        self._evictions = 0
        self._crashes = 0

    @property
    def store(self) -> StoreActor:
        """The store actor every session of this host writes through."""
        return self._store

    def statistics(self) -> HostStatistics:
        """Live actors, evictions, crashes and the store actor's counters."""
        return HostStatistics(
            live_actors=len(self._live),
            known_sessions=len(self._sessions),
            started=self._started,
            evictions=self._evictions,
            crashes=self._crashes,
            store=self._store.statistics(),
        )

    # -- sessions ------------------------------------------------------------

    @host_op("create_session")
    async def create_session(
        self,
        *,
        id: str | None = None,
        agent_id: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        project_root: str | None = None,
        _data: SessionData | None = None,
        on_pairing_drop: Callable[[PairingDrop], None] | None = None,
    ) -> Session:
        """A new session, its header saved to the store.

        An id this host or the store already holds raises :class:`ConflictError`.
        ``_data`` restores a session from its data instead, as the standalone
        :func:`~zidane_actors.actors.create_session` does (nothing written;
        its next save writes it whole); an id this host holds still conflicts.
        """
        self._check_open()
        if _data is not None:
            id = _data.id if isinstance(_data, SessionData) else None
        if id is not None:
            validate_id(id)
            # A load or create of this id under way decides first: wait for it.
            while (under_way := self._loading.get(id)) is not None:
                await under_way.done.wait()
                self._check_open()
            if id in self._sessions:
                raise ConflictError(f"session {id!r} is already open in this host")
        # Claim the id for the whole create: a concurrent create of it is a
        # conflict, and a concurrent load waits for this one and shares it.
        pending = _PendingLoad()
        if id is not None:
            self._loading[id] = pending
        try:
            pre = None
            if _data is not None:
                data, pre, rev = await _restored_session_data(
                    self._store, _data, on_pairing_drop=on_pairing_drop, caps=self._caps
                )
            else:
                data, rev = await _new_session_data(
                    self._store,
                    id=id,
                    agent_id=agent_id,
                    metadata=metadata,
                    project_root=project_root,
                    clock=self._clock,
                    caps=self._caps,
                )
            if data.id in self._sessions or (id is None and data.id in self._loading):
                raise ConflictError(f"session {data.id!r} is already open in this host")
            session = Session(
                data,
                store=self._store,
                runner=self,
                clock=self._clock,
                caps=self._caps,
                rev=rev,
                pre=pre,
            )
            self._sessions[data.id] = session
            pending.session = session
            return session
        finally:
            if id is not None:
                del self._loading[id]
                pending.done.set()

    @host_op("load_session")
    async def load_session(
        self,
        session_id: str,
        *,
        persist_heal: bool = True,
        on_pairing_drop: Callable[[PairingDrop], None] | None = None,
        clock: Clock | None = None,
    ) -> Session | None:
        """The session with this id, or ``None`` when the store has none.

        A session already open in this host is returned as the same handle
        (same actor); on a versioned store its ``rev`` is checked first and,
        when another writer moved it, memory is refreshed through the
        session's actor (after the commands queued before), or ``None`` is
        answered when the session was deleted. Otherwise it is read from the
        store with the load-time heals of :func:`load_session`, judging a
        stored run marker's staleness at ``clock()`` (default: the host's
        clock). Concurrent loads of one id share one read.
        """
        validate_id(session_id)
        while True:
            self._check_open()
            existing = self._sessions.get(session_id)
            if existing is not None:
                if await existing._sync(persist_demotion=persist_heal):
                    return existing
                self._forget(existing)
                return None
            pending = self._loading.get(session_id)
            if pending is None:
                break
            # Its read may predate a write this call must see: check the rev again.
            await pending.done.wait()
        pending = _PendingLoad()
        self._loading[session_id] = pending
        try:
            loaded = await _loaded_session_data(
                self._store,
                session_id,
                persist_heal=persist_heal,
                on_pairing_drop=on_pairing_drop,
                clock=clock or self._clock,
                caps=self._caps,
            )
            if loaded is None:
                return None
            data, pre, rev, held = loaded
            session = Session(
                data,
                store=self._store,
                runner=self,
                clock=self._clock,
                pre=pre,
                caps=self._caps,
                rev=rev,
                held=held,
            )
            self._sessions[session_id] = session
            pending.session = session
            return session
        finally:
            del self._loading[session_id]
            pending.done.set()

    @host_op("load_model_view")
    async def load_model_view(self, session_id: str) -> list[SessionTurn] | None:
        """The turns the model sees of the stored session, or ``None`` when the store has none.

        Exactly :func:`~zidane_actors.model.model_view` of the turns the store
        holds, read from the latest compaction on (the store's
        ``load_model_view``: the turns a compaction summarized are not read;
        a store without it is loaded whole). Nothing is loaded into this host
        and no heal is applied; it runs after the writes queued before it.
        ``Session.to_messages`` is this view as wire messages, for an open session.
        """
        self._check_open()
        validate_id(session_id)
        return await read_model_view(self._store, session_id, self._caps)

    @host_op("fork_session")
    async def fork_session(
        self, source_id: str, *, at: str | None = None, id: str | None = None
    ) -> Session:
        """A new session: the fork of ``source_id`` through turn ``at`` (all turns by default).

        The fork is :func:`~zidane_actors.model.fork_document` of the source as
        the store holds it once the writes this host queued for it landed (a
        handle's unsaved changes are not in it), made in
        one step of the store (shared history on the SQL stores, a copy on the
        others); its metadata's ``forkedFrom`` says where it came from. ``id``
        defaults to one the store generates. Raises :class:`SessionNotFoundError`
        without a source, :class:`ConflictError` when ``id`` is taken, and a
        :class:`ValidationError` at ``$.at`` when ``at`` names no turn.
        """
        self._check_open()
        validate_id(source_id)
        if id is None:
            id = await generated_session_id(self._store, self._caps)
        validate_id(id)
        if id in self._sessions or id in self._loading:
            raise ConflictError(f"session {id!r} is already open in this host")
        held = self._sessions.get(source_id)
        if held is not None and not held._idle():  # its queued writes land first
            await held._call(_Refresh())
        await fork_session(self._store, source_id, id, at=at, created_at=self._clock())
        session = await self.load_session(id)
        if session is None:  # deleted by another writer at once
            raise ConflictError(f"the fork {id!r} was deleted as it was made")
        return session

    @host_op("delete_session")
    async def delete_session(self, session_id: str) -> None:
        """Delete a session from the store and forget its handle in this host.

        Its actor is closed first (the command in hand finishes, queued ones
        fail with ``ActorClosed``) and its writes land before the delete, so a
        later ``load_session`` answers ``None`` and ``create_session`` may
        reuse the id. A handle kept elsewhere must not be written to again.
        The archives of the branches it left (:attr:`Session.branches`) are
        deleted after it; its forks stay whole.
        """
        self._check_open()
        validate_id(session_id)
        while (under_way := self._loading.get(session_id)) is not None:
            await under_way.done.wait()
            self._check_open()
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._live.pop(session_id, None)
            actor = session._actor
            if actor is not None:
                actor.close()
                await actor.wait_stopped()
        metadata = await stored_metadata(self._store, session_id)
        await self._store.delete(session_id)
        if metadata is not None:
            await delete_archives(self._store, session_id, branches_of(metadata))

    # -- the runner protocol -------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ActorClosed("the session host is closed")

    def check_open(self) -> None:
        """Raise ``ActorClosed`` once the host is closed."""
        self._check_open()

    def actor_for(self, session: Session) -> Actor[_SessionCommand[Any]]:
        """The session's running actor, started (or revived) when it has none."""
        self._check_open()
        actor = session._live_actor()
        if actor is None:
            previous = session._actor
            actor = session._new_actor(
                mailbox_size=self._mailbox_size, on_crash=self.crashed, on_idle=self._went_idle
            )
            self._nursery.start_soon(_run_after, previous, actor)
            self._started += 1
            if self._sessions.get(session.id) is not session:
                self._sessions[session.id] = session
        self._live[session.id] = session
        self._live.move_to_end(session.id)
        if len(self._live) > self._max_live:
            self._evict_lru(keep=session)
        return actor

    def direct_store(self, session: Session) -> StoreActor:
        """The store actor, for store writes that skip an idle session's actor."""
        self._check_open()
        return self._store

    def _went_idle(self, session: Session) -> None:
        # Busy actors cannot be evicted when a new one starts; trim once they idle.
        if len(self._live) > self._max_live:
            self._evict_lru(keep=None)

    def _evict(self, session: Session) -> None:
        actor = session._live_actor()
        self._live.pop(session.id, None)
        if actor is not None:
            actor.close()
            self._evictions += 1

    def _evict_lru(self, *, keep: Session | None) -> None:
        # Oldest first; busy actors are skipped (they are trimmed once they idle),
        # so a touch past the cap costs O(1) while the oldest actors are idle.
        excess = len(self._live) - self._max_live
        victims: list[Session] = []
        for candidate in self._live.values():
            if len(victims) >= excess:
                break
            if candidate is not keep and candidate._idle():
                victims.append(candidate)
        for victim in victims:
            self._evict(victim)

    def _store_changed(self, session_id: str, rev: int) -> None:
        """A store's change notification: refresh that session soon if this host holds it.

        A hint only (``load_session`` still checks the rev): a stale or own
        change, or one for a session not held, is ignored.
        """
        session = self._sessions.get(session_id)
        if self._closed or session is None or session._rev is None or rev == session._rev:
            return
        if rev and rev < session._rev:
            return  # older than what memory reflects
        self._nursery.start_soon(self._refresh, session)

    def _store_resynced(self) -> None:
        """The store's change feed reconnected: changes made meanwhile were never told.

        Every held session's rev is checked again (and its memory refreshed when
        another writer moved it), so a held view is stale at most for the time
        the feed was down.
        """
        if self._closed:
            return
        for session in list(self._sessions.values()):
            if session._rev is not None:
                self._nursery.start_soon(self._refresh, session)

    async def _refresh(self, session: Session) -> None:
        try:
            if not await session._sync():
                self._forget(session)
        except Exception:  # a hint: a failed refresh leaves the rev check to load_session
            _log.debug("refresh of session %r after a change notification failed", session.id)

    def _forget(self, session: Session) -> None:
        """Drop a session the store no longer holds from the cache (its handle stays usable)."""
        self._evict(session)
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]

    def crashed(self, session: Session, exc: BaseException) -> None:
        """Count a crashed session, forget it, and call the ``on_crash`` hook."""
        self._crashes += 1
        self._live.pop(session.id, None)
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        if self._on_crash is not None:
            try:
                self._on_crash(session.id, exc)
            except Exception:
                _log.exception("on_crash hook failed for session %r", session.id)

    async def _reap(self) -> None:
        interval = max(self._idle_seconds / 4, 0.01)
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for session in list(self._live.values()):
                if session._idle() and now - session._last_active >= self._idle_seconds:
                    self._evict(session)

    def _close(self) -> None:
        self._closed = True
        for session in list(self._live.values()):
            actor = session._live_actor()
            if actor is not None:
                actor.close()
        self._live.clear()


@asynccontextmanager
async def open_session_host(
    store: SessionStore,
    *,
    max_live_sessions: int = 10_000,
    idle_seconds: float = 300.0,
    on_crash: CrashHook | None = None,
    mailbox_size: int = 64,
    store_mailbox_size: int = 1024,
    max_batch: int | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[SessionHost]:
    """Run a :class:`SessionHost` over ``store`` for the ``async with`` body.

    ``store`` is wrapped in a store actor (group commit when it batches). A
    store with ``subscribe_changes`` (PostgreSQL opened with ``listen=True``)
    tells the host of other writers' changes, and held sessions are
    refreshed right away. On exit every actor finishes the command in hand,
    fails its queue with ``ActorClosed``, and stops; the store itself is left
    open.
    """
    if max_live_sessions < 1 or idle_seconds <= 0:
        raise ValueError("max_live_sessions must be >= 1 and idle_seconds > 0")
    async with (
        open_store_actor(store, mailbox_size=store_mailbox_size, max_batch=max_batch) as actor,
        open_service_nursery() as nursery,
    ):
        refresh()  # trace and measure this host's sessions when the application set a provider
        host = SessionHost(
            actor,
            nursery,
            max_live_sessions=max_live_sessions,
            idle_seconds=idle_seconds,
            on_crash=on_crash,
            mailbox_size=mailbox_size,
            clock=clock or _wall_clock,
        )
        reaper = trio.CancelScope()

        async def reap() -> None:
            with reaper:
                await host._reap()

        nursery.start_soon(reap)
        subscribe = getattr(store, "subscribe_changes", None)
        unsubscribe = (
            subscribe(host._store_changed, on_resync=host._store_resynced)
            if callable(subscribe)
            else None
        )
        try:
            yield host
        finally:
            if unsubscribe is not None:
                unsubscribe()
            host._close()
            reaper.cancel()
