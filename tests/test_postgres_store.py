"""The PostgreSQL store on its own: contract, schema, group commit, failures, bad rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import msgspec
import outcome
import psycopg
import pytest
import trio
import trio.testing
from _pg import DSN, schema_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo
from store_contract import StoreContract, StoreOpener

from zidane_actors.errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from zidane_actors.model import (
    AppendTurnsOptions,
    RunOwner,
    Schedule,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionSearch,
    SessionTurn,
    TextBlock,
    encode_str,
    host_id,
)
from zidane_actors.stores import (
    OPTIONAL_METHODS,
    PostgresStore,
    StoreWrite,
    open_memory_store,
    open_postgres_store,
)
from zidane_actors.stores.postgres._schema import _V1, SCHEMA_VERSION

FAST_DSN = make_conninfo(DSN, options="-c synchronous_commit=off")
"""For the contract: the server never crashes in these tests, so skipping the WAL flush
on commit changes no result and spares the shared machine's disk."""


@contextmanager
def fresh_schema(name: str | None = None) -> Iterator[str]:
    """A schema name no other test uses, dropped (with everything in it) afterwards."""
    name = name or f"test_{uuid.uuid4().hex[:16]}"
    try:
        yield name
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def admin(schema: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``query`` on ``schema`` from outside the store (to corrupt rows, kill sessions)."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []


def turn(i: int, role: str = "user", text: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=f"t{i}",
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(text=text if text is not None else f"turn {i}"),),
        created_at=1_000 + i,
    )


def session(sid: str, **kw: Any) -> SessionData:
    return SessionData(id=sid, created_at=1, updated_at=2, **kw)


@pytest.fixture
def schema() -> Iterator[str]:
    with fresh_schema() as name:
        yield name


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    async with open_postgres_store(DSN, schema=schema, pool_size=2) as opened:
        yield opened


CONTRACT_SCHEMA = f"test_contract_{uuid.uuid4().hex[:16]}"
"""The contract's schema: this module's own, emptied before each test and each example."""


@pytest.fixture(scope="module", autouse=True)
def drop_contract_schema() -> Iterator[None]:
    with fresh_schema(CONTRACT_SCHEMA):
        yield


def empty_schema(schema: str) -> None:
    """Delete every row of ``schema`` (when it exists): fresh storage without the DDL cost."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        row = conn.execute("SELECT to_regclass('sessions')").fetchone()
        if row is not None and row[0] is not None:
            for table in ("sessions", "send_requests", "schedules", "schedule_fires"):
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))


class TestPostgresContract(StoreContract):
    """The shared store contract on this module's schema, emptied for each test and example."""

    required_capabilities = OPTIONAL_METHODS | {"apply_writes"}

    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        await trio.to_thread.run_sync(empty_schema, CONTRACT_SCHEMA)
        yield lambda: open_postgres_store(FAST_DSN, schema=CONTRACT_SCHEMA, pool_size=2)


@pytest.fixture
def no_indexer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened from here on run no background indexer (searches still index)."""
    monkeypatch.setattr(PostgresStore, "_start_indexer", lambda self: trio.CancelScope())


# -- schema ------------------------------------------------------------------------------------


async def test_schema_version_recorded(schema: str, store: PostgresStore) -> None:
    assert admin(schema, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]


async def test_v1_schema_is_migrated_with_its_rows_searchable(schema: str) -> None:
    """A schema at version 1 gets the words of its stored turns and titles on open; a row
    whose JSON the server cannot read (a NUL escape ``text`` keeps) stays, and its words
    are found (computed by the library, as the memory store finds them)."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(_V1.encode())
        conn.execute(
            "CREATE TABLE schema_version (version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO schema_version (version) VALUES (1)")
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata, turn_count,"
            " user_turn_count) VALUES ('a', 1, 2, 'idle', '{\"title\":\"Quarterly plan\"}', 1, 1),"
            " ('b', 1, 3, 'idle', '{}', 1, 1)"
        )
        nul = turn(1, "user", "nul \x00 inside")
        for sid, seq, t in (("a", 0, turn(0, text="weather in Oslo")), ("b", 0, nul)):
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES (%s, %s, %s, %s, %s)",
                (sid, seq, t.id, t.role, encode_str(t)),
            )
    async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:

        async def hits(text: str) -> list[str]:
            return [r.id for r in (await store.search_meta(SessionSearch(text=text))).rows]

        assert await hits("quarter") == await hits("oslo weather") == ["a"]
        assert await hits("nul inside") == ["b"]
        assert await hits("b") == ["b"]  # its id, from the header
        assert await store.get_turns("b") == [nul]
        await store.append_turns("b", [turn(2, text="later words")])
        assert await hits("later") == ["b"]
    assert admin(schema, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]


async def test_turn_words_are_computed_without_updating_the_row(
    no_indexer: None, schema: str
) -> None:
    """A turn is written with empty words and queued; the next search for words computes
    them in its own transaction without updating the turn's row. A body rewritten by
    another program's SQL is filled by that search too, so it is found by its new words
    only. (The background indexer, which does the same, is off here.)"""
    async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:

        async def hits(text: str) -> list[str]:
            return [r.id for r in (await store.search_meta(SessionSearch(text=text))).rows]

        await store.save(SessionData(id="a", created_at=1, updated_at=1))
        await store.append_turns("a", [turn(0, text="zebra crossing"), turn(1, text="okapi")])
        unset = "SELECT count(*) FROM turns WHERE words IS NULL"
        assert admin(schema, unset) == [(0,)]
        queued = "SELECT count(*) FROM words_pending"
        assert admin(schema, queued) == [(2,)]
        places = "SELECT ctid::text FROM turns ORDER BY seq"  # an update moves a row
        before = admin(schema, places)
        assert await hits("zebra") == ["a"]
        assert admin(schema, queued) == [(0,)]
        assert admin(schema, places) == before
        replaced = encode_str(turn(0, text="giraffe"))
        admin(schema, "UPDATE turns SET body = %s WHERE session_id = 'a' AND seq = 0", (replaced,))
        assert admin(schema, unset) == [(1,)]
        assert await hits("zebra") == [] and await hits("giraffe") == ["a"]
        await store.save(
            SessionData(id="a", created_at=1, updated_at=2, turns=(turn(5, text="lemur"),))
        )
        assert await hits("okapi") == [] and await hits("lemur") == ["a"]
        # A search without words reads only: nothing is computed.
        replaced = encode_str(turn(5, text="tapir"))
        admin(schema, "UPDATE turns SET body = %s WHERE session_id = 'a' AND seq = 0", (replaced,))
        await store.search_meta(SessionSearch(agent_id=None))
        assert admin(schema, unset) == [(1,)]


async def test_hosts_opening_at_once_migrate_once(schema: str) -> None:
    async def open_one() -> None:
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as opened:
            assert await opened.load("absent") is None

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(open_one)
    assert admin(schema, "SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)
    ]


async def test_newer_schema_version_is_refused(schema: str, store: PostgresStore) -> None:
    admin(schema, "INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(
        StoreError, match=rf"version {SCHEMA_VERSION + 1}, newer than the version {SCHEMA_VERSION}"
    ):
        async with open_postgres_store(DSN, schema=schema, pool_size=1):
            pass


async def test_a_version_7_schema_gains_forks_that_share_its_rows() -> None:
    """Schema v8: a v7 schema opens with the ``forks`` table and ``fork_ranges``; its
    sessions fork, and the fork's turns stay the source's rows until it is rewritten."""
    turns = [msgspec.json.encode(turn(i)).decode() for i in range(3)]
    with schema_at(7) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata, turn_count,"
            " user_turn_count) VALUES ('a', 1, 2, 'idle', '{}', 3, 3)"
        )
        for i, body in enumerate(turns):
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', %s, %s,"
                " 'user', %s)",
                (i, f"t{i}", body),
            )
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            await store.fork_session("a", "b", at="t1", created_at=5_000)
            assert conn.execute("SELECT * FROM forks").fetchall() == [("b", "a", 2)]
            assert conn.execute("SELECT count(*) FROM turns").fetchone() == (3,)
            await store.save(session("a", turns=(turn(9),)))
            fork = await store.load("b")
            assert fork is not None and [t.id for t in fork.turns] == ["t0", "t1"]
            assert conn.execute("SELECT * FROM forks").fetchall() == []


@pytest.mark.parametrize("bad", ["", "Upper", "a-b", "1abc", 'x"; DROP', "a" * 64])
async def test_bad_schema_name(bad: str) -> None:
    with pytest.raises(InvalidNameError, match="schema name"):
        async with open_postgres_store(DSN, schema=bad):
            pass


async def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot connect"):
        async with open_postgres_store(
            "host=127.0.0.1 port=1 user=postgres dbname=test", schema="x", connect_timeout=1
        ):
            pass


# -- appends and turns -------------------------------------------------------------------------


async def test_retried_append_adds_nothing(schema: str, store: PostgresStore) -> None:
    await store.save(session("s"))
    await store.append_turns("s", [turn(1), turn(2, "assistant")])
    with pytest.raises(ValidationError, match="t3"):
        await store.append_turns("s", [turn(2, "assistant"), turn(3), turn(3)])
    await store.append_turns("s", [turn(2, "assistant"), turn(3)])
    assert [t.id for t in await store.get_turns("s")] == ["t1", "t2", "t3"]
    assert admin(schema, "SELECT seq FROM turns ORDER BY seq") == [(0,), (1,), (2,)]
    meta = await store.get_meta("s")
    assert meta is not None
    assert (meta.turn_count, meta.user_message_count) == (3, 2)


async def test_nul_and_unicode_text_roundtrip(store: PostgresStore) -> None:
    odd = 'nul \x00 tab \t quote " backslash \\ 日本語 🎉 \u2028'
    await store.save(session("s", metadata={"k\x00": odd}))
    await store.append_turns("s", [turn(1, text=odd)])
    loaded = await store.load("s")
    assert loaded is not None
    assert loaded.metadata == {"k\x00": odd}
    first = loaded.turns[0].content[0]
    assert isinstance(first, TextBlock)
    assert first.text == odd


async def test_save_refuses_duplicate_turn_ids(store: PostgresStore) -> None:
    with pytest.raises(
        ValidationError, match=r"turn id 't1' appears more than once.*\$\.turns\[1\]\.id"
    ):
        await store.save(session("s", turns=(turn(1), turn(1))))
    assert await store.load("s") is None


async def test_save_keeps_the_stored_turns_it_repeats(
    no_indexer: None, schema: str, store: PostgresStore
) -> None:
    """A save rewrites turns only from the first one that differs (by id, role or text).
    (Row versions tell: the background indexer, which writes words into the rows, is off.)"""

    def rows() -> list[tuple[Any, ...]]:
        return admin(schema, "SELECT seq, id, xmin::text FROM turns ORDER BY seq")

    turns = tuple(turn(i, "user" if i % 2 else "assistant") for i in range(6))
    await store.save(session("s", turns=turns))
    first = rows()
    await store.save(session("s", turns=turns, metadata={"title": "header only"}))
    assert rows() == first
    await store.save(session("s", turns=(*turns, turn(6))))
    assert rows()[:6] == first
    changed = (*turns[:3], turn(3, text="edited"), *turns[4:])
    await store.save(session("s", turns=changed))
    assert rows()[:3] == first[:3]
    assert [r[2] for r in rows()[3:]] != [r[2] for r in first[3:]]
    loaded = await store.load("s")
    assert loaded is not None
    assert loaded.turns == changed
    for kept in (turns[:2], turns[3:], ()):
        await store.save(session("s", turns=kept))
        loaded = await store.load("s")
        assert loaded is not None
        assert loaded.turns == kept
        meta = await store.get_meta("s")
        assert meta is not None
        users = sum(1 for t in kept if t.role == "user")
        assert (meta.turn_count, meta.user_message_count) == (len(kept), users)
        assert admin(schema, "SELECT count(*), coalesce(max(seq) + 1, 0) FROM turns") == [
            (len(kept), len(kept))
        ]


async def test_append_with_run_is_one_write(store: PostgresStore) -> None:
    await store.save(session("s"))
    run = SessionRun(id="r1", prompt="p", started_at=5, status="running")
    with pytest.raises(InvalidNameError):
        await store.append_turns(
            "s", [turn(1)], AppendTurnsOptions(run=msgspec.structs.replace(run, id="bad/id"))
        )
    assert await store.get_turns("s") == []
    await store.append_turns("s", [turn(1)], AppendTurnsOptions(run=run))
    loaded = await store.load("s")
    assert loaded is not None
    assert [r.id for r in loaded.runs] == ["r1"]


async def test_concurrent_appends_in_one_process(store: PostgresStore) -> None:
    await store.save(session("s"))

    async def writer(w: int) -> None:
        for i in range(10):
            t = SessionTurn(id=f"w{w}-{i}", role="user", content=(), created_at=i)
            await store.append_turns("s", [t])

    async with trio.open_nursery() as nursery:
        for w in range(5):
            nursery.start_soon(writer, w)
    ids = [t.id for t in await store.get_turns("s")]
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(5) for i in range(10))
    for w in range(5):
        assert [x for x in ids if x.startswith(f"w{w}-")] == [f"w{w}-{i}" for i in range(10)]


# -- run epoch ---------------------------------------------------------------------------------


async def test_run_epoch_bumps_on_each_claim_only(store: PostgresStore) -> None:
    assert await store.run_epoch("s") is None
    await store.save(session("s"))
    assert await store.run_epoch("s") == 0
    me = RunOwner(host_id=host_id(), pid=1, token="x")
    assert (await store.claim_run("s", stale_at=0, owner=me)).claimed
    assert await store.run_epoch("s") == 1
    assert not (await store.claim_run("s", stale_at=0)).claimed
    assert await store.run_epoch("s") == 1
    await store.update_status("s", "idle")
    assert (await store.claim_run("s", stale_at=0)).claimed
    assert await store.run_epoch("s") == 2


# -- group commit ------------------------------------------------------------------------------


async def test_apply_writes_failing_write_is_rolled_back_alone(store: PostgresStore) -> None:
    results = await store.apply_writes(
        [
            StoreWrite("save", (session("a"),)),
            StoreWrite("append_turns", ("a", [turn(1)])),
            StoreWrite("append_turns", ("missing", [turn(1)])),
            StoreWrite("save", (session("b", turns=(turn(1), turn(1))),)),
            StoreWrite("load", ("a",)),
            StoreWrite("append_turns", ("a", [turn(2)])),
            StoreWrite("patch_meta", ("a", {"title": "A"})),
        ]
    )
    assert isinstance(results[0], outcome.Value)
    assert isinstance(results[1], outcome.Value)
    assert isinstance(results[2], outcome.Error)
    assert isinstance(results[2].error, SessionNotFoundError)
    assert isinstance(results[3], outcome.Error)
    assert isinstance(results[3].error, ValidationError)
    assert isinstance(results[4], outcome.Error)
    assert isinstance(results[4].error, UnsupportedOperationError)
    assert isinstance(results[5], outcome.Value)
    assert isinstance(results[6], outcome.Value)
    loaded = await store.load("a")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t1", "t2"]
    assert loaded.metadata == {"title": "A"}
    assert await store.load("b") is None
    assert await store.list() == ["a"]


async def test_apply_writes_on_closed_store_fails_every_write(schema: str) -> None:
    async with open_postgres_store(DSN, schema=schema, pool_size=1) as opened:
        pass
    results = await opened.apply_writes([StoreWrite("delete", ("a",))] * 2)
    assert [type(r.error) for r in results if isinstance(r, outcome.Error)] == [
        StoreClosedError,
        StoreClosedError,
    ]


# -- connection loss ---------------------------------------------------------------------------


def kill_store_connections(schema: str) -> int:
    """Terminate every server session of the store (named after its schema)."""
    rows = admin(
        schema,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND application_name = %s",
        (f"zidane_actors:{schema}",),
    )
    return len(rows)


async def test_idempotent_operations_survive_connection_loss(
    schema: str, store: PostgresStore
) -> None:
    await store.save(session("s"))
    assert kill_store_connections(schema) >= 2
    await store.append_turns("s", [turn(1)])
    assert [t.id for t in await store.get_turns("s")] == ["t1"]
    stats = store.statistics()
    assert stats.reconnects >= 1
    assert stats.retries >= 1


async def test_non_idempotent_write_is_retried_only_when_nothing_was_sent(
    schema: str, store: PostgresStore
) -> None:
    await store.save(session("s"))
    kill_store_connections(schema)
    # The dead connection fails at BEGIN, before the claim ran: retrying is safe.
    assert (await store.claim_run("s", stale_at=0)).claimed
    assert await store.run_epoch("s") == 1


async def test_server_gone_is_unavailable_after_bounded_retries(
    no_indexer: None, schema: str
) -> None:
    # Counts one call's retries: the background indexer's own are left out.
    async with open_postgres_store(DSN, schema=schema, pool_size=1, retries=2) as opened:
        await opened.save(session("s"))
        opened._writer.dsn = "host=127.0.0.1 port=1 user=postgres dbname=test connect_timeout=1"
        kill_store_connections(schema)
        with pytest.raises(StoreUnavailableError, match="after 3 attempts"):
            await opened.update_status("s", "idle")
        assert opened.statistics().retries == 2


# -- bad rows ----------------------------------------------------------------------------------


async def test_corrupt_turn_row_names_table_and_keys(schema: str, store: PostgresStore) -> None:
    await store.save(session("s", turns=(turn(1), turn(2))))
    admin(schema, "UPDATE turns SET body = '{\"id\": 3}' WHERE seq = 1")
    with pytest.raises(CorruptDataError, match=r"turns row \(session_id='s', seq=1\)"):
        await store.load("s")
    with pytest.raises(CorruptDataError, match=r"turns row \(session_id='s', seq=1\)"):
        await store.get_turns("s")


async def test_corrupt_header_names_column(schema: str, store: PostgresStore) -> None:
    await store.save(session("s"))
    admin(schema, "UPDATE sessions SET metadata = 'not json'")
    with pytest.raises(CorruptDataError, match=r"sessions row id='s' metadata"):
        await store.get_meta("s")
    with pytest.raises(CorruptDataError, match=r"sessions row id='s' metadata"):
        await store.patch_meta("s", {"a": 1})


async def test_one_unreadable_header_is_listed_as_corrupt_not_a_failed_listing(
    schema: str, store: PostgresStore
) -> None:
    for sid in ("good", "bad-meta", "bad-turn"):
        await store.save(session(sid, turns=(turn(1),)))
    admin(schema, "UPDATE sessions SET metadata = '[1, 2]' WHERE id = 'bad-meta'")
    admin(schema, "UPDATE turns SET body = '{\"id\": 3}' WHERE session_id = 'bad-turn'")
    rows = {row.id: row for row in await store.list_meta()}
    assert set(rows) == {"good", "bad-meta", "bad-turn"}
    assert rows["good"].corrupt is None
    for sid in ("bad-meta", "bad-turn"):
        assert rows[sid].corrupt is not None and sid in rows[sid].corrupt, rows[sid]


async def test_corrupt_schedule_names_table(schema: str, store: PostgresStore) -> None:
    await store.save_schedule(
        Schedule(id="sch", prompt="p", enabled=True, created_at=1, updated_at=1, interval_ms=5)
    )
    admin(schema, "UPDATE schedules SET body = '[]'")
    with pytest.raises(CorruptDataError, match=r"schedules row id='sch'"):
        await store.list_schedules()


# -- history edits -----------------------------------------------------------------------------


async def test_mutate_history_renumbers_and_keeps_counts(schema: str, store: PostgresStore) -> None:
    await store.save(session("s", turns=(turn(1), turn(2, "assistant"), turn(3))))

    def drop_first(history: SessionHistory) -> SessionHistory:
        return SessionHistory(turns=history.turns[1:], runs=history.runs)

    assert await store.mutate_history("s", drop_first) == "ok"
    assert admin(schema, "SELECT seq, id FROM turns ORDER BY seq") == [(0, "t2"), (1, "t3")]
    await store.append_turns("s", [turn(4)])
    meta = await store.get_meta("s")
    assert meta is not None
    assert (meta.turn_count, meta.user_message_count) == (3, 2)
    assert meta.first_user_turn is not None
    assert meta.first_user_turn.id == "t3"


async def test_batches_racing_on_the_same_turn_ids_keep_one_copy(schema: str) -> None:
    """Two hosts' pipelined batches append the same turns: the loser of the unique check
    reruns with savepoints, and every turn is stored once, in order."""
    async with (
        open_postgres_store(DSN, schema=schema, pool_size=1) as one,
        open_postgres_store(DSN, schema=schema, pool_size=1) as two,
    ):
        await one.save(session("s"))

        async def host(store: PostgresStore) -> None:
            for i in range(0, 40, 2):
                writes = [StoreWrite("append_turns", ("s", [turn(i), turn(i + 1)]))]
                results = await store.apply_writes(writes)
                assert all(isinstance(r, outcome.Value) for r in results), results

        async with trio.open_nursery() as nursery:
            nursery.start_soon(host, one)
            nursery.start_soon(host, two)
        assert [t.id for t in await one.get_turns("s")] == [f"t{i}" for i in range(40)]
        assert admin(schema, "SELECT max(seq), count(*) FROM turns") == [(39, 40)]


async def test_batch_with_failure_reruns_with_savepoints(store: PostgresStore) -> None:
    await store.save(session("a"))
    ok = await store.apply_writes([StoreWrite("append_turns", ("a", [turn(1)]))])
    assert isinstance(ok[0], outcome.Value)
    assert store.statistics().batch_fallbacks == 0
    mixed = await store.apply_writes(
        [
            StoreWrite("append_turns", ("a", [turn(2)])),
            StoreWrite("append_turns", ("a", [turn(1, text="other")])),
            StoreWrite("append_turns", ("a", [turn(3)])),
        ]
    )
    assert [type(r) for r in mixed] == [outcome.Value, outcome.Error, outcome.Value]
    assert isinstance(mixed[1].error, ConflictError)
    assert store.statistics().batch_fallbacks == 1
    assert [t.id for t in await store.get_turns("a")] == ["t1", "t2", "t3"]


def appends(*writes: tuple[str, list[SessionTurn]]) -> list[StoreWrite]:
    return [StoreWrite("append_turns", (sid, turns)) for sid, turns in writes]


async def test_batched_appends_keep_each_sessions_order(store: PostgresStore) -> None:
    """Many sessions, each appearing several times in one batch: one statement, in order."""
    sids = [f"s{i}" for i in range(300)]
    await store.apply_writes([StoreWrite("save", (session(sid),)) for sid in sids])
    batch = appends(
        *[(sid, [turn(3 * k), turn(3 * k + 1, "assistant")]) for k in range(2) for sid in sids],
        *[(sid, [turn(7)]) for sid in sids[::2]],
    )
    results = await store.apply_writes(batch)
    assert all(isinstance(r, outcome.Value) for r in results)
    assert store.statistics().batch_fallbacks == 0
    for sid in (sids[0], sids[1], sids[-1]):
        expected = ["t0", "t1", "t3", "t4"] + (["t7"] if int(sid[1:]) % 2 == 0 else [])
        assert [t.id for t in await store.get_turns(sid)] == expected
        meta = await store.get_meta(sid)
        assert meta is not None
        assert (meta.turn_count, meta.user_message_count) == (len(expected), len(expected) - 2)
    assert admin(
        store.statistics().schema,
        "SELECT count(*) FROM (SELECT session_id FROM turns GROUP BY session_id"
        " HAVING max(seq) + 1 <> count(*)) gaps",
    ) == [(0,)]


async def test_batched_appends_skip_retries_and_fail_unknown_sessions_alone(
    store: PostgresStore,
) -> None:
    await store.save(session("a", turns=(turn(1),)))
    await store.save(session("b"))
    rev = (await store.get_meta("b")).rev  # type: ignore[union-attr]
    results = await store.apply_writes(
        appends(
            ("a", [turn(1), turn(2)]),  # a retry of t1 with a fresh t2
            ("ghost", [turn(1)]),
            ("a", [turn(2)]),  # t2 again within the batch: a second run, a no-op
            ("b", [turn(1)]),
            ("ghost", []),
            ("b", []),
        )
    )
    assert [type(getattr(r, "error", None)) for r in results] == [
        type(None),
        SessionNotFoundError,
        type(None),
        type(None),
        SessionNotFoundError,
        type(None),
    ]
    assert store.statistics().batch_fallbacks == 0
    assert [t.id for t in await store.get_turns("a")] == ["t1", "t2"]
    assert await store.get_turns("b") == [turn(1)]
    assert await store.load("ghost") is None
    meta = await store.get_meta("b")
    assert meta is not None
    assert meta.rev is not None and rev is not None and meta.rev > rev
    again = await store.apply_writes(appends(("a", [turn(1)]), ("b", [turn(1)])))
    assert all(isinstance(r, outcome.Value) for r in again)
    assert (await store.get_meta("b")).rev == meta.rev  # type: ignore[union-attr]
    assert store.statistics().batch_fallbacks == 0


async def test_batched_append_conflict_fails_alone(store: PostgresStore) -> None:
    await store.save(session("a", turns=(turn(1),)))
    await store.save(session("b"))
    results = await store.apply_writes(
        appends(
            ("b", [turn(5)]),
            ("a", [turn(2)]),
            ("a", [turn(3), turn(1, text="other")]),  # conflicts: none of it is written
            ("ghost", [turn(1)]),
            ("a", [turn(4)]),
            ("b", [turn(5, text="other")]),  # conflicts with the batch's own t5
        )
    )
    assert [type(getattr(r, "error", None)) for r in results] == [
        type(None),
        type(None),
        ConflictError,
        SessionNotFoundError,
        type(None),
        ConflictError,
    ]
    assert store.statistics().batch_fallbacks == 1
    assert [t.id for t in await store.get_turns("a")] == ["t1", "t2", "t4"]
    assert await store.get_turns("b") == [turn(5)]


async def test_batched_retry_of_a_turn_stored_in_other_key_order(store: PostgresStore) -> None:
    """Stored text differing from the retry's (object key order) is the same turn: the
    savepoint rerun compares the documents and skips it."""
    stored = msgspec.structs.replace(turn(1), metadata={"a": 1, "b": 2})
    await store.save(session("a", turns=(stored,)))
    schema = store.statistics().schema
    [(body,)] = admin(schema, "SELECT body FROM turns WHERE id = 't1'")
    document = msgspec.json.decode(body)
    document["metadata"] = {"b": 2, "a": 1}
    admin(
        schema,
        "UPDATE turns SET body = %s WHERE id = 't1'",
        (msgspec.json.encode(document).decode(),),
    )
    retry = msgspec.structs.replace(turn(1), metadata={"a": 1, "b": 2})
    results = await store.apply_writes(appends(("a", [retry, turn(2)])))
    assert all(isinstance(r, outcome.Value) for r in results)
    assert store.statistics().batch_fallbacks == 1
    assert [t.id for t in await store.get_turns("a")] == ["t1", "t2"]


async def test_calls_waiting_for_a_connection_fail_once_closed(schema: str) -> None:
    async with open_postgres_store(DSN, schema=schema, pool_size=1) as opened:
        await opened.save(session("s"))
        errors: list[BaseException] = []

        async def reader() -> None:
            try:
                await opened.load("s")
            except StoreClosedError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(reader)
            # Every reader is in: one holds the only connection, the others wait for it.
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(opened.aclose)
    assert errors, "no call was refused"
    assert opened.statistics().reconnects == 0
    assert admin(
        schema,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        (f"zidane_actors:{schema}",),
    ) == [(0,)]


_SIDS = st.sampled_from(["s0", "s1", "s2"])


@st.composite
def batches(draw: st.DrawFn) -> list[StoreWrite]:
    """A batch of writes to three sessions, some failing (unknown session, bad id, bad method,
    turn id conflicts)."""
    writes: list[StoreWrite] = []
    next_turn = iter(range(10_000))
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["save", "append", "patch", "status", "run", "delete", "bad"]))
        sid = draw(_SIDS)
        if kind == "save":
            turns = tuple(turn(next(next_turn)) for _ in range(draw(st.integers(0, 2))))
            writes.append(StoreWrite("save", (session(sid, turns=turns),)))
        elif kind == "append":
            # Fresh ids, and ids from a small pool: retries, conflicts, repeats in one write.
            turns = tuple(
                turn(
                    draw(st.one_of(st.integers(0, 3), st.just(next(next_turn) + 100))),
                    draw(st.sampled_from(["user", "assistant"])),
                    draw(st.sampled_from([None, "other"])),
                )
                for _ in range(draw(st.integers(0, 3)))
            )
            writes.append(StoreWrite("append_turns", (sid, turns)))
        elif kind == "patch":
            key = draw(st.sampled_from(["title", "model"]))
            value = draw(st.one_of(st.just(msgspec.UNSET), st.integers(0, 3)))
            writes.append(StoreWrite("patch_meta", (sid, {key: value})))
        elif kind == "status":
            status = draw(st.sampled_from(["idle", "running", "completed", "error"]))
            writes.append(StoreWrite("update_status", (sid, status)))
        elif kind == "run":
            run_id = draw(st.sampled_from(["r0", "r1"]))
            writes.append(StoreWrite("update_run", (sid, SessionRun(run_id, "p", 1, "completed"))))
        elif kind == "delete":
            writes.append(StoreWrite("delete", (sid,)))
        else:
            writes.append(
                draw(
                    st.sampled_from(
                        [
                            StoreWrite("append_turns", ("../x", [turn(9_999)])),
                            StoreWrite("load", (sid,)),
                            StoreWrite("update_status", (sid, "bogus")),
                        ]
                    )
                )
            )
    return writes


def comparable(data: SessionData | None) -> SessionData | None:
    """``data`` without the store clock (``updatedAt`` differs between two stores)."""
    return None if data is None else msgspec.structs.replace(data, updated_at=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
async def test_apply_writes_matches_the_memory_store(batch: list[StoreWrite]) -> None:
    await trio.to_thread.run_sync(empty_schema, CONTRACT_SCHEMA)
    async with (
        open_postgres_store(FAST_DSN, schema=CONTRACT_SCHEMA, pool_size=1) as pg,
        open_memory_store() as memory,
    ):
        expected = await memory.apply_writes(batch)
        got = await pg.apply_writes(batch)
        assert [type(getattr(r, "error", None)) for r in got] == [
            type(getattr(r, "error", None)) for r in expected
        ]
        for sid in ("s0", "s1", "s2"):
            assert comparable(await pg.load(sid)) == comparable(await memory.load(sid))
        # Each store stamps updatedAt with its own clock, so two sessions may tie in one
        # store and not in the other: same ids, each in its own (updatedAt desc, id) order.
        listed = await pg.list()
        assert sorted(listed) == sorted(await memory.list())
        stamps = []
        for sid in listed:
            loaded = await pg.load(sid)
            assert loaded is not None
            stamps.append((-loaded.updated_at, sid))
        assert stamps == sorted(stamps)


async def test_the_background_indexer_fills_the_words_of_single_appends(
    schema: str, store: PostgresStore
) -> None:
    """An append made as one statement (the lone writer's path) counts as a write for the
    background indexer too: the queue drains without a search."""
    await store.save(session("a"))
    for i in range(3):
        await store.append_turns("a", [turn(i, text=f"word{i}")])
    queued = "SELECT count(*) FROM words_pending"
    for _ in range(600):  # the indexer looks again 0.2 s after an idle step: at most 30 s
        if await trio.to_thread.run_sync(admin, schema, queued) == [(0,)]:
            break
        await trio.sleep(0.05)
    else:
        raise AssertionError("the background indexer left the queue as it was")
    assert (await store.search_meta(SessionSearch(text="word2"))).rows[0].id == "a"


async def test_one_connection_serves_batches_and_lone_statements_one_at_a_time(
    schema: str,
) -> None:
    """With ``pool_size=1`` the batch connection is the pooled one too: a batch (in a
    worker thread) and a lone statement (in the trio thread) called on the store directly,
    at once, take turns on it; every write lands and every answer is right."""
    async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
        ids = [f"s{i}" for i in range(6)]
        for sid in ids:
            await store.save(session(sid))
        revs: dict[str, list[int]] = {sid: [] for sid in ids}

        async def batches(sid: str) -> None:
            for n in range(10):
                answers = await store.apply_writes(
                    [
                        StoreWrite("append_turns", (sid, [turn(2 * n)])),
                        StoreWrite("append_turns", (sid, [turn(2 * n + 1)])),
                    ]
                )
                assert all(type(a) is outcome.Value for a in answers), answers

        async def lone(sid: str) -> None:
            for n in range(20):
                await store.append_turns(sid, [turn(100 + n)])
                rev = await store.get_rev(sid)
                assert rev is not None
                revs[sid].append(rev)

        async with trio.open_nursery() as nursery:
            for sid in ids[:3]:
                nursery.start_soon(batches, sid)
            for sid in ids[3:]:
                nursery.start_soon(lone, sid)
        for sid in ids[:3]:
            assert [t.id for t in (await store.load(sid)).turns] == [f"t{n}" for n in range(20)]
        for sid in ids[3:]:
            loaded = await store.load(sid)
            assert [t.id for t in loaded.turns] == [f"t{100 + n}" for n in range(20)]
            assert all(a < b for a, b in zip(revs[sid], revs[sid][1:], strict=False))
