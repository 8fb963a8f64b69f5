"""A session host on its own trio loop in a background thread.

The thread runs ``trio.run``. Callers in other threads put calls in one
inbox; the first call of a wave wakes the trio loop (``run_sync_soon``) and
one drain there takes every call queued by then. A coroutine call runs on a
parked worker task (a pool that grows to the peak number of calls in flight
and shrinks when idle), so no task is spawned per call; a plain function
(``post``, and the handles' plain calls) runs in the drain itself.

Verdicts go back in batches too: a courier task hands back every verdict of
one pass of the loop in the next pass (a lone call's goes at once). A
blocking caller waits on a lock of its own; every asyncio loop has one
outbox, flushed with one ``call_soon_threadsafe`` per wave.

Every call is tracked until it has a verdict (in the inbox, held by a
worker, or recorded for the courier): when the trio thread ends, normally or
by a crash, whatever is still pending fails with ``ActorClosed`` or
``ActorCrashed``, so no caller ever waits forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, Final, TypeVar

import attrs
import trio

from ..actors import SessionHost
from ..errors import ActorClosed, ActorCrashed

__all__ = ["HostOpener", "Portal", "PortalStatistics", "wait_future"]

T = TypeVar("T")

HostOpener = Callable[[], AbstractAsyncContextManager[SessionHost]]

_log = logging.getLogger("zidane_actors.portal")

_TRIM_SECONDS: Final = 5.0
"""How often idle workers beyond what the last period needed are retired."""

# A call's life: queued in the inbox, running (on a worker or in the drain), done.
_QUEUED: Final = 0
_RUNNING: Final = 1
_DONE: Final = 2

_allocate_lock = threading.Lock


@attrs.frozen
class PortalStatistics:
    """A snapshot of a portal's traffic (read without a lock: counters may lag a little)."""

    calls: int
    """Calls taken from the inbox and started (or refused)."""
    waves: int
    """Drains of the inbox: each took every call queued since the one before."""
    deliveries: int
    """Passes of the courier: each handed back every verdict of one pass of the loop."""
    workers: int
    """Worker tasks alive (busy or parked)."""
    idle_workers: int
    """Worker tasks parked, waiting for a call."""
    queued: int
    """Calls in the inbox, not yet drained."""


def _settle(
    future: cf.Future[Any], *, result: Any = None, error: BaseException | None = None
) -> None:
    """Resolve ``future`` unless it already has a verdict (first writer wins)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except cf.InvalidStateError:
        pass


class _Call:
    """One call into the trio loop and how its verdict goes back.

    Exactly one of ``lock`` (a blocking caller waits on it) and ``outbox``
    (an asyncio caller's loop, woken through ``waiter``) is set, or neither
    for a post. ``withdraw`` is set by the asyncio side to ask for a cancel;
    everything else is written by the trio thread only.
    """

    __slots__ = (
        "args",
        "error",
        "fn",
        "inline",
        "kwargs",
        "lock",
        "outbox",
        "state",
        "value",
        "waiter",
        "withdraw",
        "worker",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        inline: bool,
        lock: Any,
        outbox: _Outbox | None,
        waiter: asyncio.Future[None] | None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.inline = inline
        self.lock = lock
        self.outbox = outbox
        self.waiter = waiter
        self.state = _QUEUED
        self.value: Any = None
        self.error: BaseException | None = None
        self.withdraw = False
        self.worker: _Worker | None = None

    def settle(self, value: Any, error: BaseException | None) -> None:
        """Record the verdict and hand it back now (first writer wins)."""
        if self.record(value, error):
            self.deliver()

    def record(self, value: Any, error: BaseException | None) -> bool:
        """Record the verdict; ``False`` when it had one already."""
        if self.state == _DONE:
            return False
        self.value = value
        self.error = error
        self.state = _DONE
        self.worker = None
        return True

    def deliver(self) -> None:
        """Hand the recorded verdict back to whoever waits."""
        error = self.error
        if self.lock is not None:
            self.lock.release()
        elif self.outbox is not None:
            self.outbox.put(self)
        elif error is not None and not isinstance(error, ActorClosed):
            _log.error("a posted portal call failed", exc_info=error)

    def verdict(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Outbox:
    """The verdicts bound for one asyncio loop, delivered in waves.

    The first verdict of a wave schedules one :meth:`flush` on the loop; the
    ones that arrive before it runs ride along. It holds its loop weakly, so
    a finished loop (``asyncio.run`` makes one per call) is freed with it.
    """

    __slots__ = ("_lock", "_ready", "_scheduled", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[_Call] = []
        self._scheduled = False

    def put(self, call: _Call) -> None:
        with self._lock:
            self._ready.append(call)
            if self._scheduled:
                return
            self._scheduled = True
        loop = self.loop()
        if loop is not None:
            with suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._scheduled = False
        for call in ready:
            waiter = call.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = (
    weakref.WeakKeyDictionary()
)
_outboxes_lock = threading.Lock()
_last_outbox: _Outbox | None = None  # the loop of the last asyncio call, looked up first


def _outbox_for(loop: asyncio.AbstractEventLoop) -> _Outbox:
    global _last_outbox
    outbox = _last_outbox
    if outbox is not None and outbox.loop() is loop:
        return outbox
    with _outboxes_lock:
        outbox = _outboxes.get(loop)
        if outbox is None:
            outbox = _outboxes[loop] = _Outbox(loop)
    _last_outbox = outbox
    return outbox


def _abort_parked(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.SUCCEEDED


class _Worker:
    """A task of the pool: runs one call at a time, parked between calls."""

    __slots__ = ("call", "idle", "scope", "task")

    def __init__(self, idle: list[_Worker], call: _Call) -> None:
        self.idle = idle
        self.call: _Call | None = call
        self.scope: trio.CancelScope | None = None
        self.task: trio.lowlevel.Task | None = None

    def abort(self, _: object) -> trio.lowlevel.Abort:
        # Only a shutdown (or a retired worker's own cancel) aborts a parked worker.
        with suppress(ValueError):
            self.idle.remove(self)
        return trio.lowlevel.Abort.SUCCEEDED


class Portal:
    """One trio thread running one :class:`SessionHost` for callers in other threads.

    :meth:`start` launches the thread and answers a future that resolves once
    the host is open (or fails with the opener's error). :meth:`call`,
    :meth:`call_async` and :meth:`post` run work in the trio loop;
    :meth:`close` stops accepting calls, cancels the calls in flight
    (accepted mutations are applied first), closes the host and the store,
    and ends the thread.
    """

    def __init__(self, opener: HostOpener, *, name: str = "zidane-actors-portal") -> None:
        self._opener = opener
        self._name = name
        self._lock = threading.Lock()
        self._inbox: list[_Call] = []
        self._wake_pending = False
        self._accepting = False
        self._ready: cf.Future[None] = cf.Future()
        self._stopped: cf.Future[None] = cf.Future()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._closing: trio.Event | None = None
        self._host: SessionHost | None = None
        self._crash: BaseException | None = None
        self._crash_reported = False
        self._close_requested = False
        # The trio thread's own state: every worker, the parked ones (a stack),
        # and the fewest parked at once since the last trim.
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._idle_low = 0
        # Verdicts recorded in this pass of the trio loop, handed back together by
        # the courier task in the next pass (one wake-up per asyncio loop a wave).
        self._verdicts: list[_Call] = []
        self._courier: trio.lowlevel.Task | None = None
        self._courier_parked = False
        self._calls = 0
        self._waves = 0
        self._deliveries = 0

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> cf.Future[None]:
        """Launch the trio thread; the answer resolves once the host is open."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the portal was already started")
            self._thread = threading.Thread(target=self._thread_main, name=self._name, daemon=True)
        self._thread.start()
        return self._ready

    @property
    def host(self) -> SessionHost:
        """The host (only to be used from inside the portal's trio loop)."""
        if self._host is None:
            raise ActorClosed("the portal is not running")
        return self._host

    @property
    def stopped(self) -> cf.Future[None]:
        """Resolves when the trio thread has ended (the host and store are closed)."""
        return self._stopped

    def in_portal_thread(self) -> bool:
        """Whether the caller runs in the portal's own trio thread."""
        return threading.current_thread() is self._thread

    def close(self) -> cf.Future[None]:
        """Stop accepting calls and shut the host down; answers :attr:`stopped`.

        Calls in flight are cancelled (an accepted mutation is applied first; the
        others fail with ``ActorClosed``). Idempotent.
        """
        with self._lock:
            self._accepting = False
            self._close_requested = True
            token, closing = self._token, self._closing
        if token is not None and closing is not None:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(closing.set)
        if self._thread is None:
            _settle(self._stopped)
        return self._stopped

    def statistics(self) -> PortalStatistics:
        """Counters of calls, waves and deliveries, and the worker pool's size."""
        return PortalStatistics(
            calls=self._calls,
            waves=self._waves,
            deliveries=self._deliveries,
            workers=len(self._workers),
            idle_workers=len(self._idle),
            queued=len(self._inbox),
        )

    def unreported_crash(self) -> BaseException | None:
        """The trio thread's crash if no caller was told about it yet (then marked told)."""
        with self._lock:
            if self._crash is None or self._crash_reported:
                return None
            self._crash_reported = True
            return self._crash

    # -- calls ----------------------------------------------------------------

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` in the trio loop and block until its verdict."""
        return self._call_blocking(fn, args, kwargs, inline=False)  # type: ignore[no-any-return]

    def post(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """Run the plain function ``fn(*args, **kwargs)`` in the trio loop, without waiting.

        Calls from one thread run in the order they were made (posted or not);
        an error is logged.
        """
        self._push(_Call(fn, args, kwargs, True, None, None, None))

    async def call_async(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` in the trio loop, awaited from asyncio.

        Cancellation follows trio's rule for actor calls: a call cancelled
        before the trio side accepted it is withdrawn (never applied) and
        ``CancelledError`` is raised; once accepted it runs to its verdict,
        and only then is ``CancelledError`` raised (the work is done).
        """
        return await self._call_async(fn, args, kwargs, inline=False)  # type: ignore[no-any-return]

    def _call_blocking(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, inline: bool
    ) -> Any:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking portal call from the portal's own trio thread deadlocks")
        lock = _allocate_lock()
        lock.acquire()
        call = _Call(fn, args, kwargs, inline, lock, None, None)
        self._push(call)
        lock.acquire()
        return call.verdict()

    async def _call_async(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, inline: bool
    ) -> Any:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        call = _Call(fn, args, kwargs, inline, None, _outbox_for(loop), waiter)
        self._push(call)
        try:
            await waiter
        except asyncio.CancelledError:
            await self._withdraw(call, loop)
            raise
        return call.verdict()

    async def _withdraw(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        """Ask the trio side to withdraw ``call``, then wait (uncancellably) for its verdict."""
        if call.state == _DONE:
            return
        call.withdraw = True
        # The same call again: the drain withdraws it if it has not started, or
        # cancels its worker's scope if it is running. A portal that no longer
        # accepts settles it while closing.
        with suppress(ActorClosed, ActorCrashed):
            self._push(call)
        while call.state != _DONE:
            waiter = call.waiter = loop.create_future()
            if call.state == _DONE:  # settled before this waiter was in place
                break
            with suppress(asyncio.CancelledError):
                await waiter

    def _push(self, call: _Call) -> None:
        with self._lock:
            if not self._accepting or self._token is None:
                raise self._closed_error()
            self._inbox.append(call)
            if self._wake_pending:
                return
            self._wake_pending = True
            token = self._token
        with suppress(trio.RunFinishedError):  # the run is ending: its sweep settles the inbox
            token.run_sync_soon(self._drain)

    def _closed_error(self, *, pending: bool = False) -> ActorClosed | ActorCrashed:
        """``ActorCrashed`` for a call the crash caught pending, else ``ActorClosed``.

        Either way a crash is the ``__cause__``.
        """
        if self._crash is None:
            return ActorClosed("the portal is closed")
        error: ActorClosed | ActorCrashed
        if pending:
            error = ActorCrashed("the portal's trio thread crashed during this call")
        else:
            error = ActorClosed("the portal's trio thread crashed")
        error.__cause__ = self._crash
        return error

    # -- the trio side ----------------------------------------------------------

    def _drain(self) -> None:
        """Start every queued call (run in the trio loop, one drain per wave)."""
        with self._lock:
            batch, self._inbox = self._inbox, []
            self._wake_pending = False
            accepting = self._accepting
        self._waves += 1
        for call in batch:
            state = call.state
            if state == _DONE:
                continue
            if state == _RUNNING:  # a second entry: a withdrawal of a running call
                worker = call.worker
                if worker is not None and worker.call is call and worker.scope is not None:
                    worker.scope.cancel()
                continue
            self._calls += 1
            if call.withdraw:
                self._finish(call, None, asyncio.CancelledError())
            elif not accepting:
                self._finish(call, None, ActorClosed("the portal is closing"))
            elif call.inline:
                call.state = _RUNNING
                try:
                    value = call.fn(*call.args, **call.kwargs)
                except BaseException as exc:  # to its caller: the rest of the wave still runs
                    self._finish(call, None, exc)
                else:
                    self._finish(call, value, None)
            else:
                self._start(call)

    def _finish(self, call: _Call, value: Any, error: BaseException | None) -> None:
        """Record ``call``'s verdict; the courier hands it back at the end of this pass."""
        if not call.record(value, error):
            return
        if (call.lock is None and call.outbox is None) or (
            not self._verdicts and len(self._workers) - len(self._idle) <= 1
        ):
            # A post (nobody waits), or a lone call: no other verdict can join it.
            call.deliver()
        else:
            self._verdicts.append(call)
            if self._courier_parked:
                self._courier_parked = False
                assert self._courier is not None
                trio.lowlevel.reschedule(self._courier)

    async def _carry(self) -> None:
        """The courier: once a pass of the loop has recorded verdicts, hand them all back.

        Running one pass later, it finds every verdict of the pass: a blocking
        caller is released, and each asyncio loop is woken once for all of
        its verdicts.
        """
        self._courier = trio.lowlevel.current_task()
        try:
            while True:
                if not self._verdicts:  # (some may be in before its first pass)
                    self._courier_parked = True
                    await trio.lowlevel.wait_task_rescheduled(_abort_parked)
                verdicts, self._verdicts = self._verdicts, []
                self._deliveries += 1
                for call in verdicts:
                    call.deliver()
        finally:  # closing: what is recorded from now on, the sweep hands back
            self._courier_parked = False

    def _start(self, call: _Call) -> None:
        call.state = _RUNNING
        idle = self._idle
        if idle:
            worker = idle.pop()
            if len(idle) < self._idle_low:
                self._idle_low = len(idle)
            worker.call = call
            call.worker = worker
            assert worker.task is not None
            trio.lowlevel.reschedule(worker.task)
        else:
            assert self._nursery is not None
            worker = _Worker(idle, call)
            call.worker = worker
            self._workers.add(worker)
            self._nursery.start_soon(self._work, worker)

    async def _work(self, worker: _Worker) -> None:
        """A worker's life: run its call, park, run the next; retire when told."""
        worker.task = trio.lowlevel.current_task()
        call: _Call | None = worker.call
        try:
            while call is not None:
                # One cancel scope serves every call until one is withdrawn.
                with trio.CancelScope() as scope:
                    worker.scope = scope
                    while call is not None:
                        try:
                            value = await call.fn(*call.args, **call.kwargs)
                        except Exception as exc:
                            worker.call = None
                            self._finish(call, None, exc)
                        else:
                            worker.call = None
                            self._finish(call, value, None)
                        if scope.cancel_called:  # the cancel came too late: fresh scope
                            break
                        call = await self._park(worker)
                    else:
                        return
                if worker.call is not None:  # only our own cancel gets here: not accepted
                    withdrawn, worker.call = worker.call, None
                    self._finish(withdrawn, None, asyncio.CancelledError())
                call = await self._park(worker)
        finally:
            if worker.call is None:  # else the sweep in _thread_main settles its call
                self._workers.discard(worker)

    async def _park(self, worker: _Worker) -> _Call | None:
        """Wait in the idle stack for the next call (``None``: retire)."""
        worker.call = None
        self._idle.append(worker)
        await trio.lowlevel.wait_task_rescheduled(worker.abort)
        return worker.call

    async def _trim(self) -> None:
        """Retire the workers no call needed over a whole period (the longest parked first)."""
        while True:
            await trio.sleep(_TRIM_SECONDS)
            spare = min(self._idle_low, len(self._idle))
            retired, self._idle[:spare] = self._idle[:spare], []
            for worker in retired:
                assert worker.task is not None
                trio.lowlevel.reschedule(worker.task)  # with no call: retire
            self._idle_low = len(self._idle)

    async def _main(self) -> None:
        async with self._opener() as host, trio.open_nursery() as nursery:
            closing = trio.Event()
            with self._lock:
                self._host = host
                self._nursery = nursery
                self._closing = closing
                self._token = trio.lowlevel.current_trio_token()
                self._accepting = not self._close_requested
                if self._close_requested:
                    closing.set()
            nursery.start_soon(self._trim)
            nursery.start_soon(self._carry)
            _settle(self._ready)
            await closing.wait()
            with self._lock:
                self._accepting = False
            # Calls still in flight are cancelled, as trio cancels a nursery: one not
            # yet accepted is withdrawn (its caller gets ActorClosed from the sweep in
            # _thread_main), an accepted mutation is applied first. No call can hold
            # the close open.
            nursery.cancel_scope.cancel()
        self._nursery = None

    def _thread_main(self) -> None:
        crash: BaseException | None = None
        try:
            trio.run(self._main)
        except BaseException as exc:
            crash = exc
        with self._lock:
            self._accepting = False
            self._host = None
            self._nursery = None
            if crash is not None and self._ready.done():
                self._crash = crash
            pending = [call for call in self._inbox if call.state != _DONE]
            self._inbox = []
        pending.extend(w.call for w in self._workers if w.call is not None)
        verdicts, self._verdicts = self._verdicts, []
        for call in verdicts:  # recorded after the courier stopped
            call.deliver()
        self._workers.clear()
        self._idle.clear()
        if not self._ready.done():
            # Opening failed: the opener's error goes to whoever waits for the start.
            _settle(self._ready, error=crash or ActorClosed("the portal closed before it opened"))
        error = self._closed_error(pending=True)
        if isinstance(error, ActorCrashed) and any(c.lock or c.outbox for c in pending):
            with self._lock:
                self._crash_reported = True
        for call in pending:
            call.settle(None, error)
        _settle(self._stopped)


async def wait_future(future: cf.Future[T]) -> T:
    """Await a concurrent future from asyncio without blocking the loop or cancelling it."""
    while not future.done():
        await _wait_done(future)
    return future.result()


async def _wait_done(future: cf.Future[Any]) -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def set_waiter() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def wake(_: cf.Future[Any]) -> None:
        with suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(set_waiter)

    future.add_done_callback(wake)
    await waiter
