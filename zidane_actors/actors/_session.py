"""The session actor and its :class:`Session` handle.

A :class:`Session` holds the state of one conversation. Reads are synchronous
snapshots of that state; every mutation is a command applied by the session's
actor, one at a time. A mutation that writes to the store writes there first
and changes memory only once the store acknowledged it, so an acknowledged
write is durable and visible, and a failed one leaves memory unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

import msgspec
import outcome
import trio

from ..errors import (
    ActorClosed,
    ActorCrashed,
    ConflictError,
    NoStoreError,
    SessionNotFoundError,
    StaleSessionError,
    UnsupportedOperationError,
    ValidationError,
)
from ..model import (
    AppendTurnsOptions,
    ArtifactFilter,
    Branch,
    RunErrorDetail,
    SessionArtifact,
    SessionArtifactInput,
    SessionData,
    SessionHistory,
    SessionMessage,
    SessionRun,
    SessionRunAgent,
    SessionStatus,
    SessionTurn,
    UpdateRunOptions,
    branches_of,
    check_model,
    compaction_marker,
    fresh_turns,
    model_view,
    new_id,
    validate_id,
    with_compaction,
)
from ..model._checked import checked_turns
from ..model._frozen import frozen
from ..stores._protocol import (
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    Revision,
    SessionStore,
    StoreWrite,
    VersionedStore,
)
from ..wire import (
    PairingRepair,
    ResolveContentRef,
    to_wire_messages,
)
from ._actor import Actor, Reply
from ._args import (
    _check_ids,
    _checked_agent,
    _checked_append_options,
    _checked_key,
    _checked_runs,
    _checked_status,
    _meta_value,
)
from ._branches import _Branch, _RestoreBranch
from ._commands import (
    RunStats,
    _AddArtifact,
    _AppendReply,
    _AppendTurns,
    _Compact,
    _DirectReply,
    _FinishRun,
    _Heal,
    _MemoryCommand,
    _MutateHistory,
    _PlanReply,
    _Refresh,
    _Runner,
    _Save,
    _SessionCommand,
    _SetField,
    _SetHistory,
    _SetMeta,
    _StartRun,
    _StoreCommand,
    _UpdateMeta,
    _UpdateRun,
    _UpdateStatus,
)
from ._contention import STALE_ATTEMPTS, back_off
from ._plans import _Planned
from ._repairs import _heal_history, _HeldMarker, close_interrupted_tool_calls
from ._store_actor import StoreActor
from ._trace import session_op
from ._view import Clock, _History, _wall_clock

__all__ = ["MetaListener", "SavedListener", "Session"]

T = TypeVar("T")

MetaListener = Callable[[str, Any], None]
"""An ``on_meta`` listener: the key and value ``set_meta`` just wrote."""

SavedListener = Callable[[], Awaitable[None] | None]
"""An ``on_saved`` listener, awaited by ``save()`` when it returns an awaitable."""

_NO_LISTENERS: Final[tuple[Any, ...]] = ()


class Session(_Planned):
    """A live session: snapshot reads, mutations through the session's actor.

    Get one from :meth:`SessionHost.create_session` / :meth:`SessionHost.load_session`
    (or the standalone :func:`create_session` / :func:`load_session`).
    """

    # A host keeps every session some handle refers to: slots, shared empty
    # containers and no actor while idle keep that small (docs/benchmarks.md).
    __slots__ = (
        "__weakref__",
        "_actor",
        "_crash",
        "_inflight",
        "_last_active",
        "_meta_listeners",
        "_queued",
        "_runner",
        "_saved_listeners",
        "_settled",
    )

    def __init__(
        self,
        data: SessionData,
        *,
        store: SessionStore | None,
        runner: _Runner,
        clock: Clock = _wall_clock,
        pre: _History | None = None,
        caps: frozenset[str] | None = None,
        rev: int | None = None,
        held: _HeldMarker | None = None,
    ) -> None:
        super().__init__(data, store=store, clock=clock, pre=pre, caps=caps, rev=rev, held=held)
        self._runner = runner
        self._meta_listeners: tuple[tuple[object, MetaListener], ...] = _NO_LISTENERS
        self._saved_listeners: tuple[tuple[object, SavedListener], ...] = _NO_LISTENERS
        self._actor: Actor[_SessionCommand[Any]] | None = None
        self._crash: BaseException | None = None
        self._last_active = trio.current_time() if _in_trio() else 0.0
        # Commands sent to the actor and not yet answered, store writes sent straight to
        # the store actor and not yet answered, and who waits for the latter to drain.
        self._queued = 0
        self._inflight = 0
        self._settled: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<Session {self.id!r} turns={len(self.turns)} status={self.status!r}>"

    # -- snapshot reads ------------------------------------------------------

    @property
    def agent_id(self) -> str | None:
        """Agent profile label, if any."""
        return self._data.agent_id

    @property
    def created_at(self) -> int:
        """Creation time, epoch ms."""
        return self._data.created_at

    @property
    def updated_at(self) -> int:
        """Last update time, epoch ms."""
        return self._data.updated_at

    @property
    def status(self) -> SessionStatus:
        """Top-level status."""
        return self._data.status

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Read-only view of the metadata (replaced, never changed in place, by writes)."""
        return MappingProxyType(self._view.metadata_of(self._data))

    @property
    def turns(self) -> tuple[SessionTurn, ...]:
        """Raw persisted turns (frozen); use :meth:`to_messages` for a provider request."""
        self._read_epoch = self._view_epoch()
        return self._view.of(self._data).turns

    @property
    def runs(self) -> tuple[SessionRun, ...]:
        """Run records, in start order (frozen)."""
        self._read_epoch = self._view_epoch()
        return self._view.runs_of(self._data)

    def _memory(self) -> SessionData:
        """Memory as it is, unfrozen, for the library's own readers that neither change it
        nor hand any of it out (a door's index of what it stored): the frozen copy of
        :attr:`turns` and :attr:`runs`, rebuilt after each write, is for callers."""
        return self._data

    @property
    def branches(self) -> tuple[Branch, ...]:
        """The branches this session left (:meth:`branch`), in the order they were made."""
        return branches_of(self._view.metadata_of(self._data))

    @property
    def rev(self) -> int | None:
        """The store ``rev`` memory reflects (``None``: the store keeps no versions)."""
        return self._rev

    @property
    def project_root(self) -> str | None:
        """Project tag stamped at creation."""
        return self._data.project_root

    @property
    def is_empty(self) -> bool:
        """True when the session has no turns yet."""
        return not self._data.turns

    @property
    def store(self) -> SessionStore | None:
        """The store this session persists to (the host's store actor in a host)."""
        return self._store

    def to_json(self) -> SessionData:
        """The session as a :class:`SessionData` value."""
        self._read_epoch = self._view_epoch()
        view = self._view.of(self._data)
        return msgspec.structs.replace(view, metadata=dict(view.metadata))

    # -- listeners -----------------------------------------------------------

    def on_meta(self, listener: MetaListener) -> Callable[[], None]:
        """Call ``listener(key, value)`` after each ``set_meta``, in subscription order."""
        token = object()
        self._meta_listeners = (*self._meta_listeners, (token, listener))

        def unsubscribe() -> None:
            self._meta_listeners = tuple(e for e in self._meta_listeners if e[0] is not token)

        return unsubscribe

    def on_saved(self, listener: SavedListener) -> Callable[[], None]:
        """Await ``listener()`` after each successful ``save()``, in subscription order."""
        token = object()
        self._saved_listeners = (*self._saved_listeners, (token, listener))

        def unsubscribe() -> None:
            self._saved_listeners = tuple(e for e in self._saved_listeners if e[0] is not token)

        return unsubscribe

    # -- mailbox plumbing ----------------------------------------------------

    def _new_actor(
        self,
        *,
        mailbox_size: int,
        on_crash: Callable[[Session, BaseException], None] | None = None,
        on_idle: Callable[[Session], None] | None = None,
    ) -> Actor[_SessionCommand[Any]]:
        """A fresh (not yet started) actor for this session; the runner starts it."""

        async def handle(command: _SessionCommand[Any]) -> Any:
            self._last_active = trio.current_time()
            while self._inflight:  # direct writes sent before this command go first
                if self._settled is None:
                    self._settled = trio.Event()
                await self._settled.wait()
            if self._crash is not None:  # a direct write just crashed the session
                raise self._crashed_error()
            return await command.apply(self)

        def crashed(exc: BaseException) -> None:
            self._crash = exc
            if on_crash is not None:
                on_crash(self, exc)

        def idle() -> None:
            if on_idle is not None:
                on_idle(self)

        def stopped() -> None:
            # A stopped actor is dropped, so an evicted session keeps no actor.
            if self._actor is actor:
                self._actor = None

        actor: Actor[_SessionCommand[Any]] = Actor(
            handle, mailbox_size=mailbox_size, on_crash=crashed, on_idle=idle, on_stop=stopped
        )
        self._actor = actor
        return actor

    def _live_actor(self) -> Actor[_SessionCommand[Any]] | None:
        actor = self._actor
        return actor if actor is not None and actor.state == "running" else None

    def _idle(self) -> bool:
        """Nothing queued, in hand or in flight (exact, unlike the actor's own view)."""
        return not self._queued and not self._inflight

    def _check_alive(self) -> None:
        if self._crash is not None:
            err = ActorClosed(f"session {self.id!r} crashed: {self._crash!r}")
            err.__cause__ = self._crash
            raise err

    def _answered(self, result: Any) -> Any:
        self._queued -= 1
        return result

    async def _call(self, command: _SessionCommand[T]) -> T:
        self._check_alive()
        if isinstance(command, _StoreCommand):
            store = self._direct_store(reads=command.reads)
            if store is not None:
                write, finish = command.plan(self)
                assert write is not None  # a session in a host has the host's store actor
                return await self._send_direct(store, write, _PlanReply(self, finish))
        self._last_active = trio.current_time()
        actor = self._runner.actor_for(self)
        command.reply._on_resolve = self._answered
        self._queued += 1
        try:
            await actor.send(command)
        except BaseException:
            self._queued -= 1  # not accepted
            raise
        return await command.reply.wait_shielded()

    def _submit(self, command: _SessionCommand[T]) -> Reply[T]:
        self._check_alive()
        if isinstance(command, _StoreCommand) and not command.reads:
            store = self._direct_store()
            if store is not None:
                write, finish = command.plan(self)
                assert write is not None
                return self._submit_direct(store, write, _PlanReply(self, finish))
        self._last_active = trio.current_time()
        actor = self._runner.actor_for(self)
        command.reply._on_resolve = self._answered
        reply = actor.submit(command)
        self._queued += 1
        return reply

    async def _apply(self, command: _MemoryCommand) -> None:
        """A memory-only command, applied by the caller when the session is idle.

        With nothing queued, in hand or in flight, the actor would apply it at
        once, and applying it here without a schedule point in between is the
        same: nothing can interleave. Cancellation keeps the actor's rule (a
        cancel before it is applied means not applied; after, it is deferred to
        the caller's next checkpoint). Otherwise it queues like any command.
        """
        self._check_alive()
        if self._queued or self._inflight:
            return await self._call(command)
        self._runner.check_open()
        await trio.lowlevel.checkpoint_if_cancelled()  # does not yield when not cancelled
        self._last_active = trio.current_time()
        try:
            command.apply_now(self)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    # -- the direct path -----------------------------------------------------
    #
    # A store write of a session with nothing queued in its actor goes straight
    # to the store actor, and the store actor's verdict applies it to memory
    # (in ``_direct_verdict``, synchronously, before the caller runs
    # again): one mailbox and one task switch fewer, and no actor started.
    # Order holds: direct writes are applied in the store actor's mailbox order;
    # a write only goes direct when no command is queued in the session's actor,
    # and one planned from memory (a run's start or finish, a save) only when
    # nothing is in flight either, so it reads what the actor would read; the
    # actor lets in-flight direct writes finish before applying anything.

    def _crashed_error(self) -> ActorCrashed:
        err = ActorCrashed(f"session {self.id!r} crashed: {self._crash!r}")
        err.__cause__ = self._crash
        return err

    def _direct_store(self, *, reads: bool = False) -> StoreActor | None:
        if self._queued or self._crash is not None or (reads and (self._inflight or self._stale)):
            return None
        return self._runner.direct_store(self)

    def _direct_verdict(
        self, result: outcome.Outcome[Any], reply: _DirectReply[T]
    ) -> outcome.Outcome[T]:
        """The store actor's verdict on a direct write, its effect applied by ``reply``."""
        if type(result) is outcome.Value:
            value = result.value
            try:
                answer = reply._finish(value)
            except BaseException as exc:
                result = outcome.Error(exc)
            else:
                if answer is not value:  # else the store's verdict says it already
                    result = outcome.Value(answer)
        elif (
            type(result) is outcome.Error
            and not isinstance(result.error, Exception)
            and self._crash is None
        ):
            # What would crash the actor crashes the session on this path too.
            fatal = result.error
            self._crash = fatal
            actor = self._actor
            if actor is not None:
                actor.close(cause=fatal)
            self._runner.crashed(self, fatal)
            result = outcome.Error(self._crashed_error())
        self._landed()
        return result

    async def _send_direct(self, store: StoreActor, write: StoreWrite, reply: Reply[T]) -> T:
        """Send ``write`` to the store actor, answering ``reply``. Cancelled: not sent."""
        self._last_active = trio.current_time()
        self._inflight += 1
        try:
            await store._send(write, reply)
        except BaseException:
            self._landed()  # not accepted: it will never be answered
            raise
        return await reply.wait_shielded()

    def _submit_direct(self, store: StoreActor, write: StoreWrite, reply: Reply[T]) -> Reply[T]:
        """:meth:`_send_direct` without waiting: ``trio.WouldBlock`` when the mailbox is full."""
        self._last_active = trio.current_time()
        store._submit(write, reply)
        self._inflight += 1
        return reply

    def _landed(self) -> None:
        """One direct write answered (or never accepted): wake the actor at the last one."""
        self._inflight -= 1
        if not self._inflight and self._settled is not None:
            self._settled.set()
            self._settled = None

    # -- mutations -----------------------------------------------------------

    @session_op("append_turns")
    async def append_turns(
        self, turns: Iterable[SessionTurn], options: AppendTurnsOptions | None = None
    ) -> None:
        """Append turns in memory and through ``store.append_turns`` (store first)."""
        checked = checked_turns(turns)
        options = _checked_append_options(options)
        store = self._direct_store()
        if store is None:
            await self._call(_AppendTurns(checked, options))
        else:
            write = StoreWrite("append_turns", (self.id, checked, options))
            await self._send_direct(store, write, _AppendReply(self, checked, options))
        if self._stale:  # another writer wrote too: fold its turns in, in store order
            await self._call(_Refresh())

    def append_turns_nowait(
        self, turns: Iterable[SessionTurn], options: AppendTurnsOptions | None = None
    ) -> Reply[None]:
        """Enqueue :meth:`append_turns`; raises ``trio.WouldBlock`` when the mailbox is full."""
        checked = checked_turns(turns)
        options = _checked_append_options(options)
        store = self._direct_store()
        if store is None:
            return self._submit(_AppendTurns(checked, options))
        write = StoreWrite("append_turns", (self.id, checked, options))
        return self._submit_direct(store, write, _AppendReply(self, checked, options))

    @session_op("save")
    async def save(self) -> None:
        """Persist the session, then await the ``on_saved`` listeners in order.

        Through ``save_meta`` with the metadata keys changed since the last
        save, unless ``set_turns``/``set_runs``/a load-time heal replaced the
        history (or the store has no ``save_meta``): then a bulk ``save``.
        Raises :class:`NoStoreError` without a store.
        """
        if self._store is None:
            raise NoStoreError(f"session {self.id!r} has no store to save to")
        await self._save(None, retry=True)
        await self._run_saved_listeners()

    async def _save(self, keys: tuple[str, ...] | None, *, retry: bool) -> bool:
        """A save over the rev memory reflects; answers whether it was a full save.

        When another writer got there first, a header save (``save_meta``: the
        changed keys and fields are plain values) folds the store's state in,
        keeping those intents, and is made again (``retry``); a bulk save (its
        history was computed from a view) is refused when that view is not the
        store's history any more: memory becomes the store's state, unsaved
        changes dropped, and ``StaleSessionError`` raised. So is any save the
        store refuses.
        """
        for attempt in range(STALE_ATTEMPTS):
            header_only = "save_meta" in self._caps and (keys is not None or not self._bulk)
            try:
                return await self._call(_Save(keys))
            except StaleSessionError:
                if not (retry and header_only) or attempt == STALE_ATTEMPTS - 1:
                    await self._call(_Refresh(reset=True))
                    raise
                await back_off(attempt)
                await self._call(_Refresh())
            except (ValidationError, ConflictError):
                # Refused: nothing of it is stored, so memory becomes the store's again
                # (a kept refused change would fail every later save the same way).
                await self._call(_Refresh(reset=True))
                raise
        raise AssertionError("unreachable")

    async def _run_saved_listeners(self) -> None:
        for _, listener in self._saved_listeners:
            result = listener()
            if result is not None:
                await result

    async def save_meta_keys(self, keys: Iterable[str]) -> None:
        """Persist only these metadata keys (plus header and runs), never the turns.

        Falls back to :meth:`save` on a store without ``save_meta``.
        """
        if self._store is None:
            raise NoStoreError(f"session {self.id!r} has no store to save to")
        checked = tuple(keys)
        for i, key in enumerate(checked):
            if not isinstance(key, str):
                raise ValidationError("metadata keys must be strings", path=f"$.keys[{i}]")
        if await self._save(checked, retry=True):
            await self._run_saved_listeners()

    async def set_meta(self, key: str, value: Any, *, touch: bool = True) -> None:
        """Set a metadata key in memory (``msgspec.UNSET`` removes it); saved by the next save.

        ``touch=False`` keeps ``updated_at``. ``on_meta`` listeners run right after
        the write, in the actor; one that raises fails this call (the write stands)
        and skips the later listeners.
        """
        await self._apply(_SetMeta(_checked_key(key), _meta_value(key, value), touch))

    def set_meta_nowait(self, key: str, value: Any, *, touch: bool = True) -> Reply[None]:
        """Enqueue :meth:`set_meta` without waiting."""
        return self._submit(_SetMeta(_checked_key(key), _meta_value(key, value), touch))

    async def _update_meta(
        self, key: str, update: Callable[[Any], Any], *, touch: bool = True
    ) -> None:
        """Read-modify-write one metadata key inside the actor (``update(current)`` → new)."""
        await self._apply(_UpdateMeta(_checked_key(key), update, touch))

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
        """Record a new ``running`` run (persisted through ``store.update_run``)."""
        return await self._call(self._start_run_command(run_id, prompt, locals()))

    def start_run_nowait(
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
    ) -> Reply[SessionRun]:
        """Enqueue :meth:`start_run` without waiting."""
        return self._submit(self._start_run_command(run_id, prompt, locals()))

    @staticmethod
    def _start_run_command(run_id: str, prompt: str | None, args: Mapping[str, Any]) -> _StartRun:
        validate_id(run_id, what="run id")
        names = ("agent", "depth", "label", "parent_call_id", "parent_run_id")
        extras = {name: args[name] for name in (*names, "resumed_from_run_id")}
        return _StartRun(run_id, prompt or "", {k: v for k, v in extras.items() if v is not None})

    async def complete_run(self, run_id: str, stats: RunStats) -> SessionRun:
        """Mark a run completed with its stats."""
        return await self._call(_FinishRun(run_id, "completed", stats))

    def complete_run_nowait(self, run_id: str, stats: RunStats) -> Reply[SessionRun]:
        """Enqueue :meth:`complete_run` without waiting."""
        return self._submit(_FinishRun(run_id, "completed", stats))

    async def abort_run(self, run_id: str, stats: RunStats | None = None) -> SessionRun:
        """Mark a run aborted, backfilling its stats when given."""
        return await self._call(_FinishRun(run_id, "aborted", stats))

    def abort_run_nowait(self, run_id: str, stats: RunStats | None = None) -> Reply[SessionRun]:
        """Enqueue :meth:`abort_run` without waiting."""
        return self._submit(_FinishRun(run_id, "aborted", stats))

    async def error_run(
        self,
        run_id: str,
        error: str,
        stats: RunStats | None = None,
        detail: RunErrorDetail | None = None,
    ) -> SessionRun:
        """Mark a run errored with its one-line error (and optional stats and detail)."""
        return await self._call(_FinishRun(run_id, "error", stats, error, detail))

    def error_run_nowait(
        self,
        run_id: str,
        error: str,
        stats: RunStats | None = None,
        detail: RunErrorDetail | None = None,
    ) -> Reply[SessionRun]:
        """Enqueue :meth:`error_run` without waiting."""
        return self._submit(_FinishRun(run_id, "error", stats, error, detail))

    @session_op("update_run")
    async def update_run(self, run: SessionRun, options: UpdateRunOptions | None = None) -> None:
        """Upsert a run record through ``store.update_run``, then in memory."""
        await self._call(_UpdateRun(_checked_runs((run,))[0], options))

    def update_run_nowait(
        self, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> Reply[None]:
        """Enqueue :meth:`update_run` without waiting."""
        return self._submit(_UpdateRun(_checked_runs((run,))[0], options))

    async def update_status(self, status: SessionStatus) -> None:
        """Set the top-level status through ``store.update_status``, then in memory."""
        await self._call(_UpdateStatus(_checked_status(status)))

    def update_status_nowait(self, status: SessionStatus) -> Reply[None]:
        """Enqueue :meth:`update_status` without waiting."""
        return self._submit(_UpdateStatus(_checked_status(status)))

    async def set_turns(self, turns: Iterable[SessionTurn]) -> None:
        """Replace every turn in memory; the next :meth:`save` is a bulk ``save``.

        The save is conditional on the view the turns came from: turns taken
        from :attr:`turns` (also as ``list(s.turns) + [t]``) carry the view
        they were read in, turns built by hand the one current now. When
        another writer's change reached memory since, the save raises
        :class:`StaleSessionError` (nothing written, memory the store's).
        A turn no store can hold is refused here, memory unchanged.
        """
        await self._apply(self._set_turns_command(turns))

    def set_turns_nowait(self, turns: Iterable[SessionTurn]) -> Reply[None]:
        """Enqueue :meth:`set_turns` without waiting."""
        return self._submit(self._set_turns_command(turns))

    async def set_runs(self, runs: Iterable[SessionRun]) -> None:
        """Replace every run in memory; the next :meth:`save` is a bulk ``save``.

        Conditional on the view the runs came from, as :meth:`set_turns`.
        """
        await self._apply(self._set_runs_command(runs))

    def set_runs_nowait(self, runs: Iterable[SessionRun]) -> Reply[None]:
        """Enqueue :meth:`set_runs` without waiting."""
        return self._submit(self._set_runs_command(runs))

    async def set_agent_id(self, agent_id: str) -> None:
        """Re-label the agent profile in memory; the next save persists it over any fold."""
        await self._apply(_SetField("agent_id", _checked_agent(agent_id)))

    def set_agent_id_nowait(self, agent_id: str) -> Reply[None]:
        """Enqueue :meth:`set_agent_id` without waiting."""
        return self._submit(_SetField("agent_id", _checked_agent(agent_id)))

    def _set_turns_command(self, turns: Iterable[SessionTurn]) -> _SetHistory:
        given = tuple(turns) if not isinstance(turns, tuple) else turns
        checked = checked_turns(given)
        _check_ids(checked, "turns")
        # The epoch is read now, in the caller: a refresh queued before this
        # command must not make the view it came from look current.
        return _SetHistory({"turns": frozen(tuple(checked))}, self._epoch_of(given))

    def _set_runs_command(self, runs: Iterable[SessionRun]) -> _SetHistory:
        given = tuple(runs) if not isinstance(runs, tuple) else runs
        checked = _checked_runs(given)
        _check_ids(checked, "runs")
        return _SetHistory({"runs": checked}, self._epoch_of(given))

    async def generate_turn_id(self) -> str:
        """A turn id from ``store.generate_turn_id`` when it has one, else a UUID4."""
        if "generate_turn_id" in self._caps:
            store = cast(FullSessionStore, self._store)
            return await store.generate_turn_id()
        return new_id()

    async def add_artifact(
        self,
        input: SessionArtifactInput,
        *,
        run_id: str | None = None,
        turn_id: str | None = None,
    ) -> SessionArtifact | None:
        """Record an artifact; ``None`` when the store keeps no artifacts."""
        if not isinstance(input, SessionArtifactInput):
            raise ValidationError(
                f"expected a SessionArtifactInput, got {type(input).__name__}", path="$.input"
            )
        check_model(input, what="artifact input", path="$.input")
        if "upsert_artifact" not in self._caps:
            return None
        return await self._call(_AddArtifact(input, run_id, turn_id))

    async def list_artifacts(
        self, kind: str | None = None, since: int | None = None, limit: int | None = None
    ) -> tuple[SessionArtifact, ...]:
        """This session's artifacts, newest first; empty when the store keeps none."""
        if "list_artifacts" not in self._caps:
            return ()
        store = cast(FullSessionStore, self._store)
        found = await store.list_artifacts(
            ArtifactFilter(session_id=self.id, kind=kind, since=since, limit=limit)
        )
        return tuple(found)

    async def mutate_history(self, mutate: HistoryMutation) -> MutateResult:
        """Edit the stored turns and runs in one atomic step of the store; memory follows.

        ``mutate`` (synchronous, pure; it may run more than once and in the
        store's thread) gets the history as the store holds it, never this
        session's memory, and returns the next one or ``None`` for no change.
        Memory then takes the stored state (a pending ``set_turns``/``set_runs``
        is dropped, unsaved metadata keys kept). Raises
        :class:`UnsupportedOperationError` when the store has no ``mutate_history``.
        """
        if self._store is None:
            raise NoStoreError(f"session {self.id!r} has no store to edit")
        if "mutate_history" not in self._caps:
            raise UnsupportedOperationError(
                f"the store of session {self.id!r} has no mutate_history"
            )
        return await self._call(_MutateHistory(mutate))

    async def heal_interrupted_tool_calls(self) -> bool:
        """Close every tool call whose result was never persisted; ``True`` when any was.

        Call it only while this process owns the session's next run. Persists
        through ``mutate_history`` (re-derived from the stored turns) when the
        store has it, else a ``save`` guarded by a turn re-count; a failed
        persist keeps the in-memory heal and never arms a bulk save.
        """
        self._check_alive()
        if (
            self._queued
            or self._inflight
            or close_interrupted_tool_calls(self._data.turns) is not None
        ):
            return await self._call(_Heal())
        # Idle with no call open: the actor would answer ``False`` and change nothing, so
        # answer it here, with ``_apply``'s cancellation rule and no actor started.
        self._runner.check_open()
        await trio.lowlevel.checkpoint_if_cancelled()  # does not yield when not cancelled
        self._last_active = trio.current_time()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return False

    async def compact(self, summary: Iterable[SessionTurn], *, through: str) -> SessionTurn:
        """Record that ``summary`` stands, for the model, for the turns through ``through``.

        Lossless: one marker turn is appended (see :mod:`zidane_actors.model`'s
        ``compaction_marker``) and every turn stays stored and in :attr:`turns`;
        :meth:`to_messages` starts from the latest marker. ``through`` must name
        a turn of the session (else :class:`ValidationError` at ``$.through``).
        Written over the rev memory reflects: when another writer wrote since,
        nothing is written, memory takes the store's state and
        :class:`StaleSessionError` is raised. Answers the marker.
        """
        marker = compaction_marker(
            summary, through=through, id=await self.generate_turn_id(), created_at=self._now()
        )
        return await self._call(_Compact(checked_turns((marker,))[0]))

    async def _do_compact(self, marker: SessionTurn) -> SessionTurn:
        if self._bulk:
            raise ConflictError(f"session {self.id!r} holds an unsaved set_turns: save it first")
        if self._stale:  # e.g. an artifact's upsert moved the rev by a step it did not say
            await self._fold()
        with_compaction(SessionHistory(self._data.turns, ()), marker)  # located, nothing sent
        if "mutate_history" in self._caps:
            told: list[Revision] = []
            versioned: dict[str, Any] = {"expected_rev": self._rev, "on_revision": told.append}
            try:
                result = await self._full().mutate_history(
                    self.id,
                    functools.partial(with_compaction, marker=marker),
                    **({} if self._rev is None else versioned),
                )
            except StaleSessionError:
                await self._fold()
                raise
            if result == "no-session":
                raise SessionNotFoundError(f"session {self.id!r} is not in the store")
            self._apply_fresh((marker,), None)
            self._observe(told[0] if told else None)
        elif self._store is not None:
            await self._do_append_turns((marker,), None)
        else:
            self._apply_fresh((marker,), None)
        return marker

    async def branch(self, at: str) -> Branch:
        """Continue the session from turn ``at``, keeping the turns after it in an archive.

        The archive is a fork of the session's stored head (``branchOf`` in its
        metadata), listed in :attr:`branches`; then the turns after ``at`` (and
        the runs only they belong to) leave the session. Conditional on the rev
        memory reflects (else :class:`StaleSessionError`, nothing kept); ``at``
        naming no turn is a :class:`ValidationError` at ``$.at``. Answers the entry.
        """
        return await self._call(_Branch(at))

    async def restore_branch(self, branch_session_id: str) -> Branch | None:
        """Bring back the turns of the listed branch ``branch_session_id`` after its turn.

        The session's turns after that turn become a new listed branch first
        (answered; ``None`` when there were none, or when the session holds
        the branch's turns already: then nothing is written); nothing is
        deleted and the restored branch stays listed. Conditional on the rev,
        as :meth:`branch`.
        """
        return await self._call(_RestoreBranch(branch_session_id))

    async def to_messages(
        self,
        *,
        provider: str | None = None,
        resolve_content_ref: ResolveContentRef | None = None,
        user_tail_directive: str | None = None,
        on_repair: Callable[[PairingRepair], None] | None = None,
    ) -> list[SessionMessage]:
        """The model's view (:func:`~zidane_actors.model.model_view`: from the latest
        compaction on) as wire-ready messages, pairing repaired; never written back.
        ``on_repair``'s indexes are into that view."""
        self._read_epoch = self._view_epoch()
        messages: list[SessionMessage] = await to_wire_messages(
            model_view(self._view.of(self._data).turns),
            provider=provider,
            resolve_content_ref=resolve_content_ref,
            user_tail_directive=user_tail_directive,
            on_repair=on_repair,
        )
        return messages

    # -- the actor's side (only ever run by this session's actor) ------------
    async def _sync(self, *, persist_demotion: bool = False) -> bool:
        """Refresh memory through the actor when the store's rev moved; ``False`` if it is gone."""
        if self._rev is None:
            return True
        rev = await cast(VersionedStore, self._store).get_rev(self.id)
        if rev is None:
            return False
        if rev != self._rev or self._stale:
            await self._call(_Refresh(persist_demotion=persist_demotion))
        return True

    async def _do_append_turns(
        self, turns: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        # The store's rule, applied to memory first: a held different turn
        # conflicts before any write, and an append of only held turns (a retry)
        # without a run writes nothing. Nothing else touches memory meanwhile:
        # direct writes wait while the actor has a command in hand.
        fresh = fresh_turns(self._data.id, turns, self._turns_by_id())
        if not fresh and (options is None or options.run is None):
            return
        revision = None
        if self._store is not None:
            revision = await self._store.append_turns(self._data.id, turns, options)
        self._apply_fresh(fresh, options)
        if self._store is not None:
            self._observe(revision)

    def _do_set_meta(self, key: str, update: Callable[[Any], Any], touch: bool) -> None:
        data = self._data
        value = update(data.metadata.get(key, msgspec.UNSET))
        metadata = dict(data.metadata)
        if value is msgspec.UNSET:
            metadata.pop(key, None)
        else:
            metadata[key] = value
        updated_at = self._now() if touch else data.updated_at
        self._commit(msgspec.structs.replace(data, metadata=metadata, updated_at=updated_at))
        if key not in self._changed:
            self._changed = (*self._changed, key)
        for _, listener in self._meta_listeners:
            listener(key, value)

    async def _do_mutate_history(self, mutate: HistoryMutation) -> MutateResult:
        result = await self._full().mutate_history(self.id, mutate)
        if self._bulk:  # replaced in the store: a pending replacement is moot
            self._retire(self._edit_epoch)
            self._bulk = False
            self._pre = None
        if self._rev is not None:
            self._stale = True
            await self._fold()
        else:
            stored = await self._full().load(self.id)
            if stored is not None:
                self._commit(
                    msgspec.structs.replace(self._data, turns=stored.turns, runs=stored.runs)
                )
        return result

    async def _persist_heal(self) -> None:
        """Write the heal through ``mutate_history``, over memory's rev on a versioned store.

        Another writer in between makes the store refuse it: memory folds the
        store's state in and is healed again, so memory ends as the store holds.
        """
        if self._rev is None:
            await self._full().mutate_history(self.id, _heal_history)
            return
        for attempt in range(STALE_ATTEMPTS):
            told: list[Revision] = []
            try:
                await self._full().mutate_history(
                    self.id,
                    _heal_history,
                    expected_rev=self._rev,  # type: ignore[call-arg]
                    on_revision=told.append,
                )
            except StaleSessionError:
                # Folded in and healed again; past the last attempt the in-memory heal
                # stands unwritten, as a heal is best effort by contract.
                await back_off(attempt)
                await self._fold()
                healed = close_interrupted_tool_calls(self._data.turns)
                if healed is None:
                    return
                self._commit(
                    msgspec.structs.replace(self._data, turns=healed, updated_at=self._now())
                )
                continue
            self._observe(told[0] if told else None)
            return

    async def _do_heal(self) -> bool:
        if self._stale:
            await self._fold()
        before = self._data
        healed = close_interrupted_tool_calls(before.turns)
        if healed is None:
            return False
        self._commit(msgspec.structs.replace(before, turns=healed, updated_at=self._now()))
        if self._store is None:
            return True
        try:
            if "mutate_history" in self._caps:
                await self._persist_heal()
            elif len(await self._store.get_turns(self.id)) == len(before.turns):
                await self._store.save(self._snapshot())
        except Exception:  # best-effort by contract: the in-memory heal stands
            return True
        return True


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
