"""A session's commands and replies: what its actor applies, one at a time, and how a
direct write's verdict reaches memory.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, TypeVar

import attrs
import outcome

from ..model import (
    AppendTurnsOptions,
    RunErrorDetail,
    RunStatus,
    SessionArtifact,
    SessionArtifactInput,
    SessionRun,
    SessionStatus,
    SessionTurn,
    TurnUsage,
    UpdateRunOptions,
)
from ..stores._protocol import (
    HistoryMutation,
    MutateResult,
    StoreWrite,
)
from ._actor import Actor, Command, Reply
from ._store_actor import StoreActor

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["RunStats"]

T = TypeVar("T")


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
class _Compact(_SessionCommand[SessionTurn]):
    marker: SessionTurn

    async def apply(self, session: Session) -> SessionTurn:
        return await session._do_compact(self.marker)


@attrs.frozen(eq=False)
class _Heal(_SessionCommand[bool]):
    async def apply(self, session: Session) -> bool:
        return await session._do_heal()
