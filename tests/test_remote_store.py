"""The remote store against real server processes: the store contract, retries, errors."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import httpx
import pytest
import store_contract
import trio
from hypothesis import HealthCheck, given, settings
from store_contract import (
    StoreContract,
    StoreOpener,
    dead_pid,
    make_session,
    make_turn,
    now_ms,
)
from test_server_e2e import ServerProcess

from zidane_actors.errors import (
    ConflictError,
    InvalidNameError,
    StoreClosedError,
    StoreUnavailableError,
    ValidationError,
)
from zidane_actors.model import RunOwner, SessionHistory, host_id
from zidane_actors.server import served_capabilities
from zidane_actors.stores import (
    OPTIONAL_METHODS,
    RemoteStore,
    SessionStore,
    create_memory_store,
    create_remote_store,
)

_SERVERS: dict[str, ServerProcess] = {}


@pytest.fixture(scope="module", autouse=True)
def servers() -> Iterator[dict[str, ServerProcess]]:
    """One memory-backed server process for the whole module."""
    _SERVERS["memory"] = ServerProcess("memory")
    for server in _SERVERS.values():
        server.start()
    yield _SERVERS
    for server in _SERVERS.values():
        server.stop()
    _SERVERS.clear()


# Send-request ids can be claimed for ids with no session row, which ``list`` does not
# show; ``delete`` drops them too, so the ids the contract uses are deleted as well.
CONTRACT_SESSION_IDS = ("s0", "s1", "s2")


async def wipe(url: str) -> None:
    """Empty the server's store: delete every session (with its artifacts and send-request
    ids) and every schedule, so each test starts on empty storage."""
    async with create_remote_store(url) as store:
        for sid in {*await store.list(), *CONTRACT_SESSION_IDS}:
            await store.delete(sid)
        for schedule in await store.list_schedules():
            await store.delete_schedule(schedule.id)


def dead_pid_owner() -> RunOwner:
    return RunOwner(host_id=host_id(), pid=dead_pid(), token="t")


class _RemoteContract(StoreContract):
    backend: ClassVar[str]
    # What every server serves: the store's optional methods plus id generation
    # and the history rewrite; ``aclose`` is the client's own.
    required_capabilities = OPTIONAL_METHODS
    property_examples = 10

    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        url = _SERVERS[self.backend].url
        await wipe(url)
        yield lambda: create_remote_store(url)

    @pytest.mark.parametrize("dead", [pytest.param(dead_pid_owner, id="pid")])
    async def test_claim_run_takes_over_dead_owner(
        self, store: SessionStore, dead: Callable[[], RunOwner]
    ) -> None:
        # Only the pid check crosses processes: the server judges liveness.
        await super().test_claim_run_takes_over_dead_owner(store, dead)

    async def test_claim_run_token_liveness_is_judged_by_the_server(
        self, store: SessionStore
    ) -> None:
        """An owner naming this client's pid with another token is dead to this client
        only; the server, which decides the claim, sees a live pid and keeps it."""
        remote = self.need(store, "claim_run")
        await remote.save(make_session("s1"))
        other_token = RunOwner(host_id=host_id(), pid=os.getpid(), token="other")
        await remote.update_status("s1", "running", owner=other_token)
        mine = RunOwner(host_id="claimer", pid=7, token="me")
        claim = await remote.claim_run("s1", stale_at=now_ms() - 60_000, owner=mine)
        assert (claim.claimed, claim.previous) == (False, None)


class TestRemoteOverMemory(_RemoteContract):
    """The full contract over HTTP (a SQLite-backed server is covered by test_faults)."""

    backend = "memory"

    # Each example is ~25 HTTP round trips on a shared machine: a smaller budget.
    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(program=store_contract.PROGRAMS)
    async def test_matches_reference_model(self, program: list[tuple[Any, ...]]) -> None:
        await self.check_reference_model(program)


@pytest.fixture
async def remote() -> AsyncIterator[RemoteStore]:
    url = _SERVERS["memory"].url
    await wipe(url)
    async with create_remote_store(url, timeout_ms=5_000) as store:
        yield store


async def test_served_capabilities_match_the_server(remote: RemoteStore) -> None:
    assert await remote.capabilities() == served_capabilities(create_memory_store())


async def test_append_retry_never_duplicates(remote: RemoteStore) -> None:
    await remote.save(make_session("s1"))
    await remote.append_turns("s1", [make_turn(1), make_turn(2)])
    # The same request again, as a retry after a lost answer would send it.
    await remote.append_turns("s1", [make_turn(1), make_turn(2), make_turn(3)])
    assert [t.id for t in await remote.get_turns("s1")] == ["t1", "t2", "t3"]


async def test_mutate_history_retries_after_a_concurrent_append(remote: RemoteStore) -> None:
    await remote.save(make_session("s1", turns=(make_turn(1), make_turn(2))))
    calls = 0

    def drop_t1(history: SessionHistory) -> SessionHistory:
        nonlocal calls
        calls += 1
        if calls == 1:  # another writer appends between this read and its write
            turn = {"id": "t3", "role": "user", "content": [], "createdAt": 3}
            httpx.post(f"{remote.url}/sessions/s1/turns", json={"turns": [turn]})
        return SessionHistory(
            turns=tuple(t for t in history.turns if t.id != "t1"), runs=history.runs
        )

    assert await remote.mutate_history("s1", drop_t1) == "ok"
    assert [t.id for t in await remote.get_turns("s1")] == ["t2", "t3"]
    assert calls == 2


async def test_stale_history_write_is_refused_with_409(remote: RemoteStore) -> None:
    await remote.save(make_session("s1", turns=(make_turn(1),)))
    state = await remote._history("s1")
    assert state is not None
    await remote.append_turns("s1", [make_turn(2)])
    async with httpx.AsyncClient(base_url=remote.url) as client:
        r = await client.put(
            "/sessions/s1/history",
            json={"history": {"turns": [], "runs": []}, "expectedRev": state.rev},
        )
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "rev_mismatch"
    assert [t.id for t in await remote.get_turns("s1")] == ["t1", "t2"]


async def test_mutate_history_gives_up_when_the_history_keeps_moving(
    remote: RemoteStore,
) -> None:
    await remote.save(make_session("s1", turns=(make_turn(0),)))
    n = 0

    def append_and_edit(history: SessionHistory) -> SessionHistory:
        # Every read is followed by a foreign append before the write lands.
        nonlocal n
        n += 1
        httpx.post(
            f"{remote.url}/sessions/s1/turns",
            json={"turns": [{"id": f"x{n}", "role": "user", "content": [], "createdAt": n}]},
        )
        return SessionHistory(turns=(), runs=())

    with pytest.raises(ConflictError, match="kept changing"):
        await remote.mutate_history("s1", append_and_edit)
    # Every foreign append survived; the edit never landed.
    assert len(await remote.get_turns("s1")) == n + 1


async def test_errors_map_to_library_exceptions(remote: RemoteStore) -> None:
    with pytest.raises(InvalidNameError):
        await remote.load("../etc")
    with pytest.raises(ValidationError):
        create_remote_store("ftp://x")
    await remote.save(make_session("s1"))
    with pytest.raises(ValidationError):
        await remote.get_turns("s1", -1)


async def test_unreachable_server_is_store_unavailable() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with create_remote_store(f"http://127.0.0.1:{port}", retries=2) as store:
        with pytest.raises(StoreUnavailableError, match="3 attempt"):
            await store.load("s1")


async def test_closed_store_refuses_calls() -> None:
    store = create_remote_store(_SERVERS["memory"].url)
    await store.aclose()
    with pytest.raises(StoreClosedError):
        await store.list()
