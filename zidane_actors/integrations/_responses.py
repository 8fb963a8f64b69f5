"""OpenAI Responses input items ↔ zidane turns, item-exact.

Items become turns through the wire layer's Responses converters: each run
of consecutive items of one role is one turn (so an assistant turn holds a
response's tool calls and the next user turn their outputs, as the pairing
rules want). Where the converters do not give the items back exactly (item
ids, ``status``, output-text annotations, …), the turn also keeps the items
as sent under ``metadata["openaiItems"]``; a turn's native items are used
only while they still convert to exactly the turn's content, so a turn
changed by anything else (a heal, an edit) is read from its content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from ..errors import WireFormatError
from ..model import SessionContentBlock, SessionMessage, SessionTurn
from ..wire import from_openai_responses, to_openai_responses

__all__ = [
    "OPENAI_ITEMS_METADATA_KEY",
    "ItemGroup",
    "group_items",
    "items_of_turn",
    "native_metadata",
    "turn_without_last_item",
]

OPENAI_ITEMS_METADATA_KEY: Final = "openaiItems"

Role = Literal["system", "user", "assistant"]
ItemGroup = tuple[Role, tuple[SessionContentBlock, ...], list[dict[str, Any]]]
"""A run of items of one role: the role, their neutral content, the items."""


def group_items(items: Sequence[Mapping[str, Any]]) -> list[ItemGroup]:
    """Split items into runs of one role, each with its neutral content.

    Raises :class:`WireFormatError` (path ``$[i]…`` into ``items``) for an
    item the converters cannot carry.
    """
    from_openai_responses(items)  # validates the whole list, with located errors
    groups: list[ItemGroup] = []
    for item in items:
        (message,) = from_openai_responses([item])
        if groups and groups[-1][0] == message.role:
            role, content, members = groups[-1]
            groups[-1] = (role, content + message.content, [*members, dict(item)])
        else:
            groups.append((message.role, message.content, [dict(item)]))
    return groups


def native_metadata(role: Role, content: tuple[SessionContentBlock, ...], items: list[Any]) -> Any:
    """The ``openaiItems`` value a turn needs: ``None`` when the converters are exact."""
    if to_openai_responses([SessionMessage(role=role, content=content)]) == items:
        return None
    return items


def _native_items(turn: SessionTurn) -> list[dict[str, Any]] | None:
    stored = (turn.metadata or {}).get(OPENAI_ITEMS_METADATA_KEY)
    if not isinstance(stored, list) or not stored:
        return None
    if not all(isinstance(item, dict) for item in stored):
        return None
    try:
        messages = from_openai_responses(stored)
    except WireFormatError:
        return None
    if len(messages) != 1 or messages[0].role != turn.role or messages[0].content != turn.content:
        return None
    return [dict(item) for item in stored]


def items_of_turn(turn: SessionTurn) -> list[dict[str, Any]]:
    """The Responses input items a turn stands for (none for ``command`` turns)."""
    if turn.role == "command":
        return []
    native = _native_items(turn)
    if native is not None:
        return native
    return to_openai_responses([SessionMessage(role=turn.role, content=turn.content)])


def turn_without_last_item(turn: SessionTurn) -> SessionTurn | None:
    """``turn`` with its last item removed, or ``None`` when nothing would remain."""
    native = _native_items(turn)
    if native is not None:
        rest = native[:-1]
        if not rest:
            return None
        ((role, content, items),) = group_items(rest)
        metadata = dict(turn.metadata or {})
        kept = native_metadata(role, content, items)
        if kept is None:
            metadata.pop(OPENAI_ITEMS_METADATA_KEY, None)
        else:
            metadata[OPENAI_ITEMS_METADATA_KEY] = kept
        return _replace(turn, content, metadata or None)
    items = items_of_turn(turn)
    if len(items) <= 1:
        return None
    # The longest content prefix that still gives every item but the last.
    assert turn.role != "command"
    for end in range(len(turn.content) - 1, 0, -1):
        prefix = turn.content[:end]
        if to_openai_responses([SessionMessage(role=turn.role, content=prefix)]) == items[:-1]:
            return _replace(turn, prefix, turn.metadata)
    return None  # pragma: no cover - a one-block turn gives at most one item


def _replace(
    turn: SessionTurn, content: tuple[SessionContentBlock, ...], metadata: dict[str, Any] | None
) -> SessionTurn:
    return SessionTurn(
        id=turn.id,
        role=turn.role,
        content=content,
        created_at=turn.created_at,
        run_id=turn.run_id,
        usage=turn.usage,
        metadata=metadata,
    )
