"""What a session shows repaired: interrupted tool calls closed, another process's run marker
demoted while the store keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import msgspec

from ..model import (
    ID_MAX_LENGTH,
    RunOwner,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionTurn,
    ToolCallBlock,
    ToolResultBlock,
)
from ..wire import (
    interrupted_tool_result_output,
)

__all__ = ["close_interrupted_tool_calls"]


def close_interrupted_tool_calls(turns: Sequence[SessionTurn]) -> tuple[SessionTurn, ...] | None:
    """``turns`` with every unanswered tool call closed by a synthetic error result.

    The result goes into the next turn when that is a same-run user turn that
    already carries tool results, else into a new user turn right after the
    call (its id derived from the calling turn's, so the heal is
    deterministic). ``None`` when no call is open. Pure.
    """
    answered = {
        block.call_id
        for turn in turns
        for block in turn.content
        if isinstance(block, ToolResultBlock)
    }
    healed: list[SessionTurn] = []
    changed = False
    pending: tuple[ToolResultBlock, ...] = ()
    pending_after: SessionTurn | None = None
    for turn in turns:
        if pending and pending_after is not None:
            if (
                turn.role == "user"
                and turn.run_id == pending_after.run_id
                and any(isinstance(b, ToolResultBlock) for b in turn.content)
            ):
                turn = msgspec.structs.replace(turn, content=turn.content + pending)
            else:
                healed.append(_interrupted_turn(pending_after, pending))
            pending, pending_after = (), None
        healed.append(turn)
        if turn.role == "assistant":
            open_calls = tuple(
                ToolResultBlock(
                    call_id=b.id,
                    output=interrupted_tool_result_output(b.name),
                    is_error=True,
                    name=b.name,
                )
                for b in turn.content
                if isinstance(b, ToolCallBlock) and b.id not in answered
            )
            if open_calls:
                changed = True
                pending, pending_after = open_calls, turn
    if pending and pending_after is not None:
        healed.append(_interrupted_turn(pending_after, pending))
    return tuple(healed) if changed else None


def _interrupted_turn(after: SessionTurn, results: tuple[ToolResultBlock, ...]) -> SessionTurn:
    suffix = ".interrupted"
    return SessionTurn(
        id=after.id[: ID_MAX_LENGTH - len(suffix)] + suffix,
        role="user",
        content=results,
        created_at=after.created_at,
        run_id=after.run_id,
    )


def _lane_for_run(runs: Sequence[SessionRun]) -> Callable[[str | None], str]:
    """Wire-view lanes: depth-0 runs share the main view, resumed runs their chain root's."""
    by_id = {r.id: r for r in runs}

    def lane(run_id: str | None) -> str:
        run = by_id.get(run_id) if run_id is not None else None
        if run_id is None or (run is not None and not run.depth):
            return "main"
        if run is None:
            return f"run:{run_id}"
        seen = {run.id}
        while run.resumed_from_run_id in by_id and run.resumed_from_run_id not in seen:
            run = by_id[run.resumed_from_run_id]
            seen.add(run.id)
        return f"run:{run.id}"

    return lane


def _heal_history(history: SessionHistory) -> SessionHistory | None:
    """The heal re-derived from the stored turns (inside the store's transaction)."""
    stored = close_interrupted_tool_calls(history.turns)
    return None if stored is None else SessionHistory(stored, history.runs)


@attrs.frozen
class _HeldMarker:
    """The stored run marker a load showed demoted while the store kept it."""

    status: bool  # memory's settled status stands for a stored ``running``
    runs: Mapping[str, tuple[SessionRun, SessionRun]]  # id: (shown demoted, stored)
    owner: RunOwner | None = None  # the stored ``running`` marker's owner

    @classmethod
    def of(cls, stored: SessionData, shown: SessionData) -> _HeldMarker:
        runs = {a.id: (b, a) for a, b in zip(stored.runs, shown.runs, strict=True) if a is not b}
        status = stored.status == "running" and shown.status != "running"
        return cls(status, runs, stored.run_owner if status else None)

    def settled(self) -> _HeldMarker:
        """After this session set its status itself."""
        return _HeldMarker(False, self.runs)

    def restore(self, data: SessionData) -> SessionData:
        """``data`` with what still shows the demotion put back as stored."""
        changes: dict[str, Any] = {}
        if self.status and data.status == "idle" and data.run_owner is None:
            changes["status"] = "running"
            changes["run_owner"] = self.owner
        if self.runs:
            runs = tuple(self._stored(r) for r in data.runs)
            if any(a is not b for a, b in zip(runs, data.runs, strict=True)):
                changes["runs"] = runs
        return msgspec.structs.replace(data, **changes) if changes else data

    def _stored(self, run: SessionRun) -> SessionRun:
        """The stored record of ``run`` while it is still the demoted one the load showed."""
        pair = self.runs.get(run.id)
        return pair[1] if pair is not None and pair[0] is run else run
