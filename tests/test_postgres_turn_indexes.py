"""PostgreSQL schema v11: the turn indexes of runs and compaction markers, made smaller.

``turns_runs`` keys a run's rows by ``seq / 32`` (deduplicated) and ``turns_commands``
holds only the rows that may be compaction markers. A v10 schema's rows are indexed
again on open; forks keep the runs the rule says and the model's view is the rule's, and
both statements read their index.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from _pg import DSN, schema_at

from zidane_actors.model import (
    SessionRun,
    SessionTurn,
    TextBlock,
    compaction_marker,
    encode_str,
    model_view,
)
from zidane_actors.stores import open_postgres_store
from zidane_actors.stores.postgres._schema import MARKERS, SCHEMA_VERSION
from zidane_actors.stores.sql import POSTGRES
from zidane_actors.stores.sql._forks import ForkPlan, RowRange, left_out


def _turns() -> list[SessionTurn]:
    """70 turns: runs r0 (t0-t39, past a key's 32 rows), r1 (t40-t59), r2 (t60-t69); every
    fifth a plain ``command`` turn, t30 a compaction marker through t10 (a ``command`` too)."""
    turns: list[SessionTurn] = []
    for i in range(70):
        run = "r0" if i < 40 else "r1" if i < 60 else "r2"
        if i == 30:
            made = compaction_marker(
                [SessionTurn(id="s0", role="assistant", content=(TextBlock("sum"),), created_at=1)],
                through="t10",
                id=f"t{i}",
                created_at=1,
            )
            turns.append(msgspec.structs.replace(made, run_id=run))
            continue
        role = "command" if i % 5 == 4 else "user" if i % 2 else "assistant"
        turns.append(
            SessionTurn(
                id=f"t{i}",
                role=role,  # type: ignore[arg-type]
                content=(TextBlock(f"turn {i}"),),
                created_at=1,
                run_id=run,
            )
        )
    return turns


def _plan(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> str:
    """The plan of ``sql`` with sequential scans off (a few rows: any plan would do)."""
    conn.execute("SET enable_seqscan = off")
    return str(conn.execute(f"EXPLAIN {sql}".encode(), params).fetchall())


async def test_a_v10_schema_gets_the_smaller_turn_indexes() -> None:
    turns = _turns()
    runs = [SessionRun(id=f"r{i}", prompt="p", status="completed", started_at=1) for i in range(3)]
    with schema_at(10) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata, turn_count,"
            " user_turn_count) VALUES ('a', 1, 2, 'idle', '{}', %s, %s)",
            (len(turns), sum(t.role == "user" for t in turns)),
        )
        for seq, t in enumerate(turns):
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', %s, %s, %s, %s)",
                (seq, t.id, t.role, encode_str(t)),
            )
        for seq, r in enumerate(runs):
            conn.execute(
                "INSERT INTO runs (session_id, id, seq, body) VALUES ('a', %s, %s, %s)",
                (r.id, seq, encode_str(r)),
            )
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            assert await store.load_model_view("a") == list(model_view(turns))
            for at, kept in {"t35": ["r0"], "t45": ["r0", "r1"], "t65": ["r0", "r1", "r2"]}.items():
                await store.fork_session("a", f"at{at}", at=at, created_at=5_000)
                fork = await store.load(f"at{at}")
                assert fork is not None and [r.id for r in fork.runs] == kept, at
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        assert version == (SCHEMA_VERSION,) and SCHEMA_VERSION == 11
        defs = dict(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s"
                " AND indexname IN ('turns_runs', 'turns_commands')",
                (schema,),
            ).fetchall()
        )
        assert "(seq / 32)" in defs["turns_runs"] and "zidaneCompaction" in defs["turns_commands"]
        markers = f"SELECT seq FROM turns WHERE session_id = 'a' AND {MARKERS} AND seq < 60"
        assert conn.execute(markers.encode()).fetchall() == [(30,)]
        plan = _plan(conn, f"{markers} ORDER BY seq DESC LIMIT 8", [])
        assert "turns_commands" in plan
        probe, params = left_out(
            ForkPlan((RowRange("a", 0, None),), 45, 70, 0, ()), POSTGRES, "?", ("r0",)
        )
        plan = _plan(conn, POSTGRES.sql(f"SELECT {probe}"), params)
        assert "turns_runs" in plan and "(seq / 32) >=" in plan and "(seq / 32) <=" in plan
