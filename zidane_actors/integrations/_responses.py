"""OpenAI Responses input items ↔ zidane turns, item-exact.

Items become turns through the wire layer's Responses converters: each run
of consecutive items of one role is one turn (so an assistant turn holds a
response's tool calls and the next user turn their outputs, as the pairing
rules want). The converters carry every field (provider data, native
blocks); where they still do not give the items back identically (today:
the order of an item's keys, or a reasoning item with no follower in its
turn), the turn also keeps the items as sent under
``metadata["openaiItems"]``. A turn's copy is used only while it still
converts to exactly the turn's content, so a turn changed by anything else
(a heal, an edit) is read from its content.
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
    "identical",
    "items_of_turn",
    "turn_without_last_item",
    "with_native_metadata",
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


def identical(a: Any, b: Any) -> bool:
    """``a == b`` as JSON text: same types (``1`` is not ``1.0`` nor ``True``), same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _converted(role: Role, content: tuple[SessionContentBlock, ...]) -> list[dict[str, Any]]:
    return to_openai_responses([SessionMessage(role=role, content=content)])


def _native_metadata(role: Role, content: tuple[SessionContentBlock, ...], items: list[Any]) -> Any:
    """The ``openaiItems`` value a turn needs: ``None`` when the converters are exact."""
    return None if identical(_converted(role, content), items) else items


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
    return _converted(turn.role, turn.content)


def turn_without_last_item(turn: SessionTurn) -> SessionTurn | None:
    """``turn`` with its last item removed, or ``None`` when nothing would remain."""
    native = _native_items(turn)
    items = items_of_turn(turn) if native is None else native
    if len(items) <= 1:
        return None
    rest = items[:-1]
    if native is None:
        # The longest content prefix that still gives every item but the last
        # keeps the turn's own blocks (and whatever else they carry).
        assert turn.role != "command"
        for end in range(len(turn.content) - 1, 0, -1):
            prefix = turn.content[:end]
            if identical(_converted(turn.role, prefix), rest):
                return _replace(turn, prefix, turn.metadata)
    # Otherwise (a reasoning item left without its follower…) the remaining
    # items are converted again, with their copy when still needed.
    ((role, content, group),) = group_items(rest)
    return _replace(turn, content, with_native_metadata(turn.metadata, role, content, group))


def with_native_metadata(
    metadata: Mapping[str, Any] | None,
    role: Role,
    content: tuple[SessionContentBlock, ...],
    items: list[Any],
) -> dict[str, Any] | None:
    """``metadata`` with the ``openaiItems`` copy ``items`` need (or without one)."""
    updated = dict(metadata or {})
    native = _native_metadata(role, content, items)
    if native is None:
        updated.pop(OPENAI_ITEMS_METADATA_KEY, None)
    else:
        updated[OPENAI_ITEMS_METADATA_KEY] = native
    return updated or None


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
