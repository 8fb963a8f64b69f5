"""The portal's two doors: their surface against the trio API, and the batched hand-off.

The handles are generated from one description of ``Session``/``SessionHost``;
the surface tests make any new trio member fail here until it is bridged (or
listed in ``TRIO_ONLY`` with its reason). The batching tests hold the trio
thread still with a posted function that waits on a ``threading.Event``, so
what queues meanwhile, and how many waves take it, is exact: no timing.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from zidane_actors.actors import Session, SessionHost
from zidane_actors.actors import _extension as extension
from zidane_actors.errors import ActorClosed, ExtensionStateError
from zidane_actors.model import SessionData, SessionTurn, TextBlock, ToolResultBlock
from zidane_actors.portal import (
    TRIO_ONLY,
    AsyncHost,
    AsyncSession,
    SyncHost,
    SyncSession,
    open_host_async,
    start_host,
)
from zidane_actors.portal._thread import Portal
from zidane_actors.stores import MemoryStore

SAFETY_S = 60.0


def turn(i: int) -> SessionTurn:
    return SessionTurn(id=f"t{i}", role="user", content=(TextBlock(f"turn {i}"),), created_at=i)


def run_async(main: Callable[[], Any]) -> Any:
    async def guarded() -> Any:
        return await asyncio.wait_for(main(), SAFETY_S)

    return asyncio.run(guarded())


def portal_of(host: SyncHost | AsyncHost) -> Portal:
    return host._portal


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition another thread makes true (bounded; the outcome is exact)."""
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.001)


class Freeze:
    """Holds the portal's trio thread inside a posted function until released."""

    def __init__(self, portal: Portal) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        portal.post(self._hold)
        assert self.entered.wait(SAFETY_S)

    def _hold(self) -> None:
        self.entered.set()
        assert self.release.wait(SAFETY_S)


# -- the surface ------------------------------------------------------------------------------


def public_members(cls: type) -> dict[str, Any]:
    return {name: value for name, value in inspect.getmembers(cls) if not name.startswith("_")}


EXTENSION_METHODS = {
    "get_extension_state": extension.get_extension_session_state,
    "set_extension_state": extension.set_extension_session_state,
    "delete_extension_state": extension.delete_extension_session_state,
}


def parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    ("trio_cls", "handles"),
    [(Session, (SyncSession, AsyncSession)), (SessionHost, (SyncHost, AsyncHost))],
)
def test_every_public_trio_member_is_bridged_or_listed_as_trio_only(
    trio_cls: type, handles: tuple[type, type]
) -> None:
    for name, member in public_members(trio_cls).items():
        if name in TRIO_ONLY:
            assert not any(hasattr(h, name) for h in handles), f"{name} is listed trio-only"
            continue
        for handle in handles:
            assert hasattr(handle, name), f"{handle.__name__} lacks {name}"
            if isinstance(member, property):
                assert not callable(inspect.getattr_static(handle, name)), name


def test_bridged_methods_have_the_trio_parameters_on_both_doors() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            session = await host.create_session()
            trio_session, trio_host = session.trio_session, host.trio_host
            sync = SyncSession(portal_of(host), trio_session)
            sync_host = SyncHost(portal_of(host))
            pairs = [(trio_session, (sync, session)), (trio_host, (sync_host, host))]
            for trio_obj, (blocking, coroutine) in pairs:
                for name, member in public_members(type(trio_obj)).items():
                    if name in TRIO_ONLY or isinstance(member, property):
                        continue
                    want = parameters(getattr(trio_obj, name))
                    for door in (blocking, coroutine):
                        assert parameters(getattr(door, name)) == want, (type(door), name)
                    if inspect.iscoroutinefunction(member):
                        assert inspect.iscoroutinefunction(getattr(coroutine, name)), name
                        assert not inspect.iscoroutinefunction(getattr(blocking, name)), name
            for name, fn in EXTENSION_METHODS.items():
                want = parameters(fn)[1:]  # the session is the handle's
                assert parameters(getattr(sync, name)) == want
                assert parameters(getattr(session, name)) == want

    run_async(main)


def test_trio_only_members_exist_and_say_why() -> None:
    every = set(public_members(Session)) | set(public_members(SessionHost))
    assert set(TRIO_ONLY) <= every
    assert all(reason for reason in TRIO_ONLY.values())


# -- members that were missing ----------------------------------------------------------------


def test_listeners_store_and_extension_state_through_the_blocking_door() -> None:
    with start_host("memory:") as host:
        session = host.create_session()
        seen: list[tuple[str, Any]] = []
        saved: list[int] = []
        unsubscribe = session.on_meta(lambda key, value: seen.append((key, value)))
        session.on_saved(lambda: saved.append(1))
        session.set_meta("a", 1)
        session.save()
        unsubscribe()
        session.set_meta("b", 2)  # runs after the unsubscribe: calls from one thread keep order
        assert seen == [("a", 1)]
        assert saved == [1]
        assert session.store is host.store is host.trio_host.store
        session.set_extension_state("my-ext", "counter", {"n": 1})
        assert session.get_extension_state("my-ext", "counter") == {"n": 1}
        session.delete_extension_state("my-ext", "counter")
        assert session.get_extension_state("my-ext", "counter") is None
        with pytest.raises(ExtensionStateError):
            session.set_extension_state("Bad Name", "k", 1)
        host.check_open()
        assert host.statistics().known_sessions == 1


def test_load_options_and_to_messages_options_cross_to_the_trio_side() -> None:
    store = MemoryStore()
    orphan = SessionTurn(
        id="r",
        role="user",
        content=(ToolResultBlock(call_id="nobody", output="x"),),
        created_at=2,
    )
    trio.run(store.save, SessionData(id="s", created_at=1, updated_at=1, turns=(turn(1), orphan)))

    @asynccontextmanager
    async def opener() -> AsyncIterator[MemoryStore]:
        yield store

    async def main() -> None:
        async with open_host_async(opener) as host:
            drops: list[Any] = []
            session = await host.load_session(
                "s", on_pairing_drop=drops.append, clock=lambda: 1_700_000_000_000
            )
            assert session is not None
            assert "nobody" in [d.call_id for d in drops]  # the orphan result, dropped
            messages = await session.to_messages(provider="anthropic", user_tail_directive="go on")
            assert messages[-1].role == "user"

    run_async(main)


# -- batching -------------------------------------------------------------------------------------


async def _noop() -> None:
    pass


def test_concurrent_asyncio_callers_queued_meanwhile_take_one_wave() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            portal = portal_of(host)
            sessions = [await host.create_session(id=f"s{i}") for i in range(50)]
            freeze = Freeze(portal)
            before = portal.statistics()
            tasks = [
                asyncio.create_task(s.append_turns([turn(j)])) for j in range(3) for s in sessions
            ]
            await asyncio.sleep(0)  # each task queues its call before its first await
            assert portal.statistics().queued == 150
            freeze.release.set()
            await asyncio.gather(*tasks)
            after = portal.statistics()
            assert after.waves - before.waves == 1
            assert after.calls - before.calls == 150
            # (concurrent appends to one session land in any order, all of them)
            assert all(sorted(t.id for t in s.turns) == ["t0", "t1", "t2"] for s in sessions)
            stored = await host.call(host.trio_host.store.load, "s7")
            assert [t.id for t in stored.turns] == [t.id for t in sessions[7].turns]

    run_async(main)


def test_verdicts_of_one_pass_reach_asyncio_in_one_delivery() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            portal = portal_of(host)
            freeze = Freeze(portal)
            tasks = [asyncio.create_task(host.call(_noop)) for _ in range(100)]
            await asyncio.sleep(0)
            before = portal.statistics()
            freeze.release.set()
            await asyncio.gather(*tasks)
            after = portal.statistics()
            # One drain starts all hundred; they finish in the same pass of the loop.
            assert after.deliveries - before.deliveries == 1

    run_async(main)


def test_calls_reuse_parked_workers_instead_of_a_task_each() -> None:
    with start_host("memory:") as host:
        portal = portal_of(host)
        session = host.create_session()
        for i in range(20):
            session.append_turns([turn(i)])
        assert portal.statistics().workers == 1
        assert len(session.turns) == 20


def test_concurrent_threads_queued_meanwhile_take_one_wave() -> None:
    with start_host("memory:") as host:
        portal = portal_of(host)
        sessions = [host.create_session(id=f"s{i}") for i in range(40)]
        freeze = Freeze(portal)
        before = portal.statistics()
        threads = [threading.Thread(target=s.append_turns, args=([turn(1)],)) for s in sessions]
        for thread in threads:
            thread.start()
        wait_until(lambda: portal.statistics().queued == 40)
        freeze.release.set()
        for thread in threads:
            thread.join(SAFETY_S)
        assert not any(t.is_alive() for t in threads)
        after = portal.statistics()
        assert after.waves - before.waves == 1
        assert all(s.turns == (turn(1),) for s in sessions)


def test_asyncio_and_threads_share_one_host_at_once() -> None:
    with start_host("memory:") as sync_host:
        portal = portal_of(sync_host)
        session = sync_host.create_session(id="shared")
        async_session = AsyncSession(portal, session.trio_session)

        def from_thread(k: int) -> None:
            for i in range(10):
                session.set_meta(f"thread-{k}-{i}", i)

        async def from_asyncio() -> None:
            await asyncio.gather(*(async_session.set_meta(f"async-{i}", i) for i in range(50)))

        threads = [threading.Thread(target=from_thread, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        run_async(from_asyncio)
        for thread in threads:
            thread.join(SAFETY_S)
        assert len(session.metadata) == 4 * 10 + 50


# -- cancellation ---------------------------------------------------------------------------------


def test_asyncio_cancel_of_a_call_still_queued_never_runs_it() -> None:
    ran: list[int] = []

    async def record() -> None:
        ran.append(1)

    async def main() -> None:
        async with open_host_async("memory:") as host:
            portal = portal_of(host)
            freeze = Freeze(portal)
            doomed = asyncio.create_task(host.call(record))
            kept = asyncio.create_task(host.call(_noop))
            await asyncio.sleep(0)
            doomed.cancel()
            await asyncio.sleep(0)  # the cancel is asked for while the call is queued
            freeze.release.set()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            await kept
            assert ran == []

    run_async(main)


def test_asyncio_cancel_mid_call_withdraws_it_and_frees_its_worker() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            portal = portal_of(host)
            waiting = asyncio.create_task(host.call(trio.sleep_forever))
            await asyncio.sleep(0)  # queued before the next call: started first
            await host.call(trio.testing.wait_all_tasks_blocked)
            assert portal.statistics().workers == 2  # the sleeper and the one just used
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The worker came back to the pool: later calls run on the same two.
            await asyncio.gather(*(host.call(_noop) for _ in range(2)))
            await host.call(trio.testing.wait_all_tasks_blocked)
            assert portal.statistics().workers == 2

    run_async(main)


def test_asyncio_cancel_mid_call_of_many_keeps_the_rest() -> None:
    async def main() -> None:
        async with open_host_async("memory:") as host:
            sleepers = [asyncio.create_task(host.call(trio.sleep_forever)) for _ in range(10)]
            await asyncio.sleep(0)
            session = await host.create_session()
            appends = [asyncio.create_task(session.append_turns([turn(i)])) for i in range(10)]
            await asyncio.sleep(0)
            await host.call(trio.testing.wait_all_tasks_blocked)
            for task in sleepers[::2]:
                task.cancel()
            await asyncio.gather(*appends)
            for task in sleepers[::2]:
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert not any(task.done() for task in sleepers[1::2])
            assert sorted(t.id for t in session.turns) == sorted(f"t{i}" for i in range(10))
        # Closing withdrew the rest.
        for task in sleepers[1::2]:
            with pytest.raises(ActorClosed):
                await task

    run_async(main)


# -- shutdown -------------------------------------------------------------------------------------


def test_close_with_calls_in_flight_and_queued_answers_every_caller() -> None:
    host = start_host("memory:")
    portal = portal_of(host)
    session = host.create_session()
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()

    def call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            with lock:
                outcomes.append(exc)
        else:
            with lock:
                outcomes.append(None)

    running = [
        threading.Thread(target=call, args=(lambda: host.call(trio.sleep_forever),))
        for _ in range(5)
    ]
    for thread in running:
        thread.start()
    wait_until(lambda: (s := portal.statistics()).workers - s.idle_workers == 5)
    freeze = Freeze(portal)
    queued = [
        threading.Thread(target=call, args=(lambda i=i: session.append_turns([turn(i)]),))
        for i in range(5)
    ]
    for thread in queued:
        thread.start()
    wait_until(lambda: portal.statistics().queued == 5)
    closer = threading.Thread(target=host.close)
    closer.start()
    wait_until(lambda: portal._close_requested)
    freeze.release.set()
    closer.join(SAFETY_S)
    for thread in running + queued:
        thread.join(SAFETY_S)
    assert not closer.is_alive() and not any(t.is_alive() for t in running + queued)
    assert len(outcomes) == 10 and all(type(o) is ActorClosed for o in outcomes)
    assert session.turns == ()
    with pytest.raises(ActorClosed):
        session.append_turns([turn(9)])


def test_asyncio_close_with_calls_in_flight_answers_every_caller() -> None:
    async def main() -> None:
        host_cm = open_host_async("memory:")
        host = await host_cm.__aenter__()
        portal = portal_of(host)
        session = await host.create_session()
        running = [asyncio.create_task(host.call(trio.sleep_forever)) for _ in range(5)]
        await asyncio.sleep(0)
        await host.call(trio.testing.wait_all_tasks_blocked)
        freeze = Freeze(portal)
        queued = [asyncio.create_task(session.append_turns([turn(i)])) for i in range(5)]
        await asyncio.sleep(0)
        closing = asyncio.create_task(host_cm.__aexit__(None, None, None))
        await asyncio.sleep(0)
        freeze.release.set()
        await closing
        results = await asyncio.gather(*running, *queued, return_exceptions=True)
        assert all(type(r) is ActorClosed for r in results)
        assert session.turns == ()

    run_async(main)


def test_subscriptions_after_close_raise_and_unsubscribe_is_quiet() -> None:
    host = start_host("memory:")
    session = host.create_session()
    unsubscribe = session.on_meta(lambda key, value: None)
    host.close()
    unsubscribe()
    with pytest.raises(ActorClosed):
        session.on_meta(lambda key, value: None)


def test_idle_workers_are_retired_and_the_pool_grows_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zidane_actors.portal import _thread

    monkeypatch.setattr(_thread, "_TRIM_SECONDS", 0.01)

    async def main() -> None:
        async with open_host_async("memory:") as host:
            portal = portal_of(host)
            freeze = Freeze(portal)
            tasks = [asyncio.create_task(host.call(_noop)) for _ in range(10)]
            await asyncio.sleep(0)
            freeze.release.set()
            await asyncio.gather(*tasks)  # ten workers (when no trim came in between)
            await asyncio.to_thread(wait_until, lambda: portal.statistics().workers == 0)
            await asyncio.gather(*(host.call(_noop) for _ in range(3)))
            session = await host.create_session()
            await session.append_turns([turn(1)])
            assert session.turns == (turn(1),)

    run_async(main)
