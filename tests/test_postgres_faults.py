"""PostgreSQL failing under load: killed backends and server restarts, through a session host.

Many sessions append at once through ``open_session_host``, so their writes reach
the store as ``apply_writes`` batches (group commit, pipelined). Whatever the
fault, every acknowledged append is stored exactly once and in order, a failed
one raised ``StoreUnavailableError``, the batch path works again as soon as the
server answers, and each outage is logged once, not once per operation.
``benchmarks/soak_postgres_faults.py`` runs the same workload longer, in processes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from _pg_faults import (
    Ledger,
    check_store,
    final_round,
    kill_backends,
    postgres_bin,
    private_cluster,
    stored_turns,
    turn,
    wait_for_events,
    write_until,
)
from psycopg import sql
from test_postgres_store import DSN, fresh_schema, session

from zidane_actors.actors import Session, SessionHost, open_session_host
from zidane_actors.errors import StoreUnavailableError
from zidane_actors.model import AppendTurnsOptions, SessionRun
from zidane_actors.server import serve
from zidane_actors.stores import (
    PostgresStore,
    StoreWrite,
    create_remote_store,
    open_postgres_store,
)

SESSIONS = 40
KILL_ROUNDS = 16
RESTARTS = 3
NOWHERE = "host=127.0.0.1 port=1 user=postgres dbname=test connect_timeout=1"
"""A DSN nothing answers at: a server that stays down."""


@pytest.fixture
def schema() -> Iterator[str]:
    with fresh_schema() as name:
        yield name


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="psycopg")
    caplog.set_level(logging.DEBUG, logger="zidane_actors")  # last: it sets the handler's level
    return caplog


def outage_lines(logs: pytest.LogCaptureFixture) -> dict[str, list[logging.LogRecord]]:
    """The store's outage lines by level, and every psycopg line at ``WARNING`` or above."""
    mine = [r for r in logs.records if r.name == "zidane_actors.stores.postgres"]
    return {
        "lost": [r for r in mine if r.levelno >= logging.WARNING],
        "back": [r for r in mine if r.levelno == logging.INFO],
        "psycopg": [
            r for r in logs.records if r.name.startswith("psycopg") and r.levelno >= logging.WARNING
        ],
    }


@asynccontextmanager
async def writing_host(
    dsn: str, schema: str, sessions: int
) -> AsyncIterator[tuple[PostgresStore, SessionHost, list[Session]]]:
    async with (
        open_postgres_store(dsn, schema=schema, pool_size=2) as store,
        open_session_host(store) as host,
    ):
        handles = [await host.create_session(id=f"s{i:02}") for i in range(sessions)]
        yield store, host, handles


def assert_recovered(ledger: Ledger, failed_after: int, stored: dict[str, list[str]]) -> None:
    assert failed_after == 0, ledger.messages
    assert set(ledger.failures) <= {"StoreUnavailableError"}
    assert not [m for m in ledger.messages if "pipeline" in m], ledger.messages
    check_store(stored, ledger)


async def test_batches_survive_killed_backends(schema: str, logs: pytest.LogCaptureFixture) -> None:
    ledger = Ledger()
    stop = trio.Event()
    with psycopg.connect(DSN, autocommit=True) as admin:
        async with writing_host(DSN, schema, SESSIONS) as (store, host, handles):
            with trio.fail_after(120):  # a batch path that never recovers fails here, not hangs
                async with trio.open_nursery() as nursery:
                    for handle in handles:
                        nursery.start_soon(write_until, handle, stop, ledger)
                    killed = 0
                    for _ in range(KILL_ROUNDS):
                        # Kill while the writers are busy, then wait until the store noticed
                        # (a backend may finish its batch before it dies) and reconnected.
                        await wait_for_events(ledger, ledger.events + SESSIONS)
                        reconnects = store.statistics().reconnects
                        killed += await trio.to_thread.run_sync(kill_backends, admin, schema)
                        while True:
                            if store.statistics().reconnects > reconnects:
                                break
                            await trio.sleep(0.01)
                    await wait_for_events(ledger, ledger.events + SESSIONS)
                    stop.set()
            failed_after = await final_round(handles, ledger, "after")
            stats = store.statistics()
            batches = host.statistics().store.batches
    assert killed >= KILL_ROUNDS
    assert stats.reconnects >= KILL_ROUNDS
    assert batches > 0  # the appends went through apply_writes
    assert_recovered(ledger, failed_after, stored_turns(DSN, schema))
    lines = outage_lines(logs)
    assert not lines["psycopg"]
    assert 1 <= len(lines["lost"]) == stats.outages <= KILL_ROUNDS
    assert len(lines["back"]) == stats.outages


async def test_batches_survive_server_restarts(logs: pytest.LogCaptureFixture) -> None:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    schema = "faults"
    ledger = Ledger()
    stop = trio.Event()
    with private_cluster(bindir) as cluster:
        async with writing_host(cluster.dsn, schema, SESSIONS // 2) as (store, host, handles):
            with trio.fail_after(120):  # a batch path that never recovers fails here, not hangs
                async with trio.open_nursery() as nursery:
                    for handle in handles:
                        nursery.start_soon(write_until, handle, stop, ledger)
                    for i in range(RESTARTS):
                        await wait_for_events(ledger, ledger.events + SESSIONS)
                        acks = ledger.acks
                        mode = "immediate" if i % 2 else "fast"
                        await trio.to_thread.run_sync(cluster.stop, mode)
                        await wait_for_events(ledger, ledger.events + SESSIONS)  # failing now
                        await trio.to_thread.run_sync(cluster.start)
                        # The writers recover by themselves: new appends are acknowledged.
                        while ledger.acks < acks + SESSIONS:
                            await ledger.answered.wait()
                    stop.set()
            failed_after = await final_round(handles, ledger, "after")
            stats = store.statistics()
            batches = host.statistics().store.batches
        stored = stored_turns(cluster.dsn, schema)
    assert batches > 0
    assert ledger.failures["StoreUnavailableError"] > 0  # the server was down for a while
    assert_recovered(ledger, failed_after, stored)
    lines = outage_lines(logs)
    assert not lines["psycopg"]
    assert len(lines["lost"]) == stats.outages == RESTARTS
    assert len(lines["back"]) == RESTARTS


async def blocked_batch(store: PostgresStore, dsn: str, schema: str, round_: int) -> None:
    """Kill the batch connection while its pipeline waits for a row lock another client holds."""
    writes = [
        StoreWrite("update_status", ("b", "idle")),
        StoreWrite("append_turns", ("a", [turn(f"a:{round_}")])),
    ]
    results: list[Any] = []

    async def apply() -> None:
        results.extend(await store.apply_writes(writes))

    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM sessions WHERE id = 'a' FOR UPDATE")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(apply)
            query = (
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND wait_event_type = 'Lock'"
            )
            while True:  # poll the server until the batch waits for the lock
                if holder.execute(query, (f"zidane_actors:{schema}",)).fetchall():
                    break
                await trio.sleep(0.01)
            holder.execute("ROLLBACK")  # the batch, retried on a fresh connection, goes on
    for result in results:
        result.unwrap()


async def test_lone_appends_survive_killed_backends(
    schema: str, logs: pytest.LogCaptureFixture
) -> None:
    """Single appends (one statement, its socket awaited in the trio thread) on a connection
    killed before each few: each append still succeeds, on a connection opened again, and
    is stored once, in order; each kill is one outage, logged once."""
    kills = 0
    sent: list[str] = []
    with psycopg.connect(DSN, autocommit=True) as admin:
        async with open_postgres_store(DSN, schema=schema, pool_size=2) as store:
            await store.save(session("a"))
            for i in range(40):
                if i % 4 == 1:
                    await trio.to_thread.run_sync(kill_backends, admin, schema, 5_000)
                    kills += 1
                run = SessionRun(id=f"r{i // 8}", prompt="p", started_at=i, status="running")
                await store.append_turns(
                    "a", [turn(f"a:{i}")], AppendTurnsOptions(run=run) if i % 2 else None
                )
                sent.append(f"a:{i}")
            stats = store.statistics()
            stored = await store.load("a")
            assert stored is not None
            assert [t.id for t in stored.turns] == sent
            assert [r.id for r in stored.runs] == ["r0", "r1", "r2", "r3", "r4"]
    assert stats.reconnects >= kills
    lines = outage_lines(logs)
    assert not lines["psycopg"]
    assert stats.outages == kills == len(lines["lost"]) == len(lines["back"])


async def test_each_outage_is_logged_once(schema: str, logs: pytest.LogCaptureFixture) -> None:
    async with open_postgres_store(DSN, schema=schema, pool_size=2) as store:
        await store.save(session("a"))
        await store.save(session("b"))
        for round_ in range(3):
            await blocked_batch(store, DSN, schema, round_)
        assert [t.id for t in await store.get_turns("a")] == ["a:0", "a:1", "a:2"]
        stats = store.statistics()
    lines = outage_lines(logs)
    assert not lines["psycopg"]  # psycopg's own "error ignored …" notes are not repeated
    assert stats.outages == 3
    assert len(lines["lost"]) == 3
    assert all("server unavailable (" in r.getMessage() for r in lines["lost"])
    assert len(lines["back"]) == 3


async def test_a_connection_left_in_pipeline_mode_is_replaced(schema: str) -> None:
    """libpq's pipeline mode left on after a failed exit (the state a lost connection can leave
    when ``PQexitPipelineMode`` finds it busy): the next batch opens a fresh connection."""
    async with open_postgres_store(DSN, schema=schema, pool_size=2) as store:
        await store.save(session("a"))
        raw = store._writer.raw
        assert raw is not None
        raw.pgconn.enter_pipeline_mode()
        writes = [StoreWrite("append_turns", ("a", [turn(f"a:{i}")])) for i in range(3)]
        for result in await store.apply_writes(writes):
            result.unwrap()
        assert store._writer.raw is not raw
        assert [t.id for t in await store.get_turns("a")] == ["a:0", "a:1", "a:2"]


async def test_a_rest_server_over_postgres_logs_an_outage_once(
    schema: str, logs: pytest.LogCaptureFixture
) -> None:
    """Requests answered 503 while the server is down add no traceback each to the log."""
    async with open_postgres_store(DSN, schema=schema, pool_size=2, retries=1) as store:
        await store.save(session("s"))
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status: serve(store, port=0, task_status=task_status)
            )
            async with create_remote_store(url, retries=0) as remote:
                await remote.append_turns("s", [turn("s:0")])
                conns = [store._writer, *store._pool]
                for conn in conns:
                    conn.dsn = NOWHERE
                with psycopg.connect(DSN, autocommit=True) as admin:
                    assert kill_backends(admin, schema) == len(conns)
                failures: list[BaseException] = []

                async def attempt(i: int) -> None:
                    try:
                        if i % 4:
                            await remote.append_turns("s", [turn(f"s:{i}")])
                        else:
                            await remote.get_turns("s")
                    except StoreUnavailableError as exc:
                        failures.append(exc)

                async with trio.open_nursery() as requests:
                    for i in range(1, 21):
                        requests.start_soon(attempt, i)
                assert len(failures) == 20
                for conn in conns:
                    conn.dsn = DSN
                await remote.append_turns("s", [turn("s:after")])
                assert [t.id for t in await remote.get_turns("s")] == ["s:0", "s:after"]
            nursery.cancel_scope.cancel()
    assert not [r.getMessage() for r in logs.records if r.name.startswith("zidane_actors.server")]
    lines = outage_lines(logs)
    assert (len(lines["lost"]), len(lines["back"]), lines["psycopg"]) == (1, 1, [])
