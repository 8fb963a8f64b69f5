"""Fault injection against a SQLite-backed server process: crashes, slow and failed answers.

The invariant every test checks: an acknowledged turn is stored exactly once,
and no turn is ever stored twice.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from test_server_e2e import ServerProcess

from zidane_actors.errors import RemoteStoreError, StoreUnavailableError
from zidane_actors.model import SessionData, SessionHistory, SessionTurn, TextBlock
from zidane_actors.stores import RemoteStore, create_remote_store


def turn(n: int) -> SessionTurn:
    return SessionTurn(
        id=f"t{n}", role="user", content=(TextBlock(text=f"message {n}"),), created_at=n
    )


def counts(turns: list[SessionTurn]) -> collections.Counter[str]:
    return collections.Counter(t.id for t in turns)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


def server_with(db: Path, faults: str | None = None) -> ServerProcess:
    env = {"ZIDANE_ACTORS_FAULTS": faults} if faults else None
    return ServerProcess(f"sqlite:{db}", env=env)


@pytest.fixture
def crashing_server(db: Path) -> Iterator[ServerProcess]:
    server = server_with(db)
    server.start()
    yield server
    server.stop()


async def test_server_killed_mid_request_loses_no_acknowledged_turn(
    crashing_server: ServerProcess,
) -> None:
    acknowledged: list[str] = []
    failed: list[str] = []
    writing_done = trio.Event()
    reached = {10: trio.Event(), 35: trio.Event()}
    # Retries with backoff span a restart (~1-2 s): no append should fail at all.
    async with create_remote_store(crashing_server.url, timeout_ms=2_000, retries=25) as store:
        await store.save(SessionData(id="s1", created_at=1, updated_at=1))

        async def writer() -> None:
            for n in range(60):
                try:
                    await store.append_turns("s1", [turn(n)])
                except StoreUnavailableError:
                    failed.append(f"t{n}")
                else:
                    acknowledged.append(f"t{n}")
                    if len(acknowledged) in reached:
                        reached[len(acknowledged)].set()
            writing_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            for event in reached.values():
                await event.wait()
                # SIGKILL while the writer has a request in flight, then restart on the file.
                await trio.to_thread.run_sync(crashing_server.restart)
            await writing_done.wait()
        stored = counts(await store.get_turns("s1"))
        assert store.statistics().retries > 0, "no kill landed on a request"
    assert not failed
    assert max(stored.values()) == 1, "a turn was stored twice"
    assert set(acknowledged) <= set(stored), "an acknowledged turn was lost"
    assert len(acknowledged) == 60


async def test_answers_past_the_timeout_are_retried_without_duplicates(db: Path) -> None:
    # Every 2nd answer comes 1 s late: after the write, so the retry finds it stored.
    server = server_with(db, "delay_ms=1000,delay_every=2")
    url = server.start()
    try:
        async with create_remote_store(url, timeout_ms=300, retries=4) as store:
            await store.save(SessionData(id="s1", created_at=1, updated_at=1))
            for n in range(6):
                await store.append_turns("s1", [turn(n)])
            stored = await store.get_turns("s1")
            assert store.statistics().timeouts >= 3
        assert [t.id for t in stored] == [f"t{n}" for n in range(6)]
    finally:
        server.stop()


async def test_timeout_without_retries_is_store_unavailable_and_a_retry_is_safe(
    db: Path,
) -> None:
    # The margins are wide (a prompt answer has 1 s, a late one comes 3 s late), so a
    # loaded machine cannot make a prompt answer look late.
    server = server_with(db, "delay_ms=3000,delay_every=2")
    url = server.start()
    try:
        async with create_remote_store(url, timeout_ms=1000, retries=0) as store:
            await store.save(SessionData(id="s1", created_at=1, updated_at=1))  # request 1
            with pytest.raises(StoreUnavailableError, match="timed out"):
                await store.append_turns("s1", [turn(1)])  # request 2: late
            await store.append_turns("s1", [turn(1)])  # request 3: the caller's own retry
        async with create_remote_store(url) as patient:  # request 4 is late too
            assert [t.id for t in await patient.get_turns("s1")] == ["t1"]
    finally:
        server.stop()


async def test_injected_500s_after_the_write_are_retried_exactly_once(db: Path) -> None:
    server = server_with(db, "fail_every=3")
    url = server.start()
    try:
        async with create_remote_store(url, retries=3) as store:
            await store.save(SessionData(id="s1", created_at=1, updated_at=1))
            for n in range(12):
                await store.append_turns("s1", [turn(2 * n), turn(2 * n + 1)])
            stored = counts(await store.get_turns("s1"))
            assert store.statistics().retries >= 5  # every 3rd of ~19 requests
        assert stored == collections.Counter(f"t{n}" for n in range(24))
    finally:
        server.stop()


async def test_history_write_whose_answer_was_lost_is_recognised(db: Path) -> None:
    # Requests: 1 save, 2 GET history (500, retried), 3 GET, 4 PUT history applied but
    # answered 500, 5 its retry gets 409, 6-7 the re-read shows the written revision.
    server = server_with(db, "fail_every=2")
    url = server.start()
    try:
        async with create_remote_store(url, retries=2) as store:
            await store.save(
                SessionData(id="s1", created_at=1, updated_at=1, turns=(turn(1), turn(2)))
            )
            calls = 0

            def drop_first(history: SessionHistory) -> SessionHistory:
                nonlocal calls
                calls += 1
                return SessionHistory(turns=history.turns[1:], runs=history.runs)

            assert await store.mutate_history("s1", drop_first) == "ok"
            assert calls == 1, "the mutation was applied twice"
            assert [t.id for t in await store.get_turns("s1")] == ["t2"]
    finally:
        server.stop()


async def test_claims_are_not_retried(db: Path) -> None:
    server = server_with(db, "fail_every=2")
    url = server.start()
    try:
        store: RemoteStore
        async with create_remote_store(url, retries=5) as store:
            await store.save(SessionData(id="s1", created_at=1, updated_at=1))  # request 1
            with pytest.raises(RemoteStoreError) as info:
                await store.claim_run("s1", stale_at=0)  # request 2: applied, answered 500
            assert (info.value.status, info.value.code) == (500, "injected")
            data = await store.load("s1")
            assert data is not None
            assert data.status == "running"
    finally:
        server.stop()
