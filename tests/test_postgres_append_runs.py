"""Appends with a run on the PostgreSQL store: one statement alone, one per run of a batch.

Each case is checked against the memory store (the reference) and, where it
matters, for the path taken: the two-step path (``_append_turns``) only for a
retry, a conflict, a fork or a write committed while the append waited.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import outcome
import psycopg
import pytest
import trio
from _pg import DSN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from test_postgres_store import (
    CONTRACT_SCHEMA,
    FAST_DSN,
    admin,
    comparable,
    empty_schema,
    fresh_schema,
    session,
    turn,
)

from zidane_actors.errors import ConflictError, SessionNotFoundError
from zidane_actors.model import AppendTurnsOptions, SessionRun
from zidane_actors.stores import (
    PostgresStore,
    StoreWrite,
    open_memory_store,
    open_postgres_store,
)
from zidane_actors.stores.postgres import _base


def run(run_id: str = "r0", status: str = "running") -> AppendTurnsOptions:
    return AppendTurnsOptions(run=SessionRun(run_id, "p", 1, status))  # type: ignore[arg-type]


@pytest.fixture
def schema() -> Iterator[str]:
    with fresh_schema() as name:
        yield name


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    async with open_postgres_store(DSN, schema=schema, pool_size=2) as opened:
        yield opened


@pytest.fixture
def slow_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The session ids of the appends that took the two-step path."""
    taken: list[str] = []
    two_steps = _base._append_turns

    def spy(cur: Any, session_id: str, *args: Any, **kwargs: Any) -> Any:
        taken.append(session_id)
        return two_steps(cur, session_id, *args, **kwargs)

    monkeypatch.setattr(_base, "_append_turns", spy)
    return taken


def seqs(schema: str, sid: str) -> list[tuple[str, int]]:
    return [(r[0], r[1]) for r in admin(schema, _RUNS, (sid,))]


_RUNS = "SELECT id, seq FROM runs WHERE session_id = %s ORDER BY seq, id"


async def test_one_statement_appends_turns_and_run(
    store: PostgresStore, schema: str, slow_paths: list[str]
) -> None:
    first = await store.save(session("a"))
    one = await store.append_turns("a", [turn(1), turn(2, "assistant")], run("r0"))
    assert one.before == first.after and one.after > one.before
    assert await store.get_rev("a") == one.after
    two = await store.append_turns("a", [turn(3)], run("r1"))
    only_run = await store.append_turns("a", [], run("r0", "completed"))
    assert (two.before, only_run.before) == (one.after, two.after)
    assert only_run.after > only_run.before
    loaded = await store.load("a")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t1", "t2", "t3"]
    assert [(r.id, r.status) for r in loaded.runs] == [("r0", "completed"), ("r1", "running")]
    assert seqs(schema, "a") == [("r0", 0), ("r1", 1)]
    assert admin(schema, "SELECT turn_count, user_turn_count FROM sessions") == [(3, 2)]
    assert slow_paths == []


async def test_retry_of_an_append_with_a_run_is_skipped(
    store: PostgresStore, slow_paths: list[str]
) -> None:
    await store.save(session("a"))
    first = await store.append_turns("a", [turn(1), turn(2)], run("r0"))
    again = await store.append_turns("a", [turn(1), turn(2)], run("r0", "completed"))
    assert again.before == first.after and again.after > again.before  # the run changed
    loaded = await store.load("a")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t1", "t2"]
    assert [(r.id, r.status) for r in loaded.runs] == [("r0", "completed")]
    assert slow_paths == ["a"]


async def test_conflicting_append_with_a_run_writes_nothing(
    store: PostgresStore, schema: str, slow_paths: list[str]
) -> None:
    await store.save(session("a"))
    await store.append_turns("a", [turn(1)], run("r0"))
    rev = await store.get_rev("a")
    with pytest.raises(ConflictError):
        await store.append_turns("a", [turn(2), turn(1, text="other")], run("r1"))
    assert await store.get_rev("a") == rev
    loaded = await store.load("a")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t1"]
    assert [r.id for r in loaded.runs] == ["r0"]
    assert slow_paths == ["a"]


async def test_append_with_a_run_to_an_unknown_session(
    store: PostgresStore, schema: str, slow_paths: list[str]
) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.append_turns("nobody", [turn(1)], run("r0"))
    with pytest.raises(SessionNotFoundError):
        await store.append_turns("nobody", [], run("r0"))
    assert admin(schema, "SELECT count(*) FROM runs") == [(0,)]
    assert slow_paths == []


async def test_append_with_a_run_to_a_fork_matches_the_memory_store(
    store: PostgresStore, slow_paths: list[str]
) -> None:
    async with open_memory_store() as memory:
        for target in (store, memory):
            await target.save(session("a"))
            await target.append_turns("a", [turn(1), turn(2)], run("r0"))
            forked = await target.fork_session("a", "b", at="t2", created_at=5)
            first = await target.append_turns("b", [turn(3)], run("r1"))
            again = await target.append_turns("b", [turn(3)], run("r1", "completed"))  # a retry
            with pytest.raises(ConflictError):  # a shared turn's id
                await target.append_turns("b", [turn(1, text="other")], run("r2"))
            assert forked is not None and first.before == forked.after
            assert again.before == first.after and await target.get_rev("b") == again.after
        for sid in ("a", "b"):
            assert comparable(await store.load(sid)) == comparable(await memory.load(sid))
    assert slow_paths == ["b", "b", "b"]


async def test_a_write_committed_while_the_append_waited(
    store: PostgresStore, schema: str, slow_paths: list[str]
) -> None:
    """Another host writes a run while holding the row: the append waits, then sees it."""
    await store.save(session("a"))
    await store.append_turns("a", [turn(1)], run("r0"))
    other = psycopg.connect(DSN)
    other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    other.execute("UPDATE sessions SET rev = nextval('revs') WHERE id = 'a'")
    other.execute(
        "INSERT INTO runs (session_id, id, seq, body) VALUES ('a', 'r1', 1, %s)",
        (msgspec.json.encode(SessionRun("r1", "p", 1, "running")).decode(),),
    )
    held = await store.get_rev("a")
    done = threading.Event()

    def commit_once_waited() -> None:
        with psycopg.connect(DSN, autocommit=True) as probe:
            while not done.is_set():
                row = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (other.info.backend_pid,),
                ).fetchone()
                if row is not None and row[0]:
                    break
                done.wait(0.01)
        other.commit()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, commit_once_waited)
        written = await store.append_turns("a", [turn(2)], run("r2"))
        done.set()
    other.close()
    assert written.before != held  # the other host's write came between
    assert await store.get_rev("a") == written.after
    assert seqs(schema, "a") == [("r0", 0), ("r1", 1), ("r2", 2)]
    assert [t.id for t in await store.get_turns("a")] == ["t1", "t2"]
    assert slow_paths == ["a"]


async def test_two_hosts_racing_appends_with_runs(schema: str) -> None:
    """Two stores append to one session at once, each with its own runs: nothing lost,
    turns dense, each run in its own place."""
    async with (
        open_postgres_store(DSN, schema=schema, pool_size=2) as one,
        open_postgres_store(DSN, schema=schema, pool_size=2) as two,
    ):
        await one.save(session("s"))
        revisions = []

        async def host(store: PostgresStore, name: str) -> None:
            for i in range(25):
                mine = msgspec.structs.replace(turn(i), id=f"{name}-{i}")
                revisions.append(await store.append_turns("s", [mine], run(f"{name}{i}")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(host, one, "x")
            nursery.start_soon(host, two, "y")
    assert admin(schema, "SELECT max(seq), count(*) FROM turns") == [(49, 50)]
    runs = seqs(schema, "s")
    assert len(runs) == 50 and sorted(s for _, s in runs) == list(range(50))
    # Each write's revision follows the one before it: no two writes saw the same rev.
    befores = sorted(r.before for r in revisions)
    afters = sorted(r.after for r in revisions)
    assert len(set(afters)) == 50 and befores[1:] == afters[:-1]


def _batch_writes(draw: st.DrawFn) -> list[StoreWrite]:
    writes: list[StoreWrite] = []
    next_turn = iter(range(10_000))
    for _ in range(draw(st.integers(1, 10))):
        sid = draw(st.sampled_from(["s0", "s1", "s2", "nobody"]))
        kind = draw(st.sampled_from(["append", "append", "run", "save"]))
        if kind == "save":
            writes.append(StoreWrite("save", (session(sid),)))
            continue
        if kind == "run":
            status = draw(st.sampled_from(["running", "completed"]))
            writes.append(StoreWrite("update_run", (sid, SessionRun("r0", "p", 1, status))))
            continue
        turns = [
            turn(
                draw(st.one_of(st.integers(0, 3), st.just(next(next_turn) + 100))),
                draw(st.sampled_from(["user", "assistant"])),
                draw(st.sampled_from([None, "other"])),
            )
            for _ in range(draw(st.integers(0, 2)))
        ]
        options = draw(st.sampled_from([None, run("r0"), run("r1", "completed"), run("r2")]))
        writes.append(StoreWrite("append_turns", (sid, turns, options)))
    return writes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.composite(_batch_writes)(), second=st.composite(_batch_writes)())
async def test_batches_and_lone_appends_with_runs_match_the_memory_store(
    first: list[StoreWrite], second: list[StoreWrite]
) -> None:
    """Two batches, then each write of the second alone: same outcomes and documents."""
    await trio.to_thread.run_sync(empty_schema, CONTRACT_SCHEMA)
    async with (
        open_postgres_store(FAST_DSN, schema=CONTRACT_SCHEMA, pool_size=1) as pg,
        open_memory_store() as memory,
    ):
        for target in (pg, memory):
            await target.apply_writes([StoreWrite("save", (session("s0"),))])
        for batch in (first, second):
            expected = await memory.apply_writes(batch)
            got = await pg.apply_writes(batch)
            assert [type(getattr(r, "error", None)) for r in got] == [
                type(getattr(r, "error", None)) for r in expected
            ]
        for write in second:
            answers = []
            for target in (memory, pg):
                answers.append(await outcome.acapture(getattr(target, write.method), *write.args))
            assert type(getattr(answers[1], "error", None)) is type(
                getattr(answers[0], "error", None)
            )
        for sid in ("s0", "s1", "s2", "nobody"):
            assert comparable(await pg.load(sid)) == comparable(await memory.load(sid))


async def test_a_batch_of_appends_with_runs_needs_no_savepoints(
    store: PostgresStore, schema: str
) -> None:
    sids = [f"s{i}" for i in range(20)]
    await store.apply_writes([StoreWrite("save", (session(sid),)) for sid in sids])
    revs = {sid: await store.get_rev(sid) for sid in sids}
    batch = [StoreWrite("append_turns", (sid, [turn(1)], run("r0"))) for sid in sids]
    batch += [StoreWrite("append_turns", ("nobody", [turn(1)], run("r0")))]
    batch += [StoreWrite("append_turns", (sid, [turn(1)], run("r1"))) for sid in sids[:5]]
    results = await store.apply_writes(batch)
    assert store.statistics().batch_fallbacks == 0
    assert isinstance(results[20], outcome.Error)
    assert isinstance(results[20].error, SessionNotFoundError)
    answers = [r.value if isinstance(r, outcome.Value) else None for r in results]
    for sid, answer in zip(sids, answers, strict=False):
        assert answer is not None and answer.before == revs[sid]
    for sid, again, first in zip(sids[:5], answers[21:], answers[:5], strict=True):
        assert again is not None and first is not None
        assert again.before == first.after < again.after
        assert seqs(schema, sid) == [("r0", 0), ("r1", 1)]
        assert await store.get_rev(sid) == again.after
    assert admin(schema, "SELECT count(*), sum(turn_count) FROM sessions") == [(20, 20)]


async def test_a_lone_append_larger_than_the_socket_buffers(
    store: PostgresStore, slow_paths: list[str]
) -> None:
    """A lone append's statement (awaited in the trio thread) several MB long: psycopg
    flushes it in parts, each waiting for the socket to drain; it is stored whole."""
    await store.save(session("s"))
    big = turn(0, text="ab\u00e9\u20ac" * 2_000_000)  # 8 M characters, 14 MB of UTF-8
    await store.append_turns("s", [big], run())
    await store.append_turns("s", [turn(1)])
    assert await store.get_turns("s") == [big, turn(1)]
    assert slow_paths == []


async def test_a_cancelled_lone_append_lands_whole(
    store: PostgresStore, schema: str, slow_paths: list[str]
) -> None:
    """Cancelled while its statement waits in the server (another host holds the row), a
    lone append still commits (shielded, as a worker thread's would): the store holds the
    turn, and the connection, never left midway, serves the next append."""
    await store.save(session("s"))
    other = psycopg.connect(DSN)
    other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    other.execute("SELECT FROM sessions WHERE id = 's' FOR UPDATE")

    def blocked() -> None:
        with psycopg.connect(DSN, autocommit=True) as probe:
            while not probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (other.info.backend_pid,),
            ).fetchone()[0]:  # type: ignore[index]
                probe.execute("SELECT pg_sleep(0.01)")

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.append_turns, "s", [turn(0)], run())
            await trio.to_thread.run_sync(blocked)
            scope.cancel()
            other.commit()
    other.close()
    await store.append_turns("s", [turn(1)])
    assert [t.id for t in await store.get_turns("s")] == ["t0", "t1"]
    assert slow_paths == []
    assert store.statistics().reconnects == 0
