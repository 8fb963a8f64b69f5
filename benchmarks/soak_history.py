"""Soak: many host processes on shared sessions, their merged history checked.

The long form of ``tests/test_multiprocess_history.py``: ``--processes`` workers
(``tests/_history_worker.py``) run seeded random programs of ``--steps`` steps
each (load, append, read, rewrite, pop, metadata save, the openai-agents
integration's pop, run claims, eviction) on ``--sessions`` shared sessions of
one store, starting together; their merged history is checked with
``tests/_history.py`` (Elle's list-append rules, extended with pops, plus the
store's ``rev`` and the fields callers set). Each round uses the next seed.

``--refresh``: another task of each host loads its sessions (refreshing the
held handles) at random moments and between a view and the write computed
from it, and the programs also rewrite from views taken before awaits, set
agent ids and patch metadata. ``--listen`` (implies ``--refresh``): a
PostgreSQL store is opened with ``listen=True``, so each host also refreshes
its held sessions when another writer moves them. ``--faults`` (PostgreSQL
only): the store is a private throwaway cluster (``tests/_pg_faults.py``;
the cluster on :5432 is never touched) whose backends are terminated every
``--interval`` seconds, and which is restarted every ``--restart-every`` fault
rounds, at most ``--restarts`` times a round (alternating fast and immediate
stops, ``--down`` seconds down); the workers record failed operations and go on.

Prints each round's operations, outcomes, faults and anomalies, then a summary
(acknowledged turns lost, stale writes applied, caller changes lost, double
run owners, anomalies by kind), and exits 1 when any round found an anomaly.

SQLite: one file in a temporary directory. PostgreSQL: a fresh database at
127.0.0.1:5432 (dropped afterwards), or of the private cluster with ``--faults``.

Run: ``.venv/bin/python benchmarks/soak_history.py [--store sqlite|postgres|both]
[--processes 6] [--steps 1000] [--sessions 3] [--rounds 1] [--seed 1] [--skip KINDS]
[--refresh] [--listen] [--faults [--interval 0.5] [--restarts 2] [--restart-every 10]
[--down 0.5]] [--keep DIR]``, e.g. ``--store postgres --processes 4 --steps 1500 --listen --faults``
(as root or the ``postgres`` user, with PostgreSQL's server programs installed).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

# This checkout's package (as the workers import it) and the tests' helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _history_worker import HistoryRun, run_processes
from _pg_faults import PrivateCluster, kill_backends, postgres_bin

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
SCHEMA = "zidane"  # the store's default schema: its connections are named after it
SUMMARY = {
    "acknowledged turns lost": ("lost-append",),
    "stale writes applied": ("stale writes",),
    "caller changes lost": ("lost-field", "lost-meta"),
    "double owners": ("double-claim",),
}
"""The summary's lines: the kinds (or counts) each adds up."""


class SoakCluster(PrivateCluster):
    """The private cluster, with room for every worker's connections."""

    def start(self) -> None:
        # Each worker holds a pool, a listening connection and the integration's stores.
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c full_page_writes=off -c max_connections=300"
            " -c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", self.data, "-l", self.root / "log", "-o", options, "-w", "start")


@contextmanager
def soak_cluster() -> Iterator[SoakCluster]:
    bindir = postgres_bin()
    if bindir is None:
        sys.exit("--faults needs PostgreSQL's server programs (initdb, pg_ctl)")
    cluster = SoakCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@contextmanager
def database(admin_dsn: str, host: str) -> Iterator[str]:
    """A fresh database of the cluster at ``admin_dsn`` (dropped afterwards): its URL."""
    name = f"soak_history_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql://postgres@{host}/{name}"
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


def injector(
    cluster: PrivateCluster, args: argparse.Namespace, faults: collections.Counter[str]
) -> Callable[[Callable[[], bool]], None]:
    """Terminate the store's backends every ``--interval`` s, restart now and then."""

    def during(running: Callable[[], bool]) -> None:
        admin: Any = psycopg.connect(cluster.dsn, autocommit=True)
        rounds = restarts = 0
        try:
            while running():
                time.sleep(args.interval)
                if not running():
                    break
                rounds += 1
                if restarts < args.restarts and rounds % args.restart_every == 0:
                    admin.close()
                    cluster.stop("immediate" if restarts % 2 else "fast")
                    time.sleep(args.down)
                    cluster.start()
                    restarts += 1
                    faults["restarts"] += 1
                    admin = psycopg.connect(cluster.dsn, autocommit=True)
                else:
                    faults["kill rounds"] += 1
                    faults["backends terminated"] += kill_backends(admin, SCHEMA)
        finally:
            admin.close()

    return during


def one_round(
    store: str,
    args: argparse.Namespace,
    seed: int,
    cluster: PrivateCluster | None,
    totals: collections.Counter[str],
) -> int:
    """Run and check one round; the number of anomalies found."""
    ids = [f"s{i}" for i in range(args.sessions)]
    skip = [name for name in args.skip.split(",") if name]
    options = [
        *(["refresh"] if args.refresh or args.listen else []),
        *(["listen"] if args.listen and store == "postgres" else []),
        *(["faults"] if cluster is not None else []),
    ]
    faults: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        out = Path(tmp)
        if args.keep is not None:  # each round's histories, one JSONL file a worker
            out = args.keep / f"{store}-seed{seed}"
            out.mkdir(parents=True, exist_ok=True)
        if cluster is not None:
            url = stack.enter_context(database(cluster.dsn, f"127.0.0.1:{cluster.port}"))
        elif store == "postgres":
            url = stack.enter_context(database(ADMIN_DSN, "127.0.0.1:5432"))
        else:
            url = f"sqlite:{Path(tmp) / 'shared.db'}"
        started = time.perf_counter()
        run = run_processes(
            url,
            out,
            processes=args.processes,
            steps=args.steps,
            seed=seed,
            sessions=ids,
            skip=skip,
            options=options,
            during=None if cluster is None else injector(cluster, args, faults),
        )
        took = time.perf_counter() - started
    return report(store, args, seed, options, run, took, faults, totals)


def report(
    store: str,
    args: argparse.Namespace,
    seed: int,
    options: list[str],
    run: HistoryRun,
    took: float,
    faults: collections.Counter[str],
    totals: collections.Counter[str],
) -> int:
    """Print one round's outcomes and anomalies, add them to ``totals``; how many were found."""
    anomalies = run.anomalies()
    rollbacks = run.meta_rollbacks()
    outcomes = collections.Counter(f"{e.f}:{e.type}" for e in run.events if e.type != "invoke")
    kinds = collections.Counter(a.kind for a in anomalies)
    kinds.update({"lost-meta": len(rollbacks)} if rollbacks else {})
    totals.update(kinds)
    # A write found stale by several rules (or missing several elements) is one write;
    # each detail starts with the operation ("p1#42 rewrite ...").
    stale = {(a.session, a.detail.split(" ", 1)[0]) for a in anomalies if a.kind == "stale-write"}
    # Those proven by the store's revs alone (the others by turns a view missed or held,
    # which also counts writes from views that only missed an append lost before).
    by_rev = {
        (a.session, a.detail.split(" ", 1)[0])
        for a in anomalies
        if a.kind == "stale-write" and "was computed from rev" in a.detail
    }
    totals["stale writes"] += len(stale)
    totals["stale writes by rev"] += len(by_rev)
    print(
        f"{store} seed={seed} processes={args.processes} steps={args.steps}"
        f" sessions={args.sessions} options={','.join(options) or '-'}:"
        f" {len(run.events) // 2} operations in {took:.1f} s"
    )
    print(f"  outcomes: {dict(sorted(outcomes.items()))}")
    if faults:
        print(f"  faults: {dict(faults)}")
    print(f"  anomalies: {dict(kinds) or 'none'}")
    print(f"  stale writes applied: {len(stale)} ({len(by_rev)} proven by rev)")
    shown: collections.Counter[str] = collections.Counter()
    for anomaly in anomalies:
        shown[anomaly.kind] += 1
        if shown[anomaly.kind] <= 3:
            print(f"    {anomaly.kind} [{anomaly.session}] {anomaly.detail[:400]}")
    for line in rollbacks[:3]:
        print(f"    lost-meta {line}")
    return sum(kinds.values())


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
    parser.add_argument("--refresh", action="store_true", help="refreshed handles, late writes")
    parser.add_argument("--listen", action="store_true", help="PostgreSQL listen=True (+refresh)")
    parser.add_argument("--faults", action="store_true", help="PostgreSQL: kill and restart")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between faults")
    parser.add_argument("--restarts", type=int, default=2, help="server restarts a round, at most")
    parser.add_argument("--restart-every", type=int, default=10, help="fault rounds a restart")
    parser.add_argument("--down", type=float, default=0.5, help="seconds down per restart")
    parser.add_argument("--keep", type=Path, help="keep each round's histories in this directory")
    args = parser.parse_args()
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    if args.faults and "sqlite" in stores:
        print("--faults: the SQLite rounds run without faults (it has no server to fault)")
    totals: collections.Counter[str] = collections.Counter()
    found = 0
    with soak_cluster() if args.faults and "postgres" in stores else nullcontext() as cluster:
        for round_ in range(args.rounds):
            for store in stores:
                seed = args.seed + round_
                faulted = cluster if store == "postgres" else None
                found += one_round(store, args, seed, faulted, totals)
    print("summary:")
    for label, kinds in SUMMARY.items():
        print(f"  {label}: {sum(totals[kind] for kind in kinds)}")
    print(f"  stale writes proven by rev: {totals['stale writes by rev']}")
    by_kind = {kind: n for kind, n in totals.items() if not kind.startswith("stale writes")}
    print(f"  anomalies by kind: {by_kind or 'none'}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
