"""The store actor: one task owning a store, serving every session in mailbox order.

Its handle satisfies ``SessionStore`` and exposes exactly the optional methods
the wrapped store has. When the store is a ``BatchingStore``, a queued run of
writes (from any number of sessions) goes to ``apply_writes`` in one call: the
run keeps mailbox order, so no session's writes are ever reordered. A queued
run of reads (``READ_METHODS``) runs at once: reads change nothing, so among
themselves their order cannot matter, and each still runs after every write
queued before it and before every write queued after it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import attrs
import outcome
import trio

from .._nursery import open_service_nursery
from ..model import SessionData
from ..stores._protocol import (
    READ_METHODS,
    WRITE_METHODS,
    BatchingStore,
    NowaitStore,
    ReadBatchingStore,
    Revision,
    SessionStore,
    StoreWrite,
    store_capabilities,
)
from ._actor import Actor, ActorStatistics, Command, Reply
from ._trace import batched

__all__ = ["StoreActor", "StoreActorStatistics", "open_store_actor"]


@attrs.frozen(eq=False)
class _StoreCall(Command[Any]):
    # The call as a StoreWrite, so a run of writes goes to apply_writes as is.
    write: StoreWrite


@attrs.frozen
class StoreActorStatistics:
    """The store actor's mailbox and its group-commit counters."""

    actor: ActorStatistics
    calls: int
    """Store calls answered (reads and writes)."""
    batches: int
    """``apply_writes`` calls made."""
    batched_writes: int
    """Writes that went through ``apply_writes``."""
    read_waves: int
    """Runs of two or more queued reads made at once."""
    calls_at_once: int
    """Calls made at once in the caller's task, the actor idle (``NowaitStore``)."""

    @property
    def avg_batch_size(self) -> float:
        """Mean writes per ``apply_writes`` call (0 before the first)."""
        return self.batched_writes / self.batches if self.batches else 0.0


def _never_fatal(exc: BaseException) -> bool:
    # A store error belongs to the caller (the session actor decides what it means).
    return False


async def _one_outcome_each(
    apply: Callable[[Sequence[StoreWrite]], Awaitable[Sequence[outcome.Outcome[Any]]]],
    calls: list[StoreWrite],
) -> list[outcome.Outcome[Any]]:
    """``apply(calls)``'s outcomes; its error, or a wrong count, as every call's outcome."""
    try:
        results = await apply(calls)
    except BaseException as exc:  # shielded by the actor: never a Cancelled
        return [outcome.Error(exc) for _ in calls]
    if len(results) != len(calls):
        name = getattr(apply, "__name__", "the store")
        err = RuntimeError(f"{name} answered {len(results)} outcomes for {len(calls)}")
        return [outcome.Error(err) for _ in calls]
    return list(results)


_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def _forwarded(method: _Method) -> _Method:
    """A :class:`StoreActor` method queueing the store call ``method`` names."""
    name = method.__name__

    async def forward(self: StoreActor, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, *args, **kwargs)

    return cast(_Method, functools.wraps(method)(forward))


class StoreActor:
    """A ``SessionStore`` whose calls run one at a time in a dedicated task."""

    def __init__(
        self, store: SessionStore, *, mailbox_size: int = 1024, max_batch: int | None = None
    ):
        self._store = store
        self._capabilities = store_capabilities(store)
        self._batching = isinstance(store, BatchingStore) and (max_batch is None or max_batch > 1)
        self._read_batching = isinstance(store, ReadBatchingStore)
        self._nowait = store.apply_nowait if isinstance(store, NowaitStore) else None
        self._coming = 0  # callers at their schedule point before a call made at once
        self._calls_at_once = 0
        self._calls = 0
        self._batches = 0
        self._batched_writes = 0
        self._read_waves = 0
        self._actor: Actor[_StoreCall] = Actor(
            handle_batch=self._handle_batch,
            mailbox_size=mailbox_size,
            max_batch=mailbox_size if max_batch is None else max_batch,
            fatal=_never_fatal,
        )

    @property
    def wrapped(self) -> SessionStore:
        """The store this actor owns."""
        return self._store

    def statistics(self) -> StoreActorStatistics:
        """Mailbox state and group-commit counters."""
        return StoreActorStatistics(
            actor=self._actor.statistics(),
            calls=self._calls,
            batches=self._batches,
            batched_writes=self._batched_writes,
            read_waves=self._read_waves,
            calls_at_once=self._calls_at_once,
        )

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        # Only the optional methods the wrapped store has, so capability checks match.
        if name in self.__dict__.get("_capabilities", ()):

            async def forward(*args: Any, **kwargs: Any) -> Any:
                return await self._call(name, *args, **kwargs)

            forward.__name__ = name
            return forward
        raise AttributeError(name)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._actor.call(_StoreCall(StoreWrite(method, args, kwargs)))

    async def call_together(self, calls: Sequence[StoreWrite]) -> list[outcome.Outcome[Any]]:
        """Queue ``calls`` one after another (nothing between them) and answer each outcome.

        Without a task each: reads among them are made in one wave (see the module
        docstring), writes grouped as always. Cancelled while queueing, none of the
        calls not yet queued is made; once all are queued their outcomes are waited
        for whatever happens.
        """
        replies = [await self._actor.send(_StoreCall(call)) for call in calls]
        results: list[outcome.Outcome[Any]] = []
        for reply in replies:
            results.append(await outcome.acapture(reply.wait_shielded))
        return results

    async def _send(self, write: StoreWrite, reply: Reply[Any]) -> None:
        """Enqueue ``write`` answering ``reply`` (whose ``on_resolve`` sees the verdict first).

        Or make it at once, in this task, when it is the only call coming (see
        :meth:`_alone`) and the store can make it without waiting (``NowaitStore``):
        nothing is ahead of it, and nothing runs until it is made, so mailbox order holds.
        """
        if self._nowait is not None and await self._alone():
            result: outcome.Outcome[Any] | None
            try:
                result = outcome.Value(self._nowait(write))
            except trio.WouldBlock:
                result = None  # nothing done: it goes through the mailbox
            except Exception as exc:  # the call's own error, as the actor answers it
                result = outcome.Error(exc)
            if result is not None:
                self._calls += 1
                self._calls_at_once += 1
                self._actor.settle(reply, result)
                return
        await self._actor.send(_StoreCall(write, reply=reply))

    async def _alone(self) -> bool:
        """The caller's schedule point; then whether its call is the only one coming: the
        actor waits for work, and no other caller passed that point meanwhile.

        The point comes first so that the tasks woken with this one (the run loop does
        not count them as runnable) get there too: a burst goes to the mailbox together,
        one group commit, instead of one call at a time. Cancelled there: nothing sent.
        """
        if not self._actor.waiting_for_work():
            return False  # (the send that follows has the schedule point)
        self._coming += 1
        try:
            await trio.lowlevel.checkpoint()
        finally:
            self._coming -= 1
        return self._coming == 0 and self._actor.waiting_for_work()

    def _submit(self, write: StoreWrite, reply: Reply[Any]) -> None:
        """:meth:`_send` without waiting: ``trio.WouldBlock`` when the mailbox is full."""
        self._actor.submit(_StoreCall(write, reply=reply))

    async def _handle_batch(self, batch: Sequence[_StoreCall]) -> list[outcome.Outcome[Any]]:
        results: list[outcome.Outcome[Any]] = []
        i = 0
        while i < len(batch):
            end = i
            while self._batching and end < len(batch) and batch[end].write.method in WRITE_METHODS:
                end += 1
            if end - i > 1:
                results.extend(await self._apply_writes([c.write for c in batch[i:end]]))
                i = end
                continue
            end = i
            while end < len(batch) and batch[end].write.method in READ_METHODS:
                end += 1
            if end - i > 1:
                results.extend(await self._read_at_once([c.write for c in batch[i:end]]))
                i = end
                continue
            call = batch[i].write
            method = getattr(self._store, call.method)
            results.append(await outcome.acapture(method, *call.args, **call.kwargs))
            i += 1
        self._calls += len(batch)
        return results

    async def _read_at_once(self, reads: list[StoreWrite]) -> list[outcome.Outcome[Any]]:
        """Make ``reads`` at the same time (``apply_reads`` when the store has it); in order."""
        self._read_waves += 1
        if self._read_batching:
            apply_reads = cast(ReadBatchingStore, self._store).apply_reads
            return await _one_outcome_each(apply_reads, reads)
        results: list[outcome.Outcome[Any]] = []

        async def read(index: int, call: StoreWrite) -> None:
            method = getattr(self._store, call.method)
            results[index] = await outcome.acapture(method, *call.args, **call.kwargs)

        results.extend(outcome.Value(None) for _ in reads)  # each replaced by its own
        async with trio.open_nursery() as nursery:
            for index, call in enumerate(reads):
                nursery.start_soon(read, index, call)
        return results

    async def _apply_writes(self, writes: list[StoreWrite]) -> list[outcome.Outcome[Any]]:
        self._batches += 1
        self._batched_writes += len(writes)
        batched(self._store, len(writes))  # zidane.store.batch.size, when measuring
        return await _one_outcome_each(cast(BatchingStore, self._store).apply_writes, writes)

    # -- SessionStore (required methods) -------------------------------------
    # Each is the protocol's method, made through the mailbox (optional ones: __getattr__).

    load = _forwarded(SessionStore.load)
    append_turns = _forwarded(SessionStore.append_turns)
    get_turns = _forwarded(SessionStore.get_turns)
    update_run = _forwarded(SessionStore.update_run)
    update_status = _forwarded(SessionStore.update_status)
    delete = _forwarded(SessionStore.delete)
    list = _forwarded(SessionStore.list)

    async def save(self, data: SessionData, **kwargs: Any) -> Revision | None:
        """See ``SessionStore.save`` (``expected_rev=`` on a versioned store)."""
        result: Revision | None = await self._call("save", data, **kwargs)
        return result


@asynccontextmanager
async def open_store_actor(
    store: SessionStore, *, mailbox_size: int = 1024, max_batch: int | None = None
) -> AsyncIterator[StoreActor]:
    """Run a :class:`StoreActor` over ``store`` for the ``async with`` body.

    ``max_batch`` (default: the whole mailbox) caps the writes one
    ``apply_writes`` call takes. The store itself stays open: whoever opened
    it closes it.
    """
    handle = StoreActor(store, mailbox_size=mailbox_size, max_batch=max_batch)
    async with open_service_nursery() as nursery:
        nursery.start_soon(handle._actor.run)
        try:
            yield handle
        finally:
            handle._actor.close()
