"""OpenAI Chat Completions ↔ neutral messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..errors import WireFormatError
from ..model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionContentBlock,
    SessionMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    call_input,
    preview,
    reasoning_text,
)
from ._anthropic import refusal_text
from ._common import (
    arguments_from_json,
    as_list,
    as_mapping,
    check_messages,
    diagnosed,
    fail,
    get_opt_str,
    get_str,
    reindex,
)
from ._downgrade import CANONICAL, ConvertContext, DowngradeSink, native_type
from ._json import arguments_to_json, copy_json_object
from ._openai_common import (
    Role,
    ToolResultPart,
    _file_data,
    _file_from_data,
    _fix_image_url,
    _foreign_part,
    _form,
    _image_from_url,
    _image_url,
    _patched,
    _refusal_kind,
    _with_data,
    openai_tool_id_map,
)
from ._provider_data import (
    CHAT,
    apply_container_patch,
    content_form,
    data_for,
    diff_into,
)

__all__ = [
    "from_openai",
    "from_openai_request",
    "to_openai",
    "to_openai_request",
]


# ---------------------------------------------------------------- Chat Completions: neutral → wire

_CHAT_TEXT_PARTS = {"assistant": ("text", "refusal"), "system": ("text",), "tool": ("text",)}


def _chat_part_to(
    block: ToolResultPart, role: str, path: str, ctx: ConvertContext
) -> dict[str, Any] | None:
    out: dict[str, Any]
    if isinstance(block, NativeBlock):
        if block.provider != CHAT:
            return _foreign_part(block, "text", path, ctx)
        kind = block.data.get("type")
        if isinstance(kind, str) and (role == "user" or kind in _CHAT_TEXT_PARTS.get(role, ())):
            return copy_json_object(block.data, f"{path}.data")
        ctx.report(path, "dropped", native_type(block))  # a part or field this role cannot hold
        return None
    if isinstance(block, TextBlock):
        if _refusal_kind(block) is not None and role == "assistant":
            out = {"type": "refusal", "refusal": block.text}
        else:
            refusal = refusal_text(block)
            if refusal is None and not block.text.strip():
                return None
            out = {"type": "text", "text": block.text if refusal is None else refusal}
    elif role in ("assistant", "system"):  # text only there: media are dropped, reported
        ctx.report(path, "dropped", "image" if isinstance(block, ImageBlock) else "file")
        return None
    elif isinstance(block, ImageBlock):
        out = {"type": "image_url", "image_url": {"url": _image_url(block, path)}}
    elif block.text is not None:
        out = {"type": "text", "text": block.text}
    elif block.url is not None:  # Chat file parts cannot point at a URL: the link as text
        ctx.report(path, "converted", "file")
        label = f"{block.name}: " if block.name else ""
        out = {"type": "text", "text": f"[document {label}{block.url}]"}
    else:
        file: dict[str, Any] = {"file_data": _file_data(block, path)}
        if block.name:
            file["filename"] = block.name
        out = {"type": "file", "file": file}
    out = _patched(out, block, CHAT)
    image = out.get("image_url")
    if out.get("type") == "image_url" and isinstance(image, dict):
        image["url"] = _fix_image_url(image.get("url"))
    return out


def _tool_message(
    block: ToolResultBlock, path: str, ctx: ConvertContext
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    moved: list[dict[str, Any]] = []
    content: str | list[dict[str, Any]]
    if isinstance(block.output, str):
        content = block.output
    else:
        texts: list[dict[str, Any]] = []
        for j, p in enumerate(block.output):
            part = _chat_part_to(p, "user", f"{path}.output[{j}]", ctx)
            if part is None:
                continue
            (texts if part.get("type") == "text" else moved).append(part)
        content = texts or ""
    out = _patched({"role": "tool", "tool_call_id": block.call_id, "content": content}, block, CHAT)
    out["tool_call_id"] = ctx.ids.get(block.call_id, block.call_id)
    return out, moved


def _chat_tool_call(block: ToolCallBlock, path: str, ctx: ConvertContext) -> dict[str, Any]:
    out = {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments_to_json(call_input(block), path)},
    }
    out = _patched(out, block, CHAT)
    out["id"] = ctx.ids.get(block.id, block.id)
    return out


def _chat_user(msg: SessionMessage, ctx: ConvertContext) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, ToolResultBlock):
            tool, media = _tool_message(block, path, ctx)
            out.append(tool)
            moved.extend(media)
        elif isinstance(block, NativeBlock) and block.provider == CHAT and "role" in block.data:
            out.append(copy_json_object(block.data, f"{path}.data"))  # a legacy function message
        elif isinstance(block, TextBlock | ImageBlock | FileBlock | NativeBlock):
            part = _chat_part_to(block, "user", path, ctx)
            if part is not None:
                parts.append(part)
        elif isinstance(block, ToolCallBlock):
            fail("tool_call blocks belong in assistant messages", path)
        else:  # reasoning never reaches a user message
            ctx.report(path, "dropped", "reasoning")
    data = data_for(msg.provider_data, CHAT)
    if moved or parts or data:
        user = {"role": "user", "content": _form(moved + parts, content_form(msg, CHAT), "list")}
        out.append(apply_container_patch(user, data, ("content",)))
    return out


def _chat_assistant(msg: SessionMessage, ctx: ConvertContext) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    reasoning: list[str] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if (
            isinstance(block, TextBlock)
            and _refusal_kind(block) == "field"
            and (block.provider_data or {}).get("provider") == CHAT
        ):
            fields["refusal"] = block.text
        elif (
            isinstance(block, NativeBlock)
            and block.provider == CHAT
            and ("audio" in block.data or "function_call" in block.data)
        ):
            fields.update(copy_json_object(block.data, f"{path}.data"))
        elif isinstance(block, TextBlock | ImageBlock | FileBlock | NativeBlock):
            part = _chat_part_to(block, "assistant", path, ctx)
            if part is not None:
                parts.append(part)
        elif isinstance(block, ToolCallBlock):
            calls.append(_chat_tool_call(block, path, ctx))
        elif isinstance(block, ReasoningBlock):
            if block.provider == CHAT:
                reasoning.append(reasoning_text(block))
            else:
                ctx.report(path, "dropped", "reasoning")
        else:
            fail("tool_result blocks belong in user messages", path)
    data = data_for(msg.provider_data, CHAT)
    if not (parts or calls or fields or data):
        return []
    out: dict[str, Any] = {"role": "assistant"}
    out["content"] = _form(parts, content_form(msg, CHAT), "list") if parts else None
    out.update(fields)
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    return [apply_container_patch(out, data, ("content", "tool_calls"))]


def _chat_system(
    msg: SessionMessage, system_role: str, ctx: ConvertContext
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        if isinstance(block, ToolCallBlock | ToolResultBlock | ReasoningBlock):
            fail("system messages may hold text only", f"$.content[{i}]")
        part = _chat_part_to(block, "system", f"$.content[{i}]", ctx)
        if part is not None:
            parts.append(part)
    data = data_for(msg.provider_data, CHAT)
    if not parts and not data:
        return []
    out = {"role": system_role, "content": _form(parts, content_form(msg, CHAT), "list")}
    return [apply_container_patch(out, data, ("content",))]


def _to_openai(msg: SessionMessage, system_role: str, ctx: ConvertContext) -> list[dict[str, Any]]:
    if msg.role == "system":
        return _chat_system(msg, system_role, ctx)
    if msg.role == "user":
        return _chat_user(msg, ctx)
    return _chat_assistant(msg, ctx)


@diagnosed("msg", one=True)
def to_openai(
    msg: SessionMessage, *, on_downgrade: DowngradeSink | None = None
) -> list[dict[str, Any]]:
    """Convert a neutral message to Chat Completions messages (zero, one or several).

    Chat ``providerData`` and native blocks come back exactly (``name``,
    ``developer``, refusals, ``audio``, legacy ``function_call``, custom
    tool calls, ``reasoning_content``, the original ``arguments`` text...).
    A user message's tool results become one ``tool`` message each (first,
    in order), text-only; images and files of those results move to the
    ``user`` message that follows. Other providers' reasoning is dropped and
    their native blocks become text (or are dropped), reported to
    ``on_downgrade``; tool ids over 40 characters are remapped
    (:func:`openai_tool_id_map`); a message with nothing left yields none.
    """
    check_messages(msg, one=True)
    return _to_openai(msg, "system", ConvertContext(openai_tool_id_map([msg]), 0, on_downgrade))


@diagnosed("messages")
def to_openai_request(
    messages: Sequence[SessionMessage],
    *,
    system_role: Literal["system", "developer"] = "system",
    on_downgrade: DowngradeSink | None = None,
) -> list[dict[str, Any]]:
    """The ``messages`` list of a Chat Completions request.

    System messages use ``system_role`` (``developer`` for o-series models)
    unless they came as the other; one tool-id map for the conversation.
    """
    check_messages(messages)
    ids = openai_tool_id_map(messages)
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        try:
            out.extend(_to_openai(message, system_role, ConvertContext(ids, index, on_downgrade)))
        except WireFormatError as exc:
            raise reindex(exc, index) from None
    return out


# ---------------------------------------------------------------- Chat Completions: wire → neutral


def _chat_part_from(value: object, path: str, role: str) -> SessionContentBlock:
    part = as_mapping(value, path)
    kind = get_str(part, "type", path)
    neutral: TextBlock | ImageBlock | FileBlock | None = None
    if kind == "text":
        neutral = TextBlock(get_str(part, "text", path))
    elif kind == "refusal" and role == "assistant":
        refusal = get_str(part, "refusal", path)
        neutral = TextBlock(refusal, provider_data={"provider": CHAT, "refusal": "part"})
    elif role == "user" and kind == "image_url":
        image = as_mapping(part.get("image_url"), f"{path}.image_url")
        neutral = _image_from_url(get_str(image, "url", f"{path}.image_url"))
    elif role == "user" and kind == "file":
        file = as_mapping(part.get("file"), f"{path}.file")
        data = get_opt_str(file, "file_data", f"{path}.file")
        if data is not None:
            neutral = _file_from_data(data, get_opt_str(file, "filename", f"{path}.file"))
    if neutral is None:  # input_audio, files by id, anything newer
        return NativeBlock(provider=CHAT, data=copy_json_object(part, path))
    canonical = _chat_part_to(neutral, role, path, CANONICAL)
    return _with_data(neutral, canonical, part, CHAT, path)  # type: ignore[no-any-return]


def _chat_tool_call_from(value: object, path: str) -> ToolCallBlock:
    call = as_mapping(value, path)
    kind = call.get("type", "function")
    call_id = get_str(call, "id", path, non_empty=True)
    if kind == "custom":
        custom = as_mapping(call.get("custom"), f"{path}.custom")
        block = ToolCallBlock(
            id=call_id,
            name=get_str(custom, "name", f"{path}.custom", non_empty=True),
            input={"input": get_str(custom, "input", f"{path}.custom")},
        )
    elif kind == "function":
        function = as_mapping(call.get("function"), f"{path}.function")
        block = ToolCallBlock(
            id=call_id,
            name=get_str(function, "name", f"{path}.function", non_empty=True),
            input=arguments_from_json(get_str(function, "arguments", f"{path}.function")),
        )
    else:
        fail(f"unsupported tool call type {preview(kind)}", f"{path}.type")
    return _with_data(block, _chat_tool_call(block, path, CANONICAL), call, CHAT, path)  # type: ignore[no-any-return]


def _chat_content(content: object, path: str, role: str) -> tuple[SessionContentBlock, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextBlock(content),)
    parts = as_list(content, path)
    return tuple(_chat_part_from(p, f"{path}[{i}]", role) for i, p in enumerate(parts))


def _chat_tool_from(m: Mapping[str, Any]) -> SessionMessage:
    call_id = get_str(m, "tool_call_id", "$", non_empty=True)
    raw = m.get("content")
    output: str | tuple[ToolResultPart, ...]
    if isinstance(raw, str):
        output = raw
    else:
        parts = as_list(raw, "$.content")
        texts: list[ToolResultPart] = []
        for i, p in enumerate(parts):
            part = _chat_part_from(p, f"$.content[{i}]", "tool")
            if not isinstance(part, TextBlock):
                fail("tool messages hold text parts only", f"$.content[{i}].type")
            texts.append(part)
        output = tuple(texts)
    block = ToolResultBlock(call_id=call_id, output=output)
    canonical, _ = _tool_message(block, "$", CANONICAL)
    block = _with_data(block, canonical, m, CHAT, "$", ("content",))
    return SessionMessage(role="user", content=(block,))


def from_openai(msg: Mapping[str, Any]) -> SessionMessage:
    """Convert a Chat Completions message to a neutral message.

    ``system``/``developer`` → ``system``; a ``tool`` message → a ``user``
    message holding one tool result; assistant ``tool_calls`` (function and
    custom) → tool-call blocks (arguments parsed; the original text kept in
    ``providerData`` when it differs from the canonical JSON); ``refusal``
    (field or part) → text marked as a refusal; ``reasoning_content`` → a
    reasoning block of provider ``openai-chat``; ``audio``, legacy
    ``function_call``/``function`` messages, audio input and ``file_id``
    files → native blocks. ``to_openai`` gives the same JSON back.
    """
    m = as_mapping(msg, "$")
    role = m.get("role")
    if role == "tool":
        return _chat_tool_from(m)
    if role == "function":
        return SessionMessage(
            role="user", content=(NativeBlock(provider=CHAT, data=copy_json_object(m, "$")),)
        )
    if role not in ("system", "developer", "user", "assistant"):
        fail(f"unsupported role {preview(role)}", "$.role")
    neutral_role: Role = "system" if role == "developer" else role
    content = m.get("content")
    blocks: list[SessionContentBlock] = []
    if role == "assistant":
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str):
            blocks.append(ReasoningBlock(text=reasoning, provider=CHAT))
    blocks.extend(
        _chat_content(
            content,
            "$.content",
            "assistant" if role == "assistant" else ("user" if role == "user" else "system"),
        )
    )
    if role == "assistant":
        refusal = get_opt_str(m, "refusal", "$")
        if refusal is not None:
            blocks.append(TextBlock(refusal, provider_data={"provider": CHAT, "refusal": "field"}))
        for key in ("audio", "function_call"):
            if m.get(key) is not None:
                blocks.append(
                    NativeBlock(provider=CHAT, data={key: copy_json_object(m[key], f"$.{key}")})
                )
        calls = m.get("tool_calls")
        if calls is not None:
            listed = as_list(calls, "$.tool_calls")
            blocks.extend(
                _chat_tool_call_from(c, f"$.tool_calls[{i}]") for i, c in enumerate(listed)
            )
    data: dict[str, Any] = {"provider": CHAT}
    if isinstance(content, str):
        data["form"] = "string"
    message = SessionMessage(role=neutral_role, content=tuple(blocks), provider_data=dict(data))
    converted = _to_openai(message, "system", CANONICAL)
    canonical = converted[0] if converted else {}
    diff_into(data, canonical, m, children=("content", "tool_calls"))
    bare = msgspec.structs.replace(message, provider_data=None)
    if len(data) == 1 and _to_openai(bare, "system", CANONICAL):
        return bare
    return msgspec.structs.replace(message, provider_data=data)  # kept even if empty: sent as is


def from_openai_request(messages: Sequence[Mapping[str, Any]]) -> list[SessionMessage]:
    """The neutral messages of a Chat Completions ``messages`` list, one each, in order."""
    out: list[SessionMessage] = []
    for index, value in enumerate(as_list(messages, "$")):
        try:
            out.append(from_openai(value))
        except WireFormatError as exc:
            raise reindex(exc, index) from None
    return out
