"""Property: accepted == applied exactly once, FIFO per sender, under random cancellation."""

from __future__ import annotations

import attrs
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import Actor, Command
from zidane_actors.errors import ActorClosed


@attrs.frozen(eq=False)
class Tagged(Command[tuple[int, int]]):
    sender: int
    seq: int
    pauses: int


sender_plans = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from([None, 0.0, 0.0002, 0.001]),  # the send's deadline (None: none)
            st.integers(0, 2),  # checkpoints the handler takes
            st.booleans(),  # submit (no wait) instead of call
        ),
        min_size=1,
        max_size=8,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40)
@given(
    plans=sender_plans,
    mailbox_size=st.integers(1, 3),
    close_after=st.one_of(st.none(), st.integers(0, 12)),
    _random=st.random_module(),
)
async def test_accepted_is_applied_exactly_once_in_sender_order(
    plans: list[list[tuple[float | None, int, bool]]],
    mailbox_size: int,
    close_after: int | None,
    _random: object,
) -> None:
    applied: list[tuple[int, int]] = []

    async def handle(command: Tagged) -> tuple[int, int]:
        for _ in range(command.pauses):
            await trio.lowlevel.checkpoint()
        applied.append((command.sender, command.seq))
        return (command.sender, command.seq)

    actor: Actor[Tagged] = Actor(handle, mailbox_size=mailbox_size)
    # Per sender: seqs whose verdict came back as a value (accepted and applied),
    # and seqs refused (cancelled in send, mailbox full, or closed).
    succeeded: dict[int, list[int]] = {i: [] for i in range(len(plans))}
    refused: dict[int, list[int]] = {i: [] for i in range(len(plans))}
    drained: dict[int, list[int]] = {i: [] for i in range(len(plans))}

    async def sender(i: int, plan: list[tuple[float | None, int, bool]]) -> None:
        for seq, (deadline, pauses, nowait) in enumerate(plan):
            command = Tagged(i, seq, pauses)
            if nowait:
                try:
                    reply = actor.submit(command)
                except (trio.WouldBlock, ActorClosed):
                    refused[i].append(seq)
                    continue
                try:
                    assert await reply.wait() == (i, seq)
                    succeeded[i].append(seq)
                except ActorClosed:
                    drained[i].append(seq)
                continue
            with trio.move_on_after(deadline if deadline is not None else 10.0) as scope:
                try:
                    assert await actor.call(command) == (i, seq)
                except ActorClosed:
                    drained[i].append(seq)
                    continue
                succeeded[i].append(seq)
            if scope.cancelled_caught and seq not in succeeded[i]:
                refused[i].append(seq)

    async def closer(after: int) -> None:
        for _ in range(after):
            await trio.lowlevel.checkpoint()
        actor.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        async with trio.open_nursery() as senders:
            for i, plan in enumerate(plans):
                senders.start_soon(sender, i, plan)
            if close_after is not None:
                senders.start_soon(closer, close_after)
        actor.close()

    for i in range(len(plans)):
        mine = [seq for sender_id, seq in applied if sender_id == i]
        assert mine == succeeded[i], (i, mine, succeeded[i])  # once each, in order
        assert not set(mine) & (set(refused[i]) | set(drained[i]))
        assert sorted(succeeded[i] + refused[i] + drained[i]) == list(range(len(plans[i])))
    stats = actor.statistics()
    assert stats.processed == len(applied)
    assert stats.state == "closed"
