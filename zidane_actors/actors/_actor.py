"""A small generic actor: one task, a bounded mailbox, one-shot replies.

Rules (see ``docs/runtime.md``):

* The mailbox is a bounded ``trio.open_memory_channel``. A command is a frozen
  attrs value carrying a :class:`Reply` slot that the actor resolves
  synchronously, first writer wins.
* A ``Cancelled`` raised while sending means the command was *not accepted*.
  Once accepted, :meth:`Actor.call` waits for the verdict shielded from
  cancellation, so an accepted command is applied and its result returned.
* Each command is handled in a shielded scope, so a cancelled actor never
  stops half-way through applying one.
* On close the actor fails every command still queued with
  :class:`~zidane_actors.errors.ActorClosed` (it drains with
  ``receive_nowait()``: closing a receive end drops its buffer silently).
* A *fatal* error (by default anything that is not an ``Exception``) crashes
  the actor: the command in hand and every queued one fail with
  :class:`~zidane_actors.errors.ActorCrashed`, later calls get ``ActorClosed``.
  Any other error goes back to the command's caller and the actor lives on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import attrs
import outcome
import trio

from .._nursery import open_service_nursery
from ..errors import ActorClosed, ActorCrashed

__all__ = [
    "Actor",
    "ActorState",
    "ActorStatistics",
    "Command",
    "Reply",
    "open_actor",
]

T = TypeVar("T")
C = TypeVar("C", bound="Command[Any]")

ActorState: TypeAlias = Literal["running", "closing", "closed", "crashed"]


def _refuse_abort(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class Reply(Generic[T]):
    """A one-shot reply slot: resolved once (first writer wins), awaited by anyone.

    Waiters park with ``trio.lowlevel.wait_task_rescheduled`` directly: this is
    the hot path of every actor call, and it lets :meth:`Actor.call` wait
    without a cancel scope (a cancel during the wait is deferred, not lost).
    The first waiter takes a slot of its own: a reply usually has exactly one,
    and a list per call would be one more object for the cyclic GC to track.
    """

    __slots__ = ("_on_resolve", "_outcome", "_waiter", "_waiters")

    def __init__(
        self, on_resolve: Callable[[outcome.Outcome[T]], outcome.Outcome[T]] | None = None
    ) -> None:
        self._outcome: outcome.Outcome[T] | None = None
        self._waiter: trio.lowlevel.Task | None = None
        self._waiters: list[trio.lowlevel.Task] | None = None  # any after the first
        # Run synchronously by whoever resolves, before any waiter can run: it may
        # apply the verdict's effect (and answer a replacement verdict). Must not raise.
        self._on_resolve = on_resolve

    def resolve(self, result: outcome.Outcome[T]) -> bool:
        """Set the verdict; ``False`` (and no effect) when it was already set."""
        if self._outcome is not None:
            return False
        if self._on_resolve is not None:
            result = self._on_resolve(result)
        self._outcome = result
        waiter, waiters = self._waiter, self._waiters
        self._waiter = self._waiters = None
        if waiter is not None:
            trio.lowlevel.reschedule(waiter)
        if waiters is not None:
            for task in waiters:
                trio.lowlevel.reschedule(task)
        return True

    def done(self) -> bool:
        """Whether the verdict is in."""
        return self._outcome is not None

    def _park(self, task: trio.lowlevel.Task) -> None:
        if self._waiter is None:
            self._waiter = task
        elif self._waiters is None:
            self._waiters = [task]
        else:
            self._waiters.append(task)

    def _verdict(self) -> T:
        # ``type(...) is`` rather than isinstance: outcome's classes are ABCs (slow checks).
        result = self._outcome
        if type(result) is outcome.Value:
            value: T = result.value
            return value
        assert type(result) is outcome.Error
        raise result.error

    async def wait(self) -> T:
        """Wait for the verdict: the command's result, or its error raised here.

        Cancellable: a cancelled wait just stops waiting (the command is not undone).
        """
        if self._outcome is not None:
            await trio.lowlevel.checkpoint()
            return self._verdict()
        task = trio.lowlevel.current_task()
        self._park(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            if self._waiter is task:
                self._waiter = None
            else:
                assert self._waiters is not None
                self._waiters.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return self._verdict()

    async def wait_shielded(self) -> T:
        """Wait for the verdict without being cancellable; a cancel lands at the next checkpoint."""
        if self._outcome is None:
            self._park(trio.lowlevel.current_task())
            await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
        return self._verdict()


@attrs.frozen(eq=False)
class Command(Generic[T]):
    """Base of actor commands: a frozen value carrying its reply slot."""

    reply: Reply[T] = attrs.field(factory=Reply, kw_only=True, repr=False)


@attrs.frozen
class ActorStatistics:
    """A snapshot of an actor: its state, mailbox use and counters."""

    state: ActorState
    queued: int
    """Commands accepted and waiting (buffered or blocked in ``send``)."""
    processed: int
    """Commands whose verdict was a result."""
    failed: int
    """Commands whose verdict was an error (including drained ones)."""
    mailbox_size: int
    busy: bool
    """Whether a command is being handled right now."""


def _not_an_exception(exc: BaseException) -> bool:
    return not isinstance(exc, Exception)


BatchHandler: TypeAlias = Callable[[Sequence[C]], Awaitable[Sequence[outcome.Outcome[Any]]]]


class Actor(Generic[C]):
    """One task applying commands from a bounded mailbox, one batch at a time.

    ``handle`` is awaited for each command and its result (or error) becomes
    the command's verdict. ``handle_batch`` (with ``max_batch > 1``) instead
    receives every command already queued, up to ``max_batch``, and answers
    one outcome per command, in order. Start the actor with :meth:`run` in a
    nursery (or use :func:`open_actor`). ``on_idle`` is called (from the actor's
    task) each time the actor has applied a batch and its mailbox is empty; it
    may close the actor.
    """

    # A host starts and drops many session actors: slots and a stop event made
    # only when someone waits for it keep each start small.
    __slots__ = (
        "_busy",
        "_close_cause",
        "_crash",
        "_failed",
        "_fatal",
        "_handle",
        "_handle_batch",
        "_mailbox_size",
        "_max_batch",
        "_on_crash",
        "_on_idle",
        "_on_stop",
        "_processed",
        "_receive",
        "_send",
        "_started",
        "_state",
        "_stopped",
    )

    def __init__(
        self,
        handle: Callable[[C], Awaitable[Any]] | None = None,
        *,
        handle_batch: BatchHandler[C] | None = None,
        mailbox_size: int = 64,
        max_batch: int = 1,
        fatal: Callable[[BaseException], bool] = _not_an_exception,
        on_crash: Callable[[BaseException], None] | None = None,
        on_stop: Callable[[], None] | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        if (handle is None) == (handle_batch is None):
            raise TypeError("give exactly one of handle and handle_batch")
        if mailbox_size < 1 or max_batch < 1:
            raise ValueError("mailbox_size and max_batch must be at least 1")
        self._handle = handle
        self._handle_batch = handle_batch
        self._max_batch = max_batch if handle_batch is not None else 1
        self._fatal = fatal
        self._on_crash = on_crash
        self._on_stop = on_stop
        self._on_idle = on_idle
        self._mailbox_size = mailbox_size
        self._send, self._receive = trio.open_memory_channel[C](mailbox_size)
        self._state: ActorState = "running"
        self._crash: BaseException | None = None
        self._close_cause: BaseException | None = None
        self._busy = False
        self._processed = 0
        self._failed = 0
        self._started = False
        self._stopped: trio.Event | None = None

    # -- caller side ---------------------------------------------------------

    @property
    def state(self) -> ActorState:
        """``running``, ``closing`` (draining), ``closed`` or ``crashed``."""
        return self._state

    @property
    def crash_cause(self) -> BaseException | None:
        """What crashed the actor, when it crashed."""
        return self._crash

    def idle(self) -> bool:
        """Running, handling nothing and with nothing queued."""
        return self._quiet() is not None

    def waiting_for_work(self) -> bool:
        """Running and parked for its next command, with none queued or in hand.

        Nothing is ahead of a command sent now: applying it at once in the
        sender's task, without a checkpoint in between, keeps mailbox order
        (see :meth:`settle`).
        """
        stats = self._quiet()
        return stats is not None and stats.tasks_waiting_receive == 1

    def _quiet(self) -> trio.MemoryChannelStatistics | None:
        """The mailbox's statistics when the actor runs, handles nothing and has nothing
        queued, else ``None``. (A command just handed to its parked task shows only as
        no task waiting to receive: see :meth:`waiting_for_work`.)"""
        if self._state != "running" or self._busy:
            return None
        stats = self._send.statistics()
        if stats.current_buffer_used or stats.tasks_waiting_send:
            return None
        return stats

    def settle(self, reply: Reply[T], result: outcome.Outcome[T]) -> None:
        """Resolve ``reply`` with a command's verdict and count it: the actor's own, or
        that of a command applied outside its task while it was :meth:`waiting_for_work`."""
        if reply.resolve(result):
            if type(result) is outcome.Value:
                self._processed += 1
            else:
                self._failed += 1

    def _closed_error(self) -> ActorClosed:
        if self._crash is not None:
            err = ActorClosed(f"actor crashed: {self._crash!r}")
            err.__cause__ = self._crash
            return err
        return ActorClosed("actor is closed")

    async def call(self, command: Command[T]) -> T:
        """Send ``command`` and wait for its verdict.

        Cancelled while sending: the command was not accepted. Once accepted the
        wait is shielded, so the verdict (result or error) always comes back.
        """
        await self.send(command)
        return await command.reply.wait_shielded()

    async def send(self, command: Command[T]) -> Reply[T]:
        """Enqueue ``command``, waiting for room in the mailbox; answer its reply.

        Cancelled (or raising) here means the command was not accepted.
        """
        if self._state != "running":
            raise self._closed_error()
        # A cancel point first (raising here means not accepted); then enqueue,
        # blocking only when the mailbox is full. The caller's parked wait that
        # follows is the schedule point, so a call with room yields once.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                self._send.send_nowait(command)  # type: ignore[arg-type]
            except trio.WouldBlock:
                await self._send.send(command)  # type: ignore[arg-type]
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._closed_error() from None
        return command.reply

    def submit(self, command: Command[T]) -> Reply[T]:
        """Enqueue without waiting; await the returned reply later.

        Raises ``trio.WouldBlock`` when the mailbox is full and ``ActorClosed``
        when the actor stopped.
        """
        if self._state != "running":
            raise self._closed_error()
        try:
            self._send.send_nowait(command)  # type: ignore[arg-type]
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._closed_error() from None
        return command.reply

    def close(self, cause: BaseException | None = None) -> None:
        """Stop accepting; the command in hand finishes, queued ones fail with ``ActorClosed``.

        With a ``cause`` (something outside the actor was fatal to what it serves),
        queued ones fail with ``ActorCrashed`` caused by it instead, and the actor
        ends ``crashed`` (without calling ``on_crash``: whoever closes reports it).
        Idempotent. A never-started actor fails its queue right away.
        """
        if self._state == "running":
            self._state = "closing"
            self._close_cause = cause
        self._send.close()
        if not self._started:
            self._stop(None)

    async def wait_stopped(self) -> None:
        """Return once the actor has stopped (closed or crashed) and failed its queue."""
        if self._state in ("closed", "crashed"):
            await trio.lowlevel.checkpoint()
            return
        if self._stopped is None:
            self._stopped = trio.Event()
        await self._stopped.wait()

    def statistics(self) -> ActorStatistics:
        """A snapshot of the actor's state and counters."""
        stats = self._send.statistics()
        return ActorStatistics(
            state=self._state,
            queued=stats.current_buffer_used + stats.tasks_waiting_send,
            processed=self._processed,
            failed=self._failed,
            mailbox_size=self._mailbox_size,
            busy=self._busy,
        )

    # -- actor side ----------------------------------------------------------

    def _stop(self, crash: BaseException | None) -> None:
        """Fail everything queued and close the mailbox; no checkpoint in between."""
        if self._state in ("closed", "crashed"):
            return
        cause = crash if crash is not None else self._close_cause
        if cause is not None:
            self._crash = cause
        while True:
            try:
                command = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self.settle(command.reply, outcome.Error(self._verdict_error(cause)))
        self._receive.close()
        self._send.close()
        self._state = "crashed" if cause is not None else "closed"
        if self._stopped is not None:
            self._stopped.set()
        on_stop, on_crash = self._on_stop, self._on_crash
        # A stopped actor calls nothing more. Dropping its hooks breaks the cycles
        # through closures that know the actor, so reference counting frees it at
        # once instead of leaving it to the cyclic GC (a host drops many actors).
        self._on_stop = self._on_idle = self._on_crash = None
        if on_stop is not None:
            on_stop()
        if crash is not None and on_crash is not None:
            on_crash(crash)

    def _verdict_error(self, crash: BaseException | None) -> BaseException:
        if crash is None:
            return ActorClosed("actor closed before handling the command")
        err = ActorCrashed(f"actor crashed: {crash!r}")
        err.__cause__ = crash
        return err

    async def _apply(self, batch: list[C]) -> BaseException | None:
        """Handle ``batch``; answer the crash cause when one of them was fatal."""
        if self._handle_batch is not None:
            answer = await outcome.acapture(self._handle_batch, batch)
            if isinstance(answer, outcome.Error):
                results: Sequence[outcome.Outcome[Any]] = [answer] * len(batch)
            else:
                results = answer.unwrap()
        else:
            assert self._handle is not None
            results = [await outcome.acapture(self._handle, batch[0])]
        for command, result in zip(batch, results, strict=True):
            if type(result) is outcome.Error and self._fatal(result.error):
                crash = result.error
                for pending in batch:
                    self.settle(pending.reply, outcome.Error(self._verdict_error(crash)))
                return crash
            self.settle(command.reply, result)
        return None

    async def _first(self) -> C:
        """The first command, taken without a schedule point when it is queued already.

        It usually is (a command starts a session's actor), so a new actor handles
        it in the pass it starts; only a cancel stops it here, as in ``receive()``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            return await self._receive.receive()

    async def run(self) -> None:
        """The actor loop; returns when closed, cancelled or crashed (never raises for a crash)."""
        if self._started:
            raise RuntimeError("an actor runs once")
        self._started = True
        crash: BaseException | None = None
        try:
            # One scope for the whole loop: open to cancellation while waiting for
            # a command, shielded while applying one (cheaper than a scope each).
            with trio.CancelScope() as guard:
                # A batching actor waits one pass instead, so writes queued in the
                # same pass as its first one join that first batch.
                fresh = self._max_batch == 1
                while self._state == "running":
                    guard.shield = False
                    try:
                        first = await (self._first() if fresh else self._receive.receive())
                    except (trio.EndOfChannel, trio.ClosedResourceError):
                        break
                    fresh = False
                    guard.shield = True
                    # A command handed straight to a waiting receive is in hand, even
                    # if close() ran since: it is applied, and only the queue drained.
                    batch = [first]
                    while len(batch) < self._max_batch and self._state == "running":
                        try:
                            batch.append(self._receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    self._busy = True
                    try:
                        crash = await self._apply(batch)
                    finally:
                        self._busy = False
                    if crash is not None:
                        break
                    if self._on_idle is not None and self.idle():
                        self._on_idle()
        finally:
            self._stop(crash)


@asynccontextmanager
async def open_actor(
    handle: Callable[[C], Awaitable[Any]],
    *,
    mailbox_size: int = 64,
    fatal: Callable[[BaseException], bool] = _not_an_exception,
    on_crash: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[Actor[C]]:
    """Run an :class:`Actor` for the ``async with`` body, closing it on exit."""
    actor: Actor[C] = Actor(handle, mailbox_size=mailbox_size, fatal=fatal, on_crash=on_crash)
    async with open_service_nursery() as nursery:
        nursery.start_soon(actor.run)
        try:
            yield actor
        finally:
            actor.close()
