"""The store contract on the memory store, plus what only the memory store promises."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import outcome
import pytest
import trio
from store_contract import (
    StoreContract,
    StoreOpener,
    make_artifact,
    make_run,
    make_session,
    make_turn,
)

from zidane_actors.errors import ConflictError, StoreClosedError, ValidationError
from zidane_actors.model import SessionData, SessionHistory, SessionTurn, TextBlock
from zidane_actors.stores import (
    OPTIONAL_METHODS,
    WRITE_METHODS,
    BatchingStore,
    FullSessionStore,
    MemoryStore,
    SessionStore,
    StoreWrite,
    create_memory_store,
    open_memory_store,
    store_capabilities,
)


class TestMemoryStore(StoreContract):
    required_capabilities = OPTIONAL_METHODS | {"apply_writes"}

    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        async with open_memory_store() as store:

            @asynccontextmanager
            async def same_store() -> AsyncIterator[MemoryStore]:
                yield store

            yield same_store


async def test_create_memory_store_is_a_full_batching_store() -> None:
    store = create_memory_store()
    full: FullSessionStore = store  # the signatures match, checked by mypy
    batching: BatchingStore = store
    assert isinstance(full, SessionStore)
    assert isinstance(batching, BatchingStore)
    assert store_capabilities(store) == OPTIONAL_METHODS
    await store.aclose()


async def test_open_memory_store_closes_on_exit() -> None:
    async with open_memory_store() as store:
        await store.save(make_session("s1"))
        assert not store.closed
    assert store.closed
    with pytest.raises(StoreClosedError):
        await store.load("s1")
    with pytest.raises(StoreClosedError):
        await store.apply_writes([StoreWrite("delete", ("s1",))])


async def test_two_stores_share_nothing() -> None:
    async with open_memory_store() as a, open_memory_store() as b:
        await a.save(make_session("s1"))
        assert await b.load("s1") is None


async def test_apply_writes_in_order_one_outcome_each() -> None:
    async with open_memory_store() as store:
        results = await store.apply_writes(
            [
                StoreWrite("save", (make_session("s1"),)),
                StoreWrite("append_turns", ("s1", [make_turn(1)])),
                StoreWrite("save", ("not a session",)),
                StoreWrite("append_turns", ("s1", [make_turn(2)])),
                StoreWrite("delete", ("s2",)),
            ]
        )
        assert [type(r) for r in results] == [
            outcome.Value,
            outcome.Value,
            outcome.Error,
            outcome.Value,
            outcome.Value,
        ]
        bad = results[2]
        assert isinstance(bad, outcome.Error)
        assert isinstance(bad.error, ValidationError)
        assert [t.id for t in await store.get_turns("s1")] == ["t1", "t2"]
        assert await store.apply_writes([]) == []


async def test_cancelled_before_a_write_applies_nothing() -> None:
    async with open_memory_store() as store:
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.save(make_session("s1"))
        assert scope.cancelled_caught
        assert await store.load("s1") is None


async def test_stored_values_are_validated_copies() -> None:
    async with open_memory_store() as store:
        metadata: dict[str, object] = {"todo": ["a"]}
        await store.save(SessionData(id="s1", created_at=1, updated_at=2, metadata=metadata))
        metadata["todo"] = "changed after save"
        row = await store.get_meta("s1")
        assert row is not None
        row.metadata["injected"] = True
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"todo": ["a"]}


async def test_apply_writes_covers_every_write_method() -> None:
    async with open_memory_store() as store:
        writes = [
            StoreWrite("save", (make_session("s1"),)),
            StoreWrite("save_meta", (make_session("s1", metadata={"a": 1}),)),
            StoreWrite("append_turns", ("s1", [make_turn(1)])),
            StoreWrite("update_run", ("s1", make_run("r1"))),
            StoreWrite("update_status", ("s1", "completed")),
            StoreWrite("patch_meta", ("s1", {"b": 2})),
            StoreWrite("upsert_artifact", (make_artifact("a1", "s1"),)),
            StoreWrite("delete_artifact", ("s1", "a1")),
            StoreWrite("settle_send_request", ("s1", "req", {"ok": True})),
            StoreWrite("delete", ("s2",)),
        ]
        assert {w.method for w in writes} == WRITE_METHODS
        results = await store.apply_writes(writes)
        assert all(isinstance(r, outcome.Value) for r in results), results
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.metadata, loaded.status, loaded.runs) == (
            {"a": 1, "b": 2},
            "completed",
            (make_run("r1"),),
        )
        assert [t.id for t in loaded.turns] == ["t1"]
        assert await store.list_artifacts() == []


async def test_append_id_check_follows_rewrites_of_the_history() -> None:
    store = create_memory_store()
    other = SessionTurn(id="t1", role="user", content=(TextBlock("other"),), created_at=1)
    await store.save(make_session("s", turns=(make_turn(0),)))
    await store.append_turns("s", [make_turn(1)])
    with pytest.raises(ConflictError, match="'t1'"):
        await store.append_turns("s", [other])
    await store.save(make_session("s", turns=(make_turn(0),)))  # t1 is gone
    await store.append_turns("s", [other])
    await store.mutate_history("s", lambda h: SessionHistory(h.turns[:1], h.runs))
    await store.append_turns("s", [make_turn(1), make_turn(2)])  # t1 is gone again
    loaded = await store.load("s")
    assert loaded is not None and loaded.turns == (make_turn(0), make_turn(1), make_turn(2))
    await store.delete("s")
    await store.save(make_session("s"))
    await store.append_turns("s", [other])
