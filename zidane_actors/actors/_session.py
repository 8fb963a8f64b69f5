"""The session actor and its :class:`Session` handle.

A :class:`Session` holds the state of one conversation. Reads are synchronous
snapshots of that state; every mutation is a command applied by the session's
actor, one at a time. A mutation that writes to the store writes there first
and changes memory only once the store acknowledged it, so an acknowledged
write is durable and visible, and a failed one leaves memory unchanged.
"""

from __future__ import annotations

import abc
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Final, Protocol, TypeAlias, TypeVar, cast

import attrs
import msgspec
import outcome
import trio

from ..errors import (
    ActorClosed,
    ActorCrashed,
    ConflictError,
    InvalidNameError,
    NoStoreError,
    StaleSessionError,
    UnsupportedOperationError,
    ValidationError,
)
from ..model import (
    ID_MAX_LENGTH,
    RUN_OWNER_HOLD_MS,
    AppendTurnsOptions,
    ArtifactFilter,
    JsonValue,
    RunErrorDetail,
    RunOwner,
    RunStatus,
    SaveMetaOptions,
    SessionArtifact,
    SessionArtifactInput,
    SessionData,
    SessionHistory,
    SessionMessage,
    SessionRun,
    SessionRunAgent,
    SessionStatus,
    SessionTurn,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    UpdateRunOptions,
    check_json,
    check_model,
    current_run_owner,
    demote_stale_running_status,
    encode,
    fresh_turns,
    key_segment,
    new_id,
    normalize_artifact,
    parse_json,
    upsert_runs,
    validate_id,
)
from ..model._artifacts import clip_artifact_label
from ..model._checked import check_values, checked_turns
from ..model._frozen import FrozenView, frozen
from ..stores._protocol import (
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    Revision,
    SessionStore,
    StoreWrite,
    VersionedStore,
    is_versioned,
    store_capabilities,
)
from ..wire import (
    PairingDrop,
    PairingRepair,
    ResolveContentRef,
    drop_invalid_tool_pairings,
    interrupted_tool_result_output,
    to_wire_messages,
)
from ._actor import Actor, Command, Reply
from ._contention import STALE_ATTEMPTS, back_off
from ._store_actor import StoreActor

__all__ = [
    "Clock",
    "MetaListener",
    "RunStats",
    "SavedListener",
    "Session",
    "close_interrupted_tool_calls",
    "create_session",
    "load_session",
]

T = TypeVar("T")

Clock = Callable[[], int]
"""A time source answering epoch milliseconds."""

MetaListener = Callable[[str, Any], None]
"""An ``on_meta`` listener: the key and value ``set_meta`` just wrote."""

SavedListener = Callable[[], Awaitable[None] | None]
"""An ``on_saved`` listener, awaited by ``save()`` when it returns an awaitable."""

_STATUSES: Final = frozenset({"error", "running", "completed", "idle"})


def _wall_clock() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen
class RunStats:
    """What a finished run spent: tokens, turns, and optionally cost and per-turn usage."""

    tokens_in: int
    tokens_out: int
    turns: int
    cost: float | None = None
    turn_usage: tuple[TurnUsage, ...] | None = None


def _total_usage(stats: RunStats) -> TurnUsage:
    usage = stats.turn_usage or ()
    cache_read = [u.cache_read for u in usage if u.cache_read is not None]
    cache_creation = [u.cache_creation for u in usage if u.cache_creation is not None]
    return TurnUsage(
        input=stats.tokens_in,
        output=stats.tokens_out,
        cache_read=sum(cache_read) if cache_read else None,
        cache_creation=sum(cache_creation) if cache_creation else None,
        cost=stats.cost,
    )


def _json_copy(value: Any, what: str, path: str, depth: int) -> Any:
    """A deep copy of a JSON value (``UNSET`` kept), refusing what JSON cannot carry exactly.

    ``path`` and ``depth`` say where the value is stored (see ``check_json``).
    """
    if value is msgspec.UNSET:
        return value
    check_json(value, what=what, path=path, depth=depth)
    try:
        return parse_json(encode(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValidationError(f"{what} is not JSON-encodable: {exc}") from None


def _checked_runs(runs: Iterable[SessionRun]) -> tuple[SessionRun, ...]:
    return check_values(runs, SessionRun, "runs")


def _checked_append_options(options: AppendTurnsOptions | None) -> AppendTurnsOptions | None:
    if options is not None:
        check_model(options, what="append options", path="$.options")
    return options


def close_interrupted_tool_calls(turns: Sequence[SessionTurn]) -> tuple[SessionTurn, ...] | None:
    """``turns`` with every unanswered tool call closed by a synthetic error result.

    The result goes into the next turn when that is a same-run user turn that
    already carries tool results, else into a new user turn right after the
    call (its id derived from the calling turn's, so the heal is
    deterministic). ``None`` when no call is open. Pure.
    """
    answered = {
        block.call_id
        for turn in turns
        for block in turn.content
        if isinstance(block, ToolResultBlock)
    }
    healed: list[SessionTurn] = []
    changed = False
    pending: tuple[ToolResultBlock, ...] = ()
    pending_after: SessionTurn | None = None
    for turn in turns:
        if pending and pending_after is not None:
            if (
                turn.role == "user"
                and turn.run_id == pending_after.run_id
                and any(isinstance(b, ToolResultBlock) for b in turn.content)
            ):
                turn = msgspec.structs.replace(turn, content=turn.content + pending)
            else:
                healed.append(_interrupted_turn(pending_after, pending))
            pending, pending_after = (), None
        healed.append(turn)
        if turn.role == "assistant":
            open_calls = tuple(
                ToolResultBlock(
                    call_id=b.id,
                    output=interrupted_tool_result_output(b.name),
                    is_error=True,
                    name=b.name,
                )
                for b in turn.content
                if isinstance(b, ToolCallBlock) and b.id not in answered
            )
            if open_calls:
                changed = True
                pending, pending_after = open_calls, turn
    if pending and pending_after is not None:
        healed.append(_interrupted_turn(pending_after, pending))
    return tuple(healed) if changed else None


def _interrupted_turn(after: SessionTurn, results: tuple[ToolResultBlock, ...]) -> SessionTurn:
    suffix = ".interrupted"
    return SessionTurn(
        id=after.id[: ID_MAX_LENGTH - len(suffix)] + suffix,
        role="user",
        content=results,
        created_at=after.created_at,
        run_id=after.run_id,
    )


def _lane_for_run(runs: Sequence[SessionRun]) -> Callable[[str | None], str]:
    """Wire-view lanes: depth-0 runs share the main view, resumed runs their chain root's."""
    by_id = {r.id: r for r in runs}

    def lane(run_id: str | None) -> str:
        run = by_id.get(run_id) if run_id is not None else None
        if run_id is None or (run is not None and not run.depth):
            return "main"
        if run is None:
            return f"run:{run_id}"
        seen = {run.id}
        while run.resumed_from_run_id in by_id and run.resumed_from_run_id not in seen:
            run = by_id[run.resumed_from_run_id]
            seen.add(run.id)
        return f"run:{run.id}"

    return lane


class _Runner(Protocol):
    """Where session actors live: answers the (possibly revived) actor of a session."""

    def actor_for(self, session: Session) -> Actor[_SessionCommand[Any]]: ...

    def direct_store(self, session: Session) -> StoreActor | None:
        """The store actor a write of an idle session may go to directly (see ``Session._call``)."""
        ...

    def crashed(self, session: Session, exc: BaseException) -> None:
        """Report a fatal error met on the direct path."""
        ...

    def check_open(self) -> None:
        """Raise ``ActorClosed`` once the runner accepts no more mutations."""
        ...


# -- commands -------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _SessionCommand(Command[T], abc.ABC):
    """A session mutation: the actor awaits ``apply`` and its result is the verdict."""

    @abc.abstractmethod
    async def apply(self, session: Session) -> T: ...


@attrs.frozen(eq=False)
class _AppendTurns(_SessionCommand[None]):
    turns: tuple[SessionTurn, ...]
    options: AppendTurnsOptions | None

    async def apply(self, session: Session) -> None:
        await session._do_append_turns(self.turns, self.options)


_Plan: TypeAlias = tuple[StoreWrite | None, Callable[[Any], T]]
"""A store command's write (``None`` without a store) and its finish: applied to memory once
the store acknowledged the write, it answers the command's result from the store's (it must
not raise nor reach a schedule point)."""


class _DirectReply(Reply[T], abc.ABC):
    """A direct write's reply: the store actor's verdict goes through the session first.

    Its subclasses carry what the verdict applies (no closures per write: a
    direct append allocates little, which keeps the cyclic GC off the hot path).
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        Reply.__init__(self)
        self._session = session

    @abc.abstractmethod
    def _finish(self, value: Any) -> T:
        """Apply the acknowledged write to memory; answer the caller's result."""

    def resolve(self, result: outcome.Outcome[T]) -> bool:
        if self._outcome is not None:
            return False
        return Reply.resolve(self, self._session._direct_verdict(result, self))


class _PlanReply(_DirectReply[T]):
    __slots__ = ("_plan_finish",)

    def __init__(self, session: Session, finish: Callable[[Any], T]) -> None:
        _DirectReply.__init__(self, session)
        self._plan_finish = finish

    def _finish(self, value: Any) -> T:
        return self._plan_finish(value)


class _AppendReply(_DirectReply[None]):
    __slots__ = ("_options", "_turns")

    def __init__(
        self, session: Session, turns: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        _DirectReply.__init__(self, session)
        self._turns = turns
        self._options = options

    def _finish(self, value: Any) -> None:
        self._session._apply_append(self._turns, self._options)
        self._session._observe(value)


@attrs.frozen(eq=False)
class _StoreCommand(_SessionCommand[T]):
    """A mutation planned as one store write and the memory change its acknowledgement makes.

    The actor plans, writes and finishes in one go. On the direct path (see
    ``Session._call``) the caller plans and the store actor's verdict finishes.
    """

    reads: ClassVar[bool] = True
    """Whether the plan reads memory: then it goes direct only with nothing in flight."""

    @abc.abstractmethod
    def plan(self, session: Session) -> _Plan[T]: ...

    async def apply(self, session: Session) -> T:
        if self.reads and session._stale:
            await session._fold()  # plan from the store's state, not a stale view
        write, finish = self.plan(session)
        return finish(None if write is None else await session._store_call(write))


@attrs.frozen(eq=False)
class _Save(_StoreCommand[bool]):
    keys: tuple[str, ...] | None = None
    """``None``: a ``save()``; else ``save_meta_keys(keys)``."""

    def plan(self, session: Session) -> _Plan[bool]:
        return session._save_plan(self.keys)


@attrs.frozen(eq=False)
class _MemoryCommand(_SessionCommand[None]):
    """A memory-only mutation: applied without awaiting, so it may run inline (``_apply``)."""

    async def apply(self, session: Session) -> None:
        self.apply_now(session)

    @abc.abstractmethod
    def apply_now(self, session: Session) -> None: ...


@attrs.frozen(eq=False)
class _SetMeta(_MemoryCommand):
    key: str
    value: Any
    touch: bool

    def apply_now(self, session: Session) -> None:
        session._do_set_meta(self.key, lambda _: self.value, self.touch)


@attrs.frozen(eq=False)
class _UpdateMeta(_MemoryCommand):
    key: str
    update: Callable[[Any], Any]
    touch: bool

    def apply_now(self, session: Session) -> None:
        session._do_set_meta(self.key, self.update, self.touch)


@attrs.frozen(eq=False)
class _StartRun(_StoreCommand[SessionRun]):
    run_id: str
    prompt: str
    extras: Mapping[str, Any]

    def plan(self, session: Session) -> _Plan[SessionRun]:
        return session._start_run_plan(self.run_id, self.prompt, self.extras)


@attrs.frozen(eq=False)
class _FinishRun(_StoreCommand[SessionRun]):
    run_id: str
    status: RunStatus
    stats: RunStats | None
    error: str | None = None
    detail: RunErrorDetail | None = None

    def plan(self, session: Session) -> _Plan[SessionRun]:
        return session._finish_run_plan(self)


@attrs.frozen(eq=False)
class _UpdateRun(_StoreCommand[None]):
    reads: ClassVar[bool] = False
    run: SessionRun
    options: UpdateRunOptions | None

    def plan(self, session: Session) -> _Plan[None]:
        return session._run_plan(self.run, self.options, None)


@attrs.frozen(eq=False)
class _UpdateStatus(_StoreCommand[None]):
    reads: ClassVar[bool] = False
    status: SessionStatus

    def plan(self, session: Session) -> _Plan[None]:
        return session._status_plan(self.status)


@attrs.frozen(eq=False)
class _SetHistory(_MemoryCommand):
    """``set_turns`` / ``set_runs``: a history replacement, computed from the view of ``epoch``."""

    changes: Mapping[str, Any]
    epoch: int

    def apply_now(self, session: Session) -> None:
        session._do_set_history(self.changes, self.epoch)


@attrs.frozen(eq=False)
class _SetField(_MemoryCommand):
    """``set_agent_id``: a header field the caller set, kept over every fold until saved."""

    name: str
    value: Any

    def apply_now(self, session: Session) -> None:
        session._do_set_field(self.name, self.value)


@attrs.frozen(eq=False)
class _AddArtifact(_StoreCommand[SessionArtifact | None]):
    reads: ClassVar[bool] = False  # only the id and project root, which never change
    input: SessionArtifactInput
    run_id: str | None
    turn_id: str | None

    def plan(self, session: Session) -> _Plan[SessionArtifact | None]:
        return session._artifact_plan(self.input, self.run_id, self.turn_id)


@attrs.frozen(eq=False)
class _Refresh(_SessionCommand[None]):
    """Fold the store's state into memory (``reset``: drop unsaved changes too).

    ``persist_demotion``: also write a stale-running demotion the fold shows,
    as a load does (see ``_loaded_session_data``).
    """

    reset: bool = False
    persist_demotion: bool = False

    async def apply(self, session: Session) -> None:
        await session._fold(reset=self.reset, persist_demotion=self.persist_demotion)


@attrs.frozen(eq=False)
class _MutateHistory(_SessionCommand[MutateResult]):
    mutate: HistoryMutation

    async def apply(self, session: Session) -> MutateResult:
        return await session._do_mutate_history(self.mutate)


@attrs.frozen(eq=False)
class _Heal(_SessionCommand[bool]):
    async def apply(self, session: Session) -> bool:
        return await session._do_heal()


# -- the handle -----------------------------------------------------------------------------


_History: TypeAlias = tuple[tuple[SessionTurn, ...], tuple[SessionRun, ...]]
"""Turns and runs: what a pending history replacement replaces in the store."""

_NO_LISTENERS: Final[tuple[Any, ...]] = ()
_NO_INDEX: Final[dict[str, SessionTurn]] = {}
_NO_RETIRED: Final[dict[int, tuple[weakref.ref[Any], int]]] = {}
"""Placeholder of a session's retired values before its first retirement (never mutated)."""
"""Placeholder of a session's turn index before its first append (never mutated)."""


class Session:
    """A live session: snapshot reads, mutations through the session's actor.

    Get one from :meth:`SessionHost.create_session` / :meth:`SessionHost.load_session`
    (or the standalone :func:`create_session` / :func:`load_session`).
    """

    # A host keeps every session some handle refers to: slots, shared empty
    # containers and no actor while idle keep that small (docs/benchmarks.md).
    __slots__ = (
        "__weakref__",
        "_actor",
        "_bulk",
        "_caps",
        "_changed",
        "_crash",
        "_data",
        "_edit_epoch",
        "_epoch",
        "_fields",
        "_held",
        "_indexed",
        "_inflight",
        "_last_active",
        "_meta_listeners",
        "_now",
        "_own_step",
        "_pre",
        "_queued",
        "_read_epoch",
        "_retired",
        "_rev",
        "_runner",
        "_saved_listeners",
        "_settled",
        "_stale",
        "_store",
        "_turn_index",
        "_view",
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
        self._data = data
        self._held = held
        # What the session hands out: its memory frozen, so no caller can change it.
        self._view = FrozenView()
        self._store = store
        if caps is None:
            caps = store_capabilities(store) if store is not None else frozenset()
        self._caps = caps
        # The store's rev memory reflects (``None``: the store keeps no versions), and
        # whether a write showed that another writer moved it since.
        self._rev = rev if is_versioned(caps) else None
        self._stale = False
        self._runner = runner
        self._now = clock
        # The caller's unsaved changes, as intents a fold keeps: metadata keys set or
        # removed, header fields set, and a history replacement (``_bulk``) with the
        # epoch of the view it was computed from and the stored history it replaces.
        self._changed: tuple[str, ...] = ()
        self._fields: tuple[str, ...] = ()
        self._bulk = pre is not None
        self._pre = pre
        # Views of the history by epoch: a fold that finds another writer's change
        # starts a new one, and the turns and runs memory held until then are
        # retired with the epoch they belonged to (by identity, while a caller can
        # still hold them), so a replacement built from them is judged against it.
        self._epoch = 0
        self._edit_epoch = 0
        self._read_epoch = 0  # the epoch of the last view handed out
        self._retired = _NO_RETIRED
        # An own write moved the rev by a step its answer does not say (an artifact).
        self._own_step = False
        self._meta_listeners: tuple[tuple[object, MetaListener], ...] = _NO_LISTENERS
        self._saved_listeners: tuple[tuple[object, SavedListener], ...] = _NO_LISTENERS
        self._actor: Actor[_SessionCommand[Any]] | None = None
        self._crash: BaseException | None = None
        # Built on the first append (an idle session holds no index of its own).
        self._turn_index: dict[str, SessionTurn] = _NO_INDEX
        self._indexed: tuple[SessionTurn, ...] | None = None
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
    def id(self) -> str:
        """Session id."""
        return self._data.id

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
        return MappingProxyType(self._view.of(self._data).metadata)

    @property
    def turns(self) -> tuple[SessionTurn, ...]:
        """Raw persisted turns (frozen); use :meth:`to_messages` for a provider request."""
        self._read_epoch = self._view_epoch()
        return self._view.of(self._data).turns

    @property
    def runs(self) -> tuple[SessionRun, ...]:
        """Run records, in start order (frozen)."""
        self._read_epoch = self._view_epoch()
        return self._view.of(self._data).runs

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

    async def to_messages(
        self,
        *,
        provider: str | None = None,
        resolve_content_ref: ResolveContentRef | None = None,
        user_tail_directive: str | None = None,
        on_repair: Callable[[PairingRepair], None] | None = None,
    ) -> list[SessionMessage]:
        """The turns as wire-ready messages (pairing repaired; never written back)."""
        self._read_epoch = self._view_epoch()
        messages: list[SessionMessage] = await to_wire_messages(
            self._view.of(self._data).turns,
            provider=provider,
            resolve_content_ref=resolve_content_ref,
            user_tail_directive=user_tail_directive,
            on_repair=on_repair,
        )
        return messages

    # -- the actor's side (only ever run by this session's actor) ------------

    def _commit(self, data: SessionData) -> None:
        self._data = data

    def _observe(self, result: object) -> None:
        """Track the store's rev through a write's :class:`Revision`.

        A write that found the rev memory reflects moves it on; any other one
        means another writer wrote in between, so memory is stale until folded.
        """
        if self._rev is None:
            return
        if type(result) is Revision and result.before == self._rev and not self._stale:
            self._rev = result.after
        else:
            self._stale = True

    async def _fold(self, *, reset: bool = False, persist_demotion: bool = False) -> None:
        """Make memory the store's state, read with its rev, under the caller's intents.

        The unsaved intents stay on top of it (metadata keys, header fields, a
        pending history replacement with its epoch); ``reset`` drops them (a
        refused save). When the store's document differs from what memory
        took it to be, another writer changed it: a new epoch starts, and the
        view's turns and runs are retired with the old one. Another process's
        ``running`` marker shows demoted, as a load shows it
        (``persist_demotion``: written too where the claim rule says it is
        stale, as a load writes it).
        """
        if self._store is None:
            return
        if self._rev is None:
            if reset:  # no versions: the store's state is all there is to go back to
                stored = await self._store.load(self.id)
                self._drop_intents()
                if stored is not None:
                    self._commit(stored)
            return
        loaded = await cast(VersionedStore, self._store).load_versioned(self.id)
        if loaded is None:  # deleted elsewhere: conditional writes keep failing
            self._stale = True
            return
        stored, rev = loaded
        # Another writer's change ends the view: any move of the rev past what memory
        # reflects, unless an own write moved it by a step its answer did not say;
        # then the document tells (unchanged: only that own step).
        same = self._holds(stored) if self._own_step else rev == self._rev
        self._own_step = False
        if not same:
            if not self._bulk:
                self._retire(self._epoch)
            self._epoch += 1
        if reset:
            self._drop_intents()
        memory = self._data
        own_runs = {r.id for r in memory.runs if r.status == "running"}
        own_owner = memory.run_owner if memory.status == "running" else None
        data = demote_stale_running_status(stored, own_runs=own_runs, own_owner=own_owner)
        held = _HeldMarker.of(stored, data) if data is not stored else None
        if self._bulk:  # the pending replacement stays; it replaces what is stored now
            self._pre = (stored.turns, stored.runs)
            data = msgspec.structs.replace(data, turns=memory.turns, runs=memory.runs)
        elif same and not reset:  # the view's turns are still the stored ones: keep them
            data = msgspec.structs.replace(data, turns=memory.turns)
        if self._changed:
            metadata = dict(data.metadata)
            for key in self._changed:
                if key in memory.metadata:
                    metadata[key] = memory.metadata[key]
                else:
                    metadata.pop(key, None)
            data = msgspec.structs.replace(data, metadata=metadata)
        if self._fields:
            data = msgspec.structs.replace(
                data, **{name: getattr(memory, name) for name in self._fields}
            )
        self._commit(data)
        self._held = held
        self._rev = rev
        self._stale = False
        if persist_demotion and held is not None and "demote_stale_run" in self._caps:
            now = self._now()
            if await self._full().demote_stale_run(
                self.id, stale_at=now - RUN_OWNER_HOLD_MS, now=now
            ):
                await self._fold()  # read the demoted state back with its rev

    def _holds(self, stored: SessionData) -> bool:
        """Whether ``stored`` is the document memory takes the store to hold (``updatedAt`` aside).

        Memory's unsaved intents are left out of the comparison: those fields
        are the caller's, whatever the store holds.
        """
        mine = self._snapshot()
        turns, runs = self._pre if self._bulk and self._pre is not None else (mine.turns, mine.runs)
        if (
            stored.turns != turns
            or stored.runs != runs
            or stored.status != mine.status
            or stored.run_owner != mine.run_owner
            or stored.created_at != mine.created_at
            or stored.project_root != mine.project_root
            or stored.extra_fields != mine.extra_fields
        ):
            return False
        if "agent_id" not in self._fields and stored.agent_id != mine.agent_id:
            return False
        theirs, ours = stored.metadata, mine.metadata
        changed = self._changed
        if not changed:
            return theirs == ours
        return {k: v for k, v in theirs.items() if k not in changed} == {
            k: v for k, v in ours.items() if k not in changed
        }

    def _drop_intents(self) -> None:
        """Forget every unsaved change (the store's state is about to be memory)."""
        if self._bulk:
            self._retire(self._edit_epoch)
        self._changed = ()
        self._fields = ()
        self._bulk = False
        self._pre = None

    def _view_epoch(self) -> int:
        """The epoch of the history memory shows (a pending replacement's own, if any)."""
        return self._edit_epoch if self._bulk else self._epoch

    def _retire(self, epoch: int) -> None:
        """Mark the turns and runs a caller may hold from this view as of ``epoch``."""
        retired = self._retired
        if retired is _NO_RETIRED:
            retired = self._retired = {}
        shown = self._view.shown()
        for value in (
            *self._data.turns,
            *self._data.runs,
            *(() if shown is None else (*shown.turns, *shown.runs)),
        ):
            entry = retired.get(id(value))
            if entry is None or entry[0]() is not value or entry[1] > epoch:
                retired[id(value)] = (weakref.ref(value), epoch)
        if len(retired) > 1024 and len(retired) > 4 * (len(self._data.turns) + 1):
            for key in [k for k, (ref, _) in retired.items() if ref() is None]:
                del retired[key]

    def _epoch_of(self, values: Sequence[SessionTurn | SessionRun]) -> int:
        """The epoch of the oldest view any of ``values`` came from.

        A value memory shows belongs to the view now; a retired one to its own;
        any other value (built by hand, or none at all: an empty list) to the
        last view this session handed out, which is what its caller could see.
        """
        epoch = self._view_epoch()
        retired = self._retired
        data, shown = self._data, self._view.shown()
        current = {id(v) for v in (*data.turns, *data.runs)}
        if shown is not None:
            current.update(id(v) for v in (*shown.turns, *shown.runs))
        by_hand = not values
        for value in values:
            entry = retired.get(id(value))
            if entry is not None and entry[0]() is value:
                epoch = min(epoch, entry[1])
            elif id(value) not in current:
                by_hand = True
        return min(epoch, self._read_epoch) if by_hand else epoch

    def _do_set_history(self, changes: Mapping[str, Any], epoch: int) -> None:
        if self._bulk:
            epoch = min(epoch, self._edit_epoch)
        else:
            data = self._snapshot()
            self._pre = (data.turns, data.runs)
        self._retire(self._view_epoch())
        self._commit(msgspec.structs.replace(self._data, **changes))
        self._bulk = True
        self._edit_epoch = epoch

    def _do_set_field(self, name: str, value: Any) -> None:
        self._commit(msgspec.structs.replace(self._data, **{name: value}))
        if name not in self._fields:
            self._fields = (*self._fields, name)

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

    def _snapshot(self) -> SessionData:
        """Memory as a save writes it: a load-time demotion the store did not take stays unwritten.

        The load shows another writer's live ``running`` marker as ``idle`` and
        its running runs as ``aborted`` (the spec's stale-running demotion), but
        that view is not this session's to persist: while memory still shows
        exactly that, the save sends the stored values back (a snapshot's
        ``running`` keeps the stored status and owner), so it never settles a
        run going on elsewhere.
        """
        held, data = self._held, self._data
        return data if held is None else held.restore(data)

    def _full(self) -> FullSessionStore:
        return cast(FullSessionStore, self._store)

    def _turns_by_id(self) -> dict[str, SessionTurn]:
        """The in-memory turns by id, rebuilt only when the turns were replaced."""
        turns = self._data.turns
        if self._indexed is not turns:
            self._turn_index = {t.id: t for t in turns}
            self._indexed = turns
        return self._turn_index

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

    def _apply_append(
        self, turns: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        """Apply a direct append the store acknowledged: only the turns memory lacks."""
        fresh = fresh_turns(self._data.id, turns, self._turns_by_id())
        if fresh or (options is not None and options.run is not None):
            self._apply_fresh(fresh, options)

    def _apply_fresh(
        self, fresh: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        index = self._turns_by_id()  # before the commit: extended, not rebuilt
        data = self._data
        runs = data.runs
        if options is not None and options.run is not None:
            runs = upsert_runs(runs, (options.run,))
        new = msgspec.structs.replace(
            data, turns=data.turns + fresh, runs=runs, updated_at=self._now()
        )
        if self._pre is not None:  # the store holds them under a pending replacement too
            pre_turns, pre_runs = self._pre
            if options is not None and options.run is not None:
                pre_runs = upsert_runs(pre_runs, (options.run,))
            self._pre = (pre_turns + fresh, pre_runs)
        self._commit(new)
        for turn in fresh:
            index[turn.id] = turn
        self._indexed = new.turns

    def _store_call(self, write: StoreWrite) -> Awaitable[Any]:
        """Make ``write`` as a call of the store (the actor's path)."""
        method: Callable[..., Awaitable[Any]] = getattr(self._store, write.method)
        return method(*write.args, **write.kwargs)

    def _store_write(self, method: str, *args: Any) -> StoreWrite | None:
        return None if self._store is None else StoreWrite(method, args)

    def _save_plan(self, keys: tuple[str, ...] | None) -> _Plan[bool]:
        """A save (``keys`` ``None``) or ``save_meta_keys``; answers whether it was a full save.

        ``save_meta`` with the keys changed since the last save, unless the
        history was replaced (a bulk save) or the store has no ``save_meta``.
        """
        data = self._snapshot()
        expect = {} if self._rev is None else {"expected_rev": self._rev}
        if "save_meta" in self._caps and (keys is not None or not self._bulk):
            saved = tuple(sorted(self._changed)) if keys is None else keys
            write = StoreWrite("save_meta", (data, SaveMetaOptions(meta_keys=saved)), expect)
            full = False
        else:
            if self._bulk and self._rev is not None and self._edit_epoch != self._epoch:
                raise StaleSessionError(
                    f"session {self.id!r}: the history given to set_turns/set_runs was read "
                    "before another writer's change reached this session",
                    expected=None,
                    actual=self._rev,
                )
            saved = self._changed
            write = StoreWrite("save", (data,), expect)
            full = True
        fields = self._fields

        def finish(result: object) -> bool:
            if type(result) is Revision and self._rev is not None:
                self._rev = result.after
            self._changed = tuple(k for k in self._changed if k not in saved)
            self._fields = tuple(f for f in self._fields if f not in fields)
            if full:
                self._bulk = False
                self._pre = None
            return full

        return write, finish

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

    def _run_plan(self, run: SessionRun, options: UpdateRunOptions | None, answer: T) -> _Plan[T]:
        """Upsert ``run`` through ``store.update_run``, then in memory; answer ``answer``."""

        def finish(result: object) -> T:
            data = self._data
            runs = upsert_runs(data.runs, (run,))
            if self._pre is not None:
                self._pre = (self._pre[0], upsert_runs(self._pre[1], (run,)))
            self._commit(msgspec.structs.replace(data, runs=runs, updated_at=self._now()))
            self._observe(result)
            return answer

        return self._store_write("update_run", self.id, run, options), finish

    def _start_run_plan(
        self, run_id: str, prompt: str, extras: Mapping[str, Any]
    ) -> _Plan[SessionRun]:
        if any(r.id == run_id for r in self._data.runs):
            raise ConflictError(f"session {self.id!r} already has a run {run_id!r}")
        run = SessionRun(
            id=run_id, prompt=prompt, started_at=self._now(), status="running", **extras
        )
        check_model(run, what="run", path="$.run")
        return self._run_plan(run, None, run)

    def _finish_run_plan(self, command: _FinishRun) -> _Plan[SessionRun]:
        current = next((r for r in self._data.runs if r.id == command.run_id), None)
        if current is None:
            raise ValidationError(
                f"session {self.id!r} has no run {command.run_id!r}", path="$.runId"
            )
        changes: dict[str, Any] = {"status": command.status, "ended_at": self._now()}
        if command.stats is not None:
            stats = command.stats
            changes.update(
                tokens_in=stats.tokens_in,
                tokens_out=stats.tokens_out,
                turns=stats.turns,
                total_usage=_total_usage(stats),
            )
            if stats.cost is not None:
                changes["cost"] = stats.cost
            if stats.turn_usage is not None:
                changes["turn_usage"] = stats.turn_usage
        if command.error is not None:
            changes["error"] = command.error
        if command.detail is not None:
            changes["error_detail"] = command.detail
        run = msgspec.structs.replace(current, **changes)
        check_model(run, what="run", path="$.run")
        return self._run_plan(run, None, run)

    def _status_plan(self, status: SessionStatus) -> _Plan[None]:
        def finish(result: object) -> None:
            owner = current_run_owner() if status == "running" else None
            if self._held is not None:
                self._held = self._held.settled()
            self._commit(
                msgspec.structs.replace(
                    self._data, status=status, run_owner=owner, updated_at=self._now()
                )
            )
            self._observe(result)

        return self._store_write("update_status", self.id, status), finish

    def _artifact_plan(
        self, input: SessionArtifactInput, run_id: str | None, turn_id: str | None
    ) -> _Plan[SessionArtifact | None]:
        now = self._now()
        artifact = SessionArtifact(
            id=new_id(),
            session_id=self.id,
            kind=input.kind,
            uri=input.uri,
            label=clip_artifact_label(input.label),
            created_at=now,
            updated_at=now,
            meta=input.meta,
            project_root=input.project_root or self._data.project_root,
            run_id=run_id,
            turn_id=turn_id,
        )
        write = self._store_write("upsert_artifact", normalize_artifact(artifact))
        return write, self._stored_artifact

    def _stored_artifact(self, result: SessionArtifact | None) -> SessionArtifact | None:
        # The upsert moved the rev by a step its answer does not say: fold before relying on it.
        if self._rev is not None:
            self._stale = True
            self._own_step = True
        return result

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


def _heal_history(history: SessionHistory) -> SessionHistory | None:
    """The heal re-derived from the stored turns (inside the store's transaction)."""
    stored = close_interrupted_tool_calls(history.turns)
    return None if stored is None else SessionHistory(stored, history.runs)


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _meta_value(key: str, value: Any) -> Any:
    """A copy of ``metadata[key]``'s new value, located at ``$.metadata.<key>`` when refused."""
    return _json_copy(value, f"metadata[{key!r}]", "$.metadata" + key_segment(key), 1)


def _check_ids(values: Sequence[SessionTurn | SessionRun], field: str) -> None:
    """Every id is one a store can hold, and none repeats: refused before memory changes."""
    seen: set[str] = set()
    for i, value in enumerate(values):
        try:
            validate_id(value.id, what=f"{field[:-1]} id")
        except InvalidNameError as exc:
            raise InvalidNameError(str(exc), path=f"$.{field}[{i}].id") from None
        if value.id in seen:
            raise ValidationError(
                f"{field[:-1]} id {value.id!r} repeats", path=f"$.{field}[{i}].id"
            )
        seen.add(value.id)


def _checked_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"metadata key must be a string, got {type(key).__name__}")
    return key


def _checked_status(status: object) -> SessionStatus:
    if not isinstance(status, str) or status not in _STATUSES:
        raise ValidationError(f"status must be one of {sorted(_STATUSES)}, got {status!r}")
    return cast(SessionStatus, status)


def _checked_agent(agent_id: object) -> str:
    if not isinstance(agent_id, str) or not agent_id:
        raise ValidationError(f"agent id must be a non-empty string, got {agent_id!r}")
    return agent_id


# -- building sessions ----------------------------------------------------------------------


async def _new_session_data(
    store: SessionStore | None,
    *,
    id: str | None,
    agent_id: str | None,
    metadata: Mapping[str, JsonValue] | None,
    project_root: str | None,
    clock: Clock,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, int | None]:
    """A fresh session's data, persisted (header only) when there is a store, and its rev.

    ``caps`` are the store's capabilities when the caller knows them already (a host).
    """
    if caps is None:
        caps = store_capabilities(store) if store is not None else frozenset()
    if id is None:
        if "generate_session_id" in caps:
            id = await cast(FullSessionStore, store).generate_session_id()
        else:
            id = new_id()
    validate_id(id)
    if agent_id is not None:
        _checked_agent(agent_id)
    meta = _json_copy(dict(metadata or {}), "metadata", "$.metadata", 0)
    now = clock()
    data = SessionData(
        id=id,
        created_at=now,
        updated_at=now,
        metadata=meta,
        agent_id=agent_id,
        project_root=project_root,
    )
    if store is not None:
        if "get_meta" in caps:
            exists = await cast(FullSessionStore, store).get_meta(id) is not None
        else:
            exists = await store.load(id) is not None
        if exists:
            raise ConflictError(f"the store already holds a session {id!r}")
        if is_versioned(caps):  # created only if still absent: a racing host conflicts
            revision = await store.save(data, expected_rev=0)  # type: ignore[call-arg]
            return data, revision.after if type(revision) is Revision else None
        await store.save(data)
    return data, None


async def _restored_session_data(
    store: SessionStore | None,
    data: SessionData,
    *,
    on_pairing_drop: Callable[[PairingDrop], None] | None,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, _History | None, int | None]:
    """``create_session(_data=...)``: a session restored from its data, nothing written.

    Its tool pairings are healed in memory (``on_pairing_drop`` told each
    deletion), and its next save writes the whole document (a bulk save),
    conditional on the store's rev read now (``0``: the store holds no such
    session, so the save creates it only while it is still absent).
    """
    if not isinstance(data, SessionData):
        raise ValidationError(
            f"_data must be a SessionData, got {type(data).__name__}", path="$._data"
        )
    validate_id(data.id)
    check_model(data, what="session data", path="$._data")
    healed = drop_invalid_tool_pairings(
        data.turns, lane_for_run=_lane_for_run(data.runs), on_drop=on_pairing_drop
    )
    pre = (data.turns, data.runs)
    if healed is not data.turns:
        data = msgspec.structs.replace(data, turns=tuple(healed))
    if caps is None:
        caps = store_capabilities(store) if store is not None else frozenset()
    rev = None
    if store is not None and is_versioned(caps):
        rev = await cast(VersionedStore, store).get_rev(data.id) or 0
    return data, (pre if store is not None else None), rev


async def _loaded_session_data(
    store: SessionStore,
    session_id: str,
    *,
    persist_heal: bool,
    on_pairing_drop: Callable[[PairingDrop], None] | None,
    clock: Clock,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, _History | None, int | None, _HeldMarker | None] | None:
    """The stored data with load-time heals applied, the stored history a bulk save armed by
    an unsaved heal replaces, its rev, and the run marker memory shows demoted while the
    store keeps it.

    Memory always shows the stale-running demotion; the store gets it only
    through ``demote_stale_run``, which writes when the marker is stale by the
    claim rule at ``clock()`` (horizon ``RUN_OWNER_HOLD_MS`` back) and still
    unchanged. A store without it keeps its marker (the next claim judges it).
    On a versioned store the heal is saved only over the rev it was computed
    from (a write in between makes the load start over), and a written
    demotion is read back, so the rev answered is the one memory reflects.
    """
    validate_id(session_id)
    if caps is None:
        caps = store_capabilities(store)
    versioned = is_versioned(caps)
    for _ in range(8):
        rev: int | None = None
        if versioned:
            loaded = await cast(VersionedStore, store).load_versioned(session_id)
            if loaded is None:
                return None
            raw, rev = loaded
        else:
            found = await store.load(session_id)
            if found is None:
                return None
            raw = found
        data = demote_stale_running_status(raw)
        demotion = data is not raw
        pre: _History | None = None
        healed = drop_invalid_tool_pairings(
            data.turns, lane_for_run=_lane_for_run(data.runs), on_drop=on_pairing_drop
        )
        if healed is not data.turns:
            data = msgspec.structs.replace(data, turns=tuple(healed))
            if persist_heal:
                # The stored status and runs, so the heal never writes over a live run marker.
                stored = msgspec.structs.replace(raw, turns=data.turns)
                if rev is None:
                    await store.save(stored)
                else:
                    try:
                        revision = await store.save(stored, expected_rev=rev)  # type: ignore[call-arg]
                    except StaleSessionError:
                        continue  # another writer moved it: heal what it holds now
                    rev = revision.after if type(revision) is Revision else None
            else:
                pre = (raw.turns, raw.runs)
        if demotion and persist_heal and "demote_stale_run" in caps:
            now = clock()
            demoted = await cast(FullSessionStore, store).demote_stale_run(
                session_id, stale_at=now - RUN_OWNER_HOLD_MS, now=now
            )
            if demoted:
                if versioned:
                    continue  # read the demoted state back with its rev
                demotion = False  # the store holds what memory shows
        return data, pre, rev, (_HeldMarker.of(raw, data) if demotion else None)
    raise StaleSessionError(
        f"session {session_id!r} kept changing while it was loaded", expected=None, actual=None
    )


async def _run_after(previous: Actor[Any] | None, actor: Actor[Any]) -> None:
    """Run ``actor`` once ``previous`` (a closed actor finishing its last command) stopped.

    Commands sent meanwhile wait in the new mailbox, so one session never has
    two actors applying commands at once.
    """
    if previous is not None:
        await previous.wait_stopped()
    await actor.run()


def _close_actor(session: Session) -> None:
    if session._actor is not None:
        session._actor.close()


@attrs.frozen
class _HeldMarker:
    """The stored run marker a load showed demoted while the store kept it."""

    status: bool  # memory's settled status stands for a stored ``running``
    runs: Mapping[str, tuple[SessionRun, SessionRun]]  # id: (shown demoted, stored)
    owner: RunOwner | None = None  # the stored ``running`` marker's owner

    @classmethod
    def of(cls, stored: SessionData, shown: SessionData) -> _HeldMarker:
        runs = {a.id: (b, a) for a, b in zip(stored.runs, shown.runs, strict=True) if a is not b}
        status = stored.status == "running" and shown.status != "running"
        return cls(status, runs, stored.run_owner if status else None)

    def settled(self) -> _HeldMarker:
        """After this session set its status itself."""
        return _HeldMarker(False, self.runs)

    def restore(self, data: SessionData) -> SessionData:
        """``data`` with what still shows the demotion put back as stored."""
        changes: dict[str, Any] = {}
        if self.status and data.status == "idle" and data.run_owner is None:
            changes["status"] = "running"
            changes["run_owner"] = self.owner
        if self.runs:
            runs = tuple(self._stored(r) for r in data.runs)
            if any(a is not b for a, b in zip(runs, data.runs, strict=True)):
                changes["runs"] = runs
        return msgspec.structs.replace(data, **changes) if changes else data

    def _stored(self, run: SessionRun) -> SessionRun:
        """The stored record of ``run`` while it is still the demoted one the load showed."""
        pair = self.runs.get(run.id)
        return pair[1] if pair is not None and pair[0] is run else run


@attrs.define
class _StandaloneRunner:
    """Sessions made outside a host: an actor per burst of commands, as a trio system task.

    The actor stops whenever its mailbox runs empty, so a dropped session
    leaves no task behind; the next mutation starts a new one.
    """

    mailbox_size: int = 64

    def actor_for(self, session: Session) -> Actor[_SessionCommand[Any]]:
        actor = session._live_actor()
        if actor is None:
            previous = session._actor
            actor = session._new_actor(mailbox_size=self.mailbox_size, on_idle=_close_actor)
            trio.lowlevel.spawn_system_task(_run_after, previous, actor)
        return actor

    def direct_store(self, session: Session) -> StoreActor | None:
        # Standalone sessions write through their actor (their store is no store actor).
        return None

    def crashed(self, session: Session, exc: BaseException) -> None:
        pass

    def check_open(self) -> None:
        pass


async def create_session(
    store: SessionStore | None = None,
    *,
    id: str | None = None,
    agent_id: str | None = None,
    metadata: Mapping[str, JsonValue] | None = None,
    project_root: str | None = None,
    clock: Clock | None = None,
    _data: SessionData | None = None,
    on_pairing_drop: Callable[[PairingDrop], None] | None = None,
) -> Session:
    """A new session outside any host (its actor is a trio system task).

    Uses ``store.generate_session_id`` when the store has it and no ``id`` is
    given; with a store the new header is saved at once, and an id the store
    already holds raises :class:`ConflictError`. ``_data`` restores a
    session from its data instead (``id``, ``agent_id``, ``metadata`` and
    ``project_root`` are then ignored, as the spec says): its tool pairings
    are healed in memory (``on_pairing_drop`` is told each deletion; fresh
    sessions never heal), nothing is written, and its next save writes it
    whole, conditional on the store's rev at the restore.
    """
    now = clock or _wall_clock
    if _data is not None:
        data, pre, rev = await _restored_session_data(store, _data, on_pairing_drop=on_pairing_drop)
        return Session(data, store=store, runner=_StandaloneRunner(), clock=now, pre=pre, rev=rev)
    data, rev = await _new_session_data(
        store, id=id, agent_id=agent_id, metadata=metadata, project_root=project_root, clock=now
    )
    return Session(data, store=store, runner=_StandaloneRunner(), clock=now, rev=rev)


async def load_session(
    store: SessionStore,
    session_id: str,
    *,
    persist_heal: bool = True,
    on_pairing_drop: Callable[[PairingDrop], None] | None = None,
    clock: Clock | None = None,
) -> Session | None:
    """Load a session outside any host; ``None`` when the store has none with that id.

    A stored ``running`` status is demoted in memory (``idle``, running runs
    ``aborted``); unless ``persist_heal=False`` the store gets the demotion
    through ``demote_stale_run`` only when the marker is stale by the claim
    rule at ``clock()`` (so a live owner keeps it). Invalid tool pairings are
    dropped (persisted with a bulk save, or armed for the next
    :meth:`Session.save` when ``persist_heal=False``).
    """
    now = clock or _wall_clock
    loaded = await _loaded_session_data(
        store, session_id, persist_heal=persist_heal, on_pairing_drop=on_pairing_drop, clock=now
    )
    if loaded is None:
        return None
    data, pre, rev, held = loaded
    return Session(
        data, store=store, runner=_StandaloneRunner(), clock=now, pre=pre, rev=rev, held=held
    )
