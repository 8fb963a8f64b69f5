"""The Session keeps the unique-turn-id rule: its turns equal the store's after every call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from store_contract import make_run, make_turn
from test_postgres_store import DSN, fresh_schema

from zidane_actors.actors import load_session, open_session_host
from zidane_actors.errors import ConflictError, ValidationError
from zidane_actors.model import AppendTurnsOptions
from zidane_actors.stores import open_memory_store, open_postgres_store, open_sqlite_store

Opener = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    if request.param == "memory":
        yield open_memory_store
    elif request.param == "sqlite":
        yield lambda: open_sqlite_store(tmp_path / "s.db")
    else:
        with fresh_schema() as schema:
            yield lambda: open_postgres_store(DSN, schema=schema, pool_size=1)


async def test_session_turns_equal_the_stores_after_retries_and_conflicts(
    opener: Opener,
) -> None:
    async with opener() as store, open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.append_turns([make_turn(1), make_turn(2)])
        await session.append_turns([make_turn(2)])  # a retry: nothing twice
        await session.append_turns([make_turn(2), make_turn(3)])
        other = replace(make_turn(3), role="assistant")
        with pytest.raises(ConflictError, match="t3"):
            await session.append_turns([make_turn(4), other])
        with pytest.raises(ConflictError, match="t3"):
            await session.append_turns([other], AppendTurnsOptions(run=make_run("r1")))
        with pytest.raises(ValidationError, match="t5"):
            await session.append_turns([make_turn(5), make_turn(5)])
        with pytest.raises(ValidationError, match="t6"):
            await session.set_turns([make_turn(6), make_turn(6)])
        assert [t.id for t in session.turns] == ["t1", "t2", "t3"]
        assert session.runs == ()
        assert tuple(await store.get_turns("s")) == session.turns
        await session.append_turns([make_turn(3)], AppendTurnsOptions(run=make_run("r1")))
        assert session.runs == (make_run("r1"),)
        stored = await store.load("s")
        assert stored.turns == session.turns and stored.runs == session.runs
        reloaded = await load_session(store, "s")
        assert reloaded is not None and [t.id for t in reloaded.turns] == ["t1", "t2", "t3"]


async def test_a_retry_after_set_turns_and_save_stays_equal(opener: Opener) -> None:
    async with opener() as store, open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.append_turns([make_turn(1)])
        await session.set_turns([make_turn(1), make_turn(2)])
        await session.save()
        await session.append_turns([make_turn(2), make_turn(3)])
        assert tuple(await store.get_turns("s")) == session.turns
        assert [t.id for t in session.turns] == ["t1", "t2", "t3"]


async def test_a_turn_changed_after_its_append_is_stored_as_checked(opener: Opener) -> None:
    # The session hands its store the bytes it checked: a dict changed inside a
    # turn while the append is in flight, or after it was acknowledged, is not
    # what the store holds.
    async with opener() as store, open_session_host(store) as host:
        session = await host.create_session(id="s")
        turns = [replace(make_turn(n), metadata={"n": n}) for n in (1, 2)]
        reply = session.append_turns_nowait(turns[:1])
        assert turns[0].metadata is not None
        turns[0].metadata["n"] = float("nan")  # in flight: not stored, never refused
        await reply.wait()
        await session.append_turns(turns[1:])
        assert turns[1].metadata is not None
        turns[1].metadata["n"] = {"later"}
        stored = [replace(make_turn(n), metadata={"n": n}) for n in (1, 2)]
        assert await store.get_turns("s") == stored
        reloaded = await load_session(store, "s")
        assert reloaded is not None and list(reloaded.turns) == stored
