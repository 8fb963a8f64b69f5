"""The SQLite store on its own: schema, durability, aggregates, group commit, errors."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import outcome
import pytest
import trio
from _sqlite import assert_current, old_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_contract import StoreContract, StoreOpener, make_session

from zidane_actors.errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    MigrationWarning,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from zidane_actors.model import (
    ARTIFACTS_PER_SESSION_CAP,
    SEND_REQUEST_HISTORY,
    AppendTurnsOptions,
    ArtifactFilter,
    SaveMetaOptions,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionRun,
    SessionTurn,
    TextBlock,
)
from zidane_actors.stores import (
    OPTIONAL_METHODS,
    MemoryStore,
    SQLiteStore,
    StoreWrite,
    open_sqlite_store,
)
from zidane_actors.stores.sqlite._schema import MIGRATIONS, SCHEMA_VERSION, migrate


class TestSQLiteContract(StoreContract):
    """The shared store contract, every optional method required."""

    required_capabilities = OPTIONAL_METHODS | {"apply_writes"}
    property_examples = 15

    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        with tempfile.TemporaryDirectory() as tmp:
            yield lambda: open_sqlite_store(Path(tmp) / "sessions.db", durability="normal")


def turn(i: int, role: str = "user", run_id: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=f"t{i}",
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(text=f"turn {i}"),),
        created_at=1_000 + i,
        run_id=run_id,
    )


def session(sid: str, **kw: Any) -> SessionData:
    fields: dict[str, Any] = {"created_at": 1, "updated_at": 2}
    fields.update(kw)
    return SessionData(id=sid, **fields)


def run(rid: str, status: str = "running") -> SessionRun:
    return SessionRun(id=rid, prompt="go", started_at=5, status=status)  # type: ignore[arg-type]


async def test_round_trip_and_reopen(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    data = session(
        "s1",
        metadata={"title": "hello", "n": [1, 2]},
        turns=(turn(0), turn(1, "assistant")),
        runs=(run("r1", "completed"),),
        agent_id="agent",
        project_root="/p",
    )
    async with open_sqlite_store(db) as store:
        await store.save(data)
        await store.append_turns("s1", [turn(2)], AppendTurnsOptions(run=run("r2")))
        assert await store.load("missing") is None
    async with open_sqlite_store(db) as store:
        loaded = await store.load("s1")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t0", "t1", "t2"]
    assert [r.id for r in loaded.runs] == ["r1", "r2"]
    assert loaded.metadata == {"title": "hello", "n": [1, 2]}
    assert (loaded.agent_id, loaded.project_root) == ("agent", "/p")
    assert loaded.updated_at >= data.updated_at


async def test_append_to_unknown_session_raises(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        with pytest.raises(SessionNotFoundError, match="nope"):
            await store.append_turns("nope", [turn(0)])
        assert await store.list() == []


async def test_bad_input_is_rejected_with_location(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s"))
        with pytest.raises(InvalidNameError):
            await store.load("../etc")
        bad = SessionTurn(id="", role="user", content=(), created_at=1)
        with pytest.raises(ValidationError) as info:
            await store.append_turns("s", [turn(0), bad])
        assert "turn 1" in str(info.value)
        with pytest.raises(ValidationError):
            await store.patch_meta("s", {"x": object()})
        with pytest.raises(ValidationError):
            await store.get_turns("s", -1)
        # Nothing of a rejected write landed.
        assert await store.get_turns("s") == []


async def test_get_turns_slices_by_seq(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s", turns=tuple(turn(i) for i in range(5))))
        await store.append_turns("s", [turn(5), turn(6)])
        assert [t.id for t in await store.get_turns("s", 3)] == ["t3", "t4", "t5", "t6"]
        assert [t.id for t in await store.get_turns("s", 2, 2)] == ["t2", "t3"]
        assert await store.get_turns("s", 10) == []
        assert await store.get_turns("other") == []


async def test_list_meta_aggregates_and_filters(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(
            session(
                "a",
                updated_at=30,
                turns=(turn(0, "system"), turn(1, "user"), turn(2, "assistant"), turn(3)),
                runs=(run("r", "completed"),),
                project_root="/p",
                agent_id="x",
            )
        )
        await store.save(session("b", updated_at=20, metadata={"title": "T"}, turns=(turn(0),)))
        await store.save(session("c", updated_at=10, project_root="/q"))
        rows = await store.list_meta()
        assert [r.id for r in rows] == ["a", "b", "c"]
        a, b, c = rows
        assert (a.turn_count, a.user_message_count, a.run_count) == (4, 2, 1)
        assert a.first_user_turn is not None and a.first_user_turn.id == "t1"
        assert b.first_user_turn is None  # a stored title needs no derivation
        assert (c.turn_count, c.first_user_turn, c.artifact_count) == (0, None, 0)
        assert await store.list(SessionFilter(project_root=None)) == ["b"]
        assert await store.list(SessionFilter(project_root="/q")) == ["c"]
        assert await store.list(SessionFilter(agent_id="x")) == ["a"]
        assert await store.list(SessionFilter(limit=2)) == ["a", "b"]
        meta = await store.get_meta("a")
        assert meta == a
        assert await store.get_meta("zzz") is None


async def test_save_meta_merges_keys_and_keeps_turns(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s", metadata={"a": 1, "b": 2}, turns=(turn(0),)))
        await store.append_turns("s", [turn(1)])
        stale = session("s", metadata={"a": 10, "b": 99, "c": 3}, runs=(run("r"),))
        await store.save_meta(stale, SaveMetaOptions(meta_keys=("a", "c", "gone")))
        loaded = await store.load("s")
        assert loaded is not None
        assert loaded.metadata == {"a": 10, "b": 2, "c": 3}
        assert [t.id for t in loaded.turns] == ["t0", "t1"]
        assert [r.id for r in loaded.runs] == ["r"]
        # A snapshot never moves the session into running.
        assert loaded.status == "idle"
        await store.patch_meta("s", {"b": msgspec.UNSET, "d": 4})
        await store.patch_meta("unknown", {"x": 1})
        loaded = await store.load("s")
        assert loaded is not None and loaded.metadata == {"a": 10, "c": 3, "d": 4}


async def test_claim_run_is_exclusive_and_bumps_epoch(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        assert (await store.claim_run("ghost", stale_at=0)).claimed
        assert await store.list() == []  # no row written for an unknown id
        await store.save(session("s"))
        assert await store.run_epoch("s") == 0
        first = await store.claim_run("s", stale_at=0)
        assert (first.claimed, first.previous) == (True, "idle")
        assert not (await store.claim_run("s", stale_at=0)).claimed
        assert await store.run_epoch("s") == 1
        meta = await store.get_meta("s")
        assert meta is not None and meta.status == "running" and meta.run_owner is not None
        await store.update_status("s", "completed")
        again = await store.claim_run("s", stale_at=0)
        assert (again.claimed, again.previous) == (True, "completed")
        assert await store.run_epoch("s") == 2
        assert await store.run_epoch("ghost") is None


async def test_update_status_preserves_updated_at(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s", updated_at=7))
        await store.update_status("s", "error", preserve_updated_at=True)
        meta = await store.get_meta("s")
        assert meta is not None and (meta.status, meta.updated_at) == ("error", 7)
        await store.update_status("s", "idle")
        meta = await store.get_meta("s")
        assert meta is not None and meta.updated_at > 7
        await store.update_status("unknown", "idle")
        assert await store.list() == ["s"]


async def test_rev_grows_with_every_write(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s"))
        revs = []
        for write in (
            store.append_turns("s", [turn(0)]),
            store.patch_meta("s", {"k": 1}),
            store.update_run("s", run("r")),
            store.update_status("s", "idle", preserve_updated_at=True),
        ):
            await write
            meta = await store.get_meta("s")
            assert meta is not None and meta.rev is not None
            revs.append(meta.rev)
        assert revs == sorted(set(revs))


async def test_mutate_history_is_atomic(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("s", turns=tuple(turn(i) for i in range(4)), runs=(run("r"),)))

        def drop_second(h: SessionHistory) -> SessionHistory:
            return SessionHistory(turns=h.turns[:1] + h.turns[2:], runs=h.runs)

        assert await store.mutate_history("s", drop_second) == "ok"
        assert [t.id for t in await store.get_turns("s")] == ["t0", "t2", "t3"]
        assert await store.mutate_history("s", lambda h: None) == "unchanged"
        assert await store.mutate_history("none", drop_second) == "no-session"

        def boom(h: SessionHistory) -> SessionHistory:
            raise RuntimeError("edit failed")

        with pytest.raises(RuntimeError, match="edit failed"):
            await store.mutate_history("s", boom)
        assert [t.id for t in await store.get_turns("s")] == ["t0", "t2", "t3"]
        with pytest.warns(DeprecationWarning, match="mutate_history"):
            assert await store.mutate_turns("s", lambda ts: ts[::-1]) == "ok"
        loaded = await store.load("s")
        assert loaded is not None
        assert [t.id for t in loaded.turns] == ["t3", "t2", "t0"]
        assert [r.id for r in loaded.runs] == ["r"]
        # Appends keep numbering after a rewrite.
        await store.append_turns("s", [turn(9)])
        assert [t.id for t in await store.get_turns("s", 3)] == ["t9"]


async def test_apply_writes_isolates_failures(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("a"))
        await store.save(session("b"))
        results = await store.apply_writes(
            [
                StoreWrite("append_turns", ("a", [turn(0)])),
                StoreWrite("append_turns", ("missing", [turn(0)])),
                StoreWrite("append_turns", ("b", [turn(1)])),
                StoreWrite("load", ("a",)),
                StoreWrite("patch_meta", ("a", {"k": "v"})),
                StoreWrite("append_turns", ("a", [turn(2)])),
            ]
        )
        assert isinstance(results[0], outcome.Value)
        assert isinstance(results[1], outcome.Error)
        assert isinstance(results[1].error, SessionNotFoundError)
        assert isinstance(results[2], outcome.Value)
        assert isinstance(results[3], outcome.Error)
        assert isinstance(results[3].error, UnsupportedOperationError)
        assert all(isinstance(r, outcome.Value) for r in results[4:])
        assert [t.id for t in await store.get_turns("a")] == ["t0", "t2"]
        assert [t.id for t in await store.get_turns("b")] == ["t1"]
        assert store.statistics().transactions > 0
        assert await store.apply_writes([]) == []


async def test_apply_writes_lone_write(tmp_path: Path) -> None:
    """A lone write (no SAVEPOINT) is answered as in a batch: its error, nothing of it applied."""
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(session("a"))
        bad, missing, refused, ok = [
            (await store.apply_writes([w]))[0]
            for w in (
                StoreWrite("append_turns", ("a", [turn(0), "not a turn"])),
                StoreWrite("append_turns", ("missing", [turn(0)])),
                StoreWrite("load", ("a",)),
                StoreWrite("append_turns", ("a", [turn(1)])),
            )
        ]
        assert isinstance(bad, outcome.Error) and isinstance(bad.error, ValidationError)
        assert isinstance(missing, outcome.Error)
        assert isinstance(missing.error, SessionNotFoundError)
        assert isinstance(refused, outcome.Error)
        assert isinstance(refused.error, UnsupportedOperationError)
        assert isinstance(ok, outcome.Value) and ok.value.after == ok.value.before + 1
        assert [t.id for t in await store.get_turns("a")] == ["t1"]


async def test_apply_writes_transaction_failure_fails_every_write(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_sqlite_store(db, busy_timeout_ms=10, busy_retries=1) as store:
        await store.save(session("a"))
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            results = await store.apply_writes(
                [
                    StoreWrite("append_turns", ("a", [turn(0)])),
                    StoreWrite("patch_meta", ("a", {"k": 1})),
                ]
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        errors = [r.error for r in results if isinstance(r, outcome.Error)]
        assert len(errors) == 2
        assert all(isinstance(e, StoreUnavailableError) for e in errors)
        loaded = await store.load("a")
        assert loaded is not None and loaded.turns == () and loaded.metadata == {}


async def test_artifacts_upsert_cap_and_listing(tmp_path: Path) -> None:
    def art(i: int, kind: str = "file", uri: str | None = None, at: int = 0) -> SessionArtifact:
        return SessionArtifact(
            id=f"a{i}",
            session_id="s",
            kind=kind,
            uri=uri or f"file:///{i}",
            label=f"L{i}",
            created_at=at or i + 1,
            updated_at=at or i + 1,
        )

    async with open_sqlite_store(tmp_path / "s.db") as store:
        assert await store.upsert_artifact(art(0)) is None  # unknown session
        await store.save(session("s"))
        await store.upsert_artifact(art(0, "branch", "b://main"))
        for i in range(1, ARTIFACTS_PER_SESSION_CAP + 3):
            await store.upsert_artifact(art(i))
        rows = await store.list_artifacts()
        assert len(rows) == ARTIFACTS_PER_SESSION_CAP
        ids = {a.id for a in rows}
        assert "a0" in ids and "a1" not in ids and "a2" not in ids  # oldest files go first
        merged = await store.upsert_artifact(
            SessionArtifact(
                id="new", session_id="s", kind="branch", uri="b://main", label="M",
                created_at=99, updated_at=5_000,
            )
        )  # fmt: skip
        assert merged is not None and (merged.id, merged.label) == ("a0", "M")
        newest = await store.list_artifacts(ArtifactFilter(limit=1))
        assert [a.id for a in newest] == ["a0"]
        await store.delete_artifact("s", "a0")
        await store.delete_artifact("s", "nope")
        meta = await store.get_meta("s")
        assert meta is not None and meta.artifact_count == ARTIFACTS_PER_SESSION_CAP - 1
        await store.delete("s")
        assert await store.list_artifacts() == []


async def test_send_requests_are_claimed_once_and_bounded(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        assert (await store.claim_send_request("s", "q0", "f")).claimed
        again = await store.claim_send_request("s", "q0", "other")
        assert not again.claimed and again.record is not None
        assert again.record.fingerprint == "f" and again.record.result is msgspec.UNSET
        await store.settle_send_request("s", "q0", {"ok": True})
        record = await store.find_send_request("s", "q0")
        assert record is not None and record.result == {"ok": True}
        await store.settle_send_request("s", "q0", None)
        assert await store.find_send_request("s", "q0") is None
        for i in range(SEND_REQUEST_HISTORY + 5):
            await store.claim_send_request("s", f"r{i}", "f")
        assert await store.find_send_request("s", "r0") is None
        assert await store.find_send_request("s", f"r{SEND_REQUEST_HISTORY + 4}") is not None


async def test_schedules_claim_once(tmp_path: Path) -> None:
    sched = Schedule(id="d", prompt="p", enabled=True, created_at=1, updated_at=1, next_fire_at=100)
    async with open_sqlite_store(tmp_path / "s.db") as store:
        await store.save_schedule(sched)
        assert await store.claim_schedule_fire("d", 100, 200)
        assert not await store.claim_schedule_fire("d", 100, 200)
        await store.save_schedule(
            msgspec.structs.replace(sched, prompt="q"), keep_next_fire_at=True
        )
        for i in range(60):
            fire = ScheduleFire(id=f"f{i}", schedule_id="d", due_at=i, fired_at=i, status="ok")
            await store.record_schedule_fire(fire)
        (listed,) = await store.list_schedules()
        assert listed.next_fire_at == 200 and listed.prompt == "q"
        assert listed.last_fire is not None and listed.last_fire.id == "f59"
        fires = await store.list_schedule_fires("d", 100)
        assert len(fires) == 50 and fires[0].id == "f59"
        assert await store.delete_schedule("d")
        assert not await store.delete_schedule("d")


async def test_turn_rows_keep_id_and_role_in_their_columns_only(tmp_path: Path) -> None:
    """A turn row's body leaves out the id and role its columns hold (schema v9); rows
    stored whole (written before v9) read back as they are, beside new ones, through
    every read (load, get_turns, list_meta's first user turn), a retried append and an edit."""
    db = tmp_path / "rows.db"
    first = SessionTurn(
        id="u:1@x+=", role="user", content=(TextBlock(text="first"),), created_at=7,
        metadata={"id": "not the turn's", "role": 1},
    )  # fmt: skip
    async with open_sqlite_store(db) as store:
        await store.save(session("new", turns=(first, turn(1, "assistant"))))
        await store.append_turns("new", [turn(2)])
        await store.save(session("old"))
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, role, body FROM turns WHERE session_id = 'new' ORDER BY seq"
        ).fetchall()
        for tid, _, body in rows:
            assert body.startswith(b'{"content":') and tid.encode() not in body[:40]
        assert (
            rows[0][2]
            == b"{" + msgspec.json.encode(first)[len(b'{"id":"u:1@x+=","role":"user",') :]
        )
        # Rows stored whole, as v8 wrote them, in one session and beside compact rows.
        whole = [turn(0), turn(1, "assistant")]
        conn.executemany(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('old', ?, ?, ?, ?)",
            [(i, t.id, t.role, msgspec.json.encode(t)) for i, t in enumerate(whole)],
        )
    async with open_sqlite_store(db) as store:
        new = await store.load("new")
        assert new is not None and new.turns == (first, turn(1, "assistant"), turn(2))
        await store.append_turns("old", [turn(2)])
        old = await store.load("old")
        assert old is not None and old.turns == (*whole, turn(2))
        assert await store.get_turns("old", 1) == [turn(1, "assistant"), turn(2)]
        # A retried append of a turn stored whole is recognised as the same turn.
        await store.append_turns("old", [turn(0)])
        with pytest.raises(ConflictError):
            await store.append_turns("old", [turn(0, "assistant")])
        rows = {r.id: r.first_user_turn for r in await store.list_meta()}
        assert rows == {"new": first, "old": turn(0)}
        edit = lambda h: msgspec.structs.replace(h, turns=(h.turns[0], turn(3)))  # noqa: E731
        assert await store.mutate_history("old", edit) == "ok"
        old = await store.load("old")
        assert old is not None and old.turns == (turn(0), turn(3))
    with sqlite3.connect(db) as conn:
        bodies = [
            r[0]
            for r in conn.execute("SELECT body FROM turns WHERE session_id = 'old' ORDER BY seq")
        ]
        assert bodies[0] == msgspec.json.encode(turn(0))  # kept whole: the edit left it
        assert bodies[1].startswith(b'{"content":')


async def test_migrations(tmp_path: Path) -> None:
    empty = tmp_path / "v0.db"
    sqlite3.connect(empty).close()  # a v0 database: no tables, user_version 0
    async with open_sqlite_store(empty) as store:
        await store.save(session("s"))
    with sqlite3.connect(empty) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION

    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        async with open_sqlite_store(newer):
            pass

    garbage = tmp_path / "junk.db"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(CorruptDataError):
        async with open_sqlite_store(garbage):
            pass


async def test_v1_database_is_migrated_keeping_every_turn(tmp_path: Path) -> None:
    """A v1 file (turns clustered by session) opens at the current version with the same history."""
    db = tmp_path / "v1.db"
    conn = old_file(db, 1, "('a', 'idle', '{}', 1, 2), ('b', 'idle', '{}', 1, 2)")
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
        [
            (sid, i, f"t{i}", "user", msgspec.json.encode(turn(i)))
            for sid in "ab"
            for i in (2, 0, 1)
        ],
    )
    conn.close()
    async with open_sqlite_store(db) as store:
        assert [t.id for t in await store.get_turns("a")] == ["t0", "t1", "t2"]
        await store.append_turns("a", [turn(3)])
        assert [t.id for t in await store.get_turns("a", 2)] == ["t2", "t3"]
        meta = await store.get_meta("b")
        assert meta is not None and meta.turn_count == 3
    with sqlite3.connect(db) as conn:
        assert_current(conn)
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body)"
                " VALUES ('a', 0, 'x', 'user', x'')"
            )


async def test_v11_file_gains_forks_that_share_its_rows(tmp_path: Path) -> None:
    """Schema v12: a v11 file opens with the ``forks`` table; its sessions fork, and the
    fork's turns stay the source's rows until the source is rewritten."""
    db = tmp_path / "v11.db"
    conn = old_file(db, 11, "('a', 'idle', '{}', 1, 2)")
    conn.executemany(
        "INSERT INTO turns (session_id, seq, id, role, body) VALUES ('a', ?, ?, 'user', ?)",
        [(i, f"t{i}", msgspec.json.encode(turn(i))) for i in range(3)],
    )
    conn.close()
    async with open_sqlite_store(db) as store:
        await store.fork_session("a", "b", at="t1", created_at=5_000)
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT * FROM forks").fetchall() == [("b", "a", 2)]
            assert conn.execute("SELECT COUNT(*) FROM turns").fetchone() == (3,)
        await store.save(session("a", turns=(turn(9),)))
        fork = await store.load("b")
        assert fork is not None and [t.id for t in fork.turns] == ["t0", "t1"]
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT * FROM forks").fetchall() == []


async def test_v2_duplicate_turn_ids_are_merged_without_losing_a_turn(tmp_path: Path) -> None:
    """Schema v3: identical repeats collapse, differing ones are renamed, order kept, warned."""
    db = tmp_path / "v2.db"
    conn = old_file(db, 2, "('a', 'idle', '{}', 1, 2), ('b', 'idle', '{}', 1, 2)")
    other = msgspec.structs.replace(turn(1), role="assistant")
    rows = [("a", turn(0)), ("a", turn(1)), ("a", turn(1)), ("a", other), ("a", turn(2))]
    rows += [("b", turn(0)), ("b", turn(1))]
    seqs = {"a": 0, "b": 0}
    for sid, t in rows:
        conn.execute(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
            (sid, seqs[sid], t.id, t.role, msgspec.json.encode(t)),
        )
        seqs[sid] += 1
    conn.close()
    with pytest.warns(MigrationWarning, match="1 identical duplicate.*1 turn"):
        async with open_sqlite_store(db) as store:
            pass
    async with open_sqlite_store(db) as store:
        renamed = msgspec.structs.replace(other, id="t1.dup3")
        assert await store.get_turns("a") == [turn(0), turn(1), renamed, turn(2)]
        assert await store.get_turns("a", 2, 1) == [renamed]
        assert [t.id for t in await store.get_turns("b")] == ["t0", "t1"]
        await store.append_turns("a", [turn(3)])
        assert (await store.get_meta("a")).turn_count == 5  # type: ignore[union-attr]
        with pytest.raises(ConflictError, match="t3"):
            await store.append_turns("a", [msgspec.structs.replace(turn(3), role="assistant")])


def test_migrate_runs_each_step_once() -> None:
    steps = ("CREATE TABLE a (x)", "CREATE TABLE b (x); INSERT INTO b VALUES (1)")
    conn = sqlite3.connect(":memory:", isolation_level=None)
    assert migrate(conn, ":memory:", steps[:1]) == 1
    assert migrate(conn, ":memory:", steps) == 2
    assert migrate(conn, ":memory:", steps) == 2
    assert conn.execute("SELECT COUNT(*) FROM b").fetchone()[0] == 1
    with pytest.raises(StoreError, match="newer"):
        migrate(conn, ":memory:", steps[:1])


async def test_corrupt_turn_row_names_table_session_seq(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_sqlite_store(db) as store:
        await store.save(session("s", turns=(turn(0), turn(1), turn(2))))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE turns SET body = ? WHERE seq = 1", (b'{"id": "t1", "role"',))
    async with open_sqlite_store(db) as store:
        with pytest.raises(CorruptDataError, match=r"table turns.*'s'.*seq 1"):
            await store.load("s")
        with pytest.raises(CorruptDataError, match="seq 1"):
            await store.get_turns("s", 1)
        assert [t.id for t in await store.get_turns("s", 2)] == ["t2"]


async def test_one_unreadable_header_is_listed_as_corrupt_not_a_failed_listing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    async with open_sqlite_store(db) as store:
        for sid in ("good", "bad-meta", "bad-turn", "bad-owner"):
            await store.save(session(sid, turns=(turn(0),)))
    deep = b'{"id":"t0","role":"user","content":[{"type":"text","text":"x"}],"createdAt":1}'
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET metadata = '{not json' WHERE id = 'bad-meta'")
        conn.execute("UPDATE turns SET body = ? WHERE session_id = 'bad-turn'", (deep[:30],))
        conn.execute("UPDATE sessions SET run_owner = '[1]' WHERE id = 'bad-owner'")
    async with open_sqlite_store(db) as store:
        rows = {row.id: row for row in await store.list_meta()}
        assert set(rows) == {"good", "bad-meta", "bad-turn", "bad-owner"}
        assert rows["good"].corrupt is None and rows["good"].turn_count == 1
        for sid in ("bad-meta", "bad-turn", "bad-owner"):
            assert rows[sid].corrupt is not None and sid in rows[sid].corrupt, rows[sid]
            assert rows[sid].turn_count == 0 and rows[sid].metadata == {}
        with pytest.raises(CorruptDataError, match="bad-meta"):
            await store.get_meta("bad-meta")  # one session asked for: its error


async def test_locked_database_maps_to_unavailable(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_sqlite_store(db, busy_timeout_ms=10, busy_retries=2) as store:
        await store.save(session("s"))
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailableError, match="locked after 2 retries"):
                await store.append_turns("s", [turn(0)])
            assert store.statistics().busy_retries == 2
            # Reads still see the last committed snapshot under WAL.
            assert await store.get_turns("s") == []
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await store.append_turns("s", [turn(0)])
        assert len(await store.get_turns("s")) == 1


async def test_lock_released_within_budget_is_invisible(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_sqlite_store(db, busy_timeout_ms=20, busy_retries=10) as store:
        await store.save(session("s"))
        blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        async with trio.open_nursery() as nursery:

            async def release() -> None:
                await trio.sleep(0.1)
                blocker.execute("ROLLBACK")

            nursery.start_soon(release)
            await store.append_turns("s", [turn(0)])
        blocker.close()
        assert store.statistics().busy_retries >= 1
        assert len(await store.get_turns("s")) == 1


async def test_cancelled_write_in_flight_still_lands(tmp_path: Path) -> None:
    """A write already running in the worker thread is never abandoned by a cancel."""
    db = tmp_path / "s.db"
    async with open_sqlite_store(db, busy_timeout_ms=5_000) as store:
        await store.save(session("s"))
        blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        async with trio.open_nursery() as nursery:

            async def release() -> None:
                await trio.sleep(0.3)
                blocker.execute("ROLLBACK")

            nursery.start_soon(release)
            with trio.move_on_after(0.05):
                await store.append_turns("s", [turn(0)])
        blocker.close()
        assert [t.id for t in await store.get_turns("s")] == ["t0"]


async def test_concurrent_tasks_share_one_connection(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db", durability="normal") as store:
        await store.save(session("s"))

        async def writer(w: int) -> None:
            for i in range(10):
                await store.append_turns("s", [turn(w * 100 + i)])

        async with trio.open_nursery() as nursery:
            for w in range(20):
                nursery.start_soon(writer, w)
        ids = [t.id for t in await store.get_turns("s")]
        assert sorted(ids) == sorted(f"t{w * 100 + i}" for w in range(20) for i in range(10))
        for w in range(20):  # each task's own appends keep their order
            own = [f"t{w * 100 + i}" for i in range(10)]
            assert [i for i in ids if i in set(own)] == own


async def test_closed_store_refuses(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        pass
    with pytest.raises(StoreClosedError):
        await store.load("s")
    await store.aclose()  # idempotent
    with pytest.raises(ValidationError):
        async with open_sqlite_store(tmp_path / "x.db", durability="sometimes"):  # type: ignore[arg-type]
            pass


async def test_every_durability_level_opens(tmp_path: Path) -> None:
    for level in ("full", "normal", "off"):
        async with open_sqlite_store(tmp_path / f"{level}.db", durability=level) as store:
            await store.save(session("s"))
            assert await store.list() == ["s"]


async def test_ids_are_fresh(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "s.db") as store:
        ids = {await store.generate_session_id() for _ in range(5)}
        ids |= {await store.generate_turn_id() for _ in range(5)}
        assert len(ids) == 10


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from("ab"), st.integers(1, 3)),
        st.tuples(st.just("save"), st.sampled_from("ab"), st.integers(0, 3)),
        st.tuples(st.just("drop"), st.sampled_from("ab"), st.integers(0, 5)),
        st.tuples(st.just("patch"), st.sampled_from("ab"), st.integers(0, 3)),
        st.tuples(st.just("run"), st.sampled_from("ab"), st.integers(0, 2)),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
async def test_matches_the_memory_store(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    """Any program of writes leaves SQLite (after a reopen) and memory with the same sessions."""
    db = tmp_path_factory.mktemp("prop") / "s.db"
    memory = MemoryStore()
    counter = 0

    async def apply(store: Any, op: tuple[str, str, int]) -> None:
        kind, sid, n = op
        try:
            if kind == "append":
                await store.append_turns(sid, [turn(counter + i) for i in range(n)])
            elif kind == "save":
                await store.save(session(sid, turns=tuple(turn(100 + i) for i in range(n))))
            elif kind == "drop":

                def drop(h: SessionHistory) -> SessionHistory | None:
                    if n >= len(h.turns):
                        return None
                    return SessionHistory(turns=h.turns[:n] + h.turns[n + 1 :], runs=h.runs)

                await store.mutate_history(sid, drop)
            elif kind == "patch":
                await store.patch_meta(sid, {f"k{n}": n})
            else:
                await store.update_run(sid, run(f"r{n}", "completed"))
        except SessionNotFoundError:
            pass

    async with open_sqlite_store(db, durability="off") as sqlite_store:
        for op in ops:
            await apply(memory, op)
            await apply(sqlite_store, op)
            counter += 10
    async with open_sqlite_store(db, durability="off") as reopened:
        assert await reopened.list() is not None
        for sid in "ab":
            want = await memory.load(sid)
            got = await reopened.load(sid)
            if want is None:
                assert got is None
                continue
            assert got is not None
            assert got.turns == want.turns
            assert got.runs == want.runs
            assert got.metadata == want.metadata
            meta = await reopened.get_meta(sid)
            assert meta is not None and meta.turn_count == len(want.turns)


_BATCH = st.lists(
    st.one_of(
        # (kind, session, n, flag): "ghost" is never created
        st.tuples(
            st.just("append"),
            st.sampled_from(["a", "b", "ghost"]),
            st.integers(0, 2),
            st.booleans(),
        ),
        st.tuples(st.just("run"), st.sampled_from(["a", "b"]), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("patch"), st.sampled_from(["a", "ghost"]), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("bad"), st.sampled_from(["a", "b"]), st.just(0), st.just(0)),
        st.tuples(st.just("delete"), st.just("b"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=_BATCH, clean=st.booleans())
async def test_one_batch_equals_the_writes_one_by_one(
    tmp_path_factory: pytest.TempPathFactory,
    program: list[tuple[str, str, int, bool]],
    clean: bool,
) -> None:
    """``apply_writes`` (runs of appends bulk-inserted) == each write called alone, in order.

    ``clean`` programs hold only writes that succeed, so the one-savepoint path
    answers them; the others exercise the write-by-write fallback.
    """
    if clean:
        program = [w for w in program if w[0] in ("append", "run", "patch") and w[1] != "ghost"]
    tmp = tmp_path_factory.mktemp("batch")
    writes = []
    for i, (kind, sid, n, flag) in enumerate(program):
        if kind == "append":
            turns = [turn(100 * i + k) for k in range(n)]
            options = AppendTurnsOptions(run=run(f"r{i}")) if flag else None
            writes.append(StoreWrite("append_turns", (sid, turns, options)))
        elif kind == "run":
            writes.append(StoreWrite("update_run", (sid, run(f"r{n}", "completed"))))
        elif kind == "patch":
            writes.append(StoreWrite("patch_meta", (sid, {f"k{n}": i})))
        elif kind == "bad":
            writes.append(StoreWrite("append_turns", (sid, [turn(i), "not a turn"])))
        else:
            writes.append(StoreWrite("delete", (sid,)))
    async with (
        open_sqlite_store(tmp / "batched.db", durability="off") as batched,
        open_sqlite_store(tmp / "alone.db", durability="off") as alone,
    ):
        for store in (batched, alone):
            await store.save(session("a", turns=(turn(-1),)))
            await store.save(session("b"))
        got = await batched.apply_writes(writes)
        want = [
            await outcome.acapture(getattr(alone, w.method), *w.args, **w.kwargs) for w in writes
        ]
        assert [type(r) for r in got] == [type(r) for r in want]
        assert [type(getattr(r, "error", None)) for r in got] == [
            type(getattr(r, "error", None)) for r in want
        ]
        for sid in ("a", "b", "ghost"):
            mine, theirs = await batched.load(sid), await alone.load(sid)
            if theirs is None:
                assert mine is None
                continue
            assert mine is not None
            assert (mine.turns, mine.runs, mine.metadata) == (
                theirs.turns,
                theirs.runs,
                theirs.metadata,
            )
            meta_mine, meta_theirs = await batched.get_meta(sid), await alone.get_meta(sid)
            assert meta_mine is not None and meta_theirs is not None
            assert meta_mine.rev == meta_theirs.rev


def test_store_is_exported() -> None:
    import zidane_actors.stores as stores

    assert stores.SQLiteStore is SQLiteStore


async def test_a_session_deleted_before_v3_is_recreated_with_a_higher_rev(tmp_path: Path) -> None:
    """v1/v2 did not record a deleted session's rev: re-created after migration, rev still grows."""
    db = tmp_path / "v2.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, str(db), MIGRATIONS[:2]) == 2
    conn.execute(
        "INSERT INTO sessions (id, status, metadata, created_at, updated_at, rev)"
        " VALUES ('gone', 'idle', '{}', 1, 2, 41)"
    )
    conn.execute("DELETE FROM sessions WHERE id = 'gone'")
    conn.close()
    async with open_sqlite_store(db) as store:
        await store.save(make_session("gone"))
        meta = await store.get_meta("gone")
        assert meta is not None and meta.rev is not None and meta.rev > 41


async def test_apply_reads_answers_each_read_in_order_from_one_transaction(
    tmp_path: Path,
) -> None:
    """Reads made together: each answers what the read alone would (errors in their
    own slot), header, rev, turn and session reads in one read transaction."""
    async with open_sqlite_store(tmp_path / "r.db") as store:
        await store.save(session("a", turns=(turn(0), turn(1, "assistant"))))
        reads = [
            StoreWrite("get_meta", ("a",)),
            StoreWrite("get_rev", ("a",)),
            StoreWrite("get_rev", ("missing",)),
            StoreWrite("get_turns", ("a", 1)),
            StoreWrite("load", ("a",)),
            StoreWrite("load_versioned", ("missing",)),
            StoreWrite("get_meta", ("../bad",)),
            StoreWrite("list_meta", ()),
            StoreWrite("get_turns", ("a",), {"limit": -1}),
        ]
        before = store.statistics().transactions
        answers = await store.apply_reads(reads)
        assert store.statistics().transactions - before == 2  # the batch, then list_meta
        alone = [
            await outcome.acapture(getattr(store, r.method), *r.args, **r.kwargs) for r in reads
        ]
    assert [type(a) for a in answers] == [type(a) for a in alone]
    for mine, theirs in zip(answers, alone, strict=True):
        if isinstance(mine, outcome.Error):
            assert isinstance(theirs, outcome.Error)
            assert type(mine.error) is type(theirs.error) and str(mine.error) == str(theirs.error)
        else:
            assert mine == theirs
    assert isinstance(answers[6], outcome.Error) and isinstance(answers[6].error, InvalidNameError)
    assert answers[2] == outcome.Value(None) and answers[3] == outcome.Value([turn(1, "assistant")])
