"""Tool call / tool result pairing: the wire-time repair and the persist-safe heal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias, TypeVar

import msgspec

from ..model import (
    ReasoningBlock,
    SessionContentBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ._common import diagnosed

__all__ = [
    "SYNTHETIC_TOOL_RESULT_PLACEHOLDER",
    "PairingDrop",
    "PairingDropKind",
    "PairingRepair",
    "PairingRepairKind",
    "drop_invalid_tool_pairings",
    "ensure_tool_result_pairing",
    "interrupted_tool_result_output",
    "orphaned_tool_result_marker",
]

SYNTHETIC_TOOL_RESULT_PLACEHOLDER = "[No tool result was recorded for this call]"
"""Prefix of every fabricated tool result, so consumers can recognise and reject them."""

PairingDropKind: TypeAlias = Literal[
    "duplicate-tool-call", "duplicate-tool-result", "orphan-tool-result", "empty-turn"
]
PairingRepairKind: TypeAlias = Literal[
    "synthetic-tool-result",
    "orphan-tool-result",
    "duplicate-tool-result",
    "displaced-tool-result",
    "duplicate-tool-call",
    "misplaced-tool-call",
    "empty-message",
]

T = TypeVar("T", SessionTurn, SessionMessage)


class PairingRepair(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One repair :func:`ensure_tool_result_pairing` made; ``index`` is into its input.

    As JSON, like :class:`PairingDrop`: camelCase, ``callId`` absent when ``None``.
    """

    index: int
    kind: PairingRepairKind
    call_id: str | None = None


class PairingDrop(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One deletion :func:`drop_invalid_tool_pairings` made; ``index`` is into its input.

    ``call_id`` is ``None`` for ``empty-turn`` drops; as JSON it is ``callId``,
    absent (not ``null``) when there is none, as in the spec.
    """

    index: int
    kind: PairingDropKind
    call_id: str | None = None


def interrupted_tool_result_output(tool_name: str) -> str:
    """Output of the synthetic result closing a call whose real result never arrived."""
    return (
        f'{SYNTHETIC_TOOL_RESULT_PLACEHOLDER} The tool "{tool_name}" was interrupted before '
        "it returned a result. It may have partially run: check its effects before retrying."
    )


def orphaned_tool_result_marker(call_id: str) -> str:
    """Text that replaces a tool result whose call is not in the preceding assistant message."""
    return f"[Orphaned tool result removed: no preceding tool call {call_id!r}]"


# ---------------------------------------------------------------- wire-time repair


@diagnosed("messages")
def ensure_tool_result_pairing(
    messages: Sequence[SessionMessage],
    *,
    on_repair: Callable[[PairingRepair], None] | None = None,
) -> list[SessionMessage]:
    """Make every tool call and result pair up the way providers require.

    Wire-only: it fabricates content, so its output must never be persisted.
    The repairs (``on_repair`` is called once per repair, in order):

    1. ``synthetic-tool-result`` — an assistant tool call with no result gets
       a synthetic error result whose output starts with
       :data:`SYNTHETIC_TOOL_RESULT_PLACEHOLDER`.
    2. ``orphan-tool-result`` — a result whose call is not in an earlier
       assistant message (or that sits outside a user message) is replaced,
       in place, by an ``[Orphaned tool result removed …]`` text marker.
    3. ``duplicate-tool-result`` — a later result for an already answered
       call is dropped.
    4. ``duplicate-tool-call`` — a later tool call reusing an id already used
       in the conversation is stripped (``misplaced-tool-call``: a call outside
       an assistant message is stripped too).
    5. ``displaced-tool-result`` — a result that is not in the user message
       right after its call, or not in its place there, is moved there.
    6. Grouping — the results of one assistant message's calls (parallel
       calls) all open ONE user message, in call order, before any other
       content; a user message is inserted when the next message is not one.

    7. ``empty-message`` — a message with no content at all (an OpenAI Chat
       ``{"role": "assistant", "content": null}`` without tool calls, which
       the API refuses) is left out.

    Messages emptied by the repair are left out. Pure and idempotent.
    """
    repairs: list[PairingRepair] = []
    stripped: set[tuple[int, int]] = set()
    calls_at: dict[int, list[ToolCallBlock]] = {}
    owner: dict[str, int] = {}
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            if not isinstance(block, ToolCallBlock):
                continue
            if message.role != "assistant":
                kind: PairingRepairKind = "misplaced-tool-call"
            elif block.id in owner:
                kind = "duplicate-tool-call"
            else:
                owner[block.id] = i
                calls_at.setdefault(i, []).append(block)
                continue
            stripped.add((i, j))
            repairs.append(PairingRepair(i, kind, block.id))

    assigned: dict[str, tuple[ToolResultBlock, int, int]] = {}
    orphans: set[tuple[int, int]] = set()
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            if not isinstance(block, ToolResultBlock):
                continue
            call_owner = owner.get(block.call_id)
            if call_owner is None or call_owner >= i or message.role != "user":
                orphans.add((i, j))
                repairs.append(PairingRepair(i, "orphan-tool-result", block.call_id))
            elif block.call_id in assigned:
                stripped.add((i, j))
                repairs.append(PairingRepair(i, "duplicate-tool-result", block.call_id))
            else:
                assigned[block.call_id] = (block, i, j)

    carried: dict[int, list[SessionContentBlock]] = {}
    inserted: dict[int, list[SessionContentBlock]] = {}
    for a, calls in calls_at.items():
        carrier = a + 1
        has_carrier = carrier < len(messages) and messages[carrier].role == "user"
        results: list[SessionContentBlock] = []
        for position, call in enumerate(calls):
            found = assigned.get(call.id)
            if found is None:
                results.append(
                    ToolResultBlock(
                        call_id=call.id,
                        output=interrupted_tool_result_output(call.name),
                        is_error=True,
                        name=call.name,
                    )
                )
                repairs.append(PairingRepair(a, "synthetic-tool-result", call.id))
                continue
            block, i, j = found
            results.append(block)
            if not (has_carrier and i == carrier and j == position):
                repairs.append(PairingRepair(i, "displaced-tool-result", call.id))
        (carried if has_carrier else inserted)[carrier if has_carrier else a] = results

    out: list[SessionMessage] = []
    for i, message in enumerate(messages):
        body: list[SessionContentBlock] = []
        changed = False
        for j, block in enumerate(message.content):
            if (i, j) in stripped:
                changed = True
            elif (i, j) in orphans:
                assert isinstance(block, ToolResultBlock)
                body.append(TextBlock(orphaned_tool_result_marker(block.call_id)))
                changed = True
            elif isinstance(block, ToolResultBlock):
                changed = True  # an assigned result: re-placed after its call
            else:
                body.append(block)
        lead = carried.get(i)
        if lead is not None:
            body = lead + body
            changed = True
        if not changed:
            if message.content:
                out.append(message)
            else:
                repairs.append(PairingRepair(i, "empty-message"))
        elif body:
            out.append(msgspec.structs.replace(message, content=tuple(body)))
        if i in inserted:
            out.append(SessionMessage(role="user", content=tuple(inserted[i])))

    repairs.sort(key=lambda r: r.index)
    if on_repair is not None:
        for repair in repairs:
            on_repair(repair)
    return _reuse_unchanged(messages, out)


def _reuse_unchanged(
    messages: Sequence[SessionMessage], out: list[SessionMessage]
) -> list[SessionMessage]:
    """Hand back equal rebuilt messages as their input objects (cheap equality later)."""
    if len(out) == len(messages):
        return [old if old == new else new for old, new in zip(messages, out, strict=True)]
    return out


# ---------------------------------------------------------------- persist-safe heal


def _seen_before(seen: set[str], ident: str) -> bool:
    """Whether ``ident`` is in ``seen`` already; a first sighting is added to it."""
    if ident in seen:
        return True
    seen.add(ident)
    return False


@diagnosed("turns")
def drop_invalid_tool_pairings(
    turns: Sequence[T],
    *,
    lane_for_run: Callable[[str | None], str] | None = None,
    on_drop: Callable[[PairingDrop], None] | None = None,
) -> Sequence[T]:
    """Delete provably invalid tool blocks from persisted turns; fabricates nothing.

    Exactly these deletions (``on_drop`` is called once per deletion, by index):

    - a ``tool_call`` whose id already appeared in the same lane (across or
      within turns): the later one, ``duplicate-tool-call``;
    - a ``tool_result`` whose ``callId`` already appeared in the same turn:
      the later one, ``duplicate-tool-result``;
    - a ``tool_result`` with no matching call in the immediately preceding
      same-lane assistant turn (after the drops above, so they cascade):
      ``orphan-tool-result``;
    - a turn those drops left empty or holding only reasoning: ``empty-turn``.

    A turn's lane is ``lane_for_run(run_id)``, by default its raw ``run_id``.
    Orphan tool calls are kept (the wire-time repair closes them). Pure,
    deterministic, idempotent; returns ``turns`` itself when nothing is dropped.
    """

    def lane(turn: T) -> str | None:
        run_id: str | None = getattr(turn, "run_id", None)
        return lane_for_run(run_id) if lane_for_run is not None else run_id

    drops: list[PairingDrop] = []
    removed: dict[int, set[int]] = {}

    def record(i: int, j: int, kind: PairingDropKind, call_id: str) -> None:
        removed.setdefault(i, set()).add(j)
        drops.append(PairingDrop(i, kind, call_id))

    seen_calls: dict[str | None, set[str]] = {}
    for i, turn in enumerate(turns):
        seen = seen_calls.setdefault(lane(turn), set())
        for j, block in enumerate(turn.content):
            if isinstance(block, ToolCallBlock) and _seen_before(seen, block.id):
                record(i, j, "duplicate-tool-call", block.id)

    for i, turn in enumerate(turns):
        seen_results: set[str] = set()
        for j, block in enumerate(turn.content):
            if isinstance(block, ToolResultBlock) and _seen_before(seen_results, block.call_id):
                record(i, j, "duplicate-tool-result", block.call_id)

    preceding_calls: dict[str | None, set[str]] = {}
    for i, turn in enumerate(turns):
        key = lane(turn)
        gone = removed.get(i, set())
        calls = preceding_calls.get(key, set())
        for j, block in enumerate(turn.content):
            if isinstance(block, ToolResultBlock) and j not in gone and block.call_id not in calls:
                record(i, j, "orphan-tool-result", block.call_id)
        if turn.role == "assistant":
            preceding_calls[key] = {
                b.id
                for j, b in enumerate(turn.content)
                if isinstance(b, ToolCallBlock) and j not in gone
            }

    if not drops:
        return turns

    out: list[T] = []
    for i, turn in enumerate(turns):
        dropped = removed.get(i)
        if not dropped:
            out.append(turn)
            continue
        kept = tuple(b for j, b in enumerate(turn.content) if j not in dropped)
        if all(isinstance(b, ReasoningBlock) for b in kept):
            drops.append(PairingDrop(i, "empty-turn"))
        else:
            out.append(msgspec.structs.replace(turn, content=kept))

    if on_drop is not None:
        for drop in sorted(drops, key=lambda d: d.index):
            on_drop(drop)
    return out
