"""A child process driving the SQLite store, for the multi-process tests.

Usage: ``python _sqlite_worker.py DB MODE SESSION [ARG]``

- ``append``: append ARG turns one by one, printing each turn id once its
  ``append_turns`` returned (the write is acknowledged).
- ``claim``: wait for a line on stdin, ``claim_run``, print ``claimed`` or
  ``blocked``, then hold the claim until stdin closes.
- ``fire``: wait for a line on stdin, try ``claim_schedule_fire`` on schedule
  SESSION due at ARG, print ``took`` or ``lost``.
- ``run``: claim the session, record a running run, then append turns
  forever, printing each acknowledged id (the parent kills it).
"""

from __future__ import annotations

import itertools
import os
import sys

import trio

from zidane_actors.model import AppendTurnsOptions, SessionRun, SessionTurn, TextBlock
from zidane_actors.stores import SQLiteStore, open_sqlite_store


def _turn(turn_id: str, run_id: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role="assistant",
        content=(TextBlock(text=f"text of {turn_id}"),),
        created_at=1,
        run_id=run_id,
    )


async def _append(store: SQLiteStore, session_id: str, count: int) -> None:
    prefix = f"p{os.getpid()}"
    for i in range(count):
        turn_id = f"{prefix}-{i}"
        await store.append_turns(session_id, [_turn(turn_id)])
        print(turn_id, flush=True)


async def _claim(store: SQLiteStore, session_id: str) -> None:
    await trio.to_thread.run_sync(sys.stdin.readline)
    claim = await store.claim_run(session_id, stale_at=0)
    print("claimed" if claim.claimed else "blocked", flush=True)
    await trio.to_thread.run_sync(sys.stdin.read)


async def _fire(store: SQLiteStore, schedule_id: str, due_at: int) -> None:
    await trio.to_thread.run_sync(sys.stdin.readline)
    took = await store.claim_schedule_fire(schedule_id, due_at, due_at + 60_000)
    print("took" if took else "lost", flush=True)


async def _run(store: SQLiteStore, session_id: str) -> None:
    claim = await store.claim_run(session_id, stale_at=0)
    assert claim.claimed
    run = SessionRun(id="run-1", prompt="go", started_at=1, status="running")
    await store.update_run(session_id, run)
    print("running", flush=True)
    for i in itertools.count():
        turn_id = f"k-{i}"
        looped = SessionRun(id="run-1", prompt="go", started_at=1, status="running", loop_turn=i)
        await store.append_turns(
            session_id, [_turn(turn_id, "run-1")], AppendTurnsOptions(run=looped)
        )
        print(turn_id, flush=True)


async def main(db: str, mode: str, session_id: str, arg: str) -> None:
    async with open_sqlite_store(db, durability="normal") as store:
        if mode == "append":
            await _append(store, session_id, int(arg))
        elif mode == "claim":
            await _claim(store, session_id)
        elif mode == "fire":
            await _fire(store, session_id, int(arg))
        elif mode == "run":
            await _run(store, session_id)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    db, mode, session_id = sys.argv[1:4]
    trio.run(main, db, mode, session_id, sys.argv[4] if len(sys.argv) > 4 else "")
