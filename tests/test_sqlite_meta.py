"""The SQLite store's per-session aggregates (schema v4, v5): kept by triggers, equal to recomputed.

``list_meta`` / ``get_meta`` read turn, user-turn, run and artifact counts and
the first user turn's ``seq`` from the session row. These tests check that
every write path keeps them equal to what the child tables hold, that the
rows answered stay exactly what the per-session subqueries of schema v3
answered, and that a v3 file is migrated with its aggregates computed.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

import msgspec
import outcome
import pytest
import trio
from _sqlite import assert_current, old_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from store_contract import make_turn

from zidane_actors.errors import ConflictError, SessionNotFoundError
from zidane_actors.model import (
    AppendTurnsOptions,
    SessionArtifact,
    SessionData,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionSearch,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    decode,
    encode,
    index_words,
    turn_search_text,
)
from zidane_actors.stores import MemoryStore, SQLiteStore, StoreWrite, open_sqlite_store
from zidane_actors.stores.sqlite._rows import _turn_json
from zidane_actors.stores.sqlite._schema import (
    SCHEMA_VERSION,
    index_pending,
)

# What list_meta answered before schema v4, from the child tables on every call.
_RECOMPUTED_ROWS = (
    "SELECT s.id, s.agent_id, s.project_root, s.status, s.metadata, s.created_at,"
    " s.updated_at, s.run_owner, s.rev,"
    " (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id),"
    " (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id AND t.role = 'user'),"
    " (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id),"
    " (SELECT COUNT(*) FROM artifacts a WHERE a.session_id = s.id),"
    " t.id, t.role, t.body FROM sessions s LEFT JOIN turns t ON t.rowid = CASE"
    " WHEN json_type(s.metadata, '$.title') IS NULL THEN"
    "  (SELECT u.rowid FROM turns u WHERE u.session_id = s.id AND u.role = 'user'"
    "   ORDER BY u.seq LIMIT 1) END"
    " ORDER BY s.updated_at DESC, s.id"
)
_STORED = (
    "SELECT id, turn_count, user_turn_count, run_count, artifact_count, first_user_seq"
    " FROM sessions ORDER BY id"
)
_RECOMPUTED = (
    "SELECT s.id, (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id),"
    " (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id AND t.role = 'user'),"
    " (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id),"
    " (SELECT COUNT(*) FROM artifacts a WHERE a.session_id = s.id),"
    " (SELECT MIN(t.seq) FROM turns t WHERE t.session_id = s.id AND t.role = 'user')"
    " FROM sessions s ORDER BY s.id"
)


def run(rid: str, status: str = "running") -> SessionRun:
    return SessionRun(id=rid, prompt="go", started_at=5, status=status)  # type: ignore[arg-type]


def artifact(sid: str, n: int) -> SessionArtifact:
    return SessionArtifact(
        id=f"a{n}",
        session_id=sid,
        kind="file",
        uri=f"file:///{n}",
        label=f"file {n}",
        created_at=1,
        updated_at=1,
    )


def session(sid: str, **kw: Any) -> SessionData:
    return SessionData(id=sid, created_at=1, updated_at=2, **kw)


def check_aggregates(db: Path) -> list[SessionMetaRow]:
    """Assert the stored aggregates equal recomputed ones; the rows v3 would have answered."""
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute(_STORED).fetchall() == conn.execute(_RECOMPUTED).fetchall()
        return [SQLiteStore._meta_row(r) for r in conn.execute(_RECOMPUTED_ROWS)]


def roles(bits: int, n: int) -> list[str]:
    return ["user" if bits >> i & 1 else "assistant" for i in range(n)]


_SID = st.sampled_from("ab")
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), _SID, st.integers(0, 3), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("retry"), _SID, st.just(0), st.just(0), st.just(False)),
        st.tuples(st.just("conflict"), _SID, st.just(0), st.just(0), st.just(False)),
        st.tuples(st.just("batch"), _SID, st.integers(1, 3), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("save"), _SID, st.integers(0, 3), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("save_meta"), _SID, st.integers(0, 2), st.just(0), st.booleans()),
        st.tuples(st.just("title"), _SID, st.just(0), st.just(0), st.booleans()),
        st.tuples(st.just("mutate"), _SID, st.integers(0, 4), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("truncate"), _SID, st.integers(0, 3), st.just(0), st.just(False)),
        st.tuples(st.just("run"), _SID, st.integers(0, 2), st.just(0), st.just(False)),
        st.tuples(st.just("artifact"), _SID, st.integers(0, 2), st.just(0), st.booleans()),
        st.tuples(st.just("delete"), _SID, st.just(0), st.just(0), st.just(False)),
    ),
    max_size=30,
)


def _error_type(result: outcome.Outcome[Any]) -> type[BaseException] | None:
    return type(result.error) if isinstance(result, outcome.Error) else None


def _mutation(kind: int, k: int) -> Any:
    """An edit of a history: drop turn k, flip its role, reverse, replace or drop the runs."""

    def edit(h: SessionHistory) -> SessionHistory | None:
        turns, runs = list(h.turns), list(h.runs)
        if kind in (0, 1) and k >= len(turns):
            return None
        if kind == 0:
            del turns[k]
        elif kind == 1:
            flipped = "assistant" if turns[k].role == "user" else "user"
            turns[k] = msgspec.structs.replace(turns[k], role=flipped)  # type: ignore[arg-type]
        elif kind == 2:
            turns.reverse()
        elif kind == 3:
            runs = [run("m0"), run("m1", "completed")]
        else:
            runs = runs[1:]
        return SessionHistory(turns=tuple(turns), runs=tuple(runs))

    return edit


@pytest.mark.filterwarnings("ignore:mutate_turns is deprecated:DeprecationWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
async def test_aggregates_equal_recomputed_after_any_program(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, int, int, bool]]
) -> None:
    """After every write, the kept counts and first user ``seq`` equal recomputed ones, the rows
    ``list_meta`` answers equal those of the v3 subqueries, and match the memory store's."""
    db = tmp_path_factory.mktemp("meta") / "s.db"
    memory = MemoryStore()
    last: dict[str, list[SessionTurn]] = {"a": [], "b": []}
    counter = 0

    async def apply(
        store: Any, op: tuple[str, str, int, int, bool]
    ) -> list[type[BaseException] | None]:
        """One write on ``store``; the error types it answered (``None`` for success)."""
        kind, sid, n, bits, flag = op
        fresh = [make_turn(counter + i, r) for i, r in enumerate(roles(bits, n))]
        calls: list[Any] = []
        if kind == "append":
            options = AppendTurnsOptions(run=run(f"r{counter}")) if flag else None
            calls.append(lambda: store.append_turns(sid, fresh, options))
        elif kind == "retry":
            calls.append(lambda: store.append_turns(sid, last[sid]))
        elif kind == "conflict":
            clash = msgspec.structs.replace(make_turn(-1), role="system")  # a's first turn
            calls.append(lambda: store.append_turns(sid, [make_turn(counter + 1), clash]))
        elif kind == "batch":
            # Group commit: one append per turn, alternating sessions, "ghost" when flagged.
            other = "b" if sid == "a" else "a"
            writes = [
                StoreWrite("append_turns", ((sid, other)[i % 2], [t])) for i, t in enumerate(fresh)
            ]
            if flag:
                writes.insert(1, StoreWrite("append_turns", ("ghost", [make_turn(counter + 9)])))
            return [_error_type(r) for r in await store.apply_writes(writes)]
        elif kind == "save":
            runs = (run(f"r{counter}"),) if flag else ()
            metadata = {"title": "x"} if flag else {}
            data = session(sid, turns=tuple(fresh), runs=runs, metadata=metadata)
            calls.append(lambda: store.save(data))
        elif kind == "save_meta":
            runs = tuple(run(f"r{i}") for i in range(n))
            metadata = {"title": "y"} if flag else {"k": 1}
            calls.append(lambda: store.save_meta(session(sid, runs=runs, metadata=metadata)))
        elif kind == "title":
            calls.append(lambda: store.patch_meta(sid, {"title": "z" if flag else UNSET}))
        elif kind == "mutate":
            calls.append(lambda: store.mutate_history(sid, _mutation(n, bits)))
        elif kind == "truncate":
            calls.append(lambda: store.mutate_turns(sid, lambda turns: turns[:n]))
        elif kind == "run":
            calls.append(lambda: store.update_run(sid, run(f"r{n}", "completed")))
        elif kind == "artifact":
            if flag:
                calls.append(lambda: store.delete_artifact(sid, f"a{n}"))
            else:
                calls.append(lambda: store.upsert_artifact(artifact(sid, n)))
        else:
            calls.append(lambda: store.delete(sid))
        return [_error_type(await outcome.acapture(call)) for call in calls]

    async with open_sqlite_store(db, durability="off") as store:
        for s in (memory, store):
            await s.save(session("a", turns=(make_turn(-1),)))
            await s.save(session("b"))
        for op in ops:
            want = await apply(memory, op)
            got = await apply(store, op)
            assert got == want, op
            assert set(got) <= {None, ConflictError, SessionNotFoundError}, got
            if op[0] == "append" and got == [None]:
                last[op[1]] = [make_turn(counter + i, r) for i, r in enumerate(roles(op[3], op[2]))]
            counter += 10
            recomputed = check_aggregates(db)
            rows = await store.list_meta()
            assert encode(rows) == encode(recomputed)
            assert [await store.get_meta(r.id) for r in rows] == rows
            mine = sorted(rows, key=lambda r: r.id)
            theirs_rows = sorted(await memory.list_meta(), key=lambda r: r.id)
            for row, theirs in zip(mine, theirs_rows, strict=True):
                assert (row.id, row.metadata, row.first_user_turn) == (
                    theirs.id,
                    theirs.metadata,
                    theirs.first_user_turn,
                )
                assert (row.turn_count, row.user_message_count, row.run_count) == (
                    theirs.turn_count,
                    theirs.user_message_count,
                    theirs.run_count,
                )
                assert row.artifact_count == theirs.artifact_count


async def test_v3_file_is_migrated_with_its_aggregates(tmp_path: Path) -> None:
    """A v3 file opens at v5 with every session's aggregates computed, silently (no data
    changes), answering the rows v3 answered; later writes keep them."""
    db = tmp_path / "v3.db"
    conn = old_file(
        db,
        3,
        "('a', 'idle', '{}', 1, 3), ('b', 'idle', '{\"title\":\"b\"}', 1, 2),"
        " ('c', 'idle', '{}', 1, 1), ('d', 'idle', '{}', 1, 4)",
    )
    turns = [("a", 0, make_turn(0, "assistant")), ("a", 1, make_turn(1)), ("a", 2, make_turn(2))]
    turns += [("b", 0, make_turn(0)), ("c", 0, make_turn(0, "assistant"))]
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
        [(sid, seq, t.id, t.role, encode(t)) for sid, seq, t in turns],
    )
    conn.executemany(
        "INSERT INTO runs (session_id, id, position, body) VALUES (?, ?, ?, ?)",
        [("a", "r0", 0, encode(run("r0"))), ("a", "r1", 1, encode(run("r1")))],
    )
    conn.execute(
        "INSERT INTO artifacts (session_id, id, kind, uri, body) VALUES (?, ?, ?, ?, ?)",
        ("b", "a0", "file", "file:///0", encode(artifact("b", 0))),
    )
    before = [SQLiteStore._meta_row(r) for r in conn.execute(_RECOMPUTED_ROWS)]
    conn.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with open_sqlite_store(db) as store:
            assert encode(await store.list_meta()) == encode(before)
            a = await store.get_meta("a")
            assert a is not None and (a.turn_count, a.user_message_count, a.run_count) == (3, 2, 2)
            assert a.first_user_turn == make_turn(1)
            await store.append_turns("c", [make_turn(1), make_turn(2)])
            await store.delete("b")
            c = await store.get_meta("c")
            assert c is not None and c.first_user_turn == make_turn(1) and c.user_message_count == 2
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 16
        assert conn.execute(_STORED).fetchall() == [
            ("a", 3, 2, 2, 0, 1),
            ("c", 3, 2, 0, 0, 1),
            ("d", 0, 0, 0, 0, None),
        ]
    check_aggregates(db)


async def test_v4_file_is_migrated_without_the_role_index(tmp_path: Path) -> None:
    """A v4 file opens at v5 without ``turns_by_role``, its aggregates untouched; deleting a
    first user turn then finds the next one past it, by any path."""
    db = tmp_path / "v4.db"
    conn = old_file(db, 4, "('a', 'idle', '{}', 1, 2), ('b', 'idle', '{}', 1, 1)")
    a = [
        make_turn(0, "assistant"),
        make_turn(1),
        make_turn(2, "assistant"),
        make_turn(3),
        make_turn(4),
    ]
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
        [("a", i, t.id, t.role, encode(t)) for i, t in enumerate(a)]
        + [("b", i, t.id, t.role, encode(t)) for i, t in enumerate(a[:2])],
    )
    stored = conn.execute(_STORED).fetchall()
    assert stored == [("a", 5, 3, 0, 0, 1), ("b", 2, 1, 0, 0, 1)]
    conn.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with open_sqlite_store(db) as store:
            assert await store.get_turns("a") == a
            drop_first_user = _mutation(0, 1)
            assert await store.mutate_history("a", drop_first_user) == "ok"
            meta = await store.get_meta("a")
            assert meta is not None and meta.first_user_turn == make_turn(3)
            assert meta.user_message_count == 2
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        assert_current(conn)
        assert conn.execute(_STORED).fetchall() == [("a", 4, 2, 0, 0, 2), ("b", 2, 1, 0, 0, 1)]
        conn.execute("DELETE FROM turns WHERE session_id = 'a' AND seq = 2")
        assert conn.execute(_STORED).fetchall()[0] == ("a", 3, 1, 0, 0, 3)
        conn.execute("DELETE FROM turns WHERE session_id = 'b' AND seq = 1")
        assert conn.execute(_STORED).fetchall()[1] == ("b", 1, 0, 0, 0, None)
    check_aggregates(db)


async def test_any_statement_on_child_rows_keeps_aggregates(tmp_path: Path) -> None:
    """The triggers hold for SQL no store method issues: re-keying and moving child rows."""
    db = tmp_path / "s.db"
    async with open_sqlite_store(db) as store:
        await store.save(
            session("a", turns=(make_turn(0, "assistant"), make_turn(1), make_turn(2)))
        )
        await store.save(session("b", turns=(make_turn(0),), runs=(run("r0"),)))
        await store.upsert_artifact(artifact("b", 0))
    statements = [
        "UPDATE turns SET role = 'assistant' WHERE session_id = 'a' AND seq = 1",
        "UPDATE turns SET seq = -1 - seq WHERE session_id = 'a'",
        "UPDATE turns SET role = 'user' WHERE session_id = 'a' AND seq = -1",
        "UPDATE turns SET session_id = 'a', seq = 10, id = 'moved' WHERE session_id = 'b'",
        "UPDATE runs SET session_id = 'a' WHERE session_id = 'b'",
        "UPDATE artifacts SET session_id = 'a' WHERE session_id = 'b'",
        "DELETE FROM turns WHERE session_id = 'a'"
        " AND seq = (SELECT first_user_seq FROM sessions WHERE id = 'a')",
        "DELETE FROM turns WHERE session_id = 'a' AND role = 'user'",
    ]
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        for statement in statements:
            conn.execute(statement)
            assert conn.execute(_STORED).fetchall() == conn.execute(_RECOMPUTED).fetchall()
        final = [("a", 1, 0, 1, 1, None), ("b", 0, 0, 0, 0, None)]
        assert conn.execute(_STORED).fetchall() == final


def _search_rows(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """The search index's documents once its queue is indexed (as a search does first):
    (rowid, session id, words), in rowid order. The index and the queue never overlap."""
    indexed = {r for (r,) in conn.execute("SELECT rowid FROM search")}
    queued = {r for (r,) in conn.execute("SELECT turn FROM search_pending")}
    assert not indexed & queued
    conn.execute("BEGIN")
    index_pending(conn)
    rows = conn.execute("SELECT rowid, session_id, words FROM search ORDER BY rowid").fetchall()
    conn.execute("ROLLBACK")
    return [row for row in rows if row[2]]  # a turn without words may be left unindexed


def _expected_search_rows(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """The documents the index must hold, recomputed from the rows with the model's rule."""

    def words(text: str) -> str:
        return " ".join(index_words([text]))

    rows: list[tuple[Any, ...]] = []
    for sid, metadata in conn.execute("SELECT id, metadata FROM sessions"):
        title = json.loads(metadata).get("title")
        text = sid + " " + (title if isinstance(title, str) else "")
        rows.append(
            (
                -conn.execute("SELECT rowid FROM sessions WHERE id = ?", (sid,)).fetchone()[0],
                sid,
                words(text),
            )
        )
    for rowid, sid, tid, role, body in conn.execute(
        "SELECT rowid, session_id, id, role, body FROM turns"
    ):
        rows.append(
            (rowid, sid, words(turn_search_text(decode(_turn_json(tid, role, body), SessionTurn))))
        )
    return sorted(row for row in rows if row[2])


async def test_v5_file_is_migrated_with_its_turns_searchable(tmp_path: Path) -> None:
    """A v5 file opens at the current version with every stored turn and title searchable;
    the index then stays equal to the rows through appends, rewrites, header edits and
    deletes, by any path (the store's methods or another program's SQL)."""
    db = tmp_path / "v5.db"
    conn = old_file(
        db, 5, "('a', 'idle', '{\"title\":\"Quarterly plan\"}', 1, 2), ('b', 'idle', '{}', 1, 1)"
    )
    tool = SessionTurn(
        id="c",
        role="assistant",
        created_at=1,
        content=(
            TextBlock("calling"),
            ToolCallBlock(id="c1", name="get_weather", input={"city": "Oslo"}),
        ),
    )
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
        [
            ("a", 0, "t0", "user", encode(make_turn(0))),
            ("b", 0, "c", "assistant", encode(tool)),
            ("b", 1, "bad", "assistant", b"not json"),
        ],
    )
    conn.close()
    async with open_sqlite_store(db) as store:

        async def hits(text: str) -> list[str]:
            return [r.id for r in (await store.search_meta(SessionSearch(text=text))).rows]

        assert await hits("quarterly") == ["a"]
        assert await hits("weather") == await hits("get_weather calling") == ["b"]
        assert await hits("oslo") == []  # tool inputs are not indexed
        assert await hits("turn 0") == ["a"]
        with closing(sqlite3.connect(db, isolation_level=None)) as raw:
            assert _search_rows(raw) == [
                (-2, "b", "b"),
                (-1, "a", "a plan quarterly"),
                (1, "a", " ".join(index_words([turn_search_text(make_turn(0))]))),
                (2, "b", "calling get weather"),
            ]
            raw.execute("DELETE FROM turns WHERE id = 'bad'")
        await store.append_turns("a", [make_turn(1), make_turn(2, "assistant")])
        await store.patch_meta("a", {"title": "Yearly plan"})
        assert await hits("quarterly") == [] and await hits("yearly") == ["a"]
        assert await store.mutate_history("a", _mutation(0, 1)) == "ok"
        await store.save(SessionData(id="b", created_at=1, updated_at=5, turns=(make_turn(7),)))
        assert await hits("weather") == []
        await store.delete("a")
        assert await hits("plan") == []
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 16
        assert _search_rows(conn) == _expected_search_rows(conn)
        conn.execute("INSERT INTO search (search) VALUES ('integrity-check')")
        conn.execute("UPDATE sessions SET id = 'b2' WHERE id = 'b'")  # another program's edits
        conn.execute(
            "UPDATE turns SET session_id = 'b2', body = ? WHERE session_id = 'b'", (encode(tool),)
        )
        assert _search_rows(conn) == _expected_search_rows(conn)


async def test_appends_queue_their_turns_and_a_search_indexes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append only queues its turns for the index; the next search for words indexes
    the queue in its own transaction and finds them, and the queue is empty after. (The
    background indexer, which drains the queue too, is off here.)"""
    monkeypatch.setattr(SQLiteStore, "_start_indexer", lambda self: trio.CancelScope())
    db = tmp_path / "queued.db"
    async with open_sqlite_store(db) as store:
        await store.save(SessionData(id="a", created_at=1, updated_at=1))
        turn = SessionTurn(
            id="q", role="user", created_at=1, content=(TextBlock("zebra crossing"),)
        )
        await store.append_turns("a", [turn])
        with closing(sqlite3.connect(db, isolation_level=None)) as raw:
            assert raw.execute("SELECT count(*) FROM search WHERE rowid > 0").fetchone() == (0,)
            queued = "SELECT count(*) FROM search_pending WHERE turn > 0"
            assert raw.execute(queued).fetchone() == (1,)
        page = await store.search_meta(SessionSearch(text="zebra"))
        assert [r.id for r in page.rows] == ["a"]
        with closing(sqlite3.connect(db, isolation_level=None)) as raw:
            assert raw.execute("SELECT count(*) FROM search_pending").fetchone() == (0,)
            assert _search_rows(raw) == _expected_search_rows(raw)
        # A rewrite takes the turn out of the index and queues it again; a delete drops both.
        rewritten = SessionData(
            id="a",
            created_at=1,
            updated_at=2,
            turns=(SessionTurn(id="q", role="user", created_at=1, content=(TextBlock("okapi"),)),),
        )
        await store.save(rewritten)
        assert (await store.search_meta(SessionSearch(text="zebra"))).rows == ()
        assert [r.id for r in (await store.search_meta(SessionSearch(text="okapi"))).rows] == ["a"]
        await store.append_turns("a", [make_turn(5)])
        await store.delete("a")
        with closing(sqlite3.connect(db, isolation_level=None)) as raw:
            assert raw.execute("SELECT count(*) FROM search_pending").fetchone() == (0,)
            assert raw.execute("SELECT count(*) FROM search").fetchone() == (0,)


async def test_the_background_indexer_drains_the_queue_without_a_search(tmp_path: Path) -> None:
    """Appended turns are indexed in the background: the queue empties with no search, and
    the index then equals the rows recomputed with the model's rule."""
    db = tmp_path / "background.db"
    async with open_sqlite_store(db) as store:
        await store.save(SessionData(id="a", created_at=1, updated_at=1))
        await store.append_turns("a", [make_turn(i) for i in range(300)])
        with closing(sqlite3.connect(db, isolation_level=None)) as raw:
            with trio.fail_after(60):
                for _ in iter(int, 1):  # until the queue is empty
                    if raw.execute("SELECT count(*) FROM search_pending").fetchone() == (0,):
                        break
                    await trio.sleep(0.05)
            assert _search_rows(raw) == _expected_search_rows(raw)
