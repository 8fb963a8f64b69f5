"""A load never breaks a live run: the stale-running demotion reaches the store only when stale.

Two store handles on one SQLite file (and two stores on one PostgreSQL
schema) stand for two processes: the owner claims the session, a reader
loads it. The reader's memory shows ``idle``; the owner's marker stays, so a
second claim still loses. A dead owner's marker, or one past the horizon of
the reader's injected clock, is demoted in the store too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from store_contract import dead_pid, make_run, make_session, make_turn, now_ms
from test_postgres_store import DSN, fresh_schema

from zidane_actors.actors import load_session, open_session_host
from zidane_actors.model import RUN_OWNER_HOLD_MS, RunOwner, host_id
from zidane_actors.stores import open_postgres_store, open_sqlite_store

Opener = Callable[[], AbstractAsyncContextManager[Any]]

LIVE_ELSEWHERE = RunOwner(host_id="another-host", pid=4242, token="live")


@pytest.fixture(params=["sqlite", "postgres"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens another handle on one shared storage per call (another "process")."""
    if request.param == "sqlite":
        yield lambda: open_sqlite_store(tmp_path / "shared.db")
        return
    with fresh_schema() as schema:
        yield lambda: open_postgres_store(DSN, schema=schema, pool_size=1)


@asynccontextmanager
async def two_handles(opener: Opener) -> AsyncIterator[tuple[Any, Any]]:
    async with opener() as owner_side, opener() as reader_side:
        yield owner_side, reader_side


async def seed_running(store: Any, owner: RunOwner) -> int:
    """A session with a running run, claimed by ``owner``; answers its epoch."""
    await store.save(make_session("s", turns=(make_turn(1),), runs=(make_run("r1", "running"),)))
    claim = await store.claim_run("s", stale_at=now_ms() - RUN_OWNER_HOLD_MS, owner=owner)
    assert claim.claimed
    epoch: int = await store.run_epoch("s")
    return epoch


@pytest.mark.parametrize("entry", ["load_session", "host"])
async def test_a_reader_load_keeps_a_live_owners_marker(opener: Opener, entry: str) -> None:
    async with two_handles(opener) as (owner_side, reader_side):
        epoch = await seed_running(owner_side, LIVE_ELSEWHERE)
        if entry == "host":
            async with open_session_host(reader_side) as host:
                session = await host.load_session("s")
                assert session is not None
                assert session.status == "idle"
        else:
            session = await load_session(reader_side, "s")
            assert session is not None
            assert session.status == "idle"  # memory shows the demotion
            assert session.runs[0].status == "aborted"
        stored = await owner_side.load("s")
        assert (stored.status, stored.run_owner) == ("running", LIVE_ELSEWHERE)
        assert stored.runs[0].status == "running"
        assert await owner_side.run_epoch("s") == epoch
        second = RunOwner(host_id="third-host", pid=1, token="t")
        claim = await reader_side.claim_run(
            "s", stale_at=now_ms() - RUN_OWNER_HOLD_MS, owner=second
        )
        assert not claim.claimed


async def test_a_dead_owners_marker_is_demoted_in_the_store(opener: Opener) -> None:
    dead = RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")
    async with two_handles(opener) as (owner_side, reader_side):
        await seed_running(owner_side, dead)
        before = await owner_side.load("s")
        session = await load_session(reader_side, "s")
        assert session is not None and session.status == "idle"
        stored = await owner_side.load("s")
        assert (stored.status, stored.run_owner) == ("idle", None)
        assert stored.runs[0].status == "aborted"
        assert stored.updated_at == before.updated_at  # a heal does not reorder listings


async def test_the_injected_clock_judges_staleness(opener: Opener) -> None:
    async with two_handles(opener) as (owner_side, reader_side):
        await seed_running(owner_side, LIVE_ELSEWHERE)
        stamped = (await owner_side.load("s")).updated_at
        within = await load_session(reader_side, "s", clock=lambda: stamped + 1_000)
        assert within is not None and within.status == "idle"
        assert (await owner_side.load("s")).status == "running"
        async with open_session_host(reader_side) as host:
            later = stamped + RUN_OWNER_HOLD_MS + 1
            evicted = await host.load_session("s", clock=lambda: later)
            assert evicted is not None and evicted.status == "idle"
        assert (await owner_side.load("s")).status == "idle"


async def test_a_marker_refreshed_after_the_read_is_not_overwritten(opener: Opener) -> None:
    """The demotion is re-judged in the writing transaction: a claim in between wins."""
    dead = RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")
    async with two_handles(opener) as (owner_side, reader_side):
        await seed_running(owner_side, dead)
        now = now_ms()
        # The reader read a dead marker; before it writes, a live owner claims.
        claim = await owner_side.claim_run(
            "s", stale_at=now - RUN_OWNER_HOLD_MS, owner=LIVE_ELSEWHERE
        )
        assert claim.claimed
        assert not await reader_side.demote_stale_run(
            "s", stale_at=now - RUN_OWNER_HOLD_MS, now=now
        )
        stored = await owner_side.load("s")
        assert (stored.status, stored.run_owner) == ("running", LIVE_ELSEWHERE)


async def test_persist_heal_false_writes_nothing(opener: Opener) -> None:
    dead = RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")
    async with two_handles(opener) as (owner_side, reader_side):
        await seed_running(owner_side, dead)
        session = await load_session(reader_side, "s", persist_heal=False)
        assert session is not None and session.status == "idle"
        assert (await owner_side.load("s")).status == "running"


@pytest.mark.parametrize("entry", ["load_session", "host"])
@pytest.mark.parametrize("bulk", [False, True], ids=["save_meta", "bulk save"])
async def test_a_readers_save_leaves_a_live_owners_marker_and_runs(
    opener: Opener, entry: str, bulk: bool
) -> None:
    """Memory shows the demotion; a save of that view writes the stored marker back as it is."""
    async with (
        two_handles(opener) as (owner_side, reader_side),
        open_session_host(reader_side) as host,
    ):
        await seed_running(owner_side, LIVE_ELSEWHERE)
        loaded = (
            await host.load_session("s")
            if entry == "host"
            else await load_session(reader_side, "s")
        )
        assert loaded is not None
        assert (loaded.status, loaded.runs[0].status) == ("idle", "aborted")
        await loaded.set_meta("note", "read while it ran")
        if bulk:
            await loaded.set_turns([*loaded.turns, make_turn(2)])
        await loaded.save()
        stored = await owner_side.load("s")
        assert stored.metadata["note"] == "read while it ran"
        assert len(stored.turns) == (2 if bulk else 1)
        assert (stored.status, stored.run_owner) == ("running", LIVE_ELSEWHERE)
        assert stored.runs[0].status == "running"
        claim = await reader_side.claim_run("s", stale_at=now_ms() - RUN_OWNER_HOLD_MS)
        assert not claim.claimed
        # What the reader sets itself is written: its own status change settles it.
        await loaded.update_status("idle")
        assert (await owner_side.load("s")).status == "idle"
