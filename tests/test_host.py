"""The session host: one actor per id, eviction and revival, crash isolation."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from test_postgres_store import DSN, fresh_schema

from zidane_actors.actors import (
    Actor,
    RunStats,
    Session,
    open_actor,
    open_session_host,
    open_store_actor,
)
from zidane_actors.errors import (
    ActorClosed,
    ActorCrashed,
    ConflictError,
    ValidationError,
)
from zidane_actors.model import (
    AppendTurnsOptions,
    SessionArtifactInput,
    SessionTurn,
    TextBlock,
)
from zidane_actors.stores import (
    MemoryStore,
    Revision,
    create_memory_store,
    open_postgres_store,
)


def text_turn(tid: str) -> SessionTurn:
    return SessionTurn(id=tid, role="user", content=(TextBlock(text=tid),), created_at=1)


async def use_actor(session: Session) -> None:
    """A command that always goes through the session's actor (a ``*_nowait`` form)."""
    await session.set_agent_id_nowait("agent").wait()


class Boom(BaseException):
    """Not an ``Exception``: fatal to the session actor that meets it."""


class CrashingStore:
    """Delegates to a memory store; appending a turn with id ``crash`` raises :class:`Boom`.

    No ``apply_writes``, so every write reaches ``append_turns`` below.
    """

    def __init__(self, inner: MemoryStore, gate: trio.Event | None = None) -> None:
        self._inner = inner
        self.gate = gate

    def __getattr__(self, name: str) -> Any:
        if name == "apply_writes":
            raise AttributeError(name)
        return getattr(self._inner, name)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> Revision:
        if any(t.id == "crash" for t in turns):
            if self.gate is not None:
                await self.gate.wait()
            raise Boom(f"injected into {session_id}")
        return await self._inner.append_turns(session_id, turns, options)


async def test_two_loads_of_one_id_share_one_session() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        created = await host.create_session(id="s")
        loaded = await host.load_session("s")
        assert loaded is created
        await created.append_turns([text_turn("a")])
        assert [t.id for t in loaded.turns] == ["a"]
    async with open_session_host(store) as host:
        results: list[Session | None] = []

        async def load() -> None:
            results.append(await host.load_session("s"))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(load)
        assert len(results) == 5 and all(r is results[0] for r in results)
        assert results[0] is not None and len(results[0].turns) == 1


async def test_delete_session_forgets_the_handle_so_the_id_can_be_reused() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s", metadata={"v": 1})
        await session.append_turns([text_turn("a")])
        await host.delete_session("s")
        assert await store.load("s") is None
        assert await host.load_session("s") is None
        again = await host.create_session(id="s", metadata={"v": 2})
        assert again is not session and again.turns == ()
        loaded = await host.load_session("s")
        assert loaded is again and loaded.metadata == {"v": 2}
        await host.delete_session("never-created")  # a no-op, like the store's delete


async def test_lru_eviction_bounds_live_actors_and_handles_revive() -> None:
    store = create_memory_store()
    async with open_session_host(store, max_live_sessions=3) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(10)]
        for s in sessions:
            await s.append_turns([text_turn(f"{s.id}-1")])  # straight to the store actor
        assert host.statistics().live_actors == 0
        for s in sessions:
            await s.set_meta("k", s.id)  # memory only, applied at once: no actor either
        assert host.statistics().live_actors == 0
        for s in sessions:
            await s.update_status("completed")  # other store writes go straight there too
        assert host.statistics().live_actors == 0
        for s in sessions:
            await use_actor(s)
        stats = host.statistics()
        assert stats.live_actors == 3
        assert stats.evictions == 7
        assert stats.known_sessions == 10
        first = sessions[0]
        assert [t.id for t in first.turns] == ["s0-1"]  # reads work while evicted
        assert first._actor is None  # an evicted session keeps no actor
        await use_actor(first)  # revives the actor
        await first.append_turns([text_turn("s0-2")])
        assert host.statistics().started == 11
        assert host.statistics().live_actors == 3
        assert (await host.load_session("s0")) is first
    stored = await store.load("s0")
    assert stored is not None and [t.id for t in stored.turns] == ["s0-1", "s0-2"]


async def test_store_writes_of_an_idle_session_start_no_actor() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        run = await session.start_run("r1", "go")
        with pytest.raises(ConflictError):  # checked against memory, as the actor would
            await session.start_run("r1")
        await session.update_run(msgspec.structs.replace(run, label="first"))
        done = await session.complete_run("r1", RunStats(1, 2, 3))
        with pytest.raises(ValidationError):
            await session.abort_run("r2")
        await session.update_status_nowait("running").wait()
        await session.update_status("completed")
        await session.set_meta("k", 1)
        await session.save_meta_keys(["k"])
        await session.set_meta("j", 2)
        await session.save()
        artifact = await session.add_artifact(SessionArtifactInput("file", "f://x", "x"))
        assert host.statistics().started == 0
        assert done.status == "completed" and done.label == "first" and done.turns == 3
        assert artifact is not None and await session.list_artifacts() == (artifact,)
        stored = await store.load("s")
        assert stored is not None
        assert (stored.runs, stored.status, dict(stored.metadata)) == (
            session.runs,
            "completed",
            {"k": 1, "j": 2},
        )
        assert session._changed == ()  # both saves took their keys


async def test_an_evicted_actor_is_freed_without_the_cyclic_gc() -> None:
    # A host drops an actor per touch past the cap: left in a reference cycle,
    # each would wait for a full collection over the whole heap.
    async with open_session_host(create_memory_store(), max_live_sessions=1) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(5)]
        gc.collect()
        gc.disable()
        try:
            for session in sessions:
                await use_actor(session)  # starts an actor, evicts one
            await trio.testing.wait_all_tasks_blocked()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            in_cycles = [o for o in gc.garbage if isinstance(o, Actor)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert host.statistics().evictions == 4
        assert in_cycles == []


async def test_idle_actors_are_evicted_after_idle_seconds() -> None:
    async with open_session_host(create_memory_store(), idle_seconds=0.05) as host:
        session = await host.create_session()
        await use_actor(session)
        assert host.statistics().live_actors == 1
        await trio.sleep(0.2)
        assert host.statistics().live_actors == 0
        assert host.statistics().evictions == 1
        await use_actor(session)
        assert host.statistics().live_actors == 1


async def test_crash_is_isolated_surfaced_and_fails_pending_callers() -> None:
    inner = create_memory_store()
    gate = trio.Event()
    store = CrashingStore(inner, gate)
    crashes: list[tuple[str, BaseException]] = []
    async with open_session_host(
        store, on_crash=lambda sid, exc: crashes.append((sid, exc))
    ) as host:  # type: ignore[arg-type]
        bad = await host.create_session(id="bad")
        good = await host.create_session(id="good")
        await bad.append_turns([text_turn("before")])
        doomed = bad.append_turns_nowait([text_turn("crash")])
        await trio.testing.wait_all_tasks_blocked()
        queued = bad.set_meta_nowait("k", 1)
        gate.set()
        await good.append_turns([text_turn("fine")])
        for reply in (doomed, queued):
            with pytest.raises(ActorCrashed) as info:
                await reply.wait()
            assert isinstance(info.value.__cause__, Boom)
        with pytest.raises(ActorClosed):
            await bad.set_meta("k", 2)
        with pytest.raises(ActorClosed):
            bad.set_meta_nowait("k", 2)
        await good.append_turns([text_turn("still-fine")])
        assert [sid for sid, _ in crashes] == ["bad"]
        stats = host.statistics()
        assert stats.crashes == 1 and stats.live_actors == 0  # good only appended: no actor
        assert [t.id for t in bad.turns] == ["before"]  # reads still answer
        fresh = await host.load_session("bad")  # a crashed session is reloaded from the store
        assert fresh is not None and fresh is not bad
        await fresh.append_turns([text_turn("after")])
    stored = await inner.load("bad")
    assert stored is not None and [t.id for t in stored.turns] == ["before", "after"]
    good_data = await inner.load("good")
    assert good_data is not None and len(good_data.turns) == 2


async def test_a_failing_crash_hook_does_not_take_the_host_down() -> None:
    def hook(session_id: str, exc: BaseException) -> None:
        raise RuntimeError("hook broke")

    store = CrashingStore(create_memory_store())
    async with open_session_host(store, on_crash=hook) as host:  # type: ignore[arg-type]
        bad = await host.create_session(id="bad")
        with pytest.raises(ActorCrashed):
            await bad.append_turns([text_turn("crash")])
        other = await host.create_session(id="other")
        await other.set_meta("k", 1)
        assert host.statistics().crashes == 1


async def test_closed_host_refuses_mutations_but_reads_still_work() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        await session.append_turns([text_turn("a")])
    with pytest.raises(ActorClosed):
        await session.append_turns([text_turn("b")])
    with pytest.raises(ActorClosed):
        await host.load_session(session.id)
    assert [t.id for t in session.turns] == ["a"]


async def test_host_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        async with open_session_host(create_memory_store(), max_live_sessions=0):
            pass  # pragma: no cover


async def test_statistics_include_the_store_actor() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        await session.append_turns([text_turn("a")])
        stats = host.statistics()
        assert stats.store.calls >= 3  # load + save at creation, then the append
        assert stats.store.actor.state == "running"


async def test_eviction_never_fails_a_command_already_handed_to_the_actor() -> None:
    async with open_session_host(create_memory_store(), max_live_sessions=1) as host:
        a = await host.create_session(id="a")
        await use_actor(a)  # a's actor now waits in receive(), idle
        b = await host.create_session(id="b")
        handed = a.set_meta_nowait("k", 1)  # goes straight to a's waiting receive
        await use_actor(b)  # a is least recently used, but not idle
        await handed.wait()  # applied, not failed with ActorClosed
        assert host.statistics().evictions == 1  # one of the two, trimmed once idle
        await use_actor(a)  # a revived actor waits for the evicted one
        await a.set_meta_nowait("j", 2).wait()
        assert dict(a.metadata) == {"k": 1, "j": 2} and host.statistics().live_actors == 1


async def test_concurrent_sessions_share_group_commits() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(20)]

        async def writer(session: Session) -> None:
            for i in range(5):
                await session.append_turns([text_turn(f"{session.id}-{i}")])

        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(writer, session)
        stats = host.statistics().store
    assert stats.batches > 0 and stats.avg_batch_size > 1
    for session in sessions:
        stored = await store.load(session.id)
        assert stored is not None and stored.turns == session.turns
        assert [t.id for t in stored.turns] == [f"{session.id}-{i}" for i in range(5)]


async def test_host_on_sqlite_group_commits_and_reloads_equal(tmp_path: Any) -> None:
    from zidane_actors.stores import open_sqlite_store

    path = tmp_path / "sessions.db"
    async with open_sqlite_store(path, durability="normal") as store:
        async with open_session_host(store, max_live_sessions=4) as host:
            sessions = [await host.create_session(id=f"s{i}") for i in range(12)]

            async def writer(session: Session) -> None:
                for i in range(4):
                    await session.append_turns([text_turn(f"{session.id}-{i}")])
                    await session.set_meta("step", i)
                await session.save()

            async with trio.open_nursery() as nursery:
                for session in sessions:
                    nursery.start_soon(writer, session)
            stats = host.statistics()
        assert stats.store.batches > 0 and stats.live_actors <= 4
    async with open_sqlite_store(path) as reopened, open_session_host(reopened) as host:
        for session in sessions:
            loaded = await host.load_session(session.id)
            assert loaded is not None
            assert loaded.turns == session.turns
            assert loaded.metadata == {"step": 3}


async def _ignore(_: object) -> None:
    await trio.lowlevel.checkpoint()


def _opener(kind: str, stack: AsyncExitStack) -> Callable[[], AbstractAsyncContextManager[Any]]:
    if kind == "actor":
        return lambda: open_actor(_ignore)
    if kind == "store actor":
        return lambda: open_store_actor(create_memory_store())
    if kind == "host":
        return lambda: open_session_host(create_memory_store())
    schema = stack.enter_context(fresh_schema())
    return lambda: open_postgres_store(DSN, schema=schema, listen=True)


@pytest.mark.parametrize("kind", ["actor", "store actor", "host", "postgres listening"])
async def test_an_error_of_the_body_comes_out_as_itself_with_its_cause(kind: str) -> None:
    """``except ConflictError`` around an ``open_*`` block catches what its body raised."""
    async with AsyncExitStack() as stack:
        opener = _opener(kind, stack)
        cause = ValueError("the cause")
        with pytest.raises(ConflictError, match="in the body") as raised:
            async with opener():
                raise ConflictError("raised in the body") from cause
        assert raised.value.__cause__ is cause
        # A cancellation of the scope around the block, from its body, is caught by that scope.
        with trio.CancelScope() as scope:
            async with opener():
                scope.cancel()
                await trio.sleep_forever()
        assert scope.cancelled_caught


async def test_host_entry_points_refuse_bad_ids_and_values_with_the_librarys_error() -> None:
    # An unhashable or deeply nested argument is a located ValidationError, never a
    # TypeError from a dict lookup or a RecursionError from building the message.
    deep: list[object] = []
    node = deep
    for _ in range(3000):
        child: list[object] = []
        node.append(child)
        node = child
    async with open_session_host(MemoryStore()) as host:
        with pytest.raises(ValidationError):
            await host.load_session(["s"])  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await host.create_session(id=["s"])  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await host.delete_session({"s": 1})  # type: ignore[arg-type]
        with pytest.raises(ValidationError) as refused:
            await host.create_session(agent_id=deep)  # type: ignore[arg-type]
        assert len(str(refused.value)) < 300
