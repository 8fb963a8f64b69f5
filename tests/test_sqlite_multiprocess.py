"""Several processes on one SQLite file: exclusive claims, no lost or failed writes, crashes.

The tests are synchronous: they drive child processes with ``subprocess``
and check the database with short ``trio.run`` calls.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import trio

from zidane_actors.model import Schedule, SessionData, demote_stale_running_status
from zidane_actors.stores import SQLiteStore, open_sqlite_store

T = TypeVar("T")

WORKER = str(Path(__file__).with_name("_sqlite_worker.py"))


def with_store(db: Path, fn: Callable[[SQLiteStore], Coroutine[Any, Any, T]]) -> T:
    async def main() -> T:
        async with open_sqlite_store(db) as store:
            return await fn(store)

    return trio.run(main)


def spawn(db: Path, mode: str, session_id: str, arg: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WORKER, str(db), mode, session_id, arg],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def create(db: Path, session_id: str) -> None:
    async def save(store: SQLiteStore) -> None:
        await store.save(SessionData(id=session_id, created_at=1, updated_at=1))

    with_store(db, save)


def test_concurrent_appenders_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    create(db, "s")
    children = [spawn(db, "append", "s", "120") for _ in range(2)]
    outputs = [child.communicate(timeout=60) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        assert "locked" not in err
    acked = [out.split() for out, _ in outputs]
    assert all(len(ids) == 120 for ids in acked)

    async def turn_ids(store: SQLiteStore) -> list[str]:
        return [t.id for t in await store.get_turns("s")]

    stored = with_store(db, turn_ids)
    assert sorted(stored) == sorted(acked[0] + acked[1])
    for ids in acked:  # each writer's own order is kept
        assert [i for i in stored if i in set(ids)] == ids


def test_claim_run_is_exclusive_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    create(db, "s")
    children = [spawn(db, "claim", "s") for _ in range(3)]
    try:
        time.sleep(0.3)  # let them open the store; the claims race once told to go
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [child.stdout.readline().strip() for child in children if child.stdout]
    finally:
        for child in children:
            child.communicate(timeout=30)
    assert sorted(answers) == ["blocked", "blocked", "claimed"], answers
    assert all(child.returncode == 0 for child in children)

    async def epoch(store: SQLiteStore) -> int | None:
        return await store.run_epoch("s")

    assert with_store(db, epoch) == 1


def test_schedule_fire_is_taken_once_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    schedule = Schedule(
        id="daily", prompt="p", enabled=True, created_at=1, updated_at=1, next_fire_at=1_000
    )

    async def save(store: SQLiteStore) -> None:
        await store.save_schedule(schedule)

    with_store(db, save)
    children = [spawn(db, "fire", "daily", "1000") for _ in range(3)]
    try:
        time.sleep(0.3)
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=30) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert sorted(out.strip() for out, _ in outputs) == ["lost", "lost", "took"], outputs

    async def next_fire(store: SQLiteStore) -> int | None:
        (stored,) = await store.list_schedules()
        return stored.next_fire_at

    assert with_store(db, next_fire) == 61_000


def test_killed_writer_loses_no_acknowledged_turn(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    create(db, "s")
    child = spawn(db, "run", "s")
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "running"
    acked: list[str] = []
    while len(acked) < 40:
        line = child.stdout.readline().strip()
        assert line, child.stderr.read() if child.stderr else "child exited"
        acked.append(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)  # reaped: its pid is gone
    acked += [line.strip() for line in child.stdout if line.strip()]

    async def check(store: SQLiteStore) -> None:
        loaded = await store.load("s")
        assert loaded is not None
        stored = [t.id for t in loaded.turns]
        assert set(acked) <= set(stored)
        assert stored == [f"k-{i}" for i in range(len(stored))]
        assert loaded.status == "running"
        assert loaded.run_owner is not None and loaded.run_owner.pid == child.pid
        (run,) = loaded.runs
        assert run.status == "running" and run.loop_turn == len(stored) - 1

        demoted = demote_stale_running_status(loaded)
        assert demoted.status == "idle" and demoted.runs[0].status == "aborted"
        assert demoted.turns == loaded.turns

        # The owner is dead, so even a claim that treats every marker as fresh takes it.
        claim = await store.claim_run("s", stale_at=0)
        assert claim.claimed and claim.previous == "running"
        meta = await store.get_meta("s")
        assert meta is not None and meta.run_owner is not None
        assert meta.run_owner.pid == os.getpid()

    with_store(db, check)


def test_a_store_opening_a_new_file_another_connection_holds_waits_for_it(
    tmp_path: Path,
) -> None:
    """Another process holding a new file's write lock (it is switching the file to WAL
    or migrating it) makes SQLite refuse the switch to WAL at once, without its busy
    handler: the opening store waits and tries again instead of failing."""
    import sqlite3
    import threading

    db = tmp_path / "new.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a rollback-journal write lock, as a new file has
    released = threading.Timer(0.5, lambda: holder.execute("ROLLBACK"))
    released.start()
    try:
        started = time.monotonic()
        assert with_store(db, lambda store: store.load("absent")) is None
        assert time.monotonic() - started >= 0.4  # it waited for the lock
    finally:
        released.join()
        holder.close()
