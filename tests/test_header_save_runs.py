"""A header save (``save_meta``) sends only the runs the store is not known to hold as they are.

The store's ``save_meta`` upserts the runs it is given and never deletes
one, so over the rev the session expects, sending the runs that differ from
what the store last showed or acknowledged leaves the store exactly as
sending them all would. Every test runs on every store: what the store holds
afterwards is read back whole through a second host (its own store object
where the store allows it), and the runs a header save sent are counted where
the store receives them (``save_meta`` and ``apply_writes`` of host A's store
object); on PostgreSQL a run row left alone also keeps its row version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import psycopg
import pytest
import trio
from psycopg import sql
from test_postgres_store import DSN, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors.actors import RunStats, Session, SessionHost, open_session_host
from zidane_actors.model import SessionData, SessionRun, SessionTurn, TextBlock, upsert_runs
from zidane_actors.stores import (
    SessionStore,
    create_file_map_store,
    create_remote_store,
    open_directory_adapter,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
)

BACKENDS = ("memory", "sqlite", "file-map", "remote", "postgres")
"""Every store; ids containing "postgres" are skipped where no PostgreSQL answers."""

RUNS = 12
"""Runs each session holds before the header saves under test."""


@dataclass
class SentRuns:
    """The run ids each ``save_meta`` host A's store object received, in order."""

    calls: list[tuple[str, ...]] = field(default_factory=list)

    def record(self, data: SessionData) -> None:
        self.calls.append(tuple(r.id for r in data.runs))

    def since(self, mark: int) -> list[tuple[str, ...]]:
        return self.calls[mark:]


class Counted:
    """``store`` with the runs it receives through ``save_meta``, alone or in a batch,
    counted in ``sent`` (every other attribute is the store's own)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.sent = SentRuns()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def save_meta(self, data: SessionData, *args: Any, **kwargs: Any) -> Any:
        self.sent.record(data)
        return await self.store.save_meta(data, *args, **kwargs)  # type: ignore[attr-defined]

    def apply_nowait(self, call: Any) -> Any:
        """The store's own, when it has one (``trio.WouldBlock``: nothing received)."""
        make = getattr(self.store, "apply_nowait", None)
        if make is None:
            raise trio.WouldBlock
        result = make(call)
        if call.method == "save_meta":
            self.sent.record(call.args[0])
        return result

    async def apply_writes(self, writes: Sequence[Any]) -> Any:
        for write in writes:
            if write.method == "save_meta":
                self.sent.record(write.args[0])
        return await self.store.apply_writes(writes)  # type: ignore[attr-defined]


@dataclass
class Rig:
    backend: str
    host_a: SessionHost
    host_b: SessionHost
    host_c: SessionHost
    store_b: SessionStore
    sent: SentRuns
    schema: str | None


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One memory-backed server process for the remote store."""
    with ServerProcess("memory") as process:
        yield process


@asynccontextmanager
async def open_rig(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Rig]:
    async with AsyncExitStack() as stack:
        store_a: SessionStore
        store_b: SessionStore
        schema = None
        if backend == "memory":
            store_a = store_b = await stack.enter_async_context(open_memory_store())
        elif backend == "file-map":  # one writer per directory: one store object
            adapter = await stack.enter_async_context(open_directory_adapter(tmp_path / "m"))
            file_map = create_file_map_store(adapter)
            stack.push_async_callback(file_map.aclose)
            store_a = store_b = file_map
        elif backend == "sqlite":
            store_a = await stack.enter_async_context(open_sqlite_store(tmp_path / "s.db"))
            store_b = await stack.enter_async_context(open_sqlite_store(tmp_path / "s.db"))
        elif backend == "postgres":
            schema = stack.enter_context(fresh_schema())
            store_a = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
            store_b = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
        else:
            url = cast(ServerProcess, request.getfixturevalue("server")).url
            store_a = await stack.enter_async_context(create_remote_store(url))
            store_b = await stack.enter_async_context(create_remote_store(url))
        counted = Counted(store_a)
        store_a = cast(SessionStore, counted)
        host_a = await stack.enter_async_context(open_session_host(store_a))
        host_b = await stack.enter_async_context(open_session_host(store_b))
        host_c = await stack.enter_async_context(open_session_host(store_a))
        yield Rig(backend, host_a, host_b, host_c, store_b, counted.sent, schema)


def turn(turn_id: str) -> SessionTurn:
    return SessionTurn(
        id=turn_id, role="user", content=(TextBlock(f"text of {turn_id}"),), created_at=1
    )


async def with_runs(host: SessionHost, sid: str) -> Session:
    """A session holding ``RUNS`` finished runs and a turn, each written by its own write."""
    session = await host.create_session(id=sid, metadata={"k": 0})
    for i in range(RUNS):
        await session.start_run(f"r{i}", f"prompt {i}")
        await session.complete_run(f"r{i}", RunStats(tokens_in=i, tokens_out=1, turns=1))
    await session.append_turns([turn("u0")])
    return session


async def stored_by_b(rig: Rig, sid: str) -> SessionData:
    """The whole stored document, read through host B's store object."""
    data = await rig.store_b.load(sid)
    assert data is not None, f"{rig.backend}: the store lost {sid!r}"
    return data


def run_row_versions(schema: str, sid: str) -> dict[str, str]:
    """PostgreSQL's row version (``xmin``) of each of ``sid``'s run rows."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, xmin::text FROM {}.runs WHERE session_id = %s").format(
                sql.Identifier(schema)
            ),
            (sid,),
        ).fetchall()
    return {str(i): str(x) for i, x in rows}


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKENDS)
async def test_a_header_save_sends_no_run_the_store_holds(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Runs written by the session's own run writes, or read at a load, are not sent again."""
    async with open_rig(backend, tmp_path, request) as rig:
        a = await with_runs(rig.host_a, "s-own")
        versions = run_row_versions(rig.schema, "s-own") if rig.schema else {}
        mark = len(rig.sent.calls)
        await a.set_meta("k", 1)
        await a.save_meta_keys(["k"])
        await a.update_run(msgspec.structs.replace(a.runs[3], label="relabelled"))
        await a.set_meta("k", 2)
        await a.save_meta_keys(["k"])
        assert rig.sent.since(mark) == [(), ()], (
            f"{backend}: header saves after own run writes must send no run, "
            f"sent {rig.sent.since(mark)}"
        )
        stored = await stored_by_b(rig, "s-own")
        assert stored == a.to_json(), f"{backend}: the store must hold memory's document"
        assert stored.runs[3].label == "relabelled" and stored.metadata == {"k": 2}
        if rig.schema:
            after = run_row_versions(rig.schema, "s-own")
            moved = sorted(r for r in after if after[r] != versions[r])
            assert moved == ["r3"], f"only r3's row is rewritten (its update_run), got {moved}"

        # A session host C loads from the store (over A's counting store object) sends
        # none either, also when B moved the rev first (refused, folded, retried).
        c = await rig.host_c.load_session("s-own")
        b = await rig.host_b.load_session("s-own")
        assert c is not None and b is not None
        await b.set_meta("from-b", True)
        await b.save_meta_keys(["from-b"])
        mark = len(rig.sent.calls)
        await c.set_meta("k", 3)
        await c.save_meta_keys(["k"])
        assert rig.sent.since(mark) and all(call == () for call in rig.sent.since(mark)), (
            f"{backend}: a loaded session's header saves sent {rig.sent.since(mark)}"
        )
        stored = await stored_by_b(rig, "s-own")
        assert stored == c.to_json(), f"{backend}: the store must hold C's document"
        assert stored.metadata == {"k": 3, "from-b": True} and stored.runs == a.to_json().runs


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKENDS)
async def test_a_run_set_in_memory_is_the_only_run_a_header_save_sends(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``set_runs`` changing one run, then ``save_meta_keys``: that run alone is sent, and
    the store holds what sending them all would have left."""
    async with open_rig(backend, tmp_path, request) as rig:
        a = await with_runs(rig.host_a, "s-set")
        before = await stored_by_b(rig, "s-set")
        versions = run_row_versions(rig.schema, "s-set") if rig.schema else {}
        changed = msgspec.structs.replace(a.runs[5], label="changed", status="error")
        added = SessionRun(id="r-new", prompt="added in memory", started_at=5, status="aborted")
        await a.set_runs([*a.runs[:5], changed, *a.runs[6:], added])
        await a.set_meta("k", 1)
        mark = len(rig.sent.calls)
        await a.save_meta_keys(["k"])
        assert rig.sent.since(mark) == [("r5", "r-new")], (
            f"{backend}: the header save must send the changed and the new run only, "
            f"sent {rig.sent.since(mark)}"
        )
        expected = msgspec.structs.replace(
            before,
            runs=upsert_runs(before.runs, (changed, added)),
            metadata={"k": 1},
            updated_at=a.updated_at,
        )
        assert await stored_by_b(rig, "s-set") == expected, (
            f"{backend}: the store must hold the document a save of every run leaves"
        )
        if rig.schema:
            after = run_row_versions(rig.schema, "s-set")
            moved = sorted(r for r in versions if after[r] != versions[r])
            assert moved == ["r5"] and "r-new" in after, f"rewritten run rows: {moved}"

        mark = len(rig.sent.calls)
        await a.set_meta("k", 2)
        await a.save_meta_keys(["k"])  # the store acknowledged both: nothing to send again
        assert rig.sent.since(mark) == [()], f"{backend}: sent again {rig.sent.since(mark)}"
        await a.save()  # the pending set_runs: a bulk save of the whole document
        assert await stored_by_b(rig, "s-set") == a.to_json()


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKENDS)
async def test_a_header_save_keeps_another_writers_run(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """B changes a run; A's header save over its older view is refused, folded, retried: it
    sends no run, and the store keeps B's run record."""
    async with open_rig(backend, tmp_path, request) as rig:
        a = await with_runs(rig.host_a, "s-other")
        b = await rig.host_b.load_session("s-other")
        assert b is not None
        theirs = msgspec.structs.replace(b.runs[7], label="B's")
        await b.update_run(theirs)
        await a.set_meta("k", 1)
        mark = len(rig.sent.calls)
        await a.save_meta_keys(["k"])
        assert all(call == () for call in rig.sent.since(mark)), (
            f"{backend}: sent {rig.sent.since(mark)}"
        )
        stored = await stored_by_b(rig, "s-other")
        assert stored.runs[7] == theirs, f"{backend}: B's run must stay, got {stored.runs[7]}"
        assert stored == a.to_json(), f"{backend}: A's memory must be the stored document"
