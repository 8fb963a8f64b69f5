"""OpenAI Chat Completions and Responses API ↔ neutral messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NoReturn

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
    arguments_from_json,
    arguments_to_json,
    as_list,
    as_mapping,
    fail,
    get_opt_str,
    get_str,
    normalize_media_type,
    parse_data_url,
    reindex,
    to_data_url,
)
from ._reasoning import reasoning_wire_action

__all__ = [
    "from_openai",
    "from_openai_responses",
    "to_openai",
    "to_openai_request",
    "to_openai_responses",
]

ToolResultPart = TextBlock | ImageBlock | FileBlock
Role = Literal["system", "user", "assistant"]

_DEFAULT_FILE_MEDIA_TYPE = "application/pdf"


# ---------------------------------------------------------------- shared pieces


def _image_from_url(url: str) -> ImageBlock:
    inline = parse_data_url(url)
    if inline is None:
        return ImageBlock(url=url)
    return ImageBlock(media_type=inline[0], data=inline[1])


def _file_from_data(file_data: str, name: str | None) -> FileBlock:
    inline = parse_data_url(file_data)
    if inline is None:  # bare base64: OpenAI file inputs are PDFs by default
        return FileBlock(media_type=_DEFAULT_FILE_MEDIA_TYPE, data=file_data, name=name)
    return FileBlock(media_type=inline[0], data=inline[1], name=name)


def _image_url(block: ImageBlock, path: str) -> str:
    if block.url is not None:
        return block.url
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return to_data_url(normalize_media_type(block.media_type or ""), block.data)


def _file_data(block: FileBlock, path: str) -> str:
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return to_data_url(normalize_media_type(block.media_type or ""), block.data)


def _unsupported_part(kind: str, path: str) -> NoReturn:
    if kind == "input_audio":
        fail("audio input is not supported by the neutral message model", f"{path}.type")
    fail(f"unsupported content part type {kind!r}", f"{path}.type")


# ---------------------------------------------------------------- Chat Completions: wire → neutral


def _chat_part_from(value: object, path: str, role: str) -> SessionContentBlock:
    part = as_mapping(value, path)
    kind = get_str(part, "type", path)
    if kind == "text":
        return TextBlock(get_str(part, "text", path))
    if kind == "refusal" and role == "assistant":
        return TextBlock(get_str(part, "refusal", path))
    if role == "user" and kind == "image_url":
        image = as_mapping(part.get("image_url"), f"{path}.image_url")
        return _image_from_url(get_str(image, "url", f"{path}.image_url"))
    if role == "user" and kind == "file":
        file = as_mapping(part.get("file"), f"{path}.file")
        name = get_opt_str(file, "filename", f"{path}.file")
        data = get_opt_str(file, "file_data", f"{path}.file")
        if data is None:
            fail("only inline file_data is supported (file_id needs the Files API)", f"{path}.file")
        return _file_from_data(data, name)
    _unsupported_part(kind, path)


def _chat_content(content: object, path: str, role: str) -> tuple[SessionContentBlock, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextBlock(content),)
    parts = as_list(content, path)
    return tuple(_chat_part_from(p, f"{path}[{i}]", role) for i, p in enumerate(parts))


def _chat_tool_call_from(value: object, path: str) -> ToolCallBlock:
    call = as_mapping(value, path)
    kind = call.get("type", "function")
    if kind != "function":
        fail(f"unsupported tool call type {kind!r}", f"{path}.type")
    function = as_mapping(call.get("function"), f"{path}.function")
    return ToolCallBlock(
        id=get_str(call, "id", path, non_empty=True),
        name=get_str(function, "name", f"{path}.function", non_empty=True),
        input=arguments_from_json(get_str(function, "arguments", f"{path}.function")),
    )


def from_openai(msg: Mapping[str, Any]) -> SessionMessage:
    """Convert a Chat Completions message to a neutral message.

    ``system``/``developer`` → ``system``; a ``tool`` message → a ``user``
    message holding one tool result; assistant ``tool_calls`` → tool-call
    blocks (arguments parsed, see ``_raw``); ``refusal`` → text. Audio input
    and ``file_id`` references raise :class:`~zidane_actors.errors.WireFormatError`.
    """
    m = as_mapping(msg, "$")
    role = m.get("role")
    if role in ("system", "developer"):
        return SessionMessage(
            role="system", content=_chat_content(m.get("content"), "$.content", "system")
        )
    if role == "user":
        return SessionMessage(
            role="user", content=_chat_content(m.get("content"), "$.content", "user")
        )
    if role == "assistant":
        content = _chat_content(m.get("content"), "$.content", "assistant")
        calls = m.get("tool_calls")
        if calls is not None:
            listed = as_list(calls, "$.tool_calls")
            content += tuple(
                _chat_tool_call_from(c, f"$.tool_calls[{i}]") for i, c in enumerate(listed)
            )
        return SessionMessage(role="assistant", content=content)
    if role == "tool":
        call_id = get_str(m, "tool_call_id", "$", non_empty=True)
        raw = m.get("content")
        output: str | tuple[ToolResultPart, ...]
        if isinstance(raw, str):
            output = raw
        else:
            parts = as_list(raw, "$.content")
            texts: list[ToolResultPart] = []
            for i, p in enumerate(parts):
                part = as_mapping(p, f"$.content[{i}]")
                if get_str(part, "type", f"$.content[{i}]") != "text":
                    fail("tool messages hold text parts only", f"$.content[{i}].type")
                texts.append(TextBlock(get_str(part, "text", f"$.content[{i}]")))
            output = tuple(texts)
        return SessionMessage(
            role="user", content=(ToolResultBlock(call_id=call_id, output=output),)
        )
    fail(f"unsupported role {role!r}", "$.role")


# ---------------------------------------------------------------- Chat Completions: neutral → wire


def _chat_media_part(block: ImageBlock | FileBlock, path: str) -> dict[str, Any]:
    if isinstance(block, ImageBlock):
        return {"type": "image_url", "image_url": {"url": _image_url(block, path)}}
    if block.text is not None:
        return {"type": "text", "text": block.text}
    if block.url is not None:
        fail("Chat Completions file parts cannot reference a URL", f"{path}.url")
    file: dict[str, Any] = {"file_data": _file_data(block, path)}
    if block.name:
        file["filename"] = block.name
    return {"type": "file", "file": file}


def _text_parts(blocks: Sequence[TextBlock]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": b.text} for b in blocks if b.text.strip()]


def _chat_user(msg: SessionMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, ToolResultBlock):
            content: str | list[dict[str, Any]]
            if isinstance(block.output, str):
                content = block.output
            else:
                texts = [p for p in block.output if isinstance(p, TextBlock)]
                for j, p in enumerate(block.output):
                    if not isinstance(p, TextBlock):
                        moved.append(_chat_media_part(p, f"{path}.output[{j}]"))
                content = _text_parts(texts) or ""
            out.append({"role": "tool", "tool_call_id": block.call_id, "content": content})
        elif isinstance(block, TextBlock):
            parts.extend(_text_parts([block]))
        elif isinstance(block, ImageBlock | FileBlock):
            parts.append(_chat_media_part(block, path))
        elif isinstance(block, ToolCallBlock):
            fail("tool_call blocks belong in assistant messages", path)
        # reasoning never reaches Chat Completions
    if moved or parts:
        out.append({"role": "user", "content": moved + parts})
    return out


def _chat_assistant(msg: SessionMessage) -> list[dict[str, Any]]:
    texts: list[TextBlock] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, TextBlock):
            texts.append(block)
        elif isinstance(block, ToolCallBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments_to_json(block.input)},
                }
            )
        elif isinstance(block, ToolResultBlock):
            fail("tool_result blocks belong in user messages", path)
        elif isinstance(block, ImageBlock | FileBlock):
            fail("assistant messages cannot carry images or files", path)
    parts = _text_parts(texts)
    if not parts and not calls:
        return []
    out: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        out["tool_calls"] = calls
    return [out]


def _chat_system(msg: SessionMessage, system_role: str) -> list[dict[str, Any]]:
    texts: list[TextBlock] = []
    for i, block in enumerate(msg.content):
        if not isinstance(block, TextBlock):
            fail("system messages may hold text only", f"$.content[{i}]")
        texts.append(block)
    parts = _text_parts(texts)
    return [{"role": system_role, "content": parts}] if parts else []


def _to_openai(msg: SessionMessage, system_role: str) -> list[dict[str, Any]]:
    if msg.role == "system":
        return _chat_system(msg, system_role)
    if msg.role == "user":
        return _chat_user(msg)
    return _chat_assistant(msg)


def to_openai(msg: SessionMessage) -> list[dict[str, Any]]:
    """Convert a neutral message to Chat Completions messages (zero, one or several).

    A user message's tool results become one ``tool`` message each (first,
    in order), text-only; images and files of those results move to the
    ``user`` message that follows, ahead of the message's own parts. An
    assistant message becomes text parts plus ``tool_calls``. Reasoning is
    dropped (Chat Completions cannot replay it); empty text is left out;
    a message with nothing left yields no message.
    """
    return _to_openai(msg, "system")


def to_openai_request(
    messages: Sequence[SessionMessage],
    *,
    system_role: Literal["system", "developer"] = "system",
) -> list[dict[str, Any]]:
    """The ``messages`` list of a Chat Completions request.

    System messages use ``system_role`` (``developer`` for o-series models).
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        try:
            out.extend(_to_openai(message, system_role))
        except WireFormatError as exc:
            raise reindex(exc, index) from None
    return out


# ---------------------------------------------------------------- Responses API: wire → neutral


def _responses_part_from(value: object, path: str) -> ToolResultPart:
    part = as_mapping(value, path)
    kind = get_str(part, "type", path)
    if kind in ("input_text", "output_text"):
        return TextBlock(get_str(part, "text", path))
    if kind == "refusal":
        return TextBlock(get_str(part, "refusal", path))
    if kind == "input_image":
        url = get_opt_str(part, "image_url", path)
        if url is None:
            fail("only image_url images are supported (file_id needs the Files API)", path)
        return _image_from_url(url)
    if kind == "input_file":
        name = get_opt_str(part, "filename", path)
        data = get_opt_str(part, "file_data", path)
        if data is not None:
            return _file_from_data(data, name)
        url = get_opt_str(part, "file_url", path)
        if url is not None:
            return FileBlock(url=url, name=name)
        fail("only file_data or file_url files are supported", path)
    _unsupported_part(kind, path)


def _responses_content(content: object, path: str) -> tuple[ToolResultPart, ...]:
    if isinstance(content, str):
        return (TextBlock(content),)
    parts = as_list(content, path)
    return tuple(_responses_part_from(p, f"{path}[{i}]") for i, p in enumerate(parts))


def _responses_item_from(value: object, path: str) -> tuple[Role, tuple[SessionContentBlock, ...]]:
    item = as_mapping(value, path)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            fail(f"unsupported role {role!r}", f"{path}.role")
        neutral: Role = "system" if role == "developer" else role
        return neutral, _responses_content(item.get("content"), f"{path}.content")
    if kind == "function_call":
        call = ToolCallBlock(
            id=get_str(item, "call_id", path, non_empty=True),
            name=get_str(item, "name", path, non_empty=True),
            input=arguments_from_json(get_str(item, "arguments", path)),
        )
        return "assistant", (call,)
    if kind == "function_call_output":
        raw = item.get("output")
        output: str | tuple[ToolResultPart, ...]
        output = raw if isinstance(raw, str) else _responses_content(raw, f"{path}.output")
        call_id = get_str(item, "call_id", path, non_empty=True)
        return "user", (ToolResultBlock(call_id=call_id, output=output),)
    if kind == "reasoning":
        summary = as_list(item.get("summary", []), f"{path}.summary")
        texts = []
        for i, s in enumerate(summary):
            entry = as_mapping(s, f"{path}.summary[{i}]")
            texts.append(get_str(entry, "text", f"{path}.summary[{i}]"))
        reasoning = ReasoningBlock(
            text="\n\n".join(texts),
            provider="openai",
            signature=get_opt_str(item, "encrypted_content", path) or None,
            id=get_opt_str(item, "id", path),
        )
        return "assistant", (reasoning,)
    fail(f"unsupported input item type {kind!r}", f"{path}.type")


def from_openai_responses(items: Sequence[Mapping[str, Any]]) -> list[SessionMessage]:
    """Convert Responses API input items to neutral messages.

    Consecutive items of one role merge into one message: ``function_call``
    and ``reasoning`` items are assistant content, ``function_call_output``
    items user content; ``developer`` messages become ``system``.
    """
    listed = as_list(items, "$")
    out: list[SessionMessage] = []
    for index, value in enumerate(listed):
        role, blocks = _responses_item_from(value, f"$[{index}]")
        if out and out[-1].role == role:
            out[-1] = SessionMessage(role=role, content=out[-1].content + blocks)
        else:
            out.append(SessionMessage(role=role, content=blocks))
    return out


# ---------------------------------------------------------------- Responses API: neutral → wire


def _responses_part(block: ToolResultPart, path: str) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text} if block.text.strip() else None
    if isinstance(block, ImageBlock):
        return {"type": "input_image", "detail": "auto", "image_url": _image_url(block, path)}
    if block.text is not None:
        return {"type": "input_text", "text": block.text}
    out: dict[str, Any] = {"type": "input_file"}
    if block.url is not None:
        out["file_url"] = block.url
    else:
        out["file_data"] = _file_data(block, path)
    if block.name:
        out["filename"] = block.name
    return out


def _responses_message(role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": parts}


def _responses_user_or_system(msg: SessionMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, ToolResultBlock) and msg.role == "user":
            if parts:
                out.append(_responses_message(msg.role, parts))
                parts = []
            output: str | list[dict[str, Any]]
            if isinstance(block.output, str):
                output = block.output
            else:
                converted = (
                    _responses_part(p, f"{path}.output[{j}]") for j, p in enumerate(block.output)
                )
                output = [p for p in converted if p is not None]
            out.append({"type": "function_call_output", "call_id": block.call_id, "output": output})
        elif isinstance(block, TextBlock | ImageBlock | FileBlock):
            if msg.role == "system" and not isinstance(block, TextBlock):
                fail("system messages may hold text only", path)
            part = _responses_part(block, path)
            if part is not None:
                parts.append(part)
        elif isinstance(block, ToolCallBlock | ToolResultBlock):
            fail(f"{block.__class__.__name__} does not belong in a {msg.role} message", path)
        # reasoning in a user or system message has no replayable place
    if parts:
        out.append(_responses_message(msg.role, parts))
    return out


def _responses_assistant(msg: SessionMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, TextBlock):
            if block.text.strip():
                out.append({"type": "message", "role": "assistant", "content": block.text})
        elif isinstance(block, ToolCallBlock):
            out.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": arguments_to_json(block.input),
                }
            )
        elif isinstance(block, ReasoningBlock):
            if reasoning_wire_action(block, "openai") == "keep":
                summary = [{"type": "summary_text", "text": block.text}] if block.text else []
                out.append(
                    {
                        "type": "reasoning",
                        "id": block.id,
                        "summary": summary,
                        "encrypted_content": block.signature,
                    }
                )
        elif isinstance(block, ToolResultBlock):
            fail("tool_result blocks belong in user messages", path)
        else:
            fail("assistant messages cannot carry images or files", path)
    return out


def to_openai_responses(messages: Sequence[SessionMessage]) -> list[dict[str, Any]]:
    """Convert neutral messages to Responses API input items.

    User tool results become ``function_call_output`` items (which may carry
    images and files); assistant text becomes one assistant ``message`` per
    block, tool calls ``function_call`` items, OpenAI reasoning with its
    ``encrypted_content`` a ``reasoning`` item (other reasoning is dropped).
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        try:
            if message.role == "assistant":
                out.extend(_responses_assistant(message))
            else:
                out.extend(_responses_user_or_system(message))
        except WireFormatError as exc:
            raise reindex(exc, index) from None
    return out
