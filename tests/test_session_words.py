"""The SQL stores answer a search from each session's words (``session_words``): a word
leaves a session's words when the last turn or title holding it goes, and a store written
by the previous schema derives them on open. The memory store is the reference."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio
from _pg import DSN, schema_at
from _sqlite import old_file
from test_search_rule import answers, session, stores, turn

from zidane_actors.model import NativeBlock, SessionSearch, SessionTurn, encode
from zidane_actors.stores import open_postgres_store, open_sqlite_store
from zidane_actors.stores.postgres import PostgresStore
from zidane_actors.stores.sqlite import _schema as sqlite_schema

WORDS = ["alpha", "beta", "gamma", "delta", "title", "tit", "b", "s"]


async def _same(memory: Any, other: Any) -> None:
    for text in WORDS:
        assert await answers(other, text) == await answers(memory, text), text


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
async def test_words_leave_a_session_with_the_turns_and_title_holding_them(kind: str) -> None:
    """Rewritten, dropped and deleted turns, a changed title and a deleted then re-created
    session answer as the memory store, each after the session's words were indexed."""
    first = [
        session("s1", turn(0, "alpha beta"), turn(1, "gamma"), title="title one"),
        session("s2", turn(0, "beta delta")),
    ]
    async with stores(kind, first) as pairs:
        ((memory, other),) = pairs
        await _same(memory, other)
        steps = [
            session("s1", turn(0, "alpha"), turn(1, "gamma"), title="title one"),  # rewritten
            session("s1", turn(0, "alpha"), title="title one"),  # dropped
            session("s1", turn(0, "alpha")),  # title gone
            session("s2", turn(0, "delta"), title="beta"),  # the word moves to the title
        ]
        for data in steps:
            await memory.save(data)
            await other.save(data)
            await _same(memory, other)
        for store in (memory, other):
            await store.delete("s2")
            await store.save(session("s2", turn(0, "gamma")))
        await _same(memory, other)


async def test_a_sqlite_file_of_version_10_derives_its_sessions_words(tmp_path: Path) -> None:
    """A v10 file's indexed turns and headers become its sessions' words on open."""
    db = tmp_path / "v10.db"
    with closing(old_file(db, 10, "('a', 'idle', '{\"title\":\"Okapi\"}', 1, 2)")) as conn:
        t = turn(0, "zebra crossing")
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', 0, ?, ?, ?)",
            (t.id, t.role, encode(t)),
        )
        conn.execute(  # indexed as v10 did: the header's and the turn's documents
            "INSERT INTO search (rowid, session_id, words)"
            " VALUES (-1, 'a', 'a okapi'), (1, 'a', 'crossing zebra')"
        )
        conn.execute("DELETE FROM search_pending")
    async with open_sqlite_store(db) as store:
        for text in ("zebra", "cross", "okapi", "a"):
            assert await answers(store, text) == ["a"], text
        assert await answers(store, "zebras") == []
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM search_stale").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM session_words").fetchone() == (4,)


async def test_a_postgres_schema_of_version_5_derives_its_sessions_words() -> None:
    """A v5 schema's filled words become its sessions' words on open."""
    with schema_at(5) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata)"
            " VALUES ('a', 1, 2, 'idle', '{\"title\":\"Okapi\"}')"
        )
        t = turn(0, "zebra crossing")
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', 0, %s, %s, %s)",
            (t.id, t.role, encode(t).decode()),
        )
        conn.execute("UPDATE turns SET words = array_to_tsvector(ARRAY['zebra', 'crossing'])")
        conn.execute("UPDATE sessions SET words = array_to_tsvector(ARRAY['a', 'okapi'])")
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            for text in ("zebra", "cross", "okapi", "a"):
                assert await answers(store, text) == ["a"], text
            assert (await store.search_meta(SessionSearch(text="zebras"))).total == 0


def _queued(conn: sqlite3.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT turn FROM search_pending WHERE turn > 0")]


async def test_a_sqlite_file_of_version_13_queues_only_turns_that_may_hold_words(
    tmp_path: Path,
) -> None:
    """From v14 a turn without a text or tool block (native data only) is not queued for
    the index, and the v13 queue rows of such turns go; searches answer as before."""
    db = tmp_path / "v13.db"
    native = SessionTurn(
        id="n", role="command", created_at=1, content=(NativeBlock("x", {"k": "zebra"}),)
    )
    escaped = b'{"content":[{"type":"t\\u0065xt","text":"okapi"}]}'  # another program's row
    with closing(old_file(db, 13, "('a', 'idle', '{}', 1, 2)")) as conn:
        text = encode(turn(2, "zebra crossing"))
        for seq, tid, body in [(0, native.id, encode(native)), (1, "e", escaped), (2, "t", text)]:
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', ?, ?, 'user', ?)",
                (seq, tid, body),
            )
        assert _queued(conn) == [1, 2, 3]
        sqlite_schema.migrate(conn, str(db))
        assert _queued(conn) == [2, 3]
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', 3, 'm', 'user', ?)",
            (encode(native),),
        )
        assert _queued(conn) == [2, 3]
        conn.execute("UPDATE turns SET body = ? WHERE id = 'n'", (encode(turn(0, "tapir")),))
        assert _queued(conn) == [1, 2, 3]
    async with open_sqlite_store(db) as store:
        for text in ("okapi", "zebra", "tapir"):
            assert await answers(store, text) == ["a"], text
        await store.append_turns("a", [turn(9, "lemur")])
        assert await answers(store, "lemur") == ["a"]


async def test_a_postgres_schema_of_version_9_queues_turns_written_with_their_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From v10 a turn that may hold words is queued for the indexer (a turn of native data
    only is not); a v9 schema's turns without words are still filled, and a deleted turn
    leaves the queue. (The background indexer, which drains the queue too, is off here.)"""
    monkeypatch.setattr(PostgresStore, "_start_indexer", lambda self: trio.CancelScope())
    with schema_at(9) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata, turn_count)"
            " VALUES ('a', 1, 2, 'idle', '{}', 1)"
        )
        t = turn(0, "zebra crossing")
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', 0, %s, %s, %s)",
            (t.id, t.role, encode(t).decode()),
        )
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            native = SessionTurn(
                id="n", role="command", created_at=1, content=(NativeBlock("x", {"k": "okapi"}),)
            )
            await store.append_turns("a", [turn(1, "lemur"), native, turn(3, "tapir")])
            queued = "SELECT seq FROM words_pending ORDER BY seq"
            assert [r[0] for r in conn.execute(queued)] == [1, 3]
            conn.execute("DELETE FROM turns WHERE seq = 3")
            assert [r[0] for r in conn.execute(queued)] == [1]
            for text in ("zebra", "lemur"):
                assert await answers(store, text) == ["a"], text
            for text in ("okapi", "tapir"):
                assert await answers(store, text) == [], text
            assert conn.execute("SELECT count(*) FROM words_pending").fetchone() == (0,)
