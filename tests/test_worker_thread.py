"""The worker thread that owns the SQLite connection: order, errors, cancellation, close."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from zidane_actors.errors import StoreClosedError
from zidane_actors.model import SessionData
from zidane_actors.stores import SQLiteStore, open_sqlite_store
from zidane_actors.stores._thread import WorkerThread, start_worker_thread


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
