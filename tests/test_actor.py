"""The generic actor: mailbox, one-shot replies, cancellation, drain, crash."""

from __future__ import annotations

import attrs
import outcome
import pytest
import trio
import trio.testing

from zidane_actors.actors import Actor, Command, Reply, open_actor
from zidane_actors.errors import ActorClosed, ActorCrashed


@attrs.frozen(eq=False)
class Op(Command[int]):
    value: int
    gate: trio.Event | None = None


class Boom(BaseException):
    """A fatal error (not an ``Exception``)."""


def recorder() -> tuple[list[int], object]:
    applied: list[int] = []

    async def handle(op: Op) -> int:
        if op.gate is not None:
            await op.gate.wait()
        if op.value < 0:
            raise ValueError(f"negative {op.value}")
        if op.value == 666:
            raise Boom("fatal")
        applied.append(op.value)
        return op.value * 10

    return applied, handle


async def test_call_returns_result_and_errors_go_to_the_caller() -> None:
    applied, handle = recorder()
    async with open_actor(handle) as actor:  # type: ignore[arg-type]
        assert await actor.call(Op(1)) == 10
        with pytest.raises(ValueError, match="negative -1"):
            await actor.call(Op(-1))
        assert await actor.call(Op(2)) == 20
        stats = actor.statistics()
    assert applied == [1, 2]
    assert (stats.processed, stats.failed, stats.state) == (2, 1, "running")


async def test_reply_first_writer_wins() -> None:
    reply: Reply[int] = Reply()
    assert not reply.done()
    assert reply.resolve(outcome.Value(1))
    assert not reply.resolve(outcome.Value(2))
    assert not reply.resolve(outcome.Error(ValueError("late")))
    assert await reply.wait() == 1
    assert await reply.wait() == 1


async def test_submit_raises_would_block_when_full_and_reply_awaits_later() -> None:
    applied, handle = recorder()
    gate = trio.Event()
    actor: Actor[Op] = Actor(handle, mailbox_size=2)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        first = actor.submit(Op(1, gate))
        await trio.testing.wait_all_tasks_blocked()  # the actor holds op 1 at the gate
        queued = [actor.submit(Op(2)), actor.submit(Op(3))]
        assert actor.statistics().queued == 2
        with pytest.raises(trio.WouldBlock):
            actor.submit(Op(4))
        gate.set()
        assert [await first.wait()] + [await r.wait() for r in queued] == [10, 20, 30]
        actor.close()
    assert applied == [1, 2, 3]
    assert actor.statistics().state == "closed"


async def test_cancelled_before_accept_is_never_applied() -> None:
    applied, handle = recorder()
    gate = trio.Event()
    actor: Actor[Op] = Actor(handle, mailbox_size=1)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        held = actor.submit(Op(1, gate))
        await trio.testing.wait_all_tasks_blocked()
        actor.submit(Op(2))  # fills the mailbox
        with trio.move_on_after(0.01) as scope:
            await actor.call(Op(3))  # blocks in send, then is cancelled
        assert scope.cancelled_caught
        gate.set()
        await held.wait()
        assert await actor.call(Op(4)) == 40
        actor.close()
    assert applied == [1, 2, 4]


async def test_accepted_call_is_shielded_and_returns_its_verdict() -> None:
    applied, handle = recorder()
    gate = trio.Event()
    results: list[int] = []
    async with open_actor(handle) as actor:  # type: ignore[arg-type]

        async def caller(scope_box: list[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                scope_box.append(scope)
                results.append(await actor.call(Op(5, gate)))
                await trio.lowlevel.checkpoint()  # the pending cancel lands here
                results.append(-1)

        box: list[trio.CancelScope] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller, box)
            await trio.testing.wait_all_tasks_blocked()
            box[0].cancel()  # after acceptance: the caller still waits for the verdict
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
    assert applied == [5]
    assert results == [50]


async def test_close_drains_queue_with_actor_closed_and_refuses_later_calls() -> None:
    applied, handle = recorder()
    gate = trio.Event()
    actor: Actor[Op] = Actor(handle, mailbox_size=8)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        in_hand = actor.submit(Op(1, gate))
        await trio.testing.wait_all_tasks_blocked()
        queued = [actor.submit(Op(i)) for i in (2, 3, 4)]
        actor.close()
        with pytest.raises(ActorClosed):
            actor.submit(Op(9))
        gate.set()
        assert await in_hand.wait() == 10  # the command in hand finishes
        for reply in queued:
            with pytest.raises(ActorClosed):
                await reply.wait()
    with pytest.raises(ActorClosed):
        await actor.call(Op(5))
    assert applied == [1]
    stats = actor.statistics()
    assert (stats.state, stats.processed, stats.failed) == ("closed", 1, 3)


async def test_cancelling_the_actor_fails_queued_commands() -> None:
    applied, handle = recorder()
    gate = trio.Event()
    actor: Actor[Op] = Actor(handle, mailbox_size=8)  # type: ignore[arg-type]
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            in_hand = actor.submit(Op(1, gate))
            await trio.testing.wait_all_tasks_blocked()
            queued = actor.submit(Op(2))
            scope.cancel()
            gate.set()
    with trio.CancelScope(shield=True):
        assert await in_hand.wait() == 10  # shielded: applied although cancelled
        with pytest.raises(ActorClosed):
            await queued.wait()
    assert applied == [1]


async def test_crash_fails_pending_with_actor_crashed_then_actor_closed() -> None:
    applied, handle = recorder()
    crashes: list[BaseException] = []
    gate = trio.Event()
    actor: Actor[Op] = Actor(handle, mailbox_size=8, on_crash=crashes.append)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        blocker = actor.submit(Op(1, gate))
        await trio.testing.wait_all_tasks_blocked()
        fatal = actor.submit(Op(666))
        after = actor.submit(Op(3))
        gate.set()
        assert await blocker.wait() == 10
        for reply in (fatal, after):
            with pytest.raises(ActorCrashed) as info:
                await reply.wait()
            assert isinstance(info.value.__cause__, Boom)
    with pytest.raises(ActorClosed) as later:
        await actor.call(Op(4))
    assert isinstance(later.value.__cause__, Boom)
    assert applied == [1]
    assert len(crashes) == 1 and isinstance(crashes[0], Boom)
    assert actor.statistics().state == "crashed"
    assert isinstance(actor.crash_cause, Boom)


async def test_batch_handler_sees_every_queued_command() -> None:
    batches: list[list[int]] = []

    async def handle_batch(ops: list[Op]) -> list[outcome.Outcome[int]]:
        batches.append([op.value for op in ops])
        return [outcome.Value(op.value) for op in ops]

    actor: Actor[Op] = Actor(handle_batch=handle_batch, mailbox_size=16, max_batch=4)  # type: ignore[arg-type]
    replies = [actor.submit(Op(i)) for i in range(10)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        assert [await r.wait() for r in replies] == list(range(10))
        actor.close()
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_constructor_rejects_bad_arguments() -> None:
    _, handle = recorder()
    with pytest.raises(TypeError):
        Actor()
    with pytest.raises(ValueError):
        Actor(handle, mailbox_size=0)  # type: ignore[arg-type]


async def test_statistics_report_busy_and_idle() -> None:
    _, handle = recorder()
    gate = trio.Event()
    idle_calls: list[int] = []
    actor: Actor[Op] = Actor(handle, on_idle=lambda: idle_calls.append(1))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        assert actor.idle()
        reply = actor.submit(Op(1, gate))
        await trio.testing.wait_all_tasks_blocked()
        stats = actor.statistics()
        assert stats.busy and not actor.idle() and stats.queued == 0 and stats.mailbox_size == 64
        gate.set()
        await reply.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.idle() and not actor.statistics().busy and idle_calls == [1]
        actor.close()
