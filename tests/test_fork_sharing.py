"""Forks on the SQL stores share their source's rows: random programs of appends, forks
(of forks), whole saves, history edits and deletes answer as the memory store does
(loads, pages, header rows, search, forks listed), and a fork costs no copy of the rows."""

from __future__ import annotations

import random
from typing import Any

import outcome
import pytest
from msgspec.structs import replace
from test_search_rule import stores

from zidane_actors.errors import ConflictError
from zidane_actors.model import (
    SessionData,
    SessionHistory,
    SessionRun,
    SessionSearch,
    SessionTurn,
    TextBlock,
)
from zidane_actors.stores import StoreWrite, fork_session, list_forks

KINDS = ["sqlite", "pg"]


def _turn(n: int, rng: random.Random) -> SessionTurn:
    role = rng.choice(["user", "assistant", "assistant"])
    run = rng.choice([None, "r0", "r1", "r2"])
    return SessionTurn(
        id=f"t{n}",
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(text=f"word{n} common"),),
        created_at=1_000 + n,
        run_id=run,
    )


def _runs() -> tuple[SessionRun, ...]:
    return tuple(
        SessionRun(id=f"r{i}", prompt="p", status="completed", started_at=1_000) for i in range(3)
    )


def _meta(row: Any) -> Any:
    """A header row without what each store stamps itself (its rev, a write's time)."""
    return (
        None
        if row is None
        else (
            row.id,
            row.turn_count,
            row.user_message_count,
            row.run_count,
            row.first_user_turn,
            row.metadata,
        )
    )


async def _same(memory: Any, other: Any, live: list[str], rng: random.Random) -> None:
    for sid in live:
        want, got = await memory.load(sid), await other.load(sid)
        assert want is not None and got is not None
        assert replace(got, updated_at=0) == replace(want, updated_at=0), sid
        start = rng.randrange(len(want.turns) + 1)
        limit = rng.choice([None, 1, 3])
        assert await other.get_turns(sid, start, limit) == await memory.get_turns(sid, start, limit)
        assert _meta(await other.get_meta(sid)) == _meta(await memory.get_meta(sid)), sid
        assert await list_forks(other, sid) == await list_forks(memory, sid)
    assert sorted(map(_meta, await other.list_meta())) == sorted(
        map(_meta, await memory.list_meta())
    )
    word = f"word{rng.randrange(40)}"
    found = [
        sorted(r.id for r in (await s.search_meta(SessionSearch(text=word, limit=100))).rows)
        for s in (memory, other)
    ]
    assert found[1] == found[0], word


async def _step(
    stores_: tuple[Any, Any], live: list[str], rng: random.Random, n: list[int]
) -> None:
    """One random write, the same on both stores."""
    op = rng.choice(["append", "append", "fork", "fork", "save", "edit", "delete"])
    sid = rng.choice(live)
    if op == "append" or (op == "delete" and len(live) < 3):
        turns = [_turn(n[0] + i, rng) for i in range(rng.randint(1, 3))]
        n[0] += len(turns)
        for s in stores_:
            await s.append_turns(sid, turns)
    elif op == "fork":
        data = await stores_[0].load(sid)
        at = rng.choice([None, *[t.id for t in data.turns]])
        new = f"s{n[0]}"
        n[0] += 1
        for s in stores_:
            await fork_session(s, sid, new, at=at, created_at=5_000)
        live.append(new)
    elif op == "save":
        data = await stores_[0].load(sid)
        keep = rng.randrange(len(data.turns) + 1)
        turns = (*data.turns[:keep], _turn(n[0], rng))
        n[0] += 1
        data = SessionData(
            id=sid, created_at=1, updated_at=2, metadata=data.metadata, turns=turns, runs=_runs()
        )
        for s in stores_:
            await s.save(data)
    elif op == "edit":
        cut = rng.random()
        extra = _turn(n[0], rng)
        n[0] += 1

        def edit(h: SessionHistory) -> SessionHistory:
            return SessionHistory((*h.turns[: int(len(h.turns) * cut)], extra), h.runs)

        for s in stores_:
            await s.mutate_history(sid, edit)
    else:
        live.remove(sid)
        for s in stores_:
            await s.delete(sid)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(6))
async def test_random_programs_answer_as_the_memory_store(kind: str, seed: int) -> None:
    rng = random.Random(seed)
    async with stores(kind, []) as pairs:
        ((memory, other),) = pairs
        first = SessionData(
            id="root",
            created_at=1,
            updated_at=2,
            metadata={"title": "root"} if seed % 2 else {},
            turns=tuple(_turn(i, rng) for i in range(6)),
            runs=_runs(),
        )
        for s in (memory, other):
            await s.save(first)
        live, n = ["root"], [100]
        for _ in range(25):
            await _step((memory, other), live, rng, n)
            await _same(memory, other, live, rng)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_sees_its_turn_ids(kind: str) -> None:
    """An append to a fork repeating a shared turn is a retry; other content is a conflict."""
    rng = random.Random(1)
    turns = tuple(_turn(i, rng) for i in range(4))
    async with stores(kind, [SessionData(id="a", created_at=1, updated_at=2, turns=turns)]) as p:
        ((_, store),) = p
        await fork_session(store, "a", "b", at="t2", created_at=5_000)
        rev = await store.get_rev("b")
        await store.append_turns("b", [turns[1]])  # retried: nothing written
        assert await store.get_rev("b") == rev
        with pytest.raises(ConflictError):
            await store.append_turns("b", [_turn(1, random.Random(9))])
        await store.append_turns("b", [turns[3]])  # left out of the fork: a new turn there
        data = await store.load("b")
        assert [t.id for t in data.turns] == ["t0", "t1", "t2", "t3"]


async def test_a_sqlite_fork_copies_no_row(tmp_path: Any) -> None:
    """The fork is a header and one link row; a rewrite of its source's last turns copies
    only those into it, a delete of the source the rest, each once."""
    import sqlite3

    from zidane_actors.stores import open_sqlite_store

    rng = random.Random(2)
    turns = tuple(_turn(i, rng) for i in range(50))
    db = tmp_path / "f.db"
    async with open_sqlite_store(db) as store:
        await store.save(SessionData(id="a", created_at=1, updated_at=2, turns=turns))
        await store.fork_session("a", "b", at=None, created_at=5_000)
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM turns").fetchone() == (50,)
        extra = _turn(99, rng)
        await store.mutate_history("a", lambda h: SessionHistory((*h.turns[:40], extra), h.runs))
        with sqlite3.connect(db) as conn:  # a's 40 kept and 1 new, b's 10 copied
            assert conn.execute("SELECT COUNT(*) FROM turns").fetchone() == (51,)
            assert conn.execute("SELECT * FROM forks").fetchall() == [("b", "a", 40)]
        await store.delete("a")
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM turns").fetchone() == (50,)
        data = await store.load("b")
        assert data is not None and data.turns == turns


@pytest.mark.parametrize("kind", KINDS)
async def test_a_forks_model_view_spans_what_it_shares(kind: str) -> None:
    """``load_model_view`` of a fork (of a fork) reads the turns it shares, as the memory
    store does, before and after the source is deleted."""
    rng = random.Random(3)
    turns = tuple(_turn(i, rng) for i in range(5))
    async with stores(kind, [SessionData(id="a", created_at=1, updated_at=2, turns=turns)]) as p:
        ((memory, other),) = p
        for s in (memory, other):
            await fork_session(s, "a", "b", at="t3", created_at=5_000)
            await s.append_turns("b", [_turn(9, random.Random(4))])
            await fork_session(s, "b", "c", at=None, created_at=6_000)
        for sid in ("b", "c"):
            assert await other.load_model_view(sid) == await memory.load_model_view(sid)
        for s in (memory, other):
            await s.delete("a")
        assert await other.load_model_view("c") == await memory.load_model_view("c")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_appending_to_a_fork_answers_as_one_by_one(kind: str) -> None:
    """A group commit of appends to a fork and its source (a retry of a shared turn among
    them) answers and stores what the writes do one by one."""
    rng = random.Random(5)
    turns = tuple(_turn(i, rng) for i in range(4))
    async with stores(kind, [SessionData(id="a", created_at=1, updated_at=2, turns=turns)]) as p:
        ((memory, other),) = p
        writes = [
            StoreWrite("append_turns", ("b", [_turn(10, rng)])),
            StoreWrite("append_turns", ("a", [_turn(11, rng)])),
            StoreWrite("append_turns", ("b", [turns[1]])),  # shared: a retry
            StoreWrite("append_turns", ("b", [_turn(12, rng)])),
        ]
        for s in (memory, other):
            await fork_session(s, "a", "b", at="t2", created_at=5_000)
        await memory.apply_writes(writes)
        answers = await other.apply_writes(writes)
        assert all(not isinstance(a, outcome.Error) for a in answers)
        for sid in ("a", "b"):
            assert [t.id for t in (await other.load(sid)).turns] == [
                t.id for t in (await memory.load(sid)).turns
            ]


def _run_turns() -> list[SessionTurn]:
    """Turns of runs r0 (t0), r1 (t1, t3), r2 (t2), then one of none (t4)."""
    runs = ["r0", "r1", "r2", "r1", None]
    return [
        SessionTurn(id=f"t{i}", role="user", content=(TextBlock(text="x"),), created_at=1, run_id=r)
        for i, r in enumerate(runs)
    ]


_ORIGIN = '{"forkedFrom": {"sessionId": "a", "turnId": null, "forkedAt": 1}}'


async def _indexed_answers(store: Any) -> None:
    """The runs forks keep and the forks listed, as the rule says, on a migrated store."""
    cases = {"t0": ["r0"], "t1": ["r0", "r1"], "t2": ["r0", "r1", "r2"], "t3": ["r0", "r1", "r2"]}
    for at, kept in cases.items():
        await store.fork_session("a", f"at{at}", at=at, created_at=5_000)
        fork = await store.load(f"at{at}")
        assert fork is not None and [r.id for r in fork.runs] == kept, at
    assert await store.list_forks("a") == ["att0", "att1", "att2", "att3", "f"]


async def test_a_v14_sqlite_file_indexes_runs_and_forks(tmp_path: Any) -> None:
    """Schema v15: a v14 file gains the indexes of each turn's run and each fork's source
    (rows that do not parse are left out of them, never refused)."""
    import sqlite3

    import msgspec

    from zidane_actors.stores import open_sqlite_store
    from zidane_actors.stores.sqlite._rows import _run_body
    from zidane_actors.stores.sqlite._schema import MIGRATIONS, migrate

    db = tmp_path / "v14.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, str(db), MIGRATIONS[:14]) == 14
    conn.execute(
        "INSERT INTO sessions (id, status, metadata, created_at, updated_at) VALUES"
        f" ('a', 'idle', '{{}}', 1, 2), ('f', 'idle', '{_ORIGIN}', 1, 2),"
        " ('bad', 'idle', '{\"forkedFrom\": oops', 1, 2)"
    )
    turns = _run_turns()
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', ?, ?, 'user', ?)",
        [(i, t.id, msgspec.json.encode(t)) for i, t in enumerate(turns)],
    )
    conn.execute(
        "INSERT INTO turns (session_id, seq, id, role, body)"
        " VALUES ('bad', 0, 't0', 'user', CAST('{\"runId\": oops' AS BLOB))"
    )
    conn.executemany(
        "INSERT INTO runs (session_id, id, position, body) VALUES ('a', ?, ?, ?)",
        [(r.id, i, _run_body(r)) for i, r in enumerate(_runs())],
    )
    conn.execute(
        "UPDATE sessions SET turn_count = 5, user_turn_count = 5, first_user_seq = 0 WHERE id = 'a'"
    )
    conn.close()
    async with open_sqlite_store(db) as store:
        await _indexed_answers(store)
    with sqlite3.connect(db) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE json_valid(metadata)"
            " AND json_extract(metadata, '$.forkedFrom.sessionId') = 'a'"
        ).fetchall()
        assert "sessions_forked_from" in str(plan)


@pytest.mark.parametrize("kind", ["pg"])
async def test_a_v8_postgres_schema_indexes_runs_and_forks(kind: str) -> None:
    """Schema v9: a v8 schema gains ``json_member`` and the indexes of each turn's run and
    each fork's source; rows that do not parse are left out of them, never refused."""
    import msgspec
    from _pg import DSN, schema_at

    from zidane_actors.stores import open_postgres_store

    with schema_at(8) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata) VALUES"
            " ('f', 1, 2, 'idle', %s), ('bad', 1, 2, 'idle', '{\"forkedFrom\": oops')",
            (_ORIGIN,),
        )
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body)"
            " VALUES ('bad', 0, 't0', 'user', '{\"runId\": oops')"
        )
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            data = SessionData(
                id="a", created_at=1, updated_at=2, turns=tuple(_run_turns()), runs=_runs()
            )
            await store.save(data)
            await _indexed_answers(store)
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body)"
                " VALUES ('bad', 1, 't1', 'user', %s)",
                (msgspec.json.encode(_run_turns()[0]).decode()[:-1],),
            )


async def test_postgres_forks_racing_into_one_id_one_wins() -> None:
    """Forks into one new id at once (a pipelined transaction each): one is made, every
    other one is a ConflictError, and the store's connections keep working."""
    import trio
    from _pg import DSN, schema_at

    from zidane_actors.errors import ConflictError
    from zidane_actors.stores import open_postgres_store
    from zidane_actors.stores.postgres._schema import SCHEMA_VERSION

    with schema_at(SCHEMA_VERSION) as (schema, _):
        async with open_postgres_store(DSN, schema=schema, pool_size=4) as store:
            data = SessionData(
                id="a", created_at=1, updated_at=2, turns=tuple(_run_turns()), runs=_runs()
            )
            await store.save(data)
            results: list[object] = []

            async def fork(at: str | None) -> None:
                try:
                    results.append(await store.fork_session("a", "b", at=at, created_at=5))
                except ConflictError as exc:
                    results.append(exc)

            async with trio.open_nursery() as nursery:
                for at in [None, "t1", None, "t3", "t0", None]:
                    nursery.start_soon(fork, at)
            assert sum(not isinstance(r, ConflictError) for r in results) == 1
            for i in range(8):  # every pooled connection answers again
                await store.fork_session("a", f"c{i}", at="t2", created_at=5)
            assert await store.list_forks("a") == ["b", *(f"c{i}" for i in range(8))]
