"""The remote store against real server processes: the store contract, retries, errors."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from typing import Any, ClassVar

import httpx
import msgspec
import outcome
import pytest
import store_contract
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from store_contract import (
    StoreContract,
    StoreOpener,
    dead_pid,
    make_artifact,
    make_run,
    make_session,
    make_turn,
    now_ms,
)
from test_server_e2e import ServerProcess

from zidane_actors.actors import open_session_host
from zidane_actors.errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from zidane_actors.model import RunOwner, SessionArtifact, SessionHistory, TextBlock, host_id
from zidane_actors.server import served_capabilities
from zidane_actors.stores import (
    OPTIONAL_METHODS,
    RemoteStore,
    SessionStore,
    StoreWrite,
    create_memory_store,
    create_remote_store,
)
from zidane_actors.stores.remote import MAX_BATCH_WRITES

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
    # and the history rewrite; ``aclose`` is the client's own. Batches go to
    # ``POST /writes``.
    required_capabilities = OPTIONAL_METHODS | {"apply_writes"}
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


# -- POST /writes ---------------------------------------------------------------------------


async def test_a_batch_applies_every_kind_of_write_in_order(remote: RemoteStore) -> None:
    artifact = make_artifact("a1")
    writes = [
        StoreWrite("save", (make_session("s1"),)),
        StoreWrite("append_turns", ("s1", [make_turn(1)])),
        StoreWrite("update_run", ("s1", make_run("r1"))),
        StoreWrite("update_status", ("s1", "idle")),
        StoreWrite("save_meta", (make_session("s1", metadata={"a": 1}),)),
        StoreWrite("patch_meta", ("s1", {"b": 2, "a": UNSET})),
        StoreWrite("settle_send_request", ("s1", "req", None)),
        StoreWrite("upsert_artifact", (artifact,)),
        StoreWrite("delete_artifact", ("s1", "a1")),
        StoreWrite("append_turns", ("s1", [make_turn(2)])),
        StoreWrite("save", (make_session("s2"),)),
        StoreWrite("delete", ("s2",)),
    ]
    results = await remote.apply_writes(writes)
    assert [type(r) for r in results] == [outcome.Value] * len(writes)
    stored = results[7].unwrap()
    assert isinstance(stored, SessionArtifact)
    assert (stored.id, stored.session_id) == ("a1", "s1")
    loaded = await remote.load("s1")
    assert loaded is not None
    assert [t.id for t in loaded.turns] == ["t1", "t2"]
    assert loaded.runs == (make_run("r1"),)
    assert loaded.metadata == {"b": 2}
    assert await remote.list_artifacts() == []
    assert await remote.load("s2") is None


async def test_a_batch_answers_each_write_its_own_error(remote: RemoteStore) -> None:
    await remote.save(make_session("s1"))
    await remote.append_turns("s1", [make_turn(1)])
    other = msgspec.structs.replace(make_turn(1), content=(TextBlock(text="other"),))
    results = await remote.apply_writes(
        [
            StoreWrite("append_turns", ("ghost", [make_turn(2)])),
            StoreWrite("append_turns", ("s1", [other])),
            StoreWrite("patch_meta", ("s1", {"k": 1})),
            StoreWrite("append_turns", ("s1", [make_turn(2)])),
            StoreWrite("load", ("s1",)),
            StoreWrite("update_run", ("s1", {"not": "a run"})),
        ]
    )
    errors = [r.error if isinstance(r, outcome.Error) else None for r in results]
    assert isinstance(errors[0], SessionNotFoundError)
    assert isinstance(errors[1], ConflictError)
    assert errors[2] is None and errors[3] is None
    assert isinstance(errors[4], UnsupportedOperationError)
    assert isinstance(errors[5], ValidationError)
    assert [t.id for t in await remote.get_turns("s1")] == ["t1", "t2"]


async def test_a_batch_with_a_bad_id_is_refused_whole() -> None:
    url = _SERVERS["memory"].url
    await wipe(url)
    async with create_remote_store(url) as store:
        await store.save(make_session("s1"))
    turn = msgspec.json.encode(make_turn(1)).decode()
    bad_turn = turn.replace('"t1"', '"..t1"')
    async with httpx.AsyncClient(base_url=url) as client:
        for writes, where in (
            ('{"op":"delete","sessionId":"a/b"}', "$.writes[1].sessionId"),
            (f'{{"op":"appendTurns","sessionId":"s1","turns":[{bad_turn}]}}', "turns[0].id"),
        ):
            body = (
                f'{{"writes":[{{"op":"appendTurns","sessionId":"s1","turns":[{turn}]}},{writes}]}}'
            )
            answer = await client.post(
                "/writes", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_name"
            assert where in answer.json()["error"]["message"]
        too_many = '{"writes":[' + ",".join(['{"op":"delete","sessionId":"x"}'] * 1001) + "]}"
        answer = await client.post(
            "/writes", content=too_many, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 422
    async with create_remote_store(url) as store:
        assert await store.get_turns("s1") == []


async def test_a_batch_past_the_request_limit_is_split(remote: RemoteStore) -> None:
    await remote.save(make_session("s1"))
    turns = [make_turn(n) for n in range(MAX_BATCH_WRITES + 5)]
    results = await remote.apply_writes([StoreWrite("append_turns", ("s1", [t])) for t in turns])
    assert all(isinstance(r, outcome.Value) for r in results)
    assert remote.statistics().requests == 3  # the save, then two POST /writes
    assert [t.id for t in await remote.get_turns("s1")] == [t.id for t in turns]


async def test_a_host_over_a_remote_store_keeps_every_session_in_order() -> None:
    url = _SERVERS["memory"].url
    await wipe(url)
    async with create_remote_store(url) as remote, open_session_host(remote) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(3)]

        async def writer(i: int) -> None:
            for n in range(20):
                await sessions[i].append_turns([make_turn(n)])

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(writer, i)
        for i in range(3):
            assert [t.id for t in await remote.get_turns(f"s{i}")] == [f"t{n}" for n in range(20)]


_BATCH_WRITES = st.one_of(
    st.builds(
        lambda sid, turns: StoreWrite("append_turns", (sid, turns)),
        store_contract._SESSION_IDS,
        store_contract._TURNS,
    ),
    st.builds(lambda data: StoreWrite("save", (data,)), store_contract._SESSIONS),
    st.builds(lambda sid: StoreWrite("delete", (sid,)), store_contract._SESSION_IDS),
    st.builds(
        lambda sid, patch: StoreWrite("patch_meta", (sid, patch)),
        store_contract._SESSION_IDS,
        store_contract._METADATA,
    ),
    st.builds(
        lambda sid, status: StoreWrite("update_status", (sid, status)),
        store_contract._SESSION_IDS,
        st.sampled_from(["idle", "completed", "error"]),
    ),
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
@given(batches=st.lists(st.lists(_BATCH_WRITES, max_size=8), min_size=1, max_size=4))
async def test_batches_over_http_match_the_memory_store(batches: list[list[StoreWrite]]) -> None:
    """Any run of batches through ``POST /writes`` answers and stores what the memory
    store's own ``apply_writes`` does, write by write."""
    url = _SERVERS["memory"].url
    await wipe(url)
    reference = create_memory_store()
    async with create_remote_store(url) as remote:
        for writes in batches:
            got = await remote.apply_writes(writes)
            want = await reference.apply_writes(writes)
            assert [_kind(r) for r in got] == [_kind(r) for r in want], writes
        for sid in ("s0", "s1", "s2"):
            stored, expected = await remote.load(sid), await reference.load(sid)
            assert (stored is None) == (expected is None), sid
            if stored is not None and expected is not None:
                assert (stored.turns, stored.runs, stored.metadata, stored.status) == (
                    expected.turns,
                    expected.runs,
                    expected.metadata,
                    expected.status,
                ), sid


def _kind(result: outcome.Outcome[Any]) -> str:
    return type(result.error).__name__ if isinstance(result, outcome.Error) else "ok"


@asynccontextmanager
async def canned_server(answer: bytes) -> AsyncIterator[str]:
    """A raw HTTP server on 127.0.0.1 answering every request with ``answer``."""

    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        with suppress(trio.BrokenResourceError):
            await stream.send_all(answer)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def _answer(body: bytes, *, declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


def _chunked(body: bytes, size: int = 1024) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    head += b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def test_an_answer_over_the_bound_is_refused_not_read_whole() -> None:
    big = b'{"id":"s1","createdAt":1,"updatedAt":1,"metadata":{"x":"' + b"x" * 50_000 + b'"}}'
    for answer in (_answer(b"{}", declared=300 * 1024 * 1024), _chunked(big)):
        async with canned_server(answer) as url:
            store = create_remote_store(url, retries=0, max_answer_bytes=10_000)
            async with store:
                with pytest.raises(StoreError, match="max_answer_bytes"):
                    await store.load("s1")


async def test_an_answer_about_another_record_is_refused() -> None:
    other = b'{"id":"other","createdAt":1,"updatedAt":1}'
    async with canned_server(_answer(other)) as url, create_remote_store(url, retries=0) as store:
        with pytest.raises(CorruptDataError, match="'other', not 's1'"):
            await store.load("s1")
    row = b'{"id":"other","metadata":{},"runCount":0,"turnCount":0,"updatedAt":1,'
    row += b'"userMessageCount":0}'
    async with canned_server(_answer(row)) as url, create_remote_store(url, retries=0) as store:
        with pytest.raises(CorruptDataError):
            await store.get_meta("s1")
    versioned = _answer(other).replace(b"connection: close", b"zidane-rev: 3\r\nconnection: close")
    async with canned_server(versioned) as url, create_remote_store(url, retries=0) as store:
        with pytest.raises(CorruptDataError, match="'other', not 's1'"):
            await store.load_versioned("s1")
