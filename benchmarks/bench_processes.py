"""Several processes appending at once to one store: PostgreSQL as a ratio to one SQLite file.

Each of ``--processes`` worker processes (default 4) runs ``open_session_host``
with its default settings over its own connection to the shared store, and
250 sessions of its own each append 3 realistic durable turns one after the
other (all sessions at once). Setup (opening, creating sessions) is untimed:
once every worker reports it ready, the parent sends them one wall-clock
instant to start appending at, and reports all the turns over the span from
that instant to the last worker's end. SQLite: one WAL file
(``durability="full"``); PostgreSQL: one schema at 127.0.0.1:5432 or
``ZIDANE_TEST_POSTGRES`` (default ``synchronous_commit``). Rounds alternate the two
and the ratio is the median.
Target (issue 14): PostgreSQL >= 0.7x SQLite.

Run: ``.venv/bin/python benchmarks/bench_processes.py [--processes N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from _common import DSN, bench_schema, run_workers
from _realistic import step_turn

from zidane_actors.actors import open_session_host
from zidane_actors.stores import SessionStore, open_postgres_store, open_sqlite_store

SESSIONS = 250  # per process
APPENDS = 3
TARGET = 0.7


@asynccontextmanager
async def opened(kind: str, where: str) -> AsyncIterator[SessionStore]:
    if kind == "sqlite":
        async with open_sqlite_store(where, durability="full") as store:
            yield store
    else:
        async with open_postgres_store(DSN, schema=where) as store:
            yield store


async def worker(kind: str, where: str, index: int) -> dict[str, float]:
    turns = [[step_turn(s, i) for i in range(APPENDS)] for s in range(SESSIONS)]
    async with opened(kind, where) as store, open_session_host(store) as host:
        sessions = [await host.create_session(id=f"p{index}-s{s}") for s in range(SESSIONS)]

        async def one(s: int) -> None:
            for turn in turns[s]:
                await sessions[s].append_turns([turn])

        print("ready", flush=True)
        start_at = float(await trio.to_thread.run_sync(sys.stdin.readline))
        await trio.sleep(max(0.0, start_at - time.time()))
        begin = time.time()
        async with trio.open_nursery() as nursery:
            for s in range(SESSIONS):
                nursery.start_soon(one, s)
        end = time.time()
        assert sessions[3].turns == tuple(turns[3])
    return {"begin": begin, "end": end}


def run_round(kind: str, where: str, processes: int) -> float:
    """Turns/s of ``processes`` workers appending at once, once every one is set up."""
    argvs = [["--worker", kind, where, str(i)] for i in range(processes)]
    start_at, reports = run_workers(__file__, argvs, timeout=600)
    late = max(r["begin"] for r in reports) - start_at
    if late > 0.1:
        print(f"   (a {kind} worker started {late:.2f} s late)")
    span = max(r["end"] for r in reports) - start_at
    return processes * SESSIONS * APPENDS / span


def main(processes: int, rounds: int) -> None:
    print(
        f"{processes} processes x {SESSIONS} sessions x {APPENDS} durable appends,"
        " all at once, through open_session_host (defaults)"
    )
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ["sqlite", "postgres"] if r % 2 == 0 else ["postgres", "sqlite"]
            found: dict[str, float] = {}
            for kind in order:
                if kind == "sqlite":
                    found[kind] = run_round(kind, str(Path(tmp) / f"r{r}.db"), processes)
                else:
                    with bench_schema() as schema:
                        found[kind] = run_round(kind, schema, processes)
            ratios.append(found["postgres"] / found["sqlite"])
            print(
                f"   round {r + 1}: sqlite {found['sqlite']:,.0f} turns/s,"
                f" postgres {found['postgres']:,.0f} turns/s, ratio {ratios[-1]:.2f}x"
            )
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"   median postgres / sqlite: {ratio:.2f}x (target >= {TARGET}x: {verdict})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, where, index = sys.argv[2:5]
        report = trio.run(worker, kind, where, int(index))
        print(json.dumps(report))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--processes", type=int, default=4)
        parser.add_argument("--rounds", type=int, default=3)
        args = parser.parse_args()
        main(args.processes, args.rounds)
