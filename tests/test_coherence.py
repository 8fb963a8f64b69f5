"""Many hosts, one truth: two hosts on one store never serve or write a stale view.

Each test opens two hosts, each over its own store object where the store
allows it (two SQLite connections on one file, two PostgreSQL stores on one
schema, two remote clients of one real server process); the memory store
lives in one process and the file map has one writer per directory, so their
two hosts share one store object.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from store_contract import make_turn
from test_postgres_store import DSN, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors.actors import (
    Session,
    SessionHost,
    get_extension_session_state,
    open_session_host,
    set_extension_session_state,
)
from zidane_actors.errors import ConflictError, StaleSessionError
from zidane_actors.model import SessionTurn
from zidane_actors.stores import (
    SessionStore,
    VersionedStore,
    create_file_map_store,
    create_memory_store,
    create_remote_store,
    open_directory_adapter,
    open_postgres_store,
    open_sqlite_store,
)

Pair = Callable[[], AbstractAsyncContextManager[tuple[SessionStore, SessionStore]]]

BACKENDS = ("memory", "file-map", "sqlite", "postgres", "remote")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One server process over a SQLite file, for the remote backend."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        process = ServerProcess(f"sqlite:{tmp}/served.db")
        process.start()
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture(params=BACKENDS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    """Opens two store objects over one backing storage."""
    backend: str = request.param

    @asynccontextmanager
    async def open_pair() -> AsyncIterator[tuple[SessionStore, SessionStore]]:
        async with AsyncExitStack() as stack:
            if backend == "memory":
                store = create_memory_store()
                yield store, store
            elif backend == "file-map":  # one session per store, one writer per directory
                adapter = await stack.enter_async_context(open_directory_adapter(tmp_path / "m"))
                fm = create_file_map_store(adapter)
                yield fm, fm
            elif backend == "sqlite":
                a = await stack.enter_async_context(open_sqlite_store(tmp_path / "s.db"))
                b = await stack.enter_async_context(open_sqlite_store(tmp_path / "s.db"))
                yield a, b
            elif backend == "postgres":
                schema = stack.enter_context(fresh_schema())
                pa = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
                pb = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
                yield pa, pb
            else:
                url = request.getfixturevalue("server").url
                ra = await stack.enter_async_context(create_remote_store(url))
                rb = await stack.enter_async_context(create_remote_store(url))
                yield ra, rb

    return open_pair


@asynccontextmanager
async def two_hosts(pair: Pair) -> AsyncIterator[tuple[SessionHost, SessionHost, SessionStore]]:
    async with (
        pair() as (sa, sb),
        open_session_host(sa) as ha,
        open_session_host(sb) as hb,
    ):
        yield ha, hb, sa


def t(turn_id: str, role: str = "user") -> SessionTurn:
    turn = make_turn(0, role)
    return SessionTurn(id=turn_id, role=turn.role, content=turn.content, created_at=turn.created_at)


def ids(turns: Any) -> list[str]:
    return [turn.id for turn in turns]


async def stored_ids(store: SessionStore, sid: str) -> list[str]:
    data = await store.load(sid)
    assert data is not None
    return ids(data.turns)


async def started(host: SessionHost, sid: str) -> Session:
    session = await host.create_session(id=sid)
    await session.append_turns([t("u0")])
    await session.save()
    return session


def new_id() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def test_every_store_is_versioned(pair: Pair) -> None:
    async with pair() as (a, b):
        assert isinstance(a, VersionedStore) and isinstance(b, VersionedStore)


async def test_a_cached_session_is_refreshed_when_another_host_wrote(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        await started(ha, sid)
        held = await hb.load_session(sid)  # host B holds the session (a live conversation)
        assert held is not None
        a = await ha.load_session(sid)
        assert a is not None
        await a.append_turns([t("a1", "assistant")])
        b = await hb.load_session(sid)
        assert b is held  # the same handle, refreshed
        assert ids(b.turns) == ["u0", "a1"] == await stored_ids(store, sid)
        await b.append_turns([t("b1")])
        assert ids(b.turns) == ["u0", "a1", "b1"] == await stored_ids(store, sid)


async def test_a_stale_set_turns_and_save_is_refused_then_a_retry_works(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        a = await started(ha, sid)
        await a.append_turns([t("a1", "assistant")])
        b = await hb.load_session(sid)
        assert b is not None
        await b.append_turns([t("b2")])
        await a.set_turns([*a.turns, t("a2", "assistant")])  # computed from A's stale view
        with pytest.raises(StaleSessionError) as info:
            await a.save()
        assert isinstance(info.value, ConflictError)
        assert await stored_ids(store, sid) == ["u0", "a1", "b2"]  # b2 kept
        assert ids(a.turns) == ["u0", "a1", "b2"]  # memory refreshed, the stale edit dropped
        await a.set_turns([*a.turns, t("a2", "assistant")])
        await a.save()
        assert await stored_ids(store, sid) == ["u0", "a1", "b2", "a2"] == ids(a.turns)


async def test_an_append_folds_in_what_another_host_appended_in_store_order(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        a = await started(ha, sid)
        b = await hb.load_session(sid)
        assert b is not None
        await b.append_turns([t("b1")])
        await b.append_turns([t("b2", "assistant")])
        await a.append_turns([t("a1")])  # A never reloaded: the append tells it
        assert ids(a.turns) == ["u0", "b1", "b2", "a1"] == await stored_ids(store, sid)
        await a.append_turns([t("a2", "assistant")])
        assert ids(a.turns) == await stored_ids(store, sid)


async def test_a_header_save_after_another_hosts_append_keeps_both(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        a = await started(ha, sid)
        b = await hb.load_session(sid)
        assert b is not None
        await b.append_turns([t("b1")])
        await a.set_meta("title", "from A")
        await a.save()  # a plain value: folded in and saved again
        data = await store.load(sid)
        assert data is not None and data.metadata["title"] == "from A"
        assert ids(data.turns) == ["u0", "b1"] == ids(a.turns)


async def test_extension_state_read_modify_writes_never_lose_another_hosts_key(
    pair: Pair,
) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        a = await started(ha, sid)
        b = await hb.load_session(sid)
        assert b is not None
        await set_extension_session_state(b, "ext", "from-b", 1)
        await set_extension_session_state(a, "ext", "from-a", 2)  # A's view lacks from-b
        data = await store.load(sid)
        assert data is not None
        assert data.metadata["extensions"] == {"ext": {"from-a": 2, "from-b": 1}}
        assert get_extension_session_state(a, "ext", "from-b") == 1


async def test_a_session_deleted_by_another_host_is_not_served(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, hb, store):
        await started(ha, sid)
        held = await hb.load_session(sid)  # B keeps its handle: the host caches it
        assert held is not None
        await store.delete(sid)
        assert await hb.load_session(sid) is None
        assert held.turns  # the handle still answers reads


async def test_the_cache_answers_without_a_reload_when_nobody_else_wrote(pair: Pair) -> None:
    sid = new_id()
    async with two_hosts(pair) as (ha, _, _):
        a = await started(ha, sid)
        await a.append_turns([t("a1", "assistant")])
        before = ha.statistics().started
        assert await ha.load_session(sid) is a
        assert ha.statistics().started == before  # no refresh went through an actor


# -- framework sessions: two workers on one session id ------------------------------------


T = TypeVar("T")


def two_worker_urls(tmp_path: Path) -> tuple[str, str]:
    """One SQLite file under two paths (a symlinked directory): two portals, hosts and stores,
    as two worker processes would have."""
    (tmp_path / "via").symlink_to(tmp_path, target_is_directory=True)
    return f"sqlite:{tmp_path / 'agents.db'}", f"sqlite:{tmp_path / 'via' / 'agents.db'}"


def with_two_workers(
    tmp_path: Path, session_id: str, play: Callable[[Any, Any], Coroutine[Any, Any, T]]
) -> T:
    """``play(one, two)`` over two ``ZidaneSession``s of one session, as two workers hold them."""
    import asyncio

    from zidane_actors.integrations.openai_agents import ZidaneSession

    one_url, two_url = two_worker_urls(tmp_path)
    one = ZidaneSession(session_id, store=one_url)
    two = ZidaneSession(session_id, store=two_url)
    try:
        return asyncio.run(play(one, two))
    finally:
        one.close()
        two.close()


def test_two_openai_agents_workers_never_erase_each_others_items(tmp_path: Path) -> None:
    """One worker adds items while another pops: every item is kept or popped, once."""

    def item(n: int) -> Any:
        return {"role": "user", "content": f"item {n}"}

    async def main(adder: Any, popper: Any) -> tuple[list[Any], list[Any]]:
        popped: list[Any] = []
        for n in range(25):
            await adder.add_items([item(n)])
            if n % 3 == 2:
                got = await popper.pop_item()
                assert got is not None
                popped.append(got)
        assert await popper.get_items() == await adder.get_items()  # each sees the other
        return await adder.get_items(), popped

    kept, popped = with_two_workers(tmp_path, "shared", main)
    added = [item(n) for n in range(25)]
    assert popped == [item(n) for n in range(2, 25, 3)]  # always the newest item
    assert kept == [i for i in added if i not in popped]  # nothing else lost, order kept


def test_a_response_split_over_two_workers_is_merged_in_the_store(tmp_path: Path) -> None:
    calls: list[Any] = [
        {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        for i in (1, 2)
    ]
    user: Any = {"role": "user", "content": "go"}

    async def main(one: Any, two: Any) -> tuple[list[Any], list[Any]]:
        await one.add_items([user])
        await one.add_items(calls[:1])
        await two.add_items(calls[1:])  # the other worker's view has the first call
        await one.add_items([{"role": "user", "content": "more"}])
        return await one.get_items(), await two.get_items()

    seen_one, seen_two = with_two_workers(tmp_path, "split", main)
    expected = [user, *calls, {"role": "user", "content": "more"}]
    assert seen_one == expected == seen_two


def test_workers_holding_stale_handles_append_in_store_order_and_merge_on_the_stored_turn(
    tmp_path: Path,
) -> None:
    """Two workers, each handle made stale by the other: nothing lost, order kept, splits merged."""
    from zidane_actors.stores import open_sqlite_store

    def said(text: str) -> Any:
        return {"role": "user", "content": text}

    def called(n: int) -> Any:
        return {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"}

    def output(n: int) -> Any:
        return {"type": "function_call_output", "call_id": f"c{n}", "output": "ok"}

    async def main(one: Any, two: Any) -> tuple[list[Any], list[Any]]:
        await one.add_items([said("a")])
        assert await two.get_items() == [said("a")]  # two now holds a handle
        await one.add_items([said("b")])
        await two.add_items([said("c")])  # two's handle is stale: c lands after b
        await one.add_items([called(1)])
        await two.add_items([called(2)])  # merged into one's stored assistant turn
        await one.add_items([called(3)])  # and so is this one, after two's
        await two.add_items([output(1), output(2), output(3)])
        return await one.get_items(), await two.get_items()

    seen_one, seen_two = with_two_workers(tmp_path, "held", main)
    expected = [said("a"), said("b"), said("c"), called(1), called(2), called(3)]
    expected += [output(1), output(2), output(3)]
    assert seen_one == expected == seen_two

    # The three calls share one assistant turn, so every output keeps its call on load.
    async def stored_roles() -> list[str]:
        async with open_sqlite_store(tmp_path / "agents.db") as store:
            data = await store.load("held")
            assert data is not None
            return [turn.role for turn in data.turns]

    assert trio.run(stored_roles) == ["user", "user", "user", "assistant", "user"]


def test_a_held_session_deleted_by_another_worker_is_created_again(tmp_path: Path) -> None:
    import asyncio

    from zidane_actors.integrations.openai_agents import ZidaneSession
    from zidane_actors.stores import open_sqlite_store

    url, _ = two_worker_urls(tmp_path)
    worker = ZidaneSession("gone", store=url)

    async def delete() -> None:
        async with open_sqlite_store(tmp_path / "agents.db") as store:
            await store.delete("gone")

    async def main() -> list[Any]:
        await worker.add_items([{"role": "user", "content": "first"}])
        await asyncio.to_thread(trio.run, delete)
        await worker.add_items([{"role": "user", "content": "again"}])
        return await worker.get_items()

    try:
        assert asyncio.run(main()) == [{"role": "user", "content": "again"}]
    finally:
        worker.close()


@pytest.mark.parametrize("first", ["user", "assistant"])
def test_a_session_deleted_between_the_decision_and_the_write_gets_the_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """Another writer deletes the session right before ``add_items`` writes (after its read
    of the session, for an assistant item that may merge; through the held session for
    any other): the items are written to the session created again, never dropped (an
    append, or a merge into the stored assistant turn, both find no session)."""
    import asyncio

    from zidane_actors.integrations.openai_agents import ZidaneSession

    url, _ = two_worker_urls(tmp_path)
    worker = ZidaneSession("raced", store=url)
    write = ZidaneSession._append_to
    deletions: list[str] = []

    async def delete_then_write(session: Any, turns: Any, records: Any) -> bool:
        if not deletions:  # the store's own delete: no actor of this host sees it
            deletions.append(session.id)
            await session.store.delete(session.id)
        return await write(session, turns, records)

    call: Any = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    said: Any = {"role": "user", "content": "again"}
    later = call if first == "assistant" else said

    async def main() -> list[Any]:
        await worker.add_items([{"role": "user", "content": "go"}, dict(call, call_id="c0")])
        monkeypatch.setattr(ZidaneSession, "_append_to", staticmethod(delete_then_write))
        await worker.add_items([later])
        monkeypatch.setattr(ZidaneSession, "_append_to", staticmethod(write))
        return await worker.get_items()

    try:
        assert asyncio.run(main()) == [later]
    finally:
        worker.close()
    assert deletions == ["raced"]


# -- PostgreSQL change notifications ------------------------------------------------------


async def test_postgres_notifications_refresh_a_held_session_without_a_load() -> None:
    """With ``listen=True`` a host refreshes what it holds when another host writes."""
    sid = new_id()
    with fresh_schema() as schema:
        async with (
            open_postgres_store(DSN, schema=schema) as sa,
            open_postgres_store(DSN, schema=schema, listen=True) as sb,
            open_session_host(sa) as ha,
            open_session_host(sb) as hb,
        ):
            await started(ha, sid)
            held = await hb.load_session(sid)
            assert held is not None
            a = await ha.load_session(sid)
            assert a is not None
            await a.append_turns([t("a1", "assistant")])
            for _ in range(3000):  # polled: 30 s bound a stuck test, never a timing claim
                if ids(held.turns) == ["u0", "a1"]:
                    break
                await trio.sleep(0.01)
            assert ids(held.turns) == ["u0", "a1"]
