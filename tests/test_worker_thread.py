"""The worker thread that owns the SQLite connection: order, errors, cancellation, close."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from store_contract import make_turn

from zidane_actors.actors import open_session_host
from zidane_actors.errors import SessionNotFoundError, StoreClosedError
from zidane_actors.model import SessionData
from zidane_actors.stores import SQLiteStore, StoreWrite, open_sqlite_store
from zidane_actors.stores import _thread as worker_thread
from zidane_actors.stores._thread import _HERE_LIMIT_SECONDS, WorkerThread, start_worker_thread
from zidane_actors.stores.sqlite._store import _HERE_TURNS


class Resource:
    """What the thread owns: it records which thread touched it, and the calls made."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.calls: list[object] = []
        self.closed = 0

    def close(self) -> None:
        assert threading.get_ident() == self.thread
        self.closed += 1


class Boom(Exception):
    pass


class Fatal(BaseException):
    pass


def closed_error() -> StoreClosedError:
    return StoreClosedError("closed")


async def start(resource: list[Resource] | None = None) -> WorkerThread[Resource]:
    def open_resource() -> Resource:
        made = Resource()
        if resource is not None:
            resource.append(made)
        return made

    return await start_worker_thread("test worker", open_resource, Resource.close, closed_error)


async def in_thread(event: threading.Event) -> None:
    """Wait from trio (without blocking it) until ``event`` is set."""
    await trio.to_thread.run_sync(event.wait)


class Gate:
    """A job that holds the thread until released, so later jobs queue behind it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, resource: Resource) -> str:
        resource.calls.append("gate")
        self.entered.set()
        assert self.release.wait(10)
        return "gate done"


@pytest.fixture
async def worker() -> AsyncIterator[WorkerThread[Resource]]:
    w = await start()
    yield w
    await w.aclose()


async def test_jobs_run_in_the_thread_in_submission_order(
    worker: WorkerThread[Resource],
) -> None:
    submitted: list[int] = []
    ran: list[int] = []
    threads: set[int] = set()
    gate = Gate()

    def job(i: int) -> int:
        ran.append(i)
        threads.add(threading.get_ident())
        return i * 10

    async def one(i: int) -> None:
        submitted.append(i)  # no schedule point between this and the hand-over
        assert await worker.run(lambda _: job(i)) == i * 10

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, gate)
        await in_thread(gate.entered)
        for i in range(20):
            nursery.start_soon(one, i)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.jobs_waiting == 20
        gate.release.set()
    assert ran == submitted and sorted(ran) == list(range(20))
    assert threads == {worker._thread.ident} and threading.get_ident() not in threads
    assert worker.jobs_waiting == 0


async def test_an_error_reaches_its_caller_and_the_thread_lives_on(
    worker: WorkerThread[Resource],
) -> None:
    def boom(_: Resource) -> None:
        raise Boom("bad")

    def fatal(_: Resource) -> None:
        raise Fatal()

    with pytest.raises(Boom, match="bad"):
        await worker.run(boom)
    with pytest.raises(Fatal):
        await worker.run(fatal)
    assert await worker.run(lambda r: r.thread) == worker._thread.ident


async def test_a_caller_cancelled_before_the_hand_over_withdraws_its_job(
    worker: WorkerThread[Resource],
) -> None:
    gate = Gate()
    withdrawn: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, gate)
        await in_thread(gate.entered)
        scope = trio.CancelScope()

        async def queued() -> None:
            with scope:
                await worker.run(lambda _: withdrawn.append("ran"))

        nursery.start_soon(queued)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.jobs_waiting == 1
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        assert worker.jobs_waiting == 0
        gate.release.set()
    # FIFO: had the withdrawn job been run, it would have run before this one.
    assert await worker.run(lambda r: list(r.calls)) == ["gate"]
    assert withdrawn == []


async def test_the_caller_waiting_on_the_socket_withdraws_too(
    worker: WorkerThread[Resource],
) -> None:
    """A lone caller (answered through the socket) cancelled while queued: never run."""
    first, second = Gate(), Gate()
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, first)  # the socket's caller
        await in_thread(first.entered)
        nursery.start_soon(worker.run, second)  # queued: answered through the token
        await trio.testing.wait_all_tasks_blocked()
        first.release.set()
        await in_thread(second.entered)
        await trio.testing.wait_all_tasks_blocked()
        assert not worker._signalled  # the first caller is answered: the socket is free
        scope = trio.CancelScope()

        async def queued() -> None:
            with scope:
                await worker.run(lambda _: ran.append("ran"))

        nursery.start_soon(queued)
        await trio.testing.wait_all_tasks_blocked()
        assert worker._signalled and worker.jobs_waiting == 1
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught and not worker._signalled
        assert worker.jobs_waiting == 0
        second.release.set()
    assert [await worker.run(lambda r: list(r.calls)) for _ in range(3)] == [["gate", "gate"]] * 3
    assert ran == []


async def test_a_caller_cancelled_after_the_hand_over_gets_the_outcome_then_the_cancel(
    worker: WorkerThread[Resource],
) -> None:
    gate = Gate()
    got: list[str] = []
    scope = trio.CancelScope()

    async def cancel_when_taken() -> None:
        await in_thread(gate.entered)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.release.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when_taken)
        with scope:
            got.append(await worker.run(gate))  # taken: waited for despite the cancel
            await trio.lowlevel.checkpoint()
            got.append("not reached")
    assert scope.cancelled_caught
    assert got == ["gate done"]


def where(resource: Resource) -> int:
    """A job that answers the thread it ran in."""
    resource.calls.append("where")
    return threading.get_ident()


async def test_a_job_runs_in_the_trio_thread_when_nothing_else_waits(
    worker: WorkerThread[Resource],
) -> None:
    """Idle thread, nothing runnable: the job fit to run here runs here, once."""
    ran: list[str] = []

    def in_thread_too(resource: Resource) -> int:
        ran.append("thread")
        return where(resource)

    assert await worker.run(in_thread_too, here=where) == threading.get_ident()
    assert ran == []
    assert await worker.run(where) == worker._thread.ident  # not fit to run here: the thread


async def test_a_job_fit_to_run_here_waits_its_turn_behind_the_threads(
    worker: WorkerThread[Resource],
) -> None:
    """A job held by the thread, or one queued: later jobs queue behind them, FIFO."""
    gate = Gate()
    answers: list[int] = []

    async def lone() -> None:
        answers.append(await worker.run(where, here=where))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, gate)
        await in_thread(gate.entered)
        nursery.start_soon(lone)
        nursery.start_soon(lone)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.jobs_waiting == 2
        gate.release.set()
    assert answers == [worker._thread.ident] * 2
    assert await worker.run(lambda r: list(r.calls)) == ["gate", "where", "where"]


async def test_no_job_runs_here_while_another_task_is_runnable(
    worker: WorkerThread[Resource],
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.lowlevel.checkpoint)  # runnable until the next pass
        assert await worker.run(where, here=where) == worker._thread.ident
    assert await worker.run(where, here=where) == threading.get_ident()


async def test_jobs_that_turn_slow_go_to_the_thread_until_they_are_quick_again(
    worker: WorkerThread[Resource],
) -> None:
    """One job far over the limit moves the average past it: the next ones go to the
    thread, where they are timed too, and come back once quick ones bring it down."""

    def slow(resource: Resource) -> int:
        time.sleep(20 * _HERE_LIMIT_SECONDS)
        return where(resource)

    assert await worker.run(slow, here=slow) == threading.get_ident()
    assert await worker.run(where, here=where) == worker._thread.ident
    threads = [await worker.run(where, here=where) for _ in range(200)]
    assert threads[-1] == threading.get_ident()
    assert threads.index(threading.get_ident()) > 0


async def test_after_close_no_job_runs_here() -> None:
    made: list[Resource] = []
    worker = await start(made)
    await worker.aclose()
    with pytest.raises(StoreClosedError):
        await worker.run(where, here=where)
    assert made[0].calls == []


async def test_close_fails_queued_jobs_finishes_the_one_in_hand_and_joins() -> None:
    made: list[Resource] = []
    worker = await start(made)
    gate = Gate()
    ran: list[int] = []
    results: dict[str, object] = {}

    async def submit(name: str, fn: object) -> None:
        try:
            results[name] = await worker.run(fn)  # type: ignore[arg-type]
        except StoreClosedError as exc:
            results[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "gate", gate)
        await in_thread(gate.entered)
        nursery.start_soon(submit, "a", lambda _: ran.append(1))
        nursery.start_soon(submit, "b", lambda _: ran.append(2))
        await trio.testing.wait_all_tasks_blocked()
        assert worker.jobs_waiting == 2
        nursery.start_soon(worker.aclose)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.closed
        gate.release.set()
    assert results["gate"] == "gate done"
    assert isinstance(results["a"], StoreClosedError)
    assert isinstance(results["b"], StoreClosedError)
    assert ran == []
    assert made[0].closed == 1 and made[0].calls == ["gate"]
    assert not worker._thread.is_alive()
    with pytest.raises(StoreClosedError):
        await worker.run(lambda _: None)
    await worker.aclose()  # idempotent
    assert made[0].closed == 1


async def test_open_and_close_errors_are_raised() -> None:
    def cannot_open() -> Resource:
        raise Boom("no such file")

    with pytest.raises(Boom, match="no such file"):
        await start_worker_thread("test worker", cannot_open, Resource.close, closed_error)

    def bad_close(resource: Resource) -> None:
        raise Boom("close failed")

    worker = await start_worker_thread("test worker", Resource, bad_close, closed_error)
    with pytest.raises(Boom, match="close failed"):
        await worker.aclose()
    assert not worker._thread.is_alive()


async def test_sqlite_store_after_close_and_with_calls_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The background search indexer would queue steps of its own among the calls counted.
    monkeypatch.setattr(SQLiteStore, "_start_indexer", lambda self: trio.CancelScope())
    async with open_sqlite_store(tmp_path / "a.db") as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        gate = Gate()
        results: list[object] = []

        async def load() -> None:
            try:
                results.append(await store.load("s"))
            except StoreClosedError as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._worker.run, lambda conn: gate(Resource()))
            await in_thread(gate.entered)
            nursery.start_soon(load)
            await trio.testing.wait_all_tasks_blocked()
            assert store.statistics().tasks_waiting == 1
            nursery.start_soon(store.aclose)
            await trio.testing.wait_all_tasks_blocked()
            gate.release.set()
        assert len(results) == 1 and isinstance(results[0], StoreClosedError)
        assert store.statistics().tasks_waiting == 0
        with pytest.raises(StoreClosedError):
            await store.load("s")
    async with open_sqlite_store(tmp_path / "a.db") as store:
        assert await store.load("s") == SessionData(id="s", created_at=1, updated_at=1)


async def test_lone_sqlite_writes_and_row_reads_run_in_the_trio_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SQLiteStore, "_start_indexer", lambda self: trio.CancelScope())
    # Where each call runs, whatever the disk: a slow fsync must not send them away.
    monkeypatch.setattr(worker_thread, "_HERE_LIMIT_SECONDS", 60.0)
    turns = [make_turn(n) for n in range(5)]
    async with open_sqlite_store(tmp_path / "a.db") as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        before = store.statistics().transactions_here
        for turn in turns:
            await store.append_turns("s", [turn])
        assert store.statistics().transactions_here == before + len(turns)
        # A read of one row too: the rev, the header.
        assert await store.get_rev("s") == 1 + len(turns)
        meta = await store.get_meta("s")
        assert meta is not None and meta.turn_count == len(turns)
        assert store.statistics().transactions_here == before + len(turns) + 2
        # An import's worth of turns never holds the run loop: the connection's thread.
        here = store.statistics().transactions_here
        most = [make_turn(n) for n in range(100, 100 + _HERE_TURNS)]
        more = [make_turn(n) for n in range(200, 201 + _HERE_TURNS)]
        await store.append_turns("s", most)
        assert store.statistics().transactions_here == here + 1
        await store.append_turns("s", more)
        # So does a whole session saved or deleted, alone or as a batch of one.
        await store.save(SessionData(id="d", created_at=1, updated_at=1))
        await store.apply_writes(
            [StoreWrite("save", (SessionData(id="e", created_at=1, updated_at=1),))]
        )
        await store.delete("d")
        await store.apply_writes([StoreWrite("delete", ("e",))])
        assert store.statistics().transactions_here == here + 1
        await store.apply_writes([StoreWrite("update_status", ("s", "idle"))])
        assert store.statistics().transactions_here == here + 2
        # Many writers at once: the store actor's group commit, in the thread as before.
        async with open_session_host(store) as host:
            solo = await host.create_session(id="solo")  # a session's lone append too
            here = store.statistics().transactions_here
            await solo.append_turns([make_turn(900)])
            assert store.statistics().transactions_here == here + 1
            sessions = [await host.create_session(id=f"m{i}") for i in range(20)]
            here = store.statistics().transactions_here
            async with trio.open_nursery() as nursery:
                for session in sessions:
                    nursery.start_soon(session.append_turns, turns)
            assert store.statistics().transactions_here == here
    async with open_sqlite_store(tmp_path / "a.db") as store:
        assert (await store.load("s")).turns == (*turns, *most, *more)
        for i in range(20):
            assert (await store.load(f"m{i}")).turns == tuple(turns)


async def test_a_lone_sqlite_write_waits_for_another_connections_lock_in_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run in the trio thread it would wait there, the whole run with it: it finds the
    lock taken at once and goes to the connection's thread, which waits for the lock
    (the busy timeout restored) while the run goes on."""
    monkeypatch.setattr(SQLiteStore, "_start_indexer", lambda self: trio.CancelScope())
    path = tmp_path / "a.db"
    async with open_sqlite_store(path) as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        await store.append_turns("s", [make_turn(0)])  # in the trio thread: timeout 0 now
        here = store.statistics().transactions_here
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        done = trio.Event()

        async def append() -> None:
            await store.append_turns("s", [make_turn(1)])
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            for _ in range(5):  # the run goes on meanwhile
                await trio.sleep(0.01)
            assert not done.is_set()
            await trio.to_thread.run_sync(other.execute, "COMMIT")
        other.close()
        stats = store.statistics()
        assert stats.transactions_here == here and stats.busy_retries == 0
        assert [t.id for t in (await store.load("s")).turns] == ["t0", "t1"]


async def test_sqlite_apply_nowait_makes_a_small_call_now_or_would_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``apply_nowait`` makes is what awaiting the call makes; what it refuses is
    left undone, and the awaited call still makes it."""
    monkeypatch.setattr(SQLiteStore, "_start_indexer", lambda self: trio.CancelScope())
    monkeypatch.setattr(worker_thread, "_HERE_LIMIT_SECONDS", 60.0)
    path = tmp_path / "a.db"
    async with open_sqlite_store(path) as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        here = store.statistics().transactions_here
        revision = store.apply_nowait(StoreWrite("append_turns", ("s", [make_turn(0)])))
        assert (revision.before, revision.after) == (1, 2)
        assert store.apply_nowait(StoreWrite("get_rev", ("s",))) == 2
        meta = store.apply_nowait(StoreWrite("get_meta", ("s",)))
        assert meta is not None and meta.turn_count == 1
        store.apply_nowait(StoreWrite("update_status", ("s", "idle")))
        assert store.statistics().transactions_here == here + 4
        # Never now: a whole session saved or deleted, an import, any other read.
        many = [make_turn(n) for n in range(100, 101 + _HERE_TURNS)]
        for call in (
            StoreWrite("save", (SessionData(id="d", created_at=1, updated_at=1),)),
            StoreWrite("delete", ("s",)),
            StoreWrite("append_turns", ("s", many)),
            StoreWrite("load", ("s",)),
            StoreWrite("get_turns", ("s",)),
        ):
            with pytest.raises(trio.WouldBlock):
                store.apply_nowait(call)
        assert await store.get_rev("s") == 3 and await store.load("d") is None
        # The call's own error, raised as awaiting it would.
        with pytest.raises(SessionNotFoundError):
            store.apply_nowait(StoreWrite("append_turns", ("nobody", [make_turn(1)])))
        # Another connection holds the lock: nothing done, no wait (the awaited call waits).
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(trio.WouldBlock):
            store.apply_nowait(StoreWrite("append_turns", ("s", [make_turn(2)])))
        other.execute("ROLLBACK")
        other.close()
        assert [t.id for t in (await store.load("s")).turns] == ["t0"]
        # Another task runnable: it would be kept waiting.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            with pytest.raises(trio.WouldBlock):
                store.apply_nowait(StoreWrite("get_rev", ("s",)))
    with pytest.raises(StoreClosedError):
        store.apply_nowait(StoreWrite("get_rev", ("s",)))


async def test_lone_store_calls_in_a_loop_let_the_other_tasks_run(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """A job run here answers without waiting, and is still a schedule point: a task
    appending in a loop straight to the store lets a task whose deadline passed run
    (before, none ran until the loop ended: no timer fired, no socket was read)."""
    async with open_sqlite_store(tmp_path / "s.db", durability="off") as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        here = store.statistics().transactions_here
        woke = [0]

        async def sleeper() -> None:
            while True:
                await trio.sleep(1)
                woke[0] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(20):
                mock_clock.jump(1)  # its deadline passes: runnable at the next pass
                await store.append_turns("s", [make_turn(i)])
            nursery.cancel_scope.cancel()
        # It runs in the pass after each call (before or after the caller's next one, in
        # trio's order), sleeping again from then: once every two calls at the least.
        assert woke[0] >= 9
        # Calls ran here (one made while the sleeper was runnable goes to the thread).
        assert store.statistics().transactions_here > here
