"""What several benchmarks open the same way: a throw-away SQLite file or PostgreSQL schema,
and worker processes started at one wall-clock instant.

PostgreSQL is ``ZIDANE_TEST_POSTGRES``, default the local ``test`` database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from zidane_actors.stores import SessionStore, open_postgres_store, open_sqlite_store

__all__ = [
    "DSN",
    "bench_schema",
    "drop_schema",
    "postgres_answers",
    "postgres_store",
    "run_workers",
    "sqlite_store",
]

DSN = os.environ.get("ZIDANE_TEST_POSTGRES") or "host=127.0.0.1 port=5432 user=postgres dbname=test"


def drop_schema(schema: str) -> None:
    """Drop ``schema`` of ``DSN`` and everything in it."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def bench_schema() -> Iterator[str]:
    """A new schema name of ``DSN``, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


@asynccontextmanager
async def postgres_store(**options: Any) -> AsyncIterator[SessionStore]:
    """The PostgreSQL store on a schema of its own, dropped afterwards."""
    with bench_schema() as schema:
        async with open_postgres_store(DSN, schema=schema, **options) as store:
            yield store


@asynccontextmanager
async def sqlite_store(**options: Any) -> AsyncIterator[SessionStore]:
    """The SQLite store on a file in a directory of its own, removed afterwards."""
    with tempfile.TemporaryDirectory() as where:
        async with open_sqlite_store(Path(where) / "bench.db", **options) as store:
            yield store


def postgres_answers() -> bool:
    """Whether a PostgreSQL answers on ``DSN`` (a benchmark skips it otherwise)."""
    try:
        with psycopg.connect(DSN, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def run_workers(
    script: str, argvs: Sequence[Sequence[str]], timeout: float
) -> tuple[float, list[dict[str, Any]]]:
    """Start ``script`` once per ``argvs`` entry; once each printed ``ready``, send all of
    them one instant to start at, then read each one's JSON report.

    Answers that instant and the reports, in ``argvs`` order.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, script, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for argv in argvs
    ]
    for proc, argv in zip(procs, argvs, strict=True):
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a worker failed during setup: {' '.join(argv)}")
    start_at = time.time() + 0.2
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start_at!r}\n")
        proc.stdin.flush()
    reports = []
    for proc, argv in zip(procs, argvs, strict=True):
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"a worker failed ({proc.returncode}): {' '.join(argv)}")
        reports.append(json.loads(out))
    return start_at, reports
