"""Several hosts in real processes on shared sessions: the recorded history must be consistent.

Three worker processes (``tests/_history_worker.py``) each open a host on one
store and run a seeded random program (load, append, read, rewrite, pop,
metadata save, the openai-agents integration's pop, run claims, eviction) on
three shared sessions, starting together. Their histories are merged and
checked by ``tests/_history.py`` (Elle's list-append rules, extended with
pops): every acknowledged turn is in the store exactly once and in order, each
read (of the store, of a host's view after ``load_session`` or after an
append) is a state the store held during it, no write computed from a stale
view was applied, and run claims never overlap. The programs are seeded; the
interleaving is the operating system's, so a failure names the anomalies found
and the run's seed.

``benchmarks/soak_history.py`` runs the same harness longer.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from _history import Anomaly, check
from _history_worker import HistoryRun, run_processes
from psycopg import sql

from zidane_actors.actors import open_session_host
from zidane_actors.model import RunOwner, SessionData
from zidane_actors.stores import open_sqlite_store

PROCESSES = 3
STEPS = 80
SEED = 21
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def summary(anomalies: list[Anomaly], run: HistoryRun) -> str:
    kinds = collections.Counter(a.kind for a in anomalies)
    lines = [f"seed {SEED}: {dict(kinds)}"]
    shown: collections.Counter[str] = collections.Counter()
    for anomaly in anomalies:
        shown[anomaly.kind] += 1
        if shown[anomaly.kind] <= 3:
            lines.append(f"  {anomaly.kind} [{anomaly.session}] {anomaly.detail}")
    lines.extend(f"  lost-meta {line}" for line in run.meta_rollbacks())
    return "\n".join(lines)


def assert_consistent(run: HistoryRun) -> None:
    anomalies = check(run.events, run.turns)
    if anomalies or run.meta_rollbacks():
        pytest.fail(summary(anomalies, run), pytrace=False)
    # The programs did what they were drawn to do (the check was not vacuous).
    done = collections.Counter(e.f for e in run.events if e.type == "ok")
    assert done["append"] and done["read"] and done["rewrite"] and done["claim"], done


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (its default schema is as fresh), dropped afterwards."""
    name = f"test_history_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_one_host_alone_is_consistent(tmp_path: Path) -> None:
    # The control: one host (without the integration, a second host) has one view.
    run = run_processes(
        f"sqlite:{tmp_path / 'alone.db'}",
        tmp_path,
        processes=1,
        steps=2 * STEPS,
        seed=SEED,
        skip=("zpop",),
    )
    assert_consistent(run)


def test_sqlite_file_shared_by_three_hosts(tmp_path: Path) -> None:
    run = run_processes(
        f"sqlite:{tmp_path / 'shared.db'}",
        tmp_path,
        processes=PROCESSES,
        steps=STEPS,
        seed=SEED,
    )
    assert_consistent(run)


def test_postgres_database_shared_by_three_hosts(tmp_path: Path, pg_database: str) -> None:
    run = run_processes(pg_database, tmp_path, processes=PROCESSES, steps=STEPS, seed=SEED)
    assert_consistent(run)


async def test_a_save_keeps_another_hosts_run_claim(tmp_path: Path) -> None:
    # What the "hold" step finds (double-claim): a host loads a session while a
    # host elsewhere runs it, saves a metadata change, and the run marker is gone,
    # so a third claim wins while the first run still works.
    elsewhere = RunOwner(host_id="elsewhere", pid=1, token="t")
    async with open_sqlite_store(tmp_path / "s.db") as store, open_session_host(store) as host:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        assert (await store.claim_run("s", stale_at=0, owner=elsewhere)).claimed
        session = await host.load_session("s")
        assert session is not None
        await session.set_meta("k", 1)
        await session.save()
        stored = await store.load("s")
        assert stored is not None
        assert (stored.status, stored.run_owner) == ("running", elsewhere)
        assert not (await store.claim_run("s", stale_at=0)).claimed
