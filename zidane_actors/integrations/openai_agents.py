"""openai-agents sessions stored as zidane sessions: ``ZidaneSession``.

``ZidaneSession`` implements openai-agents' ``Session`` protocol over any
zidane store URL. Items are stored as neutral zidane turns through the
Responses converters (see :mod:`zidane_actors.integrations._responses`), so
the conversation is ordinary zidane data: loadable with ``load_session``,
listable, exportable, convertible for Anthropic. Every ``ZidaneSession`` of
one store URL shares one portal (one trio thread, one host, one store) per
process. Requires the ``openai-agents`` extra.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self, TypeVar, cast

import trio
from agents.items import TResponseInputItem
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ..actors import Session
from ..errors import ActorClosed, ConflictError
from ..model import SessionHistory, SessionTurn, validate_id
from ..portal._thread import wait_future
from . import _shared
from ._responses import (
    group_items,
    items_of_turn,
    turn_without_last_item,
    with_native_metadata,
)

__all__ = ["DEFAULT_STORE", "ZidaneSession"]

DEFAULT_STORE: Final = "sqlite:zidane-sessions.db"

T = TypeVar("T")

_locks: weakref.WeakKeyDictionary[Session, trio.Lock] = weakref.WeakKeyDictionary()


def _lock_for(session: Session) -> trio.Lock:
    # Only ever called in the trio thread that owns ``session``.
    lock = _locks.get(session)
    if lock is None:
        lock = _locks[session] = trio.Lock()
    return lock


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ZidaneSession:
    """An openai-agents ``Session`` kept in a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``file:DIR``, ``postgres://…``, ``http(s)://…``). Sessions of one URL share
    one portal; :meth:`close` (or ``with``/``async with``) releases this
    session's share, and the last release closes the store. Whatever is left
    open is closed at interpreter exit.

    A cancelled call follows the portal's rule: withdrawn before the trio side
    accepted it, else completed (applied) before ``CancelledError`` is raised.
    Within one process, all writers of a session id should go through the
    same store URL (they then share one session actor).
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        *,
        store: str = DEFAULT_STORE,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        validate_id(session_id)
        self.session_id = session_id
        self.store_url = store
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)
        self._handle: Session | None = None

    def __repr__(self) -> str:
        return f"ZidaneSession({self.session_id!r}, store={self.store_url!r})"

    # -- the Session protocol ---------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items (all when ``None``, or the settings' limit), oldest first.

        ``0`` answers none and a negative limit all, as openai-agents' SQLite session does.
        """
        resolved = resolve_session_limit(limit, self.session_settings)
        return await self._call(self._get_items, resolved)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one store write (all or nothing).

        An item the Responses converters cannot carry raises ``WireFormatError``
        (path ``$[i]…`` into ``items``) and nothing is written.
        """
        if not items:
            return
        groups = group_items(cast(list[dict[str, Any]], items))
        await self._call(self._add_items, groups)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and answer the most recent item (``None`` when there is none)."""
        return await self._call(self._pop_item)

    async def clear_session(self) -> None:
        """Remove every item; the zidane session itself (metadata, runs) stays."""
        await self._call(self._clear)

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Release this session's share of the portal (the last share closes the store).

        Blocks until that close is done; use :meth:`aclose` from asyncio code.
        """
        stopped = self._release()
        if stopped is not None:
            stopped.result()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the asyncio loop."""
        stopped = self._release()
        if stopped is not None:
            await wait_future(stopped)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _release(self) -> Any:
        shared, self._shared = self._shared, None
        self._handle = None
        return None if shared is None else _shared.release(shared)

    # -- the trio side ----------------------------------------------------------

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        shared = self._shared
        if shared is None:
            raise ActorClosed(f"{self!r} is closed")
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared, *args)

    async def _session(self, shared: _shared.SharedPortal, *, create: bool) -> Session | None:
        # Always through load_session: it refreshes the handle when another writer wrote.
        host = shared.portal.host
        for _ in range(3):
            session = await host.load_session(self.session_id)
            if session is None and create:
                try:
                    session = await host.create_session(id=self.session_id)
                except ConflictError:
                    continue  # created meanwhile, by this host or another writer: load it
            if session is not None:
                self._handle = session
            return session
        raise ConflictError(f"session {self.session_id!r} could not be created or loaded")

    async def _get_items(
        self, shared: _shared.SharedPortal, limit: int | None
    ) -> list[TResponseInputItem]:
        session = await self._session(shared, create=False)
        if session is None or limit == 0:
            return []
        wanted = None if limit is None or limit < 0 else limit
        collected: list[list[dict[str, Any]]] = []
        count = 0
        for turn in reversed(session.turns):
            if wanted is not None and count >= wanted:
                break
            items = items_of_turn(turn)
            collected.append(items)
            count += len(items)
        flat = [item for items in reversed(collected) for item in items]
        if wanted is not None:
            flat = flat[-wanted:]
        return cast(list[TResponseInputItem], flat)

    async def _add_items(self, shared: _shared.SharedPortal, groups: list[Any]) -> None:
        session = await self._session(shared, create=True)
        assert session is not None
        async with _lock_for(session):
            turns: list[SessionTurn] = []
            for role, content, items in groups:
                metadata = with_native_metadata(None, role, content, items)
                turns.append(
                    SessionTurn(
                        id=await session.generate_turn_id(),
                        role=role,
                        content=content,
                        created_at=_now_ms(),
                        metadata=metadata,
                    )
                )
            last = session.turns[-1] if session.turns else None
            if last is None or last.role != "assistant" or turns[0].role != "assistant":
                await session.append_turns(turns)
                return
            # Tool results pair with the calls of the latest assistant turn: one response's
            # items split over two add_items calls share a turn, merged into the stored
            # last turn in one step of the store (earlier turns untouched).
            new = tuple(turns)

            def merge(history: SessionHistory) -> SessionHistory:
                stored = history.turns[-1] if history.turns else None
                merged = (
                    None if stored is None or stored.role != "assistant" else _merge(stored, new[0])
                )
                if merged is None:
                    return SessionHistory((*history.turns, *new), history.runs)
                return SessionHistory((*history.turns[:-1], merged, *new[1:]), history.runs)

            await session.mutate_history(merge)

    async def _pop_item(self, shared: _shared.SharedPortal) -> TResponseInputItem | None:
        session = await self._session(shared, create=False)
        if session is None:
            return None
        popped: list[dict[str, Any]] = []

        def pop(history: SessionHistory) -> SessionHistory | None:
            # The stored newest turn that stands for items loses its last item, in one
            # step of the store: never a rewrite of this process's view.
            popped.clear()
            turns = list(history.turns)
            for index in range(len(turns) - 1, -1, -1):
                items = items_of_turn(turns[index])
                if items:
                    rest = turn_without_last_item(turns[index])
                    turns[index : index + 1] = [] if rest is None else [rest]
                    popped.append(items[-1])
                    return SessionHistory(tuple(turns), history.runs)
            return None

        async with _lock_for(session):
            if await session.mutate_history(pop) != "ok" or not popped:
                return None
            return cast(TResponseInputItem, popped[-1])

    async def _clear(self, shared: _shared.SharedPortal) -> None:
        session = await self._session(shared, create=False)
        if session is None:
            return
        async with _lock_for(session):
            await session.mutate_history(
                lambda history: SessionHistory((), history.runs) if history.turns else None
            )


def _merge(last: SessionTurn, new: SessionTurn) -> SessionTurn | None:
    """``last`` with ``new``'s items appended; ``None`` when ``last`` holds more than items."""
    before = items_of_turn(last)
    if not before or group_items(before)[0][1] != last.content:
        return None
    ((role, content, group),) = group_items([*before, *items_of_turn(new)])
    metadata = with_native_metadata(last.metadata, role, content, group)
    return SessionTurn(
        id=last.id,
        role=last.role,
        content=content,
        created_at=last.created_at,
        run_id=last.run_id,
        usage=last.usage,
        metadata=metadata,
    )
