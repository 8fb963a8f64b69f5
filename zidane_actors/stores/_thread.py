"""One worker thread owning a resource (a database connection) for its whole life.

Why not ``trio.to_thread.run_sync``: each call there hands the job to a pooled
thread and wakes the trio thread through a fresh channel; a long-lived
thread fed by a queue costs less than half of that per call, and the
resource is opened, used and closed by that thread (or used, for a job run
here, below, by the trio thread while the worker idles). The thread answers a lone
caller (the usual case: one job in flight) through a socket that caller waits
on, so the run loop reschedules it as soon as it sees the byte; callers
queued meanwhile are answered through the run's ``TrioToken``, which takes
one more pass of the loop (about two thirds of ``to_thread.run_sync``): the
answers ready before that pass runs ride along with the first, one wake-up
for all of them.
A lone caller can skip the thread altogether: :meth:`WorkerThread.run` with
``here=`` runs that job in the trio thread itself when the thread is idle (no
job queued or running) and the run has nothing else to do (no task runnable,
no ``run_sync_soon`` callback queued). Nobody can be kept waiting then, and
the job runs exactly where it would have in the thread's queue: it saves the
two hand-overs, most of what a lone caller pays above its job. A schedule
point follows it, so a caller running such jobs in a loop still lets the
other tasks run. (:meth:`WorkerThread.run_nowait` runs such a job now or
raises ``trio.WouldBlock``, for a caller that must know before it waits.) The
resource is never touched by both threads at once: only the trio thread
submits jobs, and it runs one here only while the thread is idle. Such jobs
are timed wherever they run: while their moving average is above
``_HERE_LIMIT_SECONDS`` (a slow disk), they all go to the thread, so the run
loop is never held up long by a job of the kind that is usually quick.

Semantics are those of ``to_thread.run_sync`` behind a ``CapacityLimiter(1)``:

* jobs run one at a time, in the order they were submitted;
* a caller cancelled while its job waits in the queue withdraws it (never
  run); once the thread has taken the job (the hand-over), the caller waits for
  its outcome whatever happens, and a cancel lands at its next checkpoint: a
  job is never abandoned half-way;
* a job's exception (any ``BaseException``) is raised in its caller; the
  thread lives on.

:meth:`WorkerThread.aclose` fails the jobs still queued with the owner's
"closed" error, closes the resource in the thread and joins it; later calls
raise that error at once.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

__all__ = ["WorkerThread", "start_worker_thread"]

R = TypeVar("R")
T = TypeVar("T")

_HERE_LIMIT_SECONDS: Final = 0.002
"""Jobs that could run in the trio thread run there only while they average less."""
_HERE_WEIGHT: Final = 0.125
"""The weight of the latest such job in their moving average of seconds."""


class _Job:
    """One submitted call; ``taken`` and ``withdrawn`` change under the worker's lock.

    ``task`` is the caller to reschedule, or ``None`` when the caller waits on
    the worker's socket: then the thread stores ``result`` and sends a byte.
    """

    __slots__ = ("fn", "result", "taken", "task", "timed", "withdrawn")

    def __init__(
        self, fn: Callable[[Any], Any], task: trio.lowlevel.Task | None, timed: bool
    ) -> None:
        self.fn = fn
        self.task = task
        self.timed = timed
        self.result: outcome.Outcome[Any] | None = None
        self.taken = False
        self.withdrawn = False


class _Stop:
    """The last item the thread takes: close the resource and answer ``task``."""

    __slots__ = ("task",)

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task


def _refuse_abort(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class WorkerThread(Generic[R]):
    """A thread running ``fn(resource)`` jobs for trio tasks, one at a time, in FIFO order.

    Create it with :func:`start_worker_thread`, from inside the trio run that uses it.
    """

    def __init__(
        self,
        name: str,
        open_resource: Callable[[], R],
        close_resource: Callable[[R], None],
        closed_error: Callable[[], BaseException],
    ) -> None:
        self._open = open_resource
        self._close = close_resource
        self._closed_error = closed_error
        self._token = trio.lowlevel.current_trio_token()
        self._jobs: queue.SimpleQueue[_Job | _Stop] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closing = False
        self._waiting = 0
        # Set by the thread while it runs a job (before it leaves ``_waiting``).
        self._busy = False
        self._resource: R | None = None
        self._here_seconds = 0.0  # moving average of the jobs that could run here
        # The socket one caller at a time waits on (``_signalled``: one is waiting).
        self._signal_in, self._signal_out = socket.socketpair()
        self._signal_in.setblocking(False)
        self._signalled = False
        # Outcomes for the other callers, handed over by one ``run_sync_soon`` for all
        # that arrive before the trio thread takes them (one wake-up, not one each).
        self._answers: list[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]] = []
        self._answers_lock = threading.Lock()
        # The creating task waits for the opening (see start_worker_thread).
        self._thread = threading.Thread(
            target=self._serve, args=(trio.lowlevel.current_task(),), name=name, daemon=True
        )

    @property
    def jobs_waiting(self) -> int:
        """Jobs submitted and not yet taken by the thread."""
        return self._waiting

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (new jobs are refused)."""
        return self._closing

    async def run(self, fn: Callable[[R], T], *, here: Callable[[R], T] | None = None) -> T:
        """Run ``fn(resource)`` in the thread and answer its result (or raise its error).

        Cancellable until the thread takes the job; from then on the outcome is
        always waited for (a cancel is deferred to the caller's next checkpoint).
        ``here``, the same job fit to run in the trio thread, runs there instead
        when nothing else waits (see the module docstring).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closing:
            raise self._closed_error()
        if here is not None and self._may_run_here():
            try:
                return self._run_here(here)
            finally:
                # A schedule point after it, as every trio call is one: a caller running
                # such jobs in a loop would otherwise let no other task run, nor a
                # deadline pass. Shielded: the job is made, its answer is given.
                await trio.lowlevel.cancel_shielded_checkpoint()
        timed = here is not None
        if not self._signalled:
            return await self._run_signalled(fn, timed)
        job = _Job(fn, trio.lowlevel.current_task(), timed)
        with self._lock:
            self._waiting += 1
        self._jobs.put(job)

        def abort(_: object) -> trio.lowlevel.Abort:
            return (
                trio.lowlevel.Abort.SUCCEEDED
                if self._decide(job, take=False)
                else trio.lowlevel.Abort.FAILED
            )

        # The thread reschedules this task with the job's outcome, unwrapped here.
        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def run_nowait(self, here: Callable[[R], T]) -> T:
        """Run ``here(resource)`` in the trio thread now, as :meth:`run` would run it
        there, or raise ``trio.WouldBlock`` (nothing run) when it would have to wait or
        keep someone waiting.

        No checkpoint: the caller owes the run loop one.
        """
        if self._closing:
            raise self._closed_error()
        if not self._may_run_here():
            raise trio.WouldBlock
        return self._run_here(here)

    def _may_run_here(self) -> bool:
        """Whether a job can run in the trio thread now without keeping anyone waiting."""
        # ``_waiting`` first: the thread sets ``_busy`` before it leaves ``_waiting``.
        if self._waiting or self._busy or self._resource is None:
            return False
        if self._here_seconds > _HERE_LIMIT_SECONDS:
            return False
        # (It counts the tasks waiting for I/O too, one by one: last, and only when needed.)
        stats = trio.lowlevel.current_statistics()
        return stats.tasks_runnable == 0 and stats.run_sync_soon_queue_size == 0

    def _run_here(self, fn: Callable[[R], T]) -> T:
        resource = self._resource
        assert resource is not None
        start = time.perf_counter()
        try:
            return fn(resource)
        finally:
            self._timed(time.perf_counter() - start)

    def _timed(self, seconds: float) -> None:
        """Count one job that could run here into their moving average."""
        self._here_seconds += (seconds - self._here_seconds) * _HERE_WEIGHT

    async def _run_signalled(self, fn: Callable[[R], T], timed: bool) -> T:
        """:meth:`run`, waiting on the socket (no other caller does meanwhile)."""
        job = _Job(fn, None, timed)
        self._signalled = True
        try:
            with self._lock:
                self._waiting += 1
            self._jobs.put(job)
            try:
                await self._signal(job)
            except BaseException as exc:
                if self._decide(job, take=False):
                    raise
                # Taken: its outcome is waited for; a cancel stays pending until
                # the next checkpoint, anything else is raised once it is in.
                with trio.CancelScope(shield=True):
                    await self._signal(job)
                if not isinstance(exc, trio.Cancelled):
                    raise
        finally:
            self._signalled = False
            self._close_signal_if_done()
        assert job.result is not None
        result: T = job.result.unwrap()
        return result

    async def _signal(self, job: _Job) -> None:
        """Wait until the thread has stored ``job.result`` (the byte it sends says so)."""
        while job.result is None:
            await trio.lowlevel.wait_readable(self._signal_in)
            with contextlib.suppress(BlockingIOError):
                self._signal_in.recv(64)

    def _decide(self, job: _Job, *, take: bool) -> bool:
        """Decide ``job`` once: the thread takes it (``take``) or its caller withdraws it.

        ``False`` when the other side decided first (the thread took it already,
        or its caller withdrew it).
        """
        with self._lock:
            if job.taken or job.withdrawn:
                return False
            if take:
                self._busy = True
                job.taken = True
            else:
                job.withdrawn = True
            self._waiting -= 1
            return True

    def _close_signal_if_done(self) -> None:
        # The thread may send until it has ended, and a caller may wait until its answer is in.
        if not self._signalled and self._closing and not self._thread.is_alive():
            self._signal_in.close()
            self._signal_out.close()

    async def aclose(self) -> None:
        """Refuse new jobs, fail the queued ones, close the resource, join the thread.

        Waits without being cancellable (the resource is closed either way). An
        error closing the resource is raised here. Idempotent.
        """
        if self._closing:
            await trio.lowlevel.checkpoint()
            return
        with self._lock:
            self._closing = True
        self._jobs.put(_Stop(trio.lowlevel.current_task()))
        try:
            await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
        finally:
            await trio.to_thread.run_sync(self._thread.join)
            self._close_signal_if_done()

    # -- the thread ----------------------------------------------------------

    def _answer(self, task: trio.lowlevel.Task, result: outcome.Outcome[Any]) -> None:
        with self._answers_lock:
            self._answers.append((task, result))
            if len(self._answers) > 1:
                return  # the hand-over already asked for rides along
        # When the run has ended under its waiter, there is nobody to answer.
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._hand_over)

    def _hand_over(self) -> None:
        """Reschedule every caller answered so far (runs in the trio thread)."""
        with self._answers_lock:
            answers, self._answers = self._answers, []
        for task, result in answers:
            trio.lowlevel.reschedule(task, result)

    def _answer_job(self, job: _Job, result: outcome.Outcome[Any]) -> None:
        if job.task is not None:
            self._answer(job.task, result)
        else:
            job.result = result
            self._signal_out.send(b"\0")

    def _serve(self, starter: trio.lowlevel.Task) -> None:
        opened = outcome.capture(self._open)
        if type(opened) is outcome.Value:
            self._resource = opened.value
        self._answer(starter, opened)
        if type(opened) is not outcome.Value:
            return
        resource: R = opened.value
        while True:
            item = self._jobs.get()
            if type(item) is _Stop:
                self._resource = None
                self._answer(item.task, outcome.capture(self._close, resource))
                return
            assert type(item) is _Job
            if not self._decide(item, take=True):
                continue
            if self._closing:
                result: outcome.Outcome[Any] = outcome.Error(self._closed_error())
            elif item.timed:
                start = time.perf_counter()
                result = outcome.capture(item.fn, resource)
                self._timed(time.perf_counter() - start)
            else:
                result = outcome.capture(item.fn, resource)
            self._busy = False
            self._answer_job(item, result)


async def start_worker_thread(
    name: str,
    open_resource: Callable[[], R],
    close_resource: Callable[[R], None],
    closed_error: Callable[[], BaseException],
) -> WorkerThread[R]:
    """Start a thread that opens its resource with ``open_resource()`` and serves jobs on it.

    ``open_resource`` errors are raised here (and the thread ends). The thread
    calls ``close_resource`` on :meth:`WorkerThread.aclose`; ``closed_error``
    makes the error a job gets after that. Waits without being cancellable.
    """
    worker = WorkerThread(name, open_resource, close_resource, closed_error)
    worker._thread.start()
    try:
        await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    except BaseException:
        await trio.to_thread.run_sync(worker._thread.join)
        worker._signal_in.close()
        worker._signal_out.close()
        raise
    return worker
