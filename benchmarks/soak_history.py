"""Soak: many host processes on shared sessions, their merged history checked.

The long form of ``tests/test_multiprocess_history.py``: ``--processes`` workers
(``tests/_history_worker.py``) run seeded random programs of ``--steps`` steps
each (load, append, read, rewrite, pop, metadata save, the openai-agents
integration's pop, run claims, eviction) on ``--sessions`` shared sessions of
one store, starting together; their merged history is checked with
``tests/_history.py`` (Elle's list-append rules, extended with pops). Each
round uses the next seed. Prints each round's operations, outcomes and
anomalies, and exits 1 when any round found one.

SQLite: one file in a temporary directory. PostgreSQL: a fresh database at
127.0.0.1:5432 (dropped afterwards).

Run: ``.venv/bin/python benchmarks/soak_history.py [--store sqlite|postgres|both]
[--processes 6] [--steps 1000] [--sessions 3] [--rounds 1] [--seed 1] [--skip KINDS]``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _history import check
from _history_worker import run_processes

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def one_round(
    store: str, processes: int, steps: int, sessions: int, seed: int, skip: list[str]
) -> int:
    """Run and check one round; the number of anomalies found."""
    ids = [f"s{i}" for i in range(sessions)]
    database = None
    with tempfile.TemporaryDirectory() as tmp:
        if store == "sqlite":
            url = f"sqlite:{Path(tmp) / 'shared.db'}"
        else:
            database = f"soak_history_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            url = f"postgresql://postgres@127.0.0.1:5432/{database}"
        try:
            started = time.perf_counter()
            run = run_processes(
                url, Path(tmp), processes=processes, steps=steps, seed=seed, sessions=ids, skip=skip
            )
            took = time.perf_counter() - started
        finally:
            if database is not None:
                with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                    drop = sql.SQL("DROP DATABASE {} WITH (FORCE)")
                    conn.execute(drop.format(sql.Identifier(database)))
    anomalies = check(run.events, run.turns)
    rollbacks = run.meta_rollbacks()
    outcomes = collections.Counter(f"{e.f}:{e.type}" for e in run.events if e.type != "invoke")
    kinds = collections.Counter(a.kind for a in anomalies)
    print(
        f"{store} seed={seed} processes={processes} steps={steps} sessions={sessions}: "
        f"{len(run.events) // 2} operations in {took:.1f} s"
    )
    print(f"  outcomes: {dict(sorted(outcomes.items()))}")
    print(f"  anomalies: {dict(kinds) or 'none'}; metadata rollbacks: {len(rollbacks)}")
    shown: collections.Counter[str] = collections.Counter()
    for anomaly in anomalies:
        shown[anomaly.kind] += 1
        if shown[anomaly.kind] <= 3:
            print(f"    {anomaly.kind} [{anomaly.session}] {anomaly.detail}")
    for line in rollbacks[:3]:
        print(f"    lost-meta {line}")
    return len(anomalies) + len(rollbacks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--skip", default="", help="kinds of step to leave out, comma-separated (e.g. hold)"
    )
    args = parser.parse_args()
    skip = [name for name in args.skip.split(",") if name]
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    found = 0
    for round_ in range(args.rounds):
        for store in stores:
            seed = args.seed + round_
            found += one_round(store, args.processes, args.steps, args.sessions, seed, skip)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
