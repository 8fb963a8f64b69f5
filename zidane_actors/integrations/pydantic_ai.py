"""pydantic-ai message history ↔ zidane turns.

A ``ModelRequest`` becomes one ``user`` turn (user prompts' text and images,
tool returns, retry prompts as error results), a ``ModelResponse`` one
``assistant`` turn (text, tool calls, thinking). That neutral content is
what other zidane code and other providers read. pydantic-ai's own part
types carry more than the neutral model (timestamps, system prompts, usage,
provider details, part kinds zidane has no block for), so each turn also
keeps its message exactly as ``ModelMessagesTypeAdapter`` dumps it, under
``metadata["pydanticAiMessage"]``; it is used on the way back only while it
still converts to exactly the turn's content, so turns changed by anything
else (a heal, an edit, another writer) are rebuilt from their content.

``message_history(session)`` gives a session's history for
``agent.run(..., message_history=...)``; ``append_messages`` /
``append_messages_sync`` store ``result.new_messages()``. Requires the
``pydantic-ai`` extra.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from ..actors import Session
from ..model import (
    FileBlock,
    ImageBlock,
    ReasoningBlock,
    SessionContentBlock,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    call_input,
    new_id,
    reasoning_text,
)
from ..portal import AsyncSession, SyncSession

__all__ = [
    "PYDANTIC_AI_METADATA_KEY",
    "append_messages",
    "append_messages_sync",
    "message_history",
    "messages_to_turns",
    "turns_to_messages",
]

PYDANTIC_AI_METADATA_KEY: Final = "pydanticAiMessage"


# -- pydantic-ai → neutral ------------------------------------------------------


def _user_content(item: object) -> SessionContentBlock | None:
    if isinstance(item, str):
        return TextBlock(item)
    if isinstance(item, ImageUrl):
        return ImageBlock(url=item.url)
    if isinstance(item, DocumentUrl):
        return FileBlock(url=item.url)
    if isinstance(item, BinaryContent):
        data = base64.b64encode(item.data).decode("ascii")
        if item.is_image:
            return ImageBlock(media_type=item.media_type, data=data)
        if item.is_document:
            return FileBlock(media_type=item.media_type, data=data)
    return None  # audio, video, cache points…: kept in the message copy only


def _request_content(message: ModelRequest) -> tuple[SessionContentBlock, ...]:
    blocks: list[SessionContentBlock] = []
    for part in message.parts:
        if isinstance(part, UserPromptPart):
            items = [part.content] if isinstance(part.content, str) else list(part.content)
            blocks.extend(b for b in map(_user_content, items) if b is not None)
        elif isinstance(part, ToolReturnPart):
            blocks.append(
                ToolResultBlock(
                    call_id=part.tool_call_id,
                    output=part.model_response_str(),
                    name=part.tool_name,
                )
            )
        elif isinstance(part, RetryPromptPart):
            if part.tool_name is None:
                blocks.append(TextBlock(part.model_response()))
            else:
                blocks.append(
                    ToolResultBlock(
                        call_id=part.tool_call_id,
                        output=part.model_response(),
                        is_error=True,
                        name=part.tool_name,
                    )
                )
        # System prompts are agent configuration: kept in the message copy only.
    return tuple(blocks)


def _response_content(message: ModelResponse) -> tuple[SessionContentBlock, ...]:
    blocks: list[SessionContentBlock] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            blocks.append(TextBlock(part.content))
        elif isinstance(part, ToolCallPart):
            blocks.append(
                ToolCallBlock(id=part.tool_call_id, name=part.tool_name, input=part.args_as_dict())
            )
        elif isinstance(part, ThinkingPart):
            blocks.append(
                ReasoningBlock(
                    text=part.content,
                    provider=part.provider_name,
                    signature=part.signature,
                    id=part.id,
                )
            )
    return tuple(blocks)


def _role_and_content(message: ModelMessage) -> tuple[str, tuple[SessionContentBlock, ...]]:
    if isinstance(message, ModelRequest):
        return "user", _request_content(message)
    return "assistant", _response_content(message)


def _dump(message: ModelMessage) -> Any:
    return ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]


def messages_to_turns(messages: Iterable[ModelMessage]) -> list[SessionTurn]:
    """One turn per message, with neutral content and the exact message kept alongside."""
    turns = []
    for message in messages:
        role, content = _role_and_content(message)
        stamp = message.timestamp
        created_at = int(stamp.timestamp() * 1000) if stamp is not None else time.time_ns() // 10**6
        turns.append(
            SessionTurn(
                id=new_id(),
                role="user" if role == "user" else "assistant",
                content=content,
                created_at=created_at,
                metadata={PYDANTIC_AI_METADATA_KEY: _dump(message)},
            )
        )
    return turns


# -- neutral → pydantic-ai ------------------------------------------------------


def _kept_message(turn: SessionTurn) -> ModelMessage | None:
    stored = (turn.metadata or {}).get(PYDANTIC_AI_METADATA_KEY)
    if not isinstance(stored, dict):
        return None
    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([stored])
    except ValueError:
        return None
    if _role_and_content(message) != (turn.role, turn.content):
        return None
    return message


def _binary(media_type: str | None, data: str) -> BinaryContent:
    return BinaryContent(data=base64.b64decode(data), media_type=media_type or "")


def _user_part(block: SessionContentBlock) -> Any:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ImageBlock):
        if block.data is not None:
            return _binary(block.media_type, block.data)
        if block.url is not None:
            return ImageUrl(url=block.url)
    if isinstance(block, FileBlock):
        if block.text is not None:
            return block.text
        if block.data is not None:
            return _binary(block.media_type, block.data)
        if block.url is not None:
            return DocumentUrl(url=block.url)
    return None  # unresolved refs and reasoning in a user turn have no place


def _rebuilt(turn: SessionTurn) -> ModelMessage | None:
    if turn.role == "assistant":
        parts: list[Any] = []
        for block in turn.content:
            if isinstance(block, TextBlock):
                parts.append(TextPart(block.text))
            elif isinstance(block, ToolCallBlock):
                parts.append(
                    ToolCallPart(
                        tool_name=block.name, args=dict(call_input(block)), tool_call_id=block.id
                    )
                )
            elif isinstance(block, ReasoningBlock):
                parts.append(
                    ThinkingPart(
                        reasoning_text(block),
                        id=block.id,
                        signature=block.signature,
                        provider_name=block.provider,
                    )
                )
        return ModelResponse(parts=parts) if parts else None
    if turn.role == "system":
        texts = [b.text for b in turn.content if isinstance(b, TextBlock)]
        return ModelRequest(parts=[SystemPromptPart(t) for t in texts]) if texts else None
    if turn.role != "user":
        return None
    request: list[Any] = []
    prompt: list[Any] = []

    def flush() -> None:
        if prompt:
            only_text = len(prompt) == 1 and isinstance(prompt[0], str)
            request.append(UserPromptPart(prompt[0] if only_text else list(prompt)))
            prompt.clear()

    for block in turn.content:
        if isinstance(block, ToolResultBlock):
            flush()
            output = block.output if isinstance(block.output, str) else _parts_text(block.output)
            if block.is_error:
                request.append(
                    RetryPromptPart(output, tool_name=block.name or "", tool_call_id=block.call_id)
                )
            else:
                request.append(
                    ToolReturnPart(
                        tool_name=block.name or "", content=output, tool_call_id=block.call_id
                    )
                )
        else:
            part = _user_part(block)
            if part is not None:
                prompt.append(part)
    flush()
    return ModelRequest(parts=request) if request else None


def _parts_text(parts: Sequence[Any]) -> str:
    return "\n".join(p.text for p in parts if isinstance(p, TextBlock))


def turns_to_messages(turns: Iterable[SessionTurn]) -> list[ModelMessage]:
    """pydantic-ai messages for ``turns``: each turn's kept message when it still
    matches the turn's content, else one rebuilt from the content."""
    messages: list[ModelMessage] = []
    for turn in turns:
        message = _kept_message(turn) or _rebuilt(turn)
        if message is not None:
            messages.append(message)
    return messages


# -- sessions -------------------------------------------------------------------


def message_history(session: Session | SyncSession | AsyncSession) -> list[ModelMessage]:
    """The session's history as pydantic-ai ``message_history`` (a snapshot read)."""
    return turns_to_messages(session.turns)


async def append_messages(session: AsyncSession, messages: Iterable[ModelMessage]) -> None:
    """Store a run's ``new_messages()`` in an asyncio session handle (one write)."""
    await session.append_turns(messages_to_turns(messages))


def append_messages_sync(session: SyncSession, messages: Iterable[ModelMessage]) -> None:
    """Store a run's ``new_messages()`` through a blocking session handle (one write)."""
    session.append_turns(messages_to_turns(messages))
