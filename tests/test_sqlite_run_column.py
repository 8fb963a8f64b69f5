"""SQLite schema v16: a turn row's run id is a column its writes fill, and an append with a
run costs the statements of a plain one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
from _sqlite import assert_current, old_file
from store_contract import make_run, make_turn

from zidane_actors.errors import SessionNotFoundError
from zidane_actors.model import AppendTurnsOptions, SessionData
from zidane_actors.stores import StoreWrite, open_memory_store, open_sqlite_store
from zidane_actors.stores.sqlite._schema import _RUN_IN_BODY

_MISFILED = f"SELECT COUNT(*) FROM turns WHERE run_id IS NOT ({_RUN_IN_BODY})"
"""Rows whose run_id is not what their JSON says (none, whatever wrote them)."""


def _misfiled(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(_MISFILED).fetchone()[0])


async def test_a_v15_file_takes_each_rows_run_id_from_its_json(tmp_path: Path) -> None:
    """Every stored row gets its JSON's runId (none for a row that does not parse or has none,
    a whole pre-v9 row's too), the index serves a run's probe, and forks keep runs by it."""
    db = tmp_path / "v15.db"
    conn = old_file(db, 15, "('a', 'idle', '{}', 1, 2), ('bad', 'idle', '{}', 1, 2)")
    turns = [make_turn(i, run_id=r) for i, r in enumerate(["r0", "r1", None, "r1"])]
    rows = [(i, t.id, t.role, msgspec.json.encode(t)) for i, t in enumerate(turns)]
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', ?, ?, ?, ?)", rows
    )
    conn.execute(
        "INSERT INTO turns (session_id, seq, id, role, body)"
        " VALUES ('bad', 0, 't0', 'user', CAST('{\"runId\": oops' AS BLOB))"
    )
    conn.executemany(
        "INSERT INTO runs (session_id, id, position, body) VALUES ('a', ?, ?, ?)",
        [(r, i, msgspec.json.encode(make_run(r))) for i, r in enumerate(["r0", "r1"])],
    )
    conn.execute(
        "UPDATE sessions SET turn_count = 4, user_turn_count = 2, first_user_seq = 0 WHERE id = 'a'"
    )
    conn.close()
    async with open_sqlite_store(db) as store:
        await store.fork_session("a", "f0", at="t0", created_at=5)
        await store.fork_session("a", "f2", at="t2", created_at=5)
        assert [r.id for r in (await store.load("f0")).runs] == ["r0"]  # type: ignore[union-attr]
        assert [r.id for r in (await store.load("f2")).runs] == ["r0", "r1"]  # type: ignore[union-attr]
    with sqlite3.connect(db) as conn:
        assert_current(conn)
        assert conn.execute(
            "SELECT seq, run_id FROM turns WHERE session_id = 'a' ORDER BY seq"
        ).fetchall() == [
            (0, "r0"),
            (1, "r1"),
            (2, None),
            (3, "r1"),
        ]
        assert conn.execute("SELECT run_id FROM turns WHERE session_id = 'bad'").fetchall() == [
            (None,)
        ]
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT 1 FROM turns WHERE session_id = 'a'"
            " AND run_id IS NOT NULL AND run_id = 'r1' AND seq >= 2 LIMIT 1"
        ).fetchall()
        assert "turns_runs" in str(plan)
    assert _misfiled(db) == 0


async def test_every_write_of_turns_fills_the_run_id(tmp_path: Path) -> None:
    """Appends (lone, batched, with a run), saves, history edits and the copies a fork gets
    when its source's turns are rewritten or deleted: every row's run_id is its JSON's."""
    db = tmp_path / "w.db"

    def turn(n: int) -> Any:
        return make_turn(
            n, "user" if n % 2 else "assistant", run_id=None if n % 3 == 0 else f"r{n % 2}"
        )

    async with open_sqlite_store(db) as store:
        for sid in ("a", "b", "c"):
            await store.save(SessionData(id=sid, created_at=1, updated_at=1))
        await store.append_turns("a", [turn(0), turn(1)])
        await store.append_turns("a", [turn(2)], AppendTurnsOptions(run=make_run("r0")))
        await store.apply_writes(
            [
                StoreWrite("append_turns", ("b", [turn(3)])),
                StoreWrite(
                    "append_turns", ("c", [turn(4)], AppendTurnsOptions(run=make_run("r1")))
                ),
                StoreWrite(
                    "append_turns",
                    ("b", [turn(5), turn(6)], AppendTurnsOptions(run=make_run("r0"))),
                ),
            ]
        )
        await store.save(
            SessionData(id="d", created_at=1, updated_at=1, turns=(turn(7), turn(8), turn(9)))
        )
        await store.fork_session("a", "fa", at=None, created_at=5)
        await store.fork_session("d", "fd", at=None, created_at=5)
        await store.append_turns("fa", [turn(10)], AppendTurnsOptions(run=make_run("r1")))
        await store.mutate_history(
            "a", lambda h: msgspec.structs.replace(h, turns=(*h.turns[:1], turn(11)))
        )
        await store.delete("d")  # fd gets its copies
        assert [t.id for t in (await store.load("fd")).turns] == ["t7", "t8", "t9"]  # type: ignore[union-attr]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM turns WHERE run_id IS NOT NULL").fetchone()[0] > 5
    assert _misfiled(db) == 0


async def test_an_append_with_a_run_makes_as_many_statements_as_a_plain_one(tmp_path: Path) -> None:
    """A plain append: the fork lookup, the insert, the bump; with a run: the bump (saying
    whether the session is a fork), the insert, the run's upsert, whether the run is new."""
    async with open_sqlite_store(tmp_path / "s.db") as store:
        for sid in ("a", "b"):
            await store.save(SessionData(id=sid, created_at=1, updated_at=1))
        statements: list[str] = []
        await store._worker.run(lambda conn: conn.set_trace_callback(statements.append))  # type: ignore[attr-defined]

        async def count(write: Any) -> int:
            statements.clear()
            await write
            # A trigger's program is traced as its statement again: count each statement once.
            # A PRAGMA (the busy timeout, switched for a write in the trio thread) is not one.
            return sum(
                1
                for i, s in enumerate(statements)
                if (i == 0 or statements[i - 1] != s) and not s.startswith("PRAGMA")
            )

        plain = await count(store.append_turns("a", [make_turn(0)]))
        new_run = await count(
            store.append_turns("b", [make_turn(0)], AppendTurnsOptions(run=make_run("r")))
        )
        old_run = await count(
            store.append_turns("b", [make_turn(1)], AppendTurnsOptions(run=make_run("r")))
        )
        assert new_run == old_run == plain
        await store._worker.run(lambda conn: conn.set_trace_callback(None))  # type: ignore[attr-defined]


async def test_batched_appends_with_runs_answer_as_one_by_one(tmp_path: Path) -> None:
    """Batches of appends with and without runs store and answer what the memory store does
    one write at a time: the first (a run updated twice, a fork's appends, one retrying a
    turn it shares) in shared statements, the fork's alone; the second (a retry and a
    missing session) one write at a time."""
    runs = [make_run("r0"), make_run("r1", "running"), make_run("r1", "completed", ended_at=9)]

    def append(sid: str, turns: list[int], run: int | None = None) -> StoreWrite:
        options = None if run is None else AppendTurnsOptions(run=runs[run])
        return StoreWrite("append_turns", (sid, [make_turn(n) for n in turns], options))

    batches = [
        [
            append("a", [0], 0),
            append("b", [1]),
            append("f", [7], 1),
            append("a", [2], 1),
            append("f", [9], 0),
            append("a", [], 2),
        ],
        [append("b", [5, 6], 2), append("a", [0], 0), append("f", [3], 1), append("ghost", [4], 0)],
    ]
    answers = []
    loaded = []
    async with open_memory_store() as memory, open_sqlite_store(tmp_path / "b.db") as sqlite:
        statements: list[str] = []
        for store in (memory, sqlite):
            for sid in ("a", "b"):
                await store.save(SessionData(id=sid, created_at=1, updated_at=1))
            await store.append_turns("a", [make_turn(9)])
            await store.fork_session("a", "f", at=None, created_at=5)
            got = []
            for batch in batches:
                if store is memory:
                    got += [await _outcome(store.append_turns(*w.args)) for w in batch]
                else:
                    trace = statements.append if batch is batches[0] else None
                    await store._worker.run(lambda conn, t=trace: conn.set_trace_callback(t))  # type: ignore[attr-defined,misc]
                    got += [await _outcome(_unwrap(o)) for o in await store.apply_writes(batch)]
            answers.append([g if isinstance(g, type) else g.after > g.before for g in got])
            loaded.append([await store.load(sid) for sid in ("a", "b", "f")])
    assert answers[0] == answers[1] == [True] * 9 + [SessionNotFoundError]
    for mine, theirs in zip(*loaded, strict=True):
        assert mine is not None and theirs is not None
        assert (mine.turns, mine.runs) == (theirs.turns, theirs.runs)
    # One savepoint: the batch did not fall back to one write at a time; only the fork's
    # appends (bump first, saying it is a fork) went alone.
    assert statements.count("SAVEPOINT w") == 1
    assert sum(1 for s in statements if "EXISTS (SELECT 1 FROM forks" in s) == 2


async def _outcome(awaitable: Any) -> Any:
    """The awaited value, or the type of the error it raised."""
    try:
        return await awaitable
    except Exception as exc:
        return type(exc)


async def _unwrap(result: Any) -> Any:
    return result.unwrap()
