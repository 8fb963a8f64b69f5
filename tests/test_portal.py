"""The portal: a session host on its own trio thread, used from blocking and asyncio code.

Real stores (SQLite files, the file map, a served store over HTTP), real
threads, real asyncio loops. Cross-thread coordination uses events, never
sleeps; ``SAFETY_S`` only turns a would-be hang into a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from zidane_actors.actors import load_session
from zidane_actors.errors import (
    ActorClosed,
    ActorCrashed,
    ConflictError,
    ValidationError,
)
from zidane_actors.model import AppendTurnsOptions, SessionData, SessionTurn, TextBlock
from zidane_actors.portal import AsyncHost, open_host_async, start_host
from zidane_actors.stores import MemoryStore, open_sqlite_store

SAFETY_S = 60.0


def turn(i: int, text: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=f"t{i}", role="user", content=(TextBlock(text or f"turn {i}"),), created_at=1_000 + i
    )


def run_async(main: Any) -> Any:
    async def guarded() -> Any:
        return await asyncio.wait_for(main(), SAFETY_S)

    return asyncio.run(guarded())


class GatedStore:
    """The required store methods over a memory store; ``append_turns`` can be held."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.gate: trio.Event | None = None
        self.entered = threading.Event()
        self.closed = False

    async def load(self, session_id: str) -> SessionData | None:
        return await self.inner.load(session_id)

    async def save(self, data: SessionData) -> None:
        await self.inner.save(data)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> None:
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        await self.inner.append_turns(session_id, turns, options)

    async def get_turns(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.get_turns(session_id, *args, **kwargs)

    async def update_run(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.update_run(session_id, *args, **kwargs)

    async def update_status(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.update_status(session_id, *args, **kwargs)


def gated_opener(store: GatedStore) -> Any:
    @asynccontextmanager
    async def opener() -> AsyncIterator[GatedStore]:
        try:
            yield store
        finally:
            store.closed = True

    return opener


# -- blocking callers ------------------------------------------------------


def test_sync_host_round_trips_through_sqlite_as_ordinary_zidane_data(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with start_host(f"sqlite:{db}") as host:
        session = host.create_session(agent_id="assistant", metadata={"title": "t"})
        session.append_turns([turn(1)])
        session.set_meta("k", [1, 2])
        session.save()
        assert [t.id for t in session.turns] == ["t1"]
        assert session.metadata["k"] == [1, 2]
        sid = session.id
    with start_host(f"sqlite:{db}") as host:
        again = host.load_session(sid)
        assert again is not None and again.turns == (turn(1),)
        again.append_turns([turn(2)])
        assert host.load_session("nope") is None

    async def read() -> SessionData | None:
        async with open_sqlite_store(str(db)) as store:
            loaded = await load_session(store, sid)
            return None if loaded is None else loaded.to_json()

    data = trio.run(read)
    assert data is not None and [t.id for t in data.turns] == ["t1", "t2"]
    assert data.metadata["k"] == [1, 2]


@pytest.mark.parametrize("form", ["memory:", "memory", "file", "sqlite-suffix"])
def test_every_local_store_url_form_opens(form: str, tmp_path: Path) -> None:
    url = {
        "file": f"file:{tmp_path / 'dir'}",
        "sqlite-suffix": str(tmp_path / "x.db"),
    }.get(form, form)
    with start_host(url) as host:
        session = host.create_session()
        session.append_turns([turn(1)])
        assert host.load_session(session.id) is not None


def test_remote_store_url_through_a_real_server(tmp_path: Path) -> None:
    from test_server_e2e import ServerProcess

    server = ServerProcess(f"sqlite:{tmp_path / 'served.db'}")
    url = server.start()
    try:
        with start_host(url) as host:
            session = host.create_session()
            session.append_turns([turn(1)])
            sid = session.id
        with start_host(url) as host:
            loaded = host.load_session(sid)
            assert loaded is not None and loaded.turns == (turn(1),)
    finally:
        server.stop()


def test_bad_store_url_is_a_validation_error_raised_by_start() -> None:
    with pytest.raises(ValidationError, match="unknown store URL"):
        start_host("mysql://nope")
    with pytest.raises(ValidationError, match="needs a path"):
        start_host("sqlite:")


def test_errors_are_the_library_exceptions_and_the_host_lives_on() -> None:
    with start_host("memory:") as host:
        session = host.create_session(id="one")
        with pytest.raises(ConflictError):
            host.create_session(id="one")
        with pytest.raises(ValidationError):
            session.update_status("bogus")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            session.set_meta(3, "x")  # type: ignore[arg-type]
        session.append_turns([turn(1)])
        assert len(session.turns) == 1


def test_calls_after_close_raise_actor_closed_and_close_is_idempotent() -> None:
    host = start_host("memory:")
    session = host.create_session()
    host.close()
    host.close()
    with pytest.raises(ActorClosed):
        session.append_turns([turn(1)])
    with pytest.raises(ActorClosed):
        host.create_session()
    assert session.turns == ()  # reads keep working


def test_closing_closes_the_store_after_the_calls_in_flight() -> None:
    store = GatedStore()
    host = start_host(gated_opener(store))
    session = host.create_session()
    host.call(_remember_token, store)
    host.call(_set_gate, store)
    worker = threading.Thread(target=session.append_turns, args=([turn(1)],))
    worker.start()
    assert store.entered.wait(SAFETY_S)
    closer = threading.Thread(target=host.close)
    closer.start()
    # The append in flight is not cut short by the close: release it.
    _open_gate_from_outside(store)
    closer.join(SAFETY_S)
    worker.join(SAFETY_S)
    assert not closer.is_alive() and not worker.is_alive()
    assert store.closed
    assert len(session.turns) == 1


def test_closing_cancels_a_call_that_would_never_end() -> None:
    host = start_host("memory:")
    outcome: list[BaseException] = []

    def wait_forever() -> None:
        try:
            host.call(trio.sleep_forever)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    host.call(trio.testing.wait_all_tasks_blocked)
    host.close()
    waiter.join(SAFETY_S)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and type(outcome[0]) is ActorClosed


async def _set_gate(store: GatedStore) -> None:
    store.gate = trio.Event()


def _open_gate_from_outside(store: GatedStore) -> None:
    # The portal no longer accepts calls once closing: reach the trio loop directly.
    gate = store.gate
    assert gate is not None
    token = _token_of(store)
    token.run_sync_soon(gate.set)


_TOKENS: dict[int, trio.lowlevel.TrioToken] = {}


def _token_of(store: GatedStore) -> trio.lowlevel.TrioToken:
    return _TOKENS[id(store)]


async def _remember_token(store: GatedStore) -> None:
    _TOKENS[id(store)] = trio.lowlevel.current_trio_token()


@pytest.fixture(autouse=True)
def _forget_tokens() -> Any:
    yield
    _TOKENS.clear()


# -- crashes ---------------------------------------------------------------


class Boom(BaseException):
    """A bug escaping as a non-Exception: it kills the trio loop."""


async def _boom() -> None:
    raise Boom("injected")


def test_a_crash_in_the_trio_thread_fails_every_waiting_caller_and_never_hangs() -> None:
    host = start_host("memory:")
    session = host.create_session()
    outcome: list[BaseException] = []

    def wait_forever() -> None:
        try:
            host.call(trio.sleep_forever)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    host.call(trio.testing.wait_all_tasks_blocked)
    with pytest.raises(ActorCrashed) as crashed:
        host.call(_boom)
    waiter.join(SAFETY_S)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ActorCrashed)
    assert _has(crashed.value.__cause__, Boom)
    with pytest.raises(ActorClosed) as closed:
        session.append_turns([turn(1)])
    assert _has(closed.value.__cause__, Boom)
    host.close()  # reported already: closing is quiet


def test_a_crash_no_call_saw_is_raised_by_close() -> None:
    @asynccontextmanager
    async def crashing_on_close() -> AsyncIterator[MemoryStore]:
        yield MemoryStore()
        raise Boom("store close failed")

    host = start_host(crashing_on_close)
    host.create_session()
    with pytest.raises(ActorCrashed) as crashed:
        host.close()
    assert _has(crashed.value.__cause__, Boom)
    host.close()  # reported once


def test_an_opener_failure_is_raised_by_start() -> None:
    @asynccontextmanager
    async def failing() -> AsyncIterator[MemoryStore]:
        raise ValidationError("no such store")
        yield MemoryStore()  # pragma: no cover

    with pytest.raises(ValidationError, match="no such store"):
        start_host(failing)


def _has(exc: BaseException | None, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_has(e, kind) for e in exc.exceptions)
    return False


# -- asyncio callers ---------------------------------------------------------


def test_asyncio_host_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "a.db"

    async def main() -> list[str]:
        async with open_host_async(f"sqlite:{db}") as host:
            session = await host.create_session(agent_id="a")
            await session.append_turns([turn(1)])
            await session.set_meta("title", "hello")
            await session.save()
            sid = session.id
        async with open_host_async(f"sqlite:{db}") as host:
            loaded = await host.load_session(sid)
            assert loaded is not None and loaded.metadata["title"] == "hello"
            return [t.id for t in loaded.turns]

    assert run_async(main) == ["t1"]


def test_asyncio_calls_never_block_the_loop() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            event = trio.Event()
            # If the first call blocked the asyncio loop, the second (which
            # releases it) could never be sent.
            first = asyncio.create_task(host.call(event.wait))
            await asyncio.sleep(0)
            assert not first.done()
            await host.call(_set_event, event)
            await first

    run_async(main)


async def _set_event(event: trio.Event) -> None:
    event.set()


def test_asyncio_errors_are_the_library_exceptions() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            await host.create_session(id="x")
            with pytest.raises(ConflictError):
                await host.create_session(id="x")
        with pytest.raises(ValidationError):
            async with open_host_async("nope:"):
                pass  # pragma: no cover

    run_async(main)


async def _blocked_pipeline(host: AsyncHost, store: GatedStore) -> tuple[Any, list[Any]]:
    """One append held in the store, one queued, one blocked sending (both mailboxes of size 1)."""
    session = await host.create_session()
    await host.call(_set_gate, store)
    tasks = []
    for i in (1, 2, 3):
        # Trio runs newly spawned tasks in an arbitrary order: one at a time.
        tasks.append(asyncio.create_task(session.append_turns([turn(i)])))
        await asyncio.sleep(0)  # the task submits before its first await
        await host.call(trio.testing.wait_all_tasks_blocked)
    return session, tasks


def test_asyncio_cancel_before_acceptance_withdraws_the_call() -> None:
    store = GatedStore()

    async def main() -> None:
        async with open_host_async(
            gated_opener(store), mailbox_size=1, store_mailbox_size=1
        ) as host:
            await host.call(_remember_token, store)
            session, (held, queued, blocked) = await _blocked_pipeline(host, store)
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            await host.call(_open_gate, store)
            await held
            await queued
            assert [t.id for t in session.turns] == ["t1", "t2"]
            stored = await host.call(store.inner.load, session.id)
            assert [t.id for t in stored.turns] == ["t1", "t2"]

    run_async(main)


def test_asyncio_cancel_after_acceptance_waits_for_the_verdict_then_raises() -> None:
    store = GatedStore()

    async def main() -> None:
        async with open_host_async(
            gated_opener(store), mailbox_size=1, store_mailbox_size=1
        ) as host:
            session, (held, queued, blocked) = await _blocked_pipeline(host, store)
            held.cancel()
            await asyncio.sleep(0)
            assert not held.done()  # still waiting for the verdict of an accepted call
            await host.call(_open_gate, store)
            with pytest.raises(asyncio.CancelledError):
                await held
            await queued
            await blocked
            assert [t.id for t in session.turns] == ["t1", "t2", "t3"]  # applied

    run_async(main)


def test_asyncio_timeout_on_a_withdrawn_call_is_a_timeout_error() -> None:
    store = GatedStore()

    async def main() -> None:
        async with open_host_async(
            gated_opener(store), mailbox_size=1, store_mailbox_size=1
        ) as host:
            session, (held, queued, blocked) = await _blocked_pipeline(host, store)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0):
                    await session.append_turns([turn(4)])
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            await host.call(_open_gate, store)
            await held
            await queued
            assert [t.id for t in session.turns] == ["t1", "t2"]

    run_async(main)


async def _open_gate(store: GatedStore) -> None:
    assert store.gate is not None
    store.gate.set()
    store.gate = None


def test_asyncio_crash_is_reported_never_a_hang() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            waiting = asyncio.create_task(host.call(trio.sleep_forever))
            await asyncio.sleep(0)
            with pytest.raises(ActorCrashed):
                await host.call(_boom)
            with pytest.raises(ActorCrashed):
                await waiting
            with pytest.raises(ActorClosed):
                await host.create_session()

    run_async(main)


def test_one_host_serves_several_threads_at_once() -> None:
    with start_host("memory:") as host:
        session = host.create_session()
        threads = [
            threading.Thread(target=session.append_turns, args=([turn(i)],)) for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SAFETY_S)
        assert sorted(t.id for t in session.turns) == ["t0", "t1", "t2", "t3"]


# -- the host under concurrent get-or-create (what shared portals do) ---------


async def test_concurrent_creates_of_one_id_never_overwrite_each_other() -> None:
    from zidane_actors.actors import open_session_host
    from zidane_actors.stores import open_memory_store

    async with open_memory_store() as store, open_session_host(store) as host:
        outcomes: list[Any] = []

        async def create() -> None:
            try:
                session = await host.create_session(id="same")
                await session.append_turns([turn(len(outcomes))])
                outcomes.append(session)
            except ConflictError as exc:
                outcomes.append(exc)

        async def load() -> None:
            outcomes.append(await host.load_session("same"))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(create)
            nursery.start_soon(load)
        # One handle: the creator's, shared by the load (a load that ran before
        # any create finds nothing, and a create never fails because of it).
        sessions = {id(o) for o in outcomes if o is not None and not isinstance(o, ConflictError)}
        assert len(sessions) == 1
        stored = await store.load("same")
        assert stored is not None and len(stored.turns) == 1
