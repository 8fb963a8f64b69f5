"""The store actor: capability forwarding, mailbox order, group commit."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import outcome
import pytest
import trio
import trio.testing

from zidane_actors.actors import open_session_host, open_store_actor
from zidane_actors.errors import SessionNotFoundError
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import (
    WRITE_METHODS,
    MemoryStore,
    SessionStore,
    StoreWrite,
    create_memory_store,
    store_capabilities,
)


def turn(i: int, tag: str) -> SessionTurn:
    return SessionTurn(
        id=f"{tag}-{i}", role="user", content=(TextBlock(text=f"{tag} {i}"),), created_at=i
    )


class RecordingStore(MemoryStore):
    """A memory store that records every ``apply_writes`` batch it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[str, str]]] = []

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        self.batches.append([(w.method, w.args[0] if w.args else "") for w in writes])
        return await super().apply_writes(writes)


class MinimalStore:
    """Only the required methods plus ``get_meta``, delegating to a memory store."""

    def __init__(self) -> None:
        self._inner = create_memory_store()

    async def load(self, session_id: str) -> SessionData | None:
        return await self._inner.load(session_id)

    async def save(self, data: SessionData) -> None:
        await self._inner.save(data)

    async def append_turns(self, session_id: str, turns: Any, options: Any = None) -> None:
        await self._inner.append_turns(session_id, turns, options)

    async def get_turns(self, session_id: str, from_: int = 0, limit: int | None = None) -> Any:
        return await self._inner.get_turns(session_id, from_, limit)

    async def update_run(self, session_id: str, run: Any, options: Any = None) -> None:
        await self._inner.update_run(session_id, run, options)

    async def update_status(self, session_id: str, status: Any, **kwargs: Any) -> None:
        await self._inner.update_status(session_id, status, **kwargs)

    async def delete(self, session_id: str) -> None:
        await self._inner.delete(session_id)

    async def list(self, filter: Any = None) -> builtins.list[str]:
        return await self._inner.list(filter)

    async def get_meta(self, session_id: str) -> Any:
        return await self._inner.get_meta(session_id)


async def test_handle_forwards_exactly_the_wrapped_capabilities() -> None:
    for store in (create_memory_store(), MinimalStore()):
        async with open_store_actor(store) as handle:  # type: ignore[arg-type]
            assert isinstance(handle, SessionStore)
            assert store_capabilities(handle) == store_capabilities(store)
    minimal = MinimalStore()
    async with open_store_actor(minimal) as handle:  # type: ignore[arg-type]
        assert store_capabilities(handle) == {"get_meta"}
        assert not hasattr(handle, "save_meta")
        with pytest.raises(AttributeError):
            handle.mutate_history  # noqa: B018
        await handle.save(SessionData(id="s1", created_at=1, updated_at=1))
        row = await handle.get_meta("s1")
        assert row is not None and row.id == "s1"


async def test_errors_go_to_the_caller_and_the_actor_lives_on() -> None:
    async with open_store_actor(create_memory_store()) as handle:
        with pytest.raises(SessionNotFoundError):
            await handle.append_turns("missing", [turn(0, "x")])
        await handle.save(SessionData(id="s1", created_at=1, updated_at=1))
        assert await handle.list() == ["s1"]
        stats = handle.statistics()
    assert stats.actor.failed == 1 and stats.calls == 3


async def test_group_commit_batches_many_sessions_without_reordering_any() -> None:
    store = RecordingStore()
    sessions = [f"s{i}" for i in range(20)]
    for sid in sessions:
        await store.save(SessionData(id=sid, created_at=1, updated_at=1))
    async with open_store_actor(store, max_batch=64) as handle:

        async def writer(sid: str) -> None:
            for i in range(10):
                await handle.append_turns(sid, [turn(i, sid)])

        async with trio.open_nursery() as nursery:
            for sid in sessions:
                nursery.start_soon(writer, sid)
        stats = handle.statistics()
    for sid in sessions:
        data = await store.load(sid)
        assert data is not None
        assert [t.id for t in data.turns] == [f"{sid}-{i}" for i in range(10)]
    assert stats.batches == len(store.batches) > 0
    assert stats.avg_batch_size > 1
    assert stats.batched_writes == sum(len(b) for b in store.batches)
    # Each batch holds each session at most once: a session waits for its own write.
    for batch in store.batches:
        ids = [sid for _, sid in batch]
        assert len(ids) == len(set(ids))


async def test_a_failing_write_in_a_batch_fails_alone() -> None:
    store = RecordingStore()
    await store.save(SessionData(id="ok", created_at=1, updated_at=1))
    async with open_store_actor(store) as handle:
        results: dict[str, BaseException | None] = {}

        async def write(sid: str) -> None:
            try:
                await handle.append_turns(sid, [turn(0, sid)])
                results[sid] = None
            except SessionNotFoundError as exc:
                results[sid] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, "ok")
            nursery.start_soon(write, "missing")
    assert results["ok"] is None
    assert isinstance(results["missing"], SessionNotFoundError)
    assert any(len(b) == 2 for b in store.batches)
    data = await store.load("ok")
    assert data is not None and len(data.turns) == 1


class GatedStore(MemoryStore):
    """A memory store that logs when each load, get_meta and save starts and ends.

    A load of ``"gate"`` waits for ``gate``; the other reads wait until every
    read of their wave has started (so reads made one at a time would hang).
    """

    def __init__(self, wave: int) -> None:
        super().__init__()
        self.log: list[str] = []
        self.gate = trio.Event()
        self.wave = wave
        self.started = 0
        self.all_started = trio.Event()

    async def _logged(self, name: str, call: Any) -> Any:
        self.log.append(f"start {name}")
        try:
            return await call
        finally:
            self.log.append(f"end {name}")

    async def _wave(self) -> None:
        self.started += 1
        if self.started == self.wave:
            self.all_started.set()
        with trio.fail_after(5):
            await self.all_started.wait()

    async def load(self, session_id: str) -> SessionData | None:
        if session_id == "gate":
            await self.gate.wait()
            return None
        self.log.append(f"start load {session_id}")
        await self._wave()
        self.log.append(f"end load {session_id}")
        return await super().load(session_id)

    async def get_meta(self, session_id: str) -> Any:
        self.log.append(f"start get_meta {session_id}")
        await self._wave()
        self.log.append(f"end get_meta {session_id}")
        if session_id == "missing":
            raise SessionNotFoundError("no such session")
        return await super().get_meta(session_id)

    async def save(self, data: SessionData, **kwargs: Any) -> Any:
        return await self._logged(f"save {data.id}", super().save(data, **kwargs))


async def test_queued_reads_run_at_once_and_keep_their_place_among_writes() -> None:
    store = GatedStore(wave=3)
    await store.save(SessionData(id="a", created_at=1, updated_at=1))
    store.log.clear()
    async with open_store_actor(store) as handle:
        answers: dict[str, Any] = {}

        async def call(name: str, method: str, *args: Any) -> None:
            try:
                answers[name] = await getattr(handle, method)(*args)
            except SessionNotFoundError as exc:
                answers[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "gate", "load", "gate")
            await trio.testing.wait_all_tasks_blocked()  # the actor holds the gate's load
            steps = [
                ("1", "load", "a"),
                ("2", "get_meta", "a"),
                ("3", "get_meta", "missing"),
                ("4", "save", SessionData(id="b", created_at=1, updated_at=2)),
                ("5", "load", "b"),
            ]
            for name, method, arg in steps:
                nursery.start_soon(call, name, method, arg)
                await trio.testing.wait_all_tasks_blocked()  # queued in this order
            store.gate.set()
            # The three reads queued before the save made one wave: each waited for the
            # others to start. The read after the save must not join it (a wave of one).
            await trio.testing.wait_all_tasks_blocked()
            store.started, store.wave, store.all_started = 0, 1, trio.Event()
        stats = handle.statistics()
    reads = store.log[: store.log.index("start save b")]
    assert sorted(reads) == sorted(
        f"{edge} {read}"
        for edge in ("start", "end")
        for read in ("load a", "get_meta a", "get_meta missing")
    )
    assert all(r.startswith("start") for r in reads[:3])  # all started before any ended
    assert store.log[store.log.index("start save b") :] == [
        "start save b", "end save b", "start load b", "end load b"
    ]  # fmt: skip
    assert answers["1"].id == "a" and answers["2"].id == "a"
    assert isinstance(answers["3"], SessionNotFoundError)
    assert answers["5"].id == "b" and answers["gate"] is None
    assert stats.read_waves == 1


async def test_calls_queued_together_from_one_task_keep_their_order_and_read_in_one_wave() -> None:
    store = GatedStore(wave=2)
    await store.save(SessionData(id="a", created_at=1, updated_at=1))
    store.log.clear()
    async with open_store_actor(store) as handle:
        answers = await handle.call_together(
            [
                StoreWrite("load", ("a",)),
                StoreWrite("get_meta", ("missing",)),
                StoreWrite("save", (SessionData(id="b", created_at=1, updated_at=2),)),
                StoreWrite("get_meta", ("b",)),
            ]
        )
        stats = handle.statistics()
    # One wave of two (trio runs the wave's tasks in either order), then the rest in order.
    assert sorted(store.log[:2]) == ["start get_meta missing", "start load a"]
    assert store.log[4:] == ["start save b", "end save b", "start get_meta b", "end get_meta b"]
    loaded, missing, saved, meta = answers
    assert loaded.unwrap().id == "a" and saved.unwrap().after > 0
    assert isinstance(missing, outcome.Error) and isinstance(missing.error, SessionNotFoundError)
    assert meta.unwrap().id == "b" and stats.read_waves == 1


class NowStore(MemoryStore):
    """A memory store that can also make a write at once (``apply_nowait``) while ``ready``,
    logging how each write was made: now, through ``apply_writes`` or awaited alone."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = True
        self.made: list[tuple[str, str]] = []
        self.hold: trio.Event | None = None  # an awaited write waits for it when set

    def apply_nowait(self, call: StoreWrite) -> Any:
        if not self.ready or call.method not in WRITE_METHODS:
            raise trio.WouldBlock
        self.made.append(("now", call.args[0]))
        return self._apply_write(call)

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        self.made.extend(("batch", w.args[0]) for w in writes)
        return await super().apply_writes(writes)

    async def append_turns(self, session_id: str, turns: Any, options: Any = None) -> Any:
        self.made.append(("awaited", session_id))
        if self.hold is not None:
            await self.hold.wait()
        return await super().append_turns(session_id, turns, options)


async def test_a_lone_call_is_made_at_once_in_the_callers_task() -> None:
    store = NowStore()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        store.made.clear()
        await session.append_turns([turn(0, "s")])
        stats = host.statistics().store
        assert store.made == [("now", "s")] and stats.calls_at_once == 1
        assert stats.actor.processed >= 1 and stats.batches == 0
        # A store that cannot make it now: the mailbox, as always.
        store.ready = False
        await session.append_turns([turn(1, "s")])
        assert store.made[1:] == [("awaited", "s")]
        assert host.statistics().store.calls_at_once == 1
    loaded = await store.load("s")
    assert loaded is not None and loaded.turns == session.turns == (turn(0, "s"), turn(1, "s"))


async def test_a_burst_goes_to_the_mailbox_together() -> None:
    """Tasks woken together reach the store actor together: one group commit, none at once."""
    store = NowStore()
    async with open_session_host(store) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(20)]
        store.made.clear()
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(session.append_turns, [turn(0, session.id)])
        assert host.statistics().store.calls_at_once == 0
    assert sorted(store.made) == sorted(("batch", f"s{i}") for i in range(20))


async def test_a_call_behind_another_waits_its_turn() -> None:
    """While the actor has a call in hand, a lone call is never made ahead of it."""
    store = NowStore()
    store.ready = False
    async with open_session_host(store) as host:
        first, second = await host.create_session(id="a"), await host.create_session(id="b")
        store.made.clear()
        store.hold = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.append_turns, [turn(0, "a")])
            await trio.testing.wait_all_tasks_blocked()
            store.ready = True  # the store could make it now; the actor is busy
            nursery.start_soon(second.append_turns, [turn(0, "b")])
            await trio.testing.wait_all_tasks_blocked()
            assert store.made == [("awaited", "a")]
            store.hold.set()
        assert store.made == [("awaited", "a"), ("awaited", "b")]
        assert host.statistics().store.calls_at_once == 0


async def test_a_call_cancelled_at_its_schedule_point_is_never_made() -> None:
    store = NowStore()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        store.made.clear()
        with trio.CancelScope() as scope:
            scope.cancel()
            await session.append_turns([turn(0, "s")])
        assert store.made == [] and session.turns == ()
        await session.append_turns([turn(1, "s")])  # the session goes on
    loaded = await store.load("s")
    assert loaded is not None and loaded.turns == (turn(1, "s"),)


async def test_a_call_made_at_once_answers_the_stores_own_error() -> None:
    store = NowStore()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        await store.delete("s")  # behind the session's back
        with pytest.raises(SessionNotFoundError):
            await session.append_turns([turn(0, "s")])
        assert session.turns == ()
        stats = host.statistics().store
        assert stats.calls_at_once == 1 and stats.actor.failed == 1
