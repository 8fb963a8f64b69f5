"""The asyncio side of the LangGraph door: writes held for the next checkpoint.

LangGraph hands a task's writes to ``aput_writes`` as the task ends, and each
checkpoint to ``aput`` once the one before is stored: writes come while
their checkpoint waits for its turn, or right before the next checkpoint.
So writes wait here while a checkpoint of their thread is being stored, and
then at most ``NEXT_CHECKPOINT_WAIT`` (only while the next checkpoint came
that fast the last time), and ride with the first ``aput`` that is their
checkpoint's or follows it: one portal crossing and one append per step.
Writes no checkpoint took go alone, without waiting again on the trio side.
Never held: special writes (an error, an interrupt: the run stops, or an
error handler waits for them) and the writes of a graph with a
``DeltaChannel`` (LangGraph stores them before the next checkpoint).
The trio side decides and stores; this only pairs the calls, per event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import weakref
from collections import OrderedDict
from typing import Final

from ._langgraph_thread import NEXT_CHECKPOINT_WAIT, TaskWrites

__all__ = ["ALONE", "Held", "Pairing"]

_ERROR_SOURCE: Final = "__error_source_node__"
"""The write an error handler waits for (LangGraph's ``ERROR_SOURCE_NODE``)."""

ALONE: Final = "alone"
"""A held write's verdict when no checkpoint took it: its caller stores it alone."""

PASSES: Final = 3
"""Checkpoints that may pass held writes of a later one (LangGraph's steps run ahead of
its stores) before they go alone."""

KEEP_LANES: Final = 1024
"""Threads whose pairing state a loop keeps (least recently used dropped when idle)."""


class Held:
    """One ``aput_writes`` call waiting for the next ``aput`` of its thread."""

    __slots__ = ("future", "passed", "writes")

    def __init__(self, writes: TaskWrites, future: asyncio.Future[object]) -> None:
        self.writes = writes
        self.future = future  # None: stored; an exception; or ALONE
        self.passed = 0  # checkpoints that did not take it

    def settle(self, verdict: object) -> None:
        if not self.future.done():
            self.future.set_result(verdict)


class _Lane:
    """One thread's pairing state in one event loop."""

    __slots__ = ("delta", "gap", "held", "landed_at", "latest", "putting", "timer", "writes_at")

    def __init__(self) -> None:
        self.delta = False  # the last checkpoint counts DeltaChannel updates
        self.held: list[Held] = []
        self.timer: asyncio.TimerHandle | None = None
        self.latest: dict[str, str] = {}  # ns -> the checkpoint id put last
        self.putting = 0  # checkpoints of the thread being stored
        self.landed_at = 0.0  # when the last one was
        self.gap = 0.0  # seconds from writes waiting (none being stored) to the next one
        self.writes_at: float | None = None  # when writes came since the last checkpoint


class Pairing:
    """Writes held per (event loop, thread) until their thread's next checkpoint."""

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, OrderedDict[str, _Lane]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _lane(self, loop: asyncio.AbstractEventLoop, thread_id: str) -> _Lane:
        with self._lock:
            lanes = self._loops.get(loop)
            if lanes is None:
                lanes = self._loops[loop] = OrderedDict()
        lane = lanes.get(thread_id)
        if lane is None:
            lane = lanes[thread_id] = _Lane()
            if len(lanes) > KEEP_LANES:
                idle = (k for k, v in lanes.items() if not v.held and not v.putting)
                for key in list(itertools.islice(idle, len(lanes) - KEEP_LANES)):
                    del lanes[key]
        else:
            lanes.move_to_end(thread_id)
        return lane

    def hold(self, thread_id: str, writes: TaskWrites) -> Held | None:
        """``writes`` held for the thread's next checkpoint, or ``None``: store them now."""
        loop = asyncio.get_running_loop()
        lane = self._lane(loop, thread_id)
        now = loop.time()
        if lane.writes_at is None:
            lane.writes_at = now
        latest = lane.latest.get(writes.ns)
        if (
            lane.gap > NEXT_CHECKPOINT_WAIT
            or lane.delta
            or not (lane.putting or latest == writes.checkpoint)
            or (latest is not None and writes.checkpoint < latest)  # an older checkpoint's
            or any(e[0] < 0 or e[1] == _ERROR_SOURCE for e in writes.entries)
        ):
            return None
        held = Held(writes, loop.create_future())
        lane.held.append(held)
        if lane.timer is None and not lane.putting:
            lane.timer = loop.call_later(NEXT_CHECKPOINT_WAIT, self._expire, lane)
        return held

    @staticmethod
    def _expire(lane: _Lane) -> None:
        """No checkpoint came in time: the held writes go alone (and are not held next time
        until a checkpoint follows writes quickly again)."""
        lane.timer = None
        lane.gap = math.inf
        held, lane.held = lane.held, []
        for one in held:
            one.settle(ALONE)

    def take(self, thread_id: str, ns: str, checkpoint_id: str, *, delta: bool) -> list[Held]:
        """The held writes the checkpoint ``aput`` starts storing takes: its own and those
        of checkpoints stored already (``delta``: its metadata counts DeltaChannel
        updates). :meth:`landed` follows when it is done.

        Writes of a later checkpoint (ids grow) stay held for a later ``aput``
        (at most ``PASSES`` more); the others go alone."""
        loop = asyncio.get_running_loop()
        lane = self._lane(loop, thread_id)
        now = loop.time()
        if lane.writes_at is not None:
            lane.gap = now - max(lane.writes_at, lane.landed_at)
            lane.writes_at = None
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        taken: list[Held] = []
        kept: list[Held] = []
        for held in lane.held:
            writes = held.writes
            latest = checkpoint_id if writes.ns == ns else lane.latest.get(writes.ns)
            if held.future.done():
                continue
            if writes.checkpoint == latest or lane.latest.get(writes.ns) == writes.checkpoint:
                taken.append(held)  # this checkpoint's, or the one stored before it
            elif held.passed < PASSES and (latest is None or writes.checkpoint > latest):
                held.passed += 1
                kept.append(held)
            else:
                held.settle(ALONE)
        lane.held = kept
        lane.latest[ns] = checkpoint_id
        lane.delta = delta
        lane.putting += 1
        return taken

    def landed(self, thread_id: str, ns: str, checkpoint_id: str, *, stored: bool) -> None:
        """A checkpoint ``aput`` of the thread is done: held writes now wait for the next
        one (a little). Not ``stored``: no later ``aput`` takes its writes."""
        loop = asyncio.get_running_loop()
        lane = self._lane(loop, thread_id)
        if not stored and lane.latest.get(ns) == checkpoint_id:
            del lane.latest[ns]
        lane.putting -= 1
        lane.landed_at = loop.time()
        if lane.held and lane.timer is None and not lane.putting:
            lane.timer = loop.call_later(NEXT_CHECKPOINT_WAIT, self._expire, lane)

    def withdraw(self, thread_id: str, held: Held) -> bool:
        """Take ``held`` back before a checkpoint took it (its caller was cancelled)."""
        lanes = self._loops.get(asyncio.get_running_loop())
        lane = lanes.get(thread_id) if lanes is not None else None
        if lane is None or held not in lane.held:
            return False
        lane.held.remove(held)
        return True
