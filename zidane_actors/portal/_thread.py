"""A session host on its own trio loop in a background thread.

The thread runs ``trio.run``; callers in other threads hand it coroutine
functions with ``TrioToken.run_sync_soon`` and get their verdict through a
``concurrent.futures.Future``, which a blocking caller waits on and an asyncio
caller bridges to its loop with ``call_soon_threadsafe``. No thread is spent
per call, and a call from asyncio never blocks its loop.

Every submitted call is tracked until it has a verdict: when the trio thread
ends, normally or by a crash, whatever is still pending fails with
``ActorClosed`` or ``ActorCrashed``, so no caller ever waits forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, TypeVar

import trio

from ..actors import SessionHost
from ..errors import ActorClosed, ActorCrashed

__all__ = ["HostOpener", "Portal"]

T = TypeVar("T")

HostOpener = Callable[[], AbstractAsyncContextManager[SessionHost]]


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


class Portal:
    """One trio thread running one :class:`SessionHost` for callers in other threads.

    :meth:`start` launches the thread and answers a future that resolves once
    the host is open (or fails with the opener's error). :meth:`submit` runs a
    coroutine function in the trio loop; :meth:`close` stops accepting calls,
    cancels the calls in flight (accepted mutations are applied first),
    closes the host and the store, and ends the thread.
    """

    def __init__(self, opener: HostOpener, *, name: str = "zidane-actors-portal") -> None:
        self._opener = opener
        self._name = name
        self._lock = threading.Lock()
        self._pending: set[cf.Future[Any]] = set()
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

    def unreported_crash(self) -> BaseException | None:
        """The trio thread's crash if no caller was told about it yet (then marked told)."""
        with self._lock:
            if self._crash is None or self._crash_reported:
                return None
            self._crash_reported = True
            return self._crash

    # -- calls ----------------------------------------------------------------

    def submit(
        self, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> tuple[cf.Future[T], trio.CancelScope]:
        """Run ``await fn(*args)`` in the trio loop.

        Answers the verdict's future and the call's cancel scope (give it to
        :meth:`cancel`). A cancelled call's future is cancelled, its other
        outcomes are its result or its ``Exception``.
        """
        future: cf.Future[T] = cf.Future()
        scope = trio.CancelScope()
        with self._lock:
            if not self._accepting or self._token is None:
                raise self._closed_error()
            token = self._token
            self._pending.add(future)
        future.add_done_callback(self._forget)
        try:
            token.run_sync_soon(self._spawn, fn, args, future, scope)
        except trio.RunFinishedError:
            _settle(future, error=self._closed_error())
        return future, scope

    def cancel(self, scope: trio.CancelScope) -> None:
        """Cancel a submitted call: it is withdrawn unless it was already accepted."""
        with self._lock:
            token = self._token
        if token is not None:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the trio loop and block until its verdict."""
        if self.in_portal_thread():
            raise RuntimeError("a blocking portal call from the portal's own trio thread deadlocks")
        future, _ = self.submit(fn, *args)
        return future.result()

    async def call_async(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the trio loop, awaited from asyncio without blocking it.

        Cancellation follows trio's rule for actor calls: a call cancelled
        before the trio side accepted it is withdrawn (never applied) and
        ``CancelledError`` is raised; once accepted it runs to its verdict,
        and only then is ``CancelledError`` raised (the work is done).
        """
        future, scope = self.submit(fn, *args)
        cancelled: asyncio.CancelledError | None = None
        while not future.done():
            try:
                await _wait_done(future)
            except asyncio.CancelledError as exc:
                if cancelled is None:
                    cancelled = exc
                    self.cancel(scope)
        if cancelled is not None:
            raise cancelled
        if future.cancelled():  # only our own cancel withdraws a call
            raise asyncio.CancelledError
        return future.result()

    def _forget(self, future: cf.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)
            if not future.cancelled() and isinstance(future.exception(), ActorCrashed):
                self._crash_reported = True

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

    def _spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        future: cf.Future[Any],
        scope: trio.CancelScope,
    ) -> None:
        if self._nursery is None:
            _settle(future, error=self._closed_error())
            return
        self._nursery.start_soon(self._run_call, fn, args, future, scope)

    @staticmethod
    async def _run_call(
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        future: cf.Future[Any],
        scope: trio.CancelScope,
    ) -> None:
        with scope:
            try:
                result = await fn(*args)
            except Exception as exc:
                _settle(future, error=exc)
            else:
                _settle(future, result=result)
            return
        # Only our own scope's cancel gets here: the call was not accepted.
        future.cancel()

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
            pending = list(self._pending)
        if not self._ready.done():
            # Opening failed: the opener's error goes to whoever waits for the start.
            _settle(self._ready, error=crash or ActorClosed("the portal closed before it opened"))
            crash = None
        error = self._closed_error(pending=True)
        for future in pending:
            _settle(future, error=error)
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
