"""Soak: writer processes on one PostgreSQL store while backends are killed and the server restarts.

A private throwaway cluster (``initdb`` in a temporary directory, its own port;
the cluster on :5432 is never touched) holds one schema. ``--processes`` worker
processes (``tests/_pg_faults.py``) each open the store with its defaults and a
session host, and ``--sessions`` sessions each append one turn after another,
so the host's store actor sends them as ``apply_writes`` batches. Meanwhile
this script runs ``--rounds`` rounds of ``pg_terminate_backend`` on every store
connection, ``--interval`` seconds apart, and restarts the server ``--restarts``
times among them (alternating fast and immediate stops, ``--down`` seconds
down). Then every worker appends once more per session, all at once, and
reports what it was told.

Checked: every acknowledged append is stored exactly once and in order, every
failed one raised ``StoreUnavailableError``, the last appends all succeed, and
each worker's stderr stays about one line per outage. Printed: appends
acknowledged and failed, failed ones stored anyway, the delay from each restart
to the next commit, and stderr lines against outages. Exits 1 when a check fails.

Run (as root or the ``postgres`` user, with PostgreSQL's server programs installed):
``.venv/bin/python benchmarks/soak_postgres_faults.py [--processes 4] [--sessions 40]
[--rounds 80] [--restarts 17]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import psycopg

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from _pg_faults import (  # noqa: E402
    Ledger,
    PrivateCluster,
    check_store,
    kill_backends,
    postgres_bin,
    private_cluster,
    stored_turns,
)

SCHEMA = "soak"


def committed(dsn: str) -> int:
    """Turns stored so far (the sessions' counters: one cheap read)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(f"SELECT coalesce(sum(turn_count), 0) FROM {SCHEMA}.sessions").fetchone()
        return int(row[0]) if row else 0


def until_next_commit(dsn: str, timeout: float = 60.0) -> float:
    """Seconds from now until the store holds more turns than now (the writers recovered)."""
    start = time.monotonic()
    before = None
    while time.monotonic() - start < timeout:
        try:
            now = committed(dsn)
        except psycopg.OperationalError:
            now = None
        if before is None:
            before = now
        elif now is not None and now > before:
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"no commit within {timeout:.0f} s: the writers did not recover")


def start_workers(cluster: PrivateCluster, processes: int, sessions: int, logs: Path) -> list[Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = []
    for p in range(processes):
        ids = ",".join(f"p{p}-s{s}" for s in range(sessions))
        stderr = (logs / f"worker{p}.err").open("w")
        proc = subprocess.Popen(
            [sys.executable, str(TESTS / "_pg_faults.py"), cluster.dsn, SCHEMA, ids],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        workers.append((proc, stderr))
    for proc, _ in workers:
        out: IO[str] = proc.stdout
        if "ready" not in json.loads(out.readline() or "{}"):
            raise RuntimeError(f"a worker failed during setup (see {logs})")
    return workers


def soak(args: argparse.Namespace, cluster: PrivateCluster, logs: Path) -> bool:
    # The first worker creates the schema; the others race it through the migration lock.
    workers = start_workers(cluster, args.processes, args.sessions, logs)
    try:
        ok = run_faults(args, cluster)
        return collect(workers, logs, cluster) and ok
    finally:
        for proc, stderr in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stderr.close()


def run_faults(args: argparse.Namespace, cluster: PrivateCluster) -> bool:
    """Kill rounds and restarts, ``--interval`` apart; ``False`` when the writers stay stuck."""
    restart_every = max(1, args.rounds // args.restarts) if args.restarts else 0
    killed = restarts = 0
    delays: list[float] = []
    admin = psycopg.connect(cluster.dsn, autocommit=True)
    try:
        for r in range(1, args.rounds + 1):
            time.sleep(args.interval)
            if restart_every and r % restart_every == 0 and restarts < args.restarts:
                admin.close()
                cluster.stop("immediate" if restarts % 2 else "fast")
                time.sleep(args.down)
                cluster.start()
                restarts += 1
                delays.append(until_next_commit(cluster.dsn))
                admin = psycopg.connect(cluster.dsn, autocommit=True)
            else:
                killed += kill_backends(admin, SCHEMA)
    except RuntimeError as exc:
        print(f"FAIL after {restarts} restarts: {exc}")
        return False
    finally:
        admin.close()
    kills = args.rounds - restarts
    print(f"faults: {kills} kill rounds ({killed} backends), {restarts} restarts")
    print(
        f"restart -> next commit: median {statistics.median(delays or [0]):.2f} s,"
        f" max {max(delays or [0]):.2f} s"
    )
    return True


def collect(workers: list[Any], logs: Path, cluster: PrivateCluster) -> bool:
    """Stop the workers, merge their ledgers and check them against the store."""
    ledger = Ledger()
    ok = True
    outages = stderr_lines = batches = 0
    for proc, stderr in workers:
        out, _ = proc.communicate(input="", timeout=300)
        if proc.returncode:
            print(f"FAIL: a worker exited with {proc.returncode} (see {logs})")
            return False
        report = json.loads(out.strip().splitlines()[-1])
        ledger.merge(report["ledger"])
        outages += report["store"]["outages"]
        batches += report["batches"]
        stderr_lines += len(Path(stderr.name).read_text().splitlines())
        if report["failed_after"]:
            print(f"FAIL: {report['failed_after']} appends failed once the faults had stopped")
            ok = False
    failed = sum(ledger.failures.values())
    print(f"appends: {ledger.acks:,} acknowledged, {failed:,} failed, in {batches:,} batches")
    for message, count in ledger.messages.most_common(3):
        print(f"   {count:>7,} x {message}")
    if set(ledger.failures) - {"StoreUnavailableError"}:
        print(f"FAIL: failures other than StoreUnavailableError: {dict(ledger.failures)}")
        ok = False
    try:
        landed = check_store(stored_turns(cluster.dsn, SCHEMA), ledger)
        print(f"store: every acknowledged append once and in order; {landed} failed ones stored")
    except AssertionError as exc:
        print(f"FAIL: {exc}")
        ok = False
    print(f"stderr: {stderr_lines} lines for {outages} outages in {len(workers)} processes")
    if stderr_lines > 2 * outages + 10:
        print("FAIL: stderr grows faster than one line per outage")
        ok = False
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=40, help="per process")
    parser.add_argument("--rounds", type=int, default=80, help="fault rounds, restarts included")
    parser.add_argument("--restarts", type=int, default=17)
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between faults")
    parser.add_argument("--down", type=float, default=0.5, help="seconds down per restart")
    args = parser.parse_args()
    bindir = postgres_bin()
    if bindir is None:
        sys.exit("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    with tempfile.TemporaryDirectory() as tmp, private_cluster(bindir) as cluster:
        ok = soak(args, cluster, Path(tmp))
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
