"""The lone caller's path: a store job run in the trio thread when nothing else waits.

A worker thread idle with nothing queued runs a job's ``here`` variant in
the trio thread (no thread crossing); a job arriving while the thread is
busy queues as always, one that would wait there runs in the thread, and
a crowd of writers is still grouped.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from zidane_actors.actors import open_session_host
from zidane_actors.errors import StoreClosedError
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import open_sqlite_store
from zidane_actors.stores._thread import RunElsewhere, start_worker_thread


def where(_: object) -> int:
    return threading.get_ident()


async def test_a_job_asked_here_runs_in_the_trio_thread_only_when_the_thread_is_idle() -> None:
    worker = await start_worker_thread(
        "lone worker", list, lambda _: None, lambda: StoreClosedError("closed")
    )
    here = threading.get_ident()
    try:
        assert await worker.run(where, here=where) == here
        assert await worker.run(where) != here  # not offered
        entered, release = threading.Event(), threading.Event()

        def gate(ran: list[str]) -> str:
            entered.set()
            assert release.wait(10)
            ran.append("gate")
            return "gate"

        def job(ran: list[str]) -> int:
            ran.append("after")
            return threading.get_ident()

        async def after() -> None:
            # The thread is busy: offered or not, the job queues behind the gate.
            assert await worker.run(job, here=job) != here

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, gate)
            await trio.to_thread.run_sync(entered.wait)
            nursery.start_soon(after)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert await worker.run(list, here=list) == ["gate", "after"]
        with pytest.raises(ZeroDivisionError):
            await worker.run(where, here=lambda _: 1 // 0)
        assert not worker._busy

        def elsewhere(ran: list[str]) -> int:
            raise RunElsewhere

        # A variant that would wait runs nowhere: the job itself runs in the thread.
        assert await worker.run(where, here=elsewhere) != here
    finally:
        await worker.aclose()
    with pytest.raises(StoreClosedError):
        await worker.run(len, here=len)


async def test_a_lone_sqlite_write_meeting_a_lock_waits_in_the_thread(tmp_path: Path) -> None:
    """The trio thread never waits on another connection's lock: the holder's task runs."""
    db = tmp_path / "locked.db"
    async with open_sqlite_store(db) as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        released: list[str] = []
        async with trio.open_nursery() as nursery:

            async def release() -> None:
                await trio.sleep(0.05)
                released.append("released")
                blocker.execute("ROLLBACK")

            nursery.start_soon(release)
            with trio.fail_after(3):  # the busy timeout is 5 s: this never waited on it
                await store.append_turns("s", [text_turn("t0")])
            assert released == ["released"]
        blocker.close()
        assert [t.id for t in await store.get_turns("s")] == ["t0"]


def text_turn(tid: str) -> SessionTurn:
    return SessionTurn(id=tid, role="user", content=(TextBlock(text=tid),), created_at=1)


async def test_sqlite_host_lone_appends_run_in_the_trio_thread_and_a_crowd_is_grouped(
    tmp_path: Path,
) -> None:
    async with (
        open_sqlite_store(tmp_path / "lone.db") as store,
        open_session_host(store) as host,
    ):
        worker = store._worker
        threads: list[int] = []
        run = worker.run

        def spied(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            def job(conn: Any) -> Any:
                threads.append(threading.get_ident())
                return fn(conn)

            return job

        async def spy(fn: Callable[[Any], Any], here: Callable[[Any], Any] | None = None) -> Any:
            return await run(spied(fn), here=None if here is None else spied(here))

        worker.run = spy  # type: ignore[method-assign]
        lone = await host.create_session(id="lone")
        for i in range(3):
            await lone.append_turns([text_turn(f"lone-{i}")])
        assert threads[-3:] == [threading.get_ident()] * 3
        sessions = [await host.create_session(id=f"s{i}") for i in range(20)]

        async def writer(i: int) -> None:
            for j in range(5):
                await sessions[i].append_turns([text_turn(f"s{i}-{j}")])

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(writer, i)
        stats = host.statistics().store
        assert stats.batches > 0 and stats.avg_batch_size > 1
        for session in [lone, *sessions]:
            stored = await store.load(session.id)
            assert stored is not None and stored.turns == session.turns
