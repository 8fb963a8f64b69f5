"""Extension state: the contextvar binding, namespaced values, naming and size rules."""

from __future__ import annotations

import pytest
import trio

from zidane_actors.actors import (
    EXTENSION_STATE_ITEM_MAX_BYTES,
    EXTENSION_STATE_METADATA_KEY,
    Session,
    bind_extension_session,
    create_session,
    current_extension_session,
    delete_extension_session_state,
    get_extension_session_state,
    load_session,
    open_session_host,
    set_extension_session_state,
    with_extension_session,
)
from zidane_actors.errors import ExtensionStateError
from zidane_actors.stores import create_memory_store


async def test_with_extension_session_binds_for_sync_and_async_fn() -> None:
    session = await create_session()
    assert current_extension_session() is None
    assert with_extension_session(session, current_extension_session) is session
    assert current_extension_session() is None

    async def inner() -> Session | None:
        await trio.lowlevel.checkpoint()
        return current_extension_session()

    assert await with_extension_session(session, inner) is session
    assert await with_extension_session(session, lambda: inner()) is session
    assert current_extension_session() is None
    with bind_extension_session(session):
        assert current_extension_session() is session
        assert with_extension_session(None, current_extension_session) is None
        assert current_extension_session() is session
    assert current_extension_session() is None


async def test_concurrent_tasks_never_see_each_others_binding() -> None:
    sessions = [await create_session() for _ in range(5)]
    mismatches: list[int] = []

    async def worker(i: int) -> None:
        async def body() -> None:
            for _ in range(20):
                await trio.lowlevel.checkpoint()
                if current_extension_session() is not sessions[i]:
                    mismatches.append(i)

        await with_extension_session(sessions[i], body)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(worker, i)
    assert mismatches == []


async def test_child_tasks_inherit_the_binding() -> None:
    session = await create_session()
    seen: list[Session | None] = []

    async def child() -> None:
        seen.append(current_extension_session())

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    await with_extension_session(session, body)
    assert seen == [session]


async def test_set_get_delete_persist_under_the_extensions_key() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        value = {"steps": ["a", "b"], "done": False}
        await set_extension_session_state(session, "planner", "plan", value)
        await set_extension_session_state(session, "planner", "cursor", 2)
        await set_extension_session_state(session, "other-ext", "x", "y")
        value["done"] = True
        got = get_extension_session_state(session, "planner", "plan")
        assert got == {"steps": ["a", "b"], "done": False}
        got["steps"].append("mutated")
        assert get_extension_session_state(session, "planner", "plan")["steps"] == ["a", "b"]
        stored = await store.load("s")
        assert stored is not None
        assert stored.metadata[EXTENSION_STATE_METADATA_KEY] == {
            "planner": {"plan": {"steps": ["a", "b"], "done": False}, "cursor": 2},
            "other-ext": {"x": "y"},
        }
        await delete_extension_session_state(session, "planner", "plan")
        await delete_extension_session_state(session, "planner", "missing")
        await delete_extension_session_state(session, "planner", "cursor")
        assert get_extension_session_state(session, "planner", "cursor") is None
    reloaded = await load_session(store, "s")
    assert reloaded is not None
    assert reloaded.metadata[EXTENSION_STATE_METADATA_KEY] == {"other-ext": {"x": "y"}}
    await delete_extension_session_state(reloaded, "other-ext", "x")
    assert EXTENSION_STATE_METADATA_KEY not in reloaded.metadata
    again = await store.load("s")
    assert again is not None and EXTENSION_STATE_METADATA_KEY not in again.metadata


async def test_unsafe_names_raise_on_set_and_read_as_none() -> None:
    session = await create_session()
    for ext, key in [("Bad", "k"), ("../x", "k"), ("", "k"), ("ok", "a/b"), ("ok", "")]:
        with pytest.raises(ExtensionStateError):
            await set_extension_session_state(session, ext, key, 1)
        assert get_extension_session_state(session, ext, key) is None
        await delete_extension_session_state(session, ext, key)  # silently nothing
    with pytest.raises(ExtensionStateError):
        await set_extension_session_state(session, "ok", "k", object())


async def test_size_limits_per_item_and_in_total() -> None:
    session = await create_session()
    await set_extension_session_state(
        session, "ext", "fits", "x" * (EXTENSION_STATE_ITEM_MAX_BYTES - 2)
    )
    with pytest.raises(ExtensionStateError, match="16384"):
        await set_extension_session_state(
            session, "ext", "big", "x" * EXTENSION_STATE_ITEM_MAX_BYTES
        )
    for i in range(3):
        await set_extension_session_state(session, "ext", f"more{i}", "y" * 15_000)
    with pytest.raises(ExtensionStateError, match="65536"):
        await set_extension_session_state(session, "ext2", "last", "z" * 16_000)
    assert get_extension_session_state(session, "ext2", "last") is None  # memory unchanged


async def test_no_session_is_a_no_op() -> None:
    await set_extension_session_state(None, "ext", "k", 1)
    await delete_extension_session_state(None, "ext", "k")
    assert get_extension_session_state(None, "ext", "k") is None


async def test_concurrent_writers_to_one_session_lose_nothing() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(set_extension_session_state, session, "ext", f"k{i}", i)
        assert all(get_extension_session_state(session, "ext", f"k{i}") == i for i in range(20))
