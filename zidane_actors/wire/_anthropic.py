"""Anthropic Messages API ↔ neutral messages."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import WireFormatError
from ..model import (
    FileBlock,
    ImageBlock,
    ReasoningBlock,
    SessionContentBlock,
    SessionMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ._common import (
    as_list,
    as_mapping,
    fail,
    get_opt_str,
    get_str,
    normalize_media_type,
    reindex,
)
from ._json import copy_json_object
from ._reasoning import reasoning_wire_action

__all__ = [
    "ANTHROPIC_IMAGE_MEDIA_TYPES",
    "anthropic_tool_id_map",
    "from_anthropic",
    "to_anthropic",
    "to_anthropic_request",
]

ANTHROPIC_IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Media types Anthropic accepts for base64 images."""

_VALID_ID = re.compile(r"[a-zA-Z0-9_-]+")
_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9_-]")

ToolResultPart = TextBlock | ImageBlock | FileBlock


# ---------------------------------------------------------------- wire → neutral


def _image_from(block: Mapping[str, Any], path: str) -> ImageBlock:
    source = as_mapping(block.get("source"), f"{path}.source")
    kind = get_str(source, "type", f"{path}.source")
    if kind == "base64":
        media_type = get_str(source, "media_type", f"{path}.source", non_empty=True)
        data = get_str(source, "data", f"{path}.source")
        return ImageBlock(media_type=normalize_media_type(media_type), data=data)
    if kind == "url":
        return ImageBlock(url=get_str(source, "url", f"{path}.source"))
    fail(f"unsupported image source type {kind!r}", f"{path}.source.type")


def _document_from(block: Mapping[str, Any], path: str) -> FileBlock:
    source = as_mapping(block.get("source"), f"{path}.source")
    kind = get_str(source, "type", f"{path}.source")
    name = get_opt_str(block, "title", path)
    if kind == "base64":
        media_type = get_str(source, "media_type", f"{path}.source", non_empty=True)
        data = get_str(source, "data", f"{path}.source")
        return FileBlock(media_type=normalize_media_type(media_type), data=data, name=name)
    if kind == "text":
        return FileBlock(text=get_str(source, "data", f"{path}.source"), name=name)
    if kind == "url":
        return FileBlock(url=get_str(source, "url", f"{path}.source"), name=name)
    fail(f"unsupported document source type {kind!r}", f"{path}.source.type")


def _part_from(value: object, path: str) -> ToolResultPart:
    block = as_mapping(value, path)
    kind = get_str(block, "type", path)
    if kind == "text":
        return TextBlock(get_str(block, "text", path))
    if kind == "image":
        return _image_from(block, path)
    if kind == "document":
        return _document_from(block, path)
    fail(f"unsupported tool_result content type {kind!r}", f"{path}.type")


def _tool_result_from(block: Mapping[str, Any], path: str) -> ToolResultBlock:
    call_id = get_str(block, "tool_use_id", path, non_empty=True)
    content = block.get("content", "")
    output: str | tuple[ToolResultPart, ...]
    if isinstance(content, str):
        output = content
    else:
        parts = as_list(content, f"{path}.content")
        output = tuple(_part_from(p, f"{path}.content[{i}]") for i, p in enumerate(parts))
    is_error = block.get("is_error", False)
    if is_error is None:
        is_error = False
    if not isinstance(is_error, bool):
        fail("expected a boolean", f"{path}.is_error")
    return ToolResultBlock(call_id=call_id, output=output, is_error=is_error)


def _block_from(value: object, path: str) -> SessionContentBlock:
    block = as_mapping(value, path)
    kind = get_str(block, "type", path)
    if kind == "text":
        return TextBlock(get_str(block, "text", path))
    if kind == "image":
        return _image_from(block, path)
    if kind == "document":
        return _document_from(block, path)
    if kind == "tool_use":
        return ToolCallBlock(
            id=get_str(block, "id", path, non_empty=True),
            name=get_str(block, "name", path, non_empty=True),
            input=copy_json_object(block.get("input"), f"{path}.input"),
        )
    if kind == "tool_result":
        return _tool_result_from(block, path)
    if kind == "thinking":
        signature = get_opt_str(block, "signature", path)
        return ReasoningBlock(
            text=get_str(block, "thinking", path),
            provider="anthropic",
            signature=signature or None,
        )
    if kind == "redacted_thinking":
        return ReasoningBlock(
            provider="anthropic", redacted_data=get_str(block, "data", path, non_empty=True)
        )
    fail(f"unsupported content block type {kind!r}", f"{path}.type")


def from_anthropic(msg: Mapping[str, Any]) -> SessionMessage:
    """Convert an Anthropic message (string or block-array ``content``) to a neutral message.

    ``cache_control`` and ``citations`` are not kept; server-tool blocks raise
    :class:`~zidane_actors.errors.WireFormatError`.
    """
    m = as_mapping(msg, "$")
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        fail(f"unsupported role {role!r}", "$.role")
    content = m.get("content")
    if isinstance(content, str):
        return SessionMessage(role=role, content=(TextBlock(content),))
    blocks = as_list(content, "$.content")
    return SessionMessage(
        role=role,
        content=tuple(_block_from(b, f"$.content[{i}]") for i, b in enumerate(blocks)),
    )


# ---------------------------------------------------------------- neutral → wire


def _candidate(call_id: str, widen: int) -> str:
    stem = _INVALID_CHAR.sub("_", call_id)[:48]
    digest = hashlib.sha256(call_id.encode()).hexdigest()
    if widen < 52:
        return f"{stem}_{digest[: 12 + widen]}"
    return f"{stem}_{digest}_{widen}"


def _tool_ids(messages: Iterable[SessionMessage]) -> list[str]:
    ids: dict[str, None] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                ids[block.id] = None
            elif isinstance(block, ToolResultBlock):
                ids[block.call_id] = None
    return list(ids)


def anthropic_tool_id_map(messages: Iterable[SessionMessage]) -> dict[str, str]:
    """Replacement ids for the tool ids Anthropic would reject (``^[a-zA-Z0-9_-]+$``).

    Both sides of a pair get the same replacement; each is derived from the
    original id (sanitized stem + sha256 prefix, so it is deterministic) and
    widened until it collides with no other id of ``messages``.
    """
    ids = _tool_ids(messages)
    taken = {i for i in ids if _VALID_ID.fullmatch(i)}
    mapping: dict[str, str] = {}
    for call_id in sorted(i for i in ids if i not in taken):
        widen = 0
        candidate = _candidate(call_id, widen)
        while candidate in taken:
            widen += 1
            candidate = _candidate(call_id, widen)
        mapping[call_id] = candidate
        taken.add(candidate)
    return mapping


def _image_to(block: ImageBlock, path: str) -> dict[str, Any]:
    if block.url is not None:
        return {"type": "image", "source": {"type": "url", "url": block.url}}
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    media_type = normalize_media_type(block.media_type or "")
    if media_type not in ANTHROPIC_IMAGE_MEDIA_TYPES:
        fail(f"Anthropic does not accept image media type {media_type!r}", f"{path}.mediaType")
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": block.data},
    }


def _document_to(block: FileBlock, path: str) -> dict[str, Any]:
    source: dict[str, Any]
    if block.url is not None:
        source = {"type": "url", "url": block.url}
    elif block.text is not None:
        source = {"type": "text", "media_type": "text/plain", "data": block.text}
    elif block.data is not None:
        media_type = normalize_media_type(block.media_type or "")
        if media_type == "application/pdf":
            source = {"type": "base64", "media_type": media_type, "data": block.data}
        elif media_type == "text/plain":
            try:
                text = base64.b64decode(block.data, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                fail("text/plain file data is not base64 UTF-8", f"{path}.data")
            source = {"type": "text", "media_type": "text/plain", "data": text}
        else:
            fail(f"Anthropic documents do not accept {media_type!r}", f"{path}.mediaType")
    else:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    out: dict[str, Any] = {"type": "document", "source": source}
    if block.name:
        out["title"] = block.name
    return out


def _part_to(part: ToolResultPart, path: str) -> dict[str, Any] | None:
    if isinstance(part, TextBlock):
        return {"type": "text", "text": part.text} if part.text.strip() else None
    if isinstance(part, ImageBlock):
        return _image_to(part, path)
    return _document_to(part, path)


def _block_to(
    block: SessionContentBlock, role: str, ids: Mapping[str, str], path: str
) -> dict[str, Any] | None:
    if isinstance(block, TextBlock | ImageBlock | FileBlock):
        return _part_to(block, path)
    if isinstance(block, ToolCallBlock):
        if role != "assistant":
            fail("tool_call blocks belong in assistant messages", path)
        return {
            "type": "tool_use",
            "id": ids.get(block.id, block.id),
            "name": block.name,
            "input": copy_json_object(block.input, f"{path}.input"),
        }
    if isinstance(block, ToolResultBlock):
        if role != "user":
            fail("tool_result blocks belong in user messages", path)
        content: str | list[dict[str, Any]]
        if isinstance(block.output, str):
            content = block.output
        else:
            converted = (_part_to(p, f"{path}.output[{i}]") for i, p in enumerate(block.output))
            content = [p for p in converted if p is not None]
        out: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": ids.get(block.call_id, block.call_id),
            "content": content,
        }
        if block.is_error:
            out["is_error"] = True
        return out
    if reasoning_wire_action(block, "anthropic") == "drop":
        return None
    if block.redacted_data:
        return {"type": "redacted_thinking", "data": block.redacted_data}
    return {"type": "thinking", "thinking": block.text, "signature": block.signature}


def _to_anthropic(msg: SessionMessage, ids: Mapping[str, str]) -> dict[str, Any]:
    if msg.role == "system":
        fail("system messages go to the request's top-level system (to_anthropic_request)", "$")
    converted = (_block_to(b, msg.role, ids, f"$.content[{i}]") for i, b in enumerate(msg.content))
    return {"role": msg.role, "content": [b for b in converted if b is not None]}


def to_anthropic(msg: SessionMessage) -> dict[str, Any]:
    """Convert a user or assistant message to an Anthropic message (``MessageParam``).

    Empty or whitespace-only text is left out, foreign reasoning is dropped
    (:func:`reasoning_wire_action`), tool ids Anthropic would reject are
    remapped (:func:`anthropic_tool_id_map`, consistent for both sides of a
    pair), ``image/jpg`` becomes ``image/jpeg``.
    """
    return _to_anthropic(msg, anthropic_tool_id_map([msg]))


def to_anthropic_request(messages: Sequence[SessionMessage]) -> dict[str, Any]:
    """``{"system": [...], "messages": [...]}`` for ``messages.create``.

    System messages' text goes to the top-level ``system`` (left out when
    there is none); the other messages are converted with one tool-id map
    for the whole conversation, and those left with no content are skipped.
    """
    ids = anthropic_tool_id_map(messages)
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            for j, block in enumerate(message.content):
                if not isinstance(block, TextBlock):
                    fail("system messages may hold text only", f"$[{index}].content[{j}]")
                if block.text.strip():
                    system.append({"type": "text", "text": block.text})
            continue
        try:
            converted = _to_anthropic(message, ids)
        except WireFormatError as exc:
            raise reindex(exc, index) from None
        if converted["content"]:
            out.append(converted)
    request: dict[str, Any] = {"messages": out}
    if system:
        request["system"] = system
    return request
