"""Writers of a file-map directory that get killed, for the crash tests.

Usage: ``python _file_map_worker.py DIR``, then one ``SEED KILL_AT`` line per
writer on stdin. The process imports once and forks a writer per line (so
each crash costs no interpreter start): it prints ``pid P``, then ``exit S``
(the writer's wait status) once the writer is gone. The writer runs the
operations of ``plan(SEED)`` on a directory file-map store, printing ``ack I``
once operation ``I`` returned (the write is acknowledged). With ``KILL_AT`` > 0
the writer sends itself SIGKILL just before its ``KILL_AT``-th file-system
write call (write, fsync, rename, unlink, truncate), so every step of the save
protocol is a seeded crash point; with 0 it runs until the test kills it.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Callable
from typing import Any

import trio

from zidane_actors.model import (
    AppendTurnsOptions,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
)
from zidane_actors.stores import DirectoryFileMapAdapter, SessionStore, create_file_map_store

OPERATIONS = 16
"""Operations in one plan."""

Op = tuple[str, str, int]
"""``(kind, tag, size)``: kind is save, append, patch or claim; tag names what it writes."""


def plan(seed: int) -> list[Op]:
    """The seeded operations of one child (the first one saves, so the session exists)."""
    rng = random.Random(seed)
    ops: list[Op] = [("save", f"{seed}-0", rng.randint(0, 4))]
    for i in range(1, OPERATIONS):
        kind = rng.choices(["save", "append", "patch", "claim"], weights=[2, 6, 1, 1])[0]
        ops.append((kind, f"{seed}-{i}", rng.randint(1, 6)))
    return ops


def _turn(turn_id: str, size: int) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role="assistant",
        content=(TextBlock(text=f"ünï {turn_id} " * size),),
        created_at=size,
    )


async def apply(store: SessionStore, op: Op) -> None:
    """Carry out one operation."""
    full: Any = store
    kind, tag, size = op
    if kind == "save":
        turns = tuple(_turn(f"s{tag}-{j}", size) for j in range(size))
        data = SessionData(id="s", created_at=1, updated_at=1, metadata={"op": tag}, turns=turns)
        await store.save(data)
    elif kind == "append":
        run = SessionRun(id="r", prompt="p", started_at=1, status="running", loop_turn=size)
        turns = [_turn(f"a{tag}-{j}", size) for j in range(size)]
        await store.append_turns("s", turns, AppendTurnsOptions(run=run))
    elif kind == "patch":
        await full.patch_meta("s", {"patched": tag})
    else:
        await full.claim_send_request("s", f"q{tag}", f"fp{size}")


def _kill_at(count: int) -> None:
    """Send SIGKILL to this process just before its ``count``-th file-system write call."""
    calls = 0

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == count:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return call

    for name in ("write", "pwrite", "fsync", "replace", "rename", "unlink", "ftruncate"):
        setattr(os, name, wrap(getattr(os, name)))


async def _write(directory: str, seed: int) -> None:
    store = create_file_map_store(DirectoryFileMapAdapter(directory))
    for i, op in enumerate(plan(seed)):
        await apply(store, op)
        print("ack", i, flush=True)


def main(directory: str) -> None:
    for line in sys.stdin:
        seed, kill_at = map(int, line.split())
        pid = os.fork()
        if pid == 0:
            if kill_at:
                _kill_at(kill_at)
            trio.run(_write, directory, seed)
            os._exit(0)
        print("pid", pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print("exit", status, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
