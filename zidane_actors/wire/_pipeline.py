"""The persisted-turns → wire-ready messages pipeline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ..errors import WireFormatError
from ..model import (
    FileBlock,
    ImageBlock,
    SessionContentBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolResultBlock,
    preview,
)
from ._common import diagnosed, diagnosed_async
from ._pairing import PairingRepair, ensure_tool_result_pairing

__all__ = [
    "DEFAULT_USER_TAIL_DIRECTIVE",
    "ResolveContentRef",
    "ensure_ends_with_user_message",
    "to_wire_messages",
]

DEFAULT_USER_TAIL_DIRECTIVE = "Continue from where you left off."
"""Text of the user message appended when a conversation ends on an assistant message."""

ResolveContentRef = Callable[[ImageBlock | FileBlock], Awaitable[ImageBlock | FileBlock]]
"""Turns a ``ref`` image/file block into one carrying inline data or a URL."""


@diagnosed("messages")
def ensure_ends_with_user_message(
    messages: Sequence[SessionMessage], directive: str = DEFAULT_USER_TAIL_DIRECTIVE
) -> list[SessionMessage]:
    """Append a user message holding ``directive`` unless the last message is a user's.

    Some models reject an assistant-final request (assistant prefill); an
    empty conversation is returned as is. Idempotent.
    """
    if not directive.strip():
        raise WireFormatError("the user tail directive must not be blank", path="directive")
    out = list(messages)
    if out and out[-1].role != "user":
        out.append(SessionMessage(role="user", content=(TextBlock(directive),)))
    return out


async def _resolve(
    block: ImageBlock | FileBlock, resolve: ResolveContentRef | None, path: str
) -> ImageBlock | FileBlock:
    if block.ref is None:
        return block
    if resolve is None:
        raise WireFormatError(
            f"content ref {preview(block.ref)} needs a resolve_content_ref to reach the wire",
            path=path,
        )
    resolved = await resolve(block)
    if not isinstance(resolved, ImageBlock | FileBlock) or resolved.ref is not None:
        raise WireFormatError(
            f"resolve_content_ref left content ref {preview(block.ref)} unresolved", path=path
        )
    return resolved


async def _resolve_block(
    block: SessionContentBlock, resolve: ResolveContentRef | None, path: str
) -> SessionContentBlock:
    if isinstance(block, ImageBlock | FileBlock):
        return await _resolve(block, resolve, path)
    if isinstance(block, ToolResultBlock) and not isinstance(block.output, str):
        parts = [
            await _resolve(p, resolve, f"{path}.output[{k}]")
            if isinstance(p, ImageBlock | FileBlock)
            else p
            for k, p in enumerate(block.output)
        ]
        if any(new is not old for new, old in zip(parts, block.output, strict=True)):
            return msgspec.structs.replace(block, output=tuple(parts))
    return block


@diagnosed_async("turns")
async def to_wire_messages(
    turns: Sequence[SessionTurn | SessionMessage],
    *,
    provider: str | None = None,
    resolve_content_ref: ResolveContentRef | None = None,
    user_tail_directive: str | None = None,
    on_repair: Callable[[PairingRepair], None] | None = None,
) -> list[SessionMessage]:
    """Project persisted turns into messages safe to send to a provider.

    1. Leave out ``system`` and ``command`` turns (they never reach the model).
    2. Resolve content refs (also inside tool-result outputs) with
       ``resolve_content_ref``; a ref with no resolver is a
       :class:`~zidane_actors.errors.WireFormatError`.
    3. :func:`ensure_tool_result_pairing` (``on_repair`` sees each repair,
       its ``index`` into ``turns``).
    4. When ``provider`` is set, :func:`ensure_ends_with_user_message`.

    Pure and idempotent; the result is wire-only and must not be persisted.
    """
    messages: list[SessionMessage] = []
    origin: list[int] = []
    for i, turn in enumerate(turns):
        if turn.role not in ("user", "assistant"):
            continue
        origin.append(i)
        content = tuple(
            [
                await _resolve_block(b, resolve_content_ref, f"$[{i}].content[{j}]")
                for j, b in enumerate(turn.content)
            ]
        )
        messages.append(
            SessionMessage(role=turn.role, content=content, provider_data=turn.provider_data)
        )
    report: Callable[[PairingRepair], None] | None = None
    if on_repair is not None:
        sink = on_repair

        def report(repair: PairingRepair) -> None:
            sink(msgspec.structs.replace(repair, index=origin[repair.index]))

    paired = ensure_tool_result_pairing(messages, on_repair=report)
    if provider is None:
        return paired
    return ensure_ends_with_user_message(paired, user_tail_directive or DEFAULT_USER_TAIL_DIRECTIVE)
