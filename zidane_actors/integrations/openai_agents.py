"""openai-agents sessions stored as zidane sessions: ``ZidaneSession``.

``ZidaneSession`` implements openai-agents' ``Session`` protocol over any
zidane store URL. Items are stored as neutral zidane turns through the
Responses converters (see :mod:`zidane_actors.integrations._responses`), so
the conversation is ordinary zidane data: loadable with ``load_session``,
listable, exportable, convertible for Anthropic. Every ``ZidaneSession`` of
one store URL shares one portal (one trio thread, one host, one store) per
process.

Each ``Runner`` call that uses the session is recorded as a ``SessionRun``:
the session opts into openai-agents' context-aware calls (a ``wrapper``
argument), so it knows which call each item belongs to. ``session.hooks``
(``Runner.run(..., session=s, hooks=s.hooks)``) adds what only the run's
lifecycle tells: agents, models, per-response usage and cost, handoffs as
child runs, and how the call ended; ``session.tool_error_formatter`` (a
``RunConfig`` formatter) marks the results of failed tool calls ``isError``. Wrapped in
``OpenAIResponsesCompactionSession``, it compacts losslessly: its compaction
hooks record a zidane compaction, so ``get_items`` answers the compacted
history while every item stays stored. It also answers
``AdvancedSQLiteSession``'s branch operations (``create_branch_from_turn``,
``list_branches``, ``switch_to_branch``… see
:mod:`zidane_actors.integrations._agents_branches`), each branch left kept
whole in a zidane branch archive. Requires the ``openai-agents`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast

import msgspec
import trio
from agents import (
    Agent,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    RunResult,
    RunResultStreaming,
    ToolErrorFormatterArgs,
)
from agents.items import TResponseInputItem
from agents.memory.session import _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ..actors import Session
from ..errors import ConflictError, StaleSessionError
from ..errors import SessionNotFoundError as ZidaneNotFound
from ..model import (
    AppendTurnsOptions,
    SessionHistory,
    SessionRun,
    SessionTurn,
    ToolCallBlock,
    ToolResultBlock,
    compaction_marker,
    compaction_of,
    encode,
    latest_compaction,
    model_view,
    new_id,
    parse_json,
    preview,
    validate_id,
)
from ..portal._thread import wait_future
from . import _agents_runs as _runs
from . import _shared
from ._agents_branches import BranchOps
from ._responses import (
    ItemGroup,
    error_marks,
    group_items,
    items_of_turn,
    marked,
    turn_metadata,
    turn_without_last_item,
)
from ._usage import Price

__all__ = ["DEFAULT_STORE", "TOOL_ERRORS_KEY", "ZidaneSession"]

_log = logging.getLogger("zidane_actors.integrations.openai_agents")

DEFAULT_STORE: Final = _shared.DEFAULT_STORE
TOOL_ERRORS_KEY: Final = "toolErrors"
"""Where a tool result turn keeps its failed calls' exception texts, by call id."""

T = TypeVar("T")

_lock_for: Final = _shared.SessionLocks()
"""Each session's lock for the writes of this door (in the trio thread)."""


class ZidaneSession(BranchOps, _shared.Share):
    """An openai-agents ``Session`` kept in a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``file:DIR``, ``postgres://…``, ``http(s)://…``). Sessions of one URL share
    one portal; :meth:`close` (or ``with``/``async with``) releases this
    session's share, and the last release closes the store. Whatever is left
    open is closed at interpreter exit.

    ``hooks`` is a ``RunHooks`` to pass with the session
    (``Runner.run(agent, input, session=s, hooks=s.hooks)``): it records
    agents, models, usage, handoffs and how each run ended;
    :meth:`tool_error_formatter`, passed as ``RunConfig(tool_error_formatter=...)``,
    marks failed tool results ``isError``. ``price(usage)``
    gives a response's cost in USD (default: genai-prices, when installed and
    it knows the model).

    A cancelled call follows the portal's rule: withdrawn before the trio side
    accepted it, else completed (applied) before ``CancelledError`` is raised.
    Within one process, all writers of a session id should go through the
    same store URL (they then share one session actor).
    """

    session_settings: SessionSettings | None
    hooks: RunHooks[Any]
    """Pass as ``Runner.run(..., hooks=session.hooks)`` to record agents, usage and handoffs."""

    def __init__(
        self,
        session_id: str,
        *,
        store: str = DEFAULT_STORE,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        price: Price | None = None,
    ) -> None:
        validate_id(session_id)
        self.session_id = session_id
        self.store_url = store
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.price = price
        self.hooks = _runs.Hooks(self)
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)
        self._handle: Session | None = None
        self._items_json: dict[str, tuple[SessionTurn, bytes]] = {}
        self._calls: dict[int, tuple[weakref.ref[Any], _runs.RunnerCall]] = {}
        self._calls_lock = threading.RLock()  # a finalizer may run inside a hold
        self._ending: BaseException | None = None  # the exception leaving a with block

    def __repr__(self) -> str:
        return f"ZidaneSession({self.session_id!r}, store={self.store_url!r})"

    # -- the Session protocol ---------------------------------------------------

    async def get_items(
        self, limit: int | None = None, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The newest ``limit`` items (all when ``None``, or the settings' limit), oldest first.

        ``0`` answers none and a negative limit all, as openai-agents' SQLite session does.
        While this process has not opened the session, only the turns holding
        those items are read (all: the model's view, from its latest compaction on)
        and converted.
        """
        resolved = resolve_session_limit(limit, self.session_settings)
        wanted = None if resolved is None or resolved < 0 else resolved
        self._open()
        if wanted == 0:
            return []
        if self._handle is None:  # not opened by this process: read the store's view
            if wanted is None:
                return _newest_items(await self._call(self._view), None)
            return _newest_items(await self._call(self._tail, wanted), wanted)
        # An open session is read through load_session: its rev check folds in what
        # another worker wrote since.
        session = await self._call(self._session, False)
        if session is None:
            return []
        return _newest_items(model_view(session.turns), wanted, self._items_json)

    async def add_items(
        self, items: list[TResponseInputItem], wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append ``items`` in one store write (all or nothing).

        An item the Responses converters cannot carry raises ``WireFormatError``
        (path ``$[i]…`` into ``items``) and nothing is written: ``WireTypeError``,
        also a ``TypeError`` as ``SQLiteSession`` raises, for a value of a type
        JSON cannot carry. Called by the
        Runner (``wrapper`` given), the items are recorded as part of that
        call's run.
        """
        if not items:
            self._open()  # a closed session refuses even an empty call
            return
        groups = group_items(cast(list[dict[str, Any]], items))
        call = (
            None if wrapper is None else self._runner_call(wrapper.usage, _runs.prompt_of(groups))
        )
        placed: list[_runs.Placed | None] = [None] * len(groups)
        if call is not None:
            assert wrapper is not None
            call.tokens = (wrapper.usage.input_tokens, wrapper.usage.output_tokens)
            call.stored = True
            for index, (role, _, _) in enumerate(groups):
                if role == "assistant" and call.pending:
                    placed[index] = call.pending.popleft()
                else:
                    previous = placed[index - 1] if index else None
                    placed[index] = (call.current if previous is None else previous[0], None)
            last_role, last_content, _ = groups[-1]
            call.answered = last_role == "assistant" and not any(
                isinstance(b, ToolCallBlock) for b in last_content
            )
            if call.final and last_role == "assistant":
                call.finish("completed")
            if call.failed:
                groups = [(r, marked(c, call.failed), i) for r, c, i in groups]
                call.failed.difference_update(*(error_marks(c) for _, c, _ in groups))
        errors = {} if call is None else call.tool_errors
        turns = [_turn(group, where, errors) for group, where in zip(groups, placed, strict=True)]
        records = _runs.records(call, [p for p in placed if p is not None])
        await self._call(self._append, turns, records)

    async def pop_item(
        self, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        """Remove and answer the most recent item (``None`` when there is none)."""
        return await self._call(self._pop_item)

    async def clear_session(self, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Remove every item; the zidane session itself (metadata, runs) stays."""
        await self._call(self._clear)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """openai-agents' compaction hook: ``items`` become the whole history the Runner reads.

        Lossless, in one step of the store: a compaction through the newest
        stored turn with ``items`` as its summary (``Session.compact``), so
        :meth:`get_items` answers ``items`` while the zidane session keeps
        every turn it held. An item the converters cannot carry raises
        ``WireFormatError`` before anything is written.
        """
        summary = _summary(items)
        return await self._call(self._replace, summary, None)

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[TResponseInputItem], bool] | None = None
    ) -> _CompactionSnapshot | None:
        """openai-agents' compaction hook: the newest ``limit`` items and how to replace a suffix.

        ``replace_suffix(start, output)`` makes the items from ``start`` on
        ``output``, as one compaction whose summary is the items before
        ``start`` then ``output`` (every stored turn kept), and only while the
        history is still the one read here (else ``False``). ``None`` (the SDK's
        whole-history path) when asked to prune expired items, which would
        delete them.
        """
        if prune_prefix is not None:
            return None
        read = await self._call(self._view_items)
        newest = read[-limit:] if limit > 0 else []
        kept = len(read) - len(newest)

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            if not newest[start:]:
                return False
            summary = _summary([*read[: kept + start], *output])
            return await self._call(self._replace, summary, read)

        return _CompactionSnapshot(
            cast(list[TResponseInputItem], newest), kept == 0, replace_suffix
        )

    def tool_error_formatter(self, args: ToolErrorFormatterArgs[Any]) -> str | None:
        """Record that a tool call failed; pass as ``RunConfig(tool_error_formatter=...)``.

        openai-agents asks it when a tool raised (tools with the default
        failure handler), was not found, or its approval was rejected; that
        call's result is then stored with ``isError``. Answers ``None``, so the
        model sees the SDK's default message: a formatter of your own can call
        this one and answer its own text.
        """
        call = self._runner_call(args.run_context.usage, "")
        call.failed.add(args.call_id)
        if args.error is not None:
            call.tool_errors[args.call_id] = _runs.error_text(args.error)
        return None

    # -- Runner calls made by the session ----------------------------------------

    async def run(
        self, agent: Agent[Any], input: str | list[TResponseInputItem], **kwargs: Any
    ) -> RunResult:
        """``Runner.run(agent, input, session=self, ...)``, its failure recorded as it was.

        ``hooks`` and ``run_config``'s ``tool_error_formatter`` default to this
        session's. When the call raises, its runs still open end ``error``
        with the exception's type and text before it propagates (a plain
        ``Runner.run`` shows the session its exception only through the
        SDK's tracing, when it is on).
        """
        begun: list[_runs.RunnerCall] = []
        token = _runs.attempt.set(begun)
        try:
            return await Runner.run(agent, input, **self._runner_kwargs(kwargs))
        except Exception as exc:
            records = self._failed(begun, exc)
            if records:
                try:
                    await self._call(self._write_runs, records)
                except Exception:  # the Runner's exception goes on: say what was lost
                    _log.exception("could not record the failure of session %r", self.session_id)
            raise
        finally:
            _runs.attempt.reset(token)

    def run_sync(
        self, agent: Agent[Any], input: str | list[TResponseInputItem], **kwargs: Any
    ) -> RunResult:
        """:meth:`run` through ``Runner.run_sync`` (blocking)."""
        begun: list[_runs.RunnerCall] = []
        token = _runs.attempt.set(begun)
        try:
            return Runner.run_sync(agent, input, **self._runner_kwargs(kwargs))
        except Exception as exc:
            records = self._failed(begun, exc)
            shared = self._shared
            if records and shared is not None:
                try:
                    shared.ready.result()
                    shared.portal.call(self._write_runs, shared, records)
                except Exception:
                    _log.exception("could not record the failure of session %r", self.session_id)
            raise
        finally:
            _runs.attempt.reset(token)

    def run_streamed(
        self, agent: Agent[Any], input: str | list[TResponseInputItem], **kwargs: Any
    ) -> RunResultStreaming:
        """:meth:`run` through ``Runner.run_streamed``.

        The exception a failed stream raises (from ``stream_events``) is kept
        as its runs' error, written when the call's runs are closed: when the
        session closes, or when the result is let go.
        """
        begun: list[_runs.RunnerCall] = []
        token = _runs.attempt.set(begun)
        try:
            result = Runner.run_streamed(agent, input, **self._runner_kwargs(kwargs))
        finally:
            _runs.attempt.reset(token)
        task = result.run_loop_task
        if task is not None:
            task.add_done_callback(functools.partial(_stream_ended, begun))
        return result

    def _runner_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with this session, and its hooks and tool error formatter unless given."""
        kwargs.setdefault("hooks", self.hooks)
        config = kwargs.get("run_config")
        if config is None:
            kwargs["run_config"] = RunConfig(tool_error_formatter=self.tool_error_formatter)
        elif config.tool_error_formatter is None:
            kwargs["run_config"] = dataclasses.replace(
                config, tool_error_formatter=self.tool_error_formatter
            )
        return {**kwargs, "session": self}

    def _failed(self, begun: list[_runs.RunnerCall], error: BaseException) -> list[SessionRun]:
        """End the runs ``begun`` still open as failed with ``error``; their records."""
        records: list[SessionRun] = []
        for call in begun:
            call.raised = call.raised or _runs.error_text(error)
            if call.stored and not call.done:
                call.settle()
                records.extend(_runs.records(call, None))
        return records

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Release this session's share of the portal (the last share closes the store).

        The runs of Runner calls still open are closed first (an exception
        leaving a ``with`` block is their error). Blocks until that close is
        done; use :meth:`aclose` from asyncio code.
        """
        records = self._settled(self._ending)
        shared = self._shared
        if records and shared is not None:
            try:
                shared.ready.result()
                shared.portal.call(self._write_runs, shared, records)
            except Exception:  # the close goes on: say what was lost
                _log.exception("could not record the end of runs of session %r", self.session_id)
        self._let_go_blocking()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the asyncio loop."""
        records = self._settled(self._ending)
        if records and self._shared is not None:
            try:
                await self._call(self._write_runs, records)
            except Exception:
                _log.exception("could not record the end of runs of session %r", self.session_id)
        await self._let_go_async()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._ending = exc
        self.close()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._ending = exc
        await self.aclose()

    def _settled(self, ending: BaseException | None) -> list[SessionRun]:
        """Close the runs of the Runner calls still open; their records to write."""
        with self._calls_lock:
            calls = [call for _, call in self._calls.values()]
            self._calls.clear()
        error = f"{type(ending).__name__}: {ending}" if isinstance(ending, Exception) else None
        records: list[SessionRun] = []
        for call in calls:
            if call.stored and not call.done:
                call.settle(error)
                records.extend(_runs.records(call, None))
        return records

    def _let_go(self) -> Any:
        stopped = super()._let_go()
        self._handle = None
        return stopped

    # -- Runner calls -------------------------------------------------------------

    def _runner_call(self, usage: Any, prompt: str) -> _runs.RunnerCall:
        """The record of the Runner call whose ``Usage`` is ``usage``, started when new."""
        key = id(usage)
        with self._calls_lock:
            known = self._calls.get(key)
            if known is not None and known[0]() is usage:
                call = known[1]
                if prompt and not call.runs[0].prompt:  # begun by the hooks (run_streamed)
                    for run in call.runs:
                        if not run.prompt:
                            run.prompt = prompt
                            call.changed.add(run.id)
                return call
            call = _runs.RunnerCall([_runs.Run(new_id(), prompt, _runs.now_ms())])
            self._calls[key] = (weakref.ref(usage), call)
            begun = _runs.attempt.get()
            if begun is not None:  # a call of run/run_sync/run_streamed: its failure is seen
                begun.append(call)
        weakref.finalize(usage, self._call_gone, weakref.ref(self), key, call)
        _runs.traced(self, call)
        return call

    @staticmethod
    def _call_gone(ref: weakref.ref[ZidaneSession], key: int, call: _runs.RunnerCall) -> None:
        """A Runner call's context is gone: close its runs as it ended (never raises)."""
        session = ref()
        if session is None:
            return
        with session._calls_lock:
            if session._calls.get(key, (None, call))[1] is call:
                session._calls.pop(key, None)
        if call.done or not call.stored:
            return  # closed already, or a run of another session the hooks were passed to
        call.settle()
        _runs.post_records(session, call)

    # -- the trio side ----------------------------------------------------------

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        shared = self._open()
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared, *args)

    @staticmethod
    def _writes(session: Session) -> trio.Lock:
        """The lock this door's writes to ``session`` hold (in the trio thread)."""
        return _lock_for(session)

    async def _session(self, shared: _shared.SharedPortal, create: bool) -> Session | None:
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
        raise ConflictError(f"session {preview(self.session_id)} could not be created or loaded")

    async def _view(self, shared: _shared.SharedPortal) -> Sequence[SessionTurn]:
        """The model's view of the stored session, read from its latest compaction on."""
        return await shared.portal.host.load_model_view(self.session_id) or ()

    async def _tail(self, shared: _shared.SharedPortal, wanted: int) -> tuple[SessionTurn, ...]:
        """The newest turns holding ``wanted`` items, read from the store (the session unopened)."""
        store = shared.portal.host.store
        meta = await store.get_meta(self.session_id)
        if meta is None:
            return ()
        # Each turn but a command stands for one item or more. Once a compaction marker
        # is read, the turns back to its ``through`` decide the view.
        end, items = meta.turn_count, 0
        turns: tuple[SessionTurn, ...] = ()
        while end > 0:
            start = max(0, end - max(wanted - items, len(turns), 1))
            read = tuple(await store.get_turns(self.session_id, start, end - start))
            if not read:
                break
            turns = read + turns
            items += sum(t.role != "command" for t in read)
            end = start
            known = _view_known(turns)
            if known or (known is None and items >= wanted):
                break
        return tuple(model_view(turns))

    async def _append(
        self, shared: _shared.SharedPortal, turns: list[SessionTurn], records: list[SessionRun]
    ) -> None:
        """Write ``turns`` and ``records`` to the session as the store holds it now.

        When the first turn is an assistant's, the session is read through
        :meth:`_session` first: whether it merges into the last stored turn
        depends on what another worker wrote meanwhile. Any other first turn is
        appended whatever the store holds: through the held handle, without that
        read (the append's answer tells memory what another writer added). A
        session deleted before the write is created again and written there.
        """
        for attempt in range(2):
            session = self._handle if attempt == 0 and turns[0].role != "assistant" else None
            if session is None:
                session = await self._session(shared, True)
                assert session is not None
            with contextlib.suppress(ZidaneNotFound):  # nothing was written: write again
                if await self._append_to(session, turns, records):
                    await _shared.name_agent(session, _shared.agent_of(records))
                    return
        raise ConflictError(f"session {preview(self.session_id)} was deleted while being written")

    @staticmethod
    async def _append_to(
        session: Session, turns: list[SessionTurn], records: list[SessionRun]
    ) -> bool:
        """The write of :meth:`_append` on ``session``; ``False``: the store has no such session."""
        async with _lock_for(session):
            held = session._memory().turns  # only read here: no frozen copy needed
            last = held[-1] if held else None
            if last is None or last.role != "assistant" or turns[0].role != "assistant":
                first = AppendTurnsOptions(run=records[0]) if records else None
                await session.append_turns(turns, first)
                for record in records[1:]:
                    await session.update_run(record)
                return True
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

            if await session.mutate_history(merge) == "no-session":
                return False
            for record in records:
                await session.update_run(record)
            return True

    def _write_runs_soon(self, shared: _shared.SharedPortal, records: list[SessionRun]) -> None:
        """Start writing ``records`` in the portal's trio loop (a run closed by the GC)."""

        async def write() -> None:
            try:
                await self._write_runs(shared, records)
            except Exception:  # nobody waits for this write: say what was lost
                _log.exception("could not record the end of runs of session %r", self.session_id)

        trio.lowlevel.spawn_system_task(write)

    async def _write_runs(self, shared: _shared.SharedPortal, records: list[SessionRun]) -> None:
        session = await self._session(shared, True)
        assert session is not None
        for record in records:
            await session.update_run(record)
        await _shared.name_agent(session, _shared.agent_of(records))

    async def _pop_item(self, shared: _shared.SharedPortal) -> TResponseInputItem | None:
        session = await self._session(shared, False)
        if session is None:
            return None
        popped: list[dict[str, Any]] = []

        def pop(history: SessionHistory) -> SessionHistory | None:
            # The newest turn of the model's view that stands for items loses its last
            # item, in one step of the store: never a rewrite of this process's view.
            popped.clear()
            turns = _popped(history.turns, popped)
            return None if turns is None else SessionHistory(turns, history.runs)

        async with _lock_for(session):
            if await session.mutate_history(pop) != "ok" or not popped:
                return None
            return cast(TResponseInputItem, popped[-1])

    async def _view_items(self, shared: _shared.SharedPortal) -> list[dict[str, Any]]:
        session = await self._session(shared, False)
        if session is None:
            return []
        return cast(list[dict[str, Any]], _newest_items(model_view(session.turns), None))

    async def _replace(
        self,
        shared: _shared.SharedPortal,
        summary: list[SessionTurn],
        read: list[dict[str, Any]] | None,
    ) -> bool:
        """Make ``summary`` the model's view in one compaction through the newest turn.

        With ``read``: only while the view still holds those items (``False``
        when not). A write another worker made first is folded in and the
        compaction made again over it.
        """
        session = await self._session(shared, True)
        assert session is not None
        async with _lock_for(session):
            for _ in range(3):
                if read is not None and _newest_items(model_view(session.turns), None) != read:
                    return False
                if not session.turns:
                    if summary:
                        await session.append_turns(summary)
                    return True
                try:
                    await session.compact(summary, through=session.turns[-1].id)
                except StaleSessionError:
                    continue  # memory is the store's now
                return True
        raise ConflictError(f"session {preview(self.session_id)} kept changing while compacted")

    async def _clear(self, shared: _shared.SharedPortal) -> None:
        session = await self._session(shared, False)
        if session is None:
            return
        async with _lock_for(session):
            await session.mutate_history(
                lambda history: SessionHistory((), history.runs) if history.turns else None
            )


def _stream_ended(begun: list[_runs.RunnerCall], task: asyncio.Task[Any]) -> None:
    """A streamed call's loop ended: keep the exception it raised as its runs' error."""
    error = None if task.cancelled() else task.exception()
    if error is not None:
        for call in begun:
            call.raised = call.raised or _runs.error_text(error)


def _turn(
    group: ItemGroup, placed: _runs.Placed | None, tool_errors: dict[str, str] | None = None
) -> SessionTurn:
    """The turn that stores ``group``, as part of the run ``placed`` names (if any).

    The exception texts of its failed tool calls (``tool_errors``, taken
    here) are kept in its ``metadata["toolErrors"]``, by call id.
    """
    role, content, items = group
    errors = {
        b.call_id: tool_errors.pop(b.call_id)
        for b in content
        if tool_errors and isinstance(b, ToolResultBlock) and b.call_id in tool_errors
    }
    turn_id = new_id()
    run, usage = (None, None) if placed is None else placed
    if run is not None and role == "assistant":
        run.turns += 1
        if usage is not None:
            run.usage.append(msgspec.structs.replace(usage, turn_id=turn_id))
    return SessionTurn(
        id=turn_id,
        role=role,
        content=content,
        created_at=_runs.now_ms(),
        run_id=None if run is None else run.id,
        usage=usage,
        metadata=turn_metadata({TOOL_ERRORS_KEY: errors} if errors else None, role, content, items),
    )


def _newest_items(
    turns: Sequence[SessionTurn],
    wanted: int | None,
    memo: dict[str, tuple[SessionTurn, bytes]] | None = None,
) -> list[TResponseInputItem]:
    """The items of the newest turns, ``wanted`` of them at most (all when ``None``).

    ``memo`` (an open session's) keeps the JSON of the items of the turns the
    last call answered, each with the very turn it was converted from: a turn
    of the session memory is immutable, so while the session still holds that
    object its items are decoded from the JSON (fresh, changeable copies)
    instead of converted again. Turns no longer answered leave the memo.
    """
    collected: list[list[dict[str, Any]]] = []
    kept: dict[str, tuple[SessionTurn, bytes]] = {}
    count = 0
    for turn in reversed(turns):
        if wanted is not None and count >= wanted:
            break
        held = memo.get(turn.id) if memo is not None else None
        if held is not None and held[0] is turn:
            encoded = held[1]
            kept[turn.id] = held
        else:
            encoded = encode(items_of_turn(turn))
            if memo is not None:
                kept[turn.id] = (turn, encoded)
        # Decoded from JSON every time: fresh items, nothing of the session's frozen memory
        # (the converters may carry its values into an item), as SQLiteSession answers them.
        items = cast(list[dict[str, Any]], parse_json(encoded))
        collected.append(items)
        count += len(items)
    if memo is not None:
        memo.clear()
        memo.update(kept)
    flat = [item for items in reversed(collected) for item in items]
    if wanted is not None and len(flat) > wanted:
        flat = flat[-wanted:]
    return cast(list[TResponseInputItem], flat)


def _summary(items: Sequence[Any]) -> list[SessionTurn]:
    """The turns that store ``items`` as a compaction's summary (no run of their own)."""
    return [_turn(group, None) for group in group_items(list(items))]


def _view_known(turns: tuple[SessionTurn, ...]) -> bool | None:
    """Whether the newest marker of ``turns`` finds its ``through`` among them (``None``: none)."""
    for index in range(len(turns) - 1, -1, -1):
        found = compaction_of(turns[index])
        if found is not None:
            return any(turn.id == found.through for turn in turns[:index])
    return None


def _popped(
    turns: tuple[SessionTurn, ...], popped: list[dict[str, Any]]
) -> tuple[SessionTurn, ...] | None:
    """``turns`` without the last item of the model's view (put in ``popped``); ``None``: none.

    An item of a turn after the compaction leaves that turn; an item of its
    summary leaves the summary the marker carries (the turns it stands for stay).
    """
    latest = latest_compaction(turns)
    first = 0 if latest is None else latest[1] + 1
    for index in range(len(turns) - 1, first - 1, -1):
        items = items_of_turn(turns[index]) if compaction_of(turns[index]) is None else []
        if items:
            rest = turn_without_last_item(turns[index])
            popped.append(items[-1])
            return (*turns[:index], *(() if rest is None else (rest,)), *turns[index + 1 :])
    if latest is None:
        return None
    at, _, compaction = latest
    summary = list(compaction.summary)
    for k in range(len(summary) - 1, -1, -1):
        items = items_of_turn(summary[k])
        if items:
            rest = turn_without_last_item(summary[k])
            popped.append(items[-1])
            summary[k : k + 1] = [] if rest is None else [rest]
            old = turns[at]
            new = compaction_marker(
                summary, through=compaction.through, id=old.id, created_at=old.created_at
            )
            return (*turns[:at], new, *turns[at + 1 :])
    return None


def _merge(last: SessionTurn, new: SessionTurn) -> SessionTurn | None:
    """``last`` with ``new``'s items appended; ``None`` when ``last`` holds more than items."""
    before = items_of_turn(last)
    marks = error_marks(last.content)
    if not before or marked(group_items(before)[0][1], marks) != last.content:
        return None
    ((role, content, group),) = group_items([*before, *items_of_turn(new)])
    content = marked(content, marks | error_marks(new.content))
    return SessionTurn(
        id=last.id,
        role=last.role,
        content=content,
        created_at=last.created_at,
        run_id=last.run_id,
        usage=last.usage or new.usage,
        metadata=turn_metadata(last.metadata, role, content, group),
    )
