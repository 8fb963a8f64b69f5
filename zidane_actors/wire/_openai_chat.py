"""OpenAI Chat Completions ↔ neutral messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from .. import model
from ..errors import WireFormatError
from ..model._types import ToolResultPart
from . import _common, _openai_common
from ._anthropic import refusal_text
from ._downgrade import CANONICAL, ConvertContext, DowngradeSink, native_type
from ._json import arguments_to_json, copy_json_object
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
    if isinstance(block, model.NativeBlock):
        if block.provider != CHAT:
            return _openai_common.foreign_part(block, "text", path, ctx)
        kind = block.data.get("type")
        if isinstance(kind, str) and (role == "user" or kind in _CHAT_TEXT_PARTS.get(role, ())):
            return copy_json_object(block.data, f"{path}.data")
        ctx.report(path, "dropped", native_type(block))  # a part or field this role cannot hold
        return None
    if isinstance(block, model.TextBlock):
        if _openai_common.refusal_kind(block) is not None and role == "assistant":
            out = {"type": "refusal", "refusal": block.text}
        else:
            refusal = refusal_text(block)
            if refusal is None and not block.text.strip():
                return None
            out = {"type": "text", "text": block.text if refusal is None else refusal}
    elif role in ("assistant", "system"):  # text only there: media are dropped, reported
        ctx.report(path, "dropped", "image" if isinstance(block, model.ImageBlock) else "file")
        return None
    elif isinstance(block, model.ImageBlock):
        out = {"type": "image_url", "image_url": {"url": _openai_common.image_url(block, path)}}
    elif block.text is not None:
        out = {"type": "text", "text": block.text}
    elif block.url is not None:  # Chat file parts cannot point at a URL: the link as text
        ctx.report(path, "converted", "file")
        label = f"{block.name}: " if block.name else ""
        out = {"type": "text", "text": f"[document {label}{block.url}]"}
    else:
        file: dict[str, Any] = {"file_data": _openai_common.file_data(block, path)}
        if block.name:
            file["filename"] = block.name
        out = {"type": "file", "file": file}
    out = _openai_common.patched(out, block, CHAT)
    image = out.get("image_url")
    if out.get("type") == "image_url" and isinstance(image, dict):
        image["url"] = _openai_common.fix_image_url(image.get("url"))
    return out


def _tool_message(
    block: model.ToolResultBlock, path: str, ctx: ConvertContext
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
    out = _openai_common.patched(
        {"role": "tool", "tool_call_id": block.call_id, "content": content}, block, CHAT
    )
    out["tool_call_id"] = ctx.ids.get(block.call_id, block.call_id)
    return out, moved


def _chat_tool_call(block: model.ToolCallBlock, path: str, ctx: ConvertContext) -> dict[str, Any]:
    out = {
        "id": block.id,
        "type": "function",
        "function": {
            "name": block.name,
            "arguments": arguments_to_json(model.call_input(block), path),
        },
    }
    out = _openai_common.patched(out, block, CHAT)
    out["id"] = ctx.ids.get(block.id, block.id)
    return out


def _chat_user(msg: model.SessionMessage, ctx: ConvertContext) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if isinstance(block, model.ToolResultBlock):
            tool, media = _tool_message(block, path, ctx)
            out.append(tool)
            moved.extend(media)
        elif (
            isinstance(block, model.NativeBlock) and block.provider == CHAT and "role" in block.data
        ):
            out.append(copy_json_object(block.data, f"{path}.data"))  # a legacy function message
        elif isinstance(block, ToolResultPart):  # what _chat_part_to converts
            part = _chat_part_to(block, "user", path, ctx)
            if part is not None:
                parts.append(part)
        elif isinstance(block, model.ToolCallBlock):
            _common.fail("tool_call blocks belong in assistant messages", path)
        else:  # reasoning never reaches a user message
            ctx.report(path, "dropped", "reasoning")
    data = data_for(msg.provider_data, CHAT)
    if moved or parts or data:
        user = {
            "role": "user",
            "content": _openai_common.form(moved + parts, content_form(msg, CHAT), "list"),
        }
        out.append(apply_container_patch(user, data, ("content",)))
    return out


def _chat_assistant(msg: model.SessionMessage, ctx: ConvertContext) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    reasoning: list[str] = []
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        if (
            isinstance(block, model.TextBlock)
            and _openai_common.refusal_kind(block) == "field"
            and (block.provider_data or {}).get("provider") == CHAT
        ):
            fields["refusal"] = block.text
        elif (
            isinstance(block, model.NativeBlock)
            and block.provider == CHAT
            and ("audio" in block.data or "function_call" in block.data)
        ):
            fields.update(copy_json_object(block.data, f"{path}.data"))
        elif isinstance(block, ToolResultPart):  # what _chat_part_to converts
            part = _chat_part_to(block, "assistant", path, ctx)
            if part is not None:
                parts.append(part)
        elif isinstance(block, model.ToolCallBlock):
            calls.append(_chat_tool_call(block, path, ctx))
        elif isinstance(block, model.ReasoningBlock):
            if block.provider == CHAT:
                reasoning.append(model.reasoning_text(block))
            else:
                ctx.report(path, "dropped", "reasoning")
        else:
            _common.fail("tool_result blocks belong in user messages", path)
    data = data_for(msg.provider_data, CHAT)
    if not (parts or calls or fields or data):
        return []
    out: dict[str, Any] = {"role": "assistant"}
    out["content"] = _openai_common.form(parts, content_form(msg, CHAT), "list") if parts else None
    out.update(fields)
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    return [apply_container_patch(out, data, ("content", "tool_calls"))]


def _chat_system(
    msg: model.SessionMessage, system_role: str, ctx: ConvertContext
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(msg.content):
        if isinstance(block, model.ToolCallBlock | model.ToolResultBlock | model.ReasoningBlock):
            _common.fail("system messages may hold text only", f"$.content[{i}]")
        part = _chat_part_to(block, "system", f"$.content[{i}]", ctx)
        if part is not None:
            parts.append(part)
    data = data_for(msg.provider_data, CHAT)
    if not parts and not data:
        return []
    out = {
        "role": system_role,
        "content": _openai_common.form(parts, content_form(msg, CHAT), "list"),
    }
    return [apply_container_patch(out, data, ("content",))]


def _to_openai(
    msg: model.SessionMessage, system_role: str, ctx: ConvertContext
) -> list[dict[str, Any]]:
    if msg.role == "system":
        return _chat_system(msg, system_role, ctx)
    if msg.role == "user":
        return _chat_user(msg, ctx)
    return _chat_assistant(msg, ctx)


@_common.diagnosed("msg", one=True)
def to_openai(
    msg: model.SessionMessage, *, on_downgrade: DowngradeSink | None = None
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
    _common.check_messages(msg, one=True)
    return _to_openai(
        msg, "system", ConvertContext(_openai_common.openai_tool_id_map([msg]), 0, on_downgrade)
    )


@_common.diagnosed("messages")
def to_openai_request(
    messages: Sequence[model.SessionMessage],
    *,
    system_role: Literal["system", "developer"] = "system",
    on_downgrade: DowngradeSink | None = None,
) -> list[dict[str, Any]]:
    """The ``messages`` list of a Chat Completions request.

    System messages use ``system_role`` (``developer`` for o-series models)
    unless they came as the other; one tool-id map for the conversation.
    """
    _common.check_messages(messages)
    ids = _openai_common.openai_tool_id_map(messages)
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        try:
            out.extend(_to_openai(message, system_role, ConvertContext(ids, index, on_downgrade)))
        except WireFormatError as exc:
            raise _common.reindex(exc, index) from None
    return out


# ---------------------------------------------------------------- Chat Completions: wire → neutral


def _chat_part_from(value: object, path: str, role: str) -> model.SessionContentBlock:
    part = _common.as_mapping(value, path)
    kind = _common.get_str(part, "type", path)
    neutral: model.TextBlock | model.ImageBlock | model.FileBlock | None = None
    if kind == "text":
        neutral = model.TextBlock(_common.get_str(part, "text", path))
    elif kind == "refusal" and role == "assistant":
        refusal = _common.get_str(part, "refusal", path)
        neutral = model.TextBlock(refusal, provider_data={"provider": CHAT, "refusal": "part"})
    elif role == "user" and kind == "image_url":
        image = _common.as_mapping(part.get("image_url"), f"{path}.image_url")
        neutral = _openai_common.image_from_url(_common.get_str(image, "url", f"{path}.image_url"))
    elif role == "user" and kind == "file":
        file = _common.as_mapping(part.get("file"), f"{path}.file")
        data = _common.get_opt_str(file, "file_data", f"{path}.file")
        if data is not None:
            neutral = _openai_common.file_from_data(
                data, _common.get_opt_str(file, "filename", f"{path}.file")
            )
    if neutral is None:  # input_audio, files by id, anything newer
        return model.NativeBlock(provider=CHAT, data=copy_json_object(part, path))
    canonical = _chat_part_to(neutral, role, path, CANONICAL)
    return _openai_common.with_data(neutral, canonical, part, CHAT, path)  # type: ignore[no-any-return]


def _chat_tool_call_from(value: object, path: str) -> model.ToolCallBlock:
    call = _common.as_mapping(value, path)
    kind = call.get("type", "function")
    call_id = _common.get_str(call, "id", path, non_empty=True)
    if kind == "custom":
        custom = _common.as_mapping(call.get("custom"), f"{path}.custom")
        block = model.ToolCallBlock(
            id=call_id,
            name=_common.get_str(custom, "name", f"{path}.custom", non_empty=True),
            input={"input": _common.get_str(custom, "input", f"{path}.custom")},
        )
    elif kind == "function":
        function = _common.as_mapping(call.get("function"), f"{path}.function")
        block = model.ToolCallBlock(
            id=call_id,
            name=_common.get_str(function, "name", f"{path}.function", non_empty=True),
            input=_common.arguments_from_json(
                _common.get_str(function, "arguments", f"{path}.function")
            ),
        )
    else:
        _common.fail(f"unsupported tool call type {model.preview(kind)}", f"{path}.type")
    canonical = _chat_tool_call(block, path, CANONICAL)
    return _openai_common.with_data(block, canonical, call, CHAT, path)  # type: ignore[no-any-return]


def _chat_content(content: object, path: str, role: str) -> tuple[model.SessionContentBlock, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (model.TextBlock(content),)
    parts = _common.as_list(content, path)
    return tuple(_chat_part_from(p, f"{path}[{i}]", role) for i, p in enumerate(parts))


def _chat_tool_from(m: Mapping[str, Any]) -> model.SessionMessage:
    call_id = _common.get_str(m, "tool_call_id", "$", non_empty=True)
    raw = m.get("content")
    output: str | tuple[ToolResultPart, ...]
    if isinstance(raw, str):
        output = raw
    else:
        parts = _common.as_list(raw, "$.content")
        texts: list[ToolResultPart] = []
        for i, p in enumerate(parts):
            part = _chat_part_from(p, f"$.content[{i}]", "tool")
            if not isinstance(part, model.TextBlock):
                _common.fail("tool messages hold text parts only", f"$.content[{i}].type")
            texts.append(part)
        output = tuple(texts)
    block = model.ToolResultBlock(call_id=call_id, output=output)
    canonical, _ = _tool_message(block, "$", CANONICAL)
    block = _openai_common.with_data(block, canonical, m, CHAT, "$", ("content",))
    return model.SessionMessage(role="user", content=(block,))


def from_openai(msg: Mapping[str, Any]) -> model.SessionMessage:
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
    m = _common.as_mapping(msg, "$")
    role = m.get("role")
    if role == "tool":
        return _chat_tool_from(m)
    if role == "function":
        return model.SessionMessage(
            role="user", content=(model.NativeBlock(provider=CHAT, data=copy_json_object(m, "$")),)
        )
    if role not in ("system", "developer", "user", "assistant"):
        _common.fail(f"unsupported role {model.preview(role)}", "$.role")
    neutral_role: _openai_common.Role = "system" if role == "developer" else role
    content = m.get("content")
    blocks: list[model.SessionContentBlock] = []
    if role == "assistant":
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str):
            blocks.append(model.ReasoningBlock(text=reasoning, provider=CHAT))
    blocks.extend(
        _chat_content(
            content,
            "$.content",
            "assistant" if role == "assistant" else ("user" if role == "user" else "system"),
        )
    )
    if role == "assistant":
        refusal = _common.get_opt_str(m, "refusal", "$")
        if refusal is not None:
            blocks.append(
                model.TextBlock(refusal, provider_data={"provider": CHAT, "refusal": "field"})
            )
        for key in ("audio", "function_call"):
            if m.get(key) is not None:
                blocks.append(
                    model.NativeBlock(
                        provider=CHAT, data={key: copy_json_object(m[key], f"$.{key}")}
                    )
                )
        calls = m.get("tool_calls")
        if calls is not None:
            listed = _common.as_list(calls, "$.tool_calls")
            blocks.extend(
                _chat_tool_call_from(c, f"$.tool_calls[{i}]") for i, c in enumerate(listed)
            )
    data: dict[str, Any] = {"provider": CHAT}
    if isinstance(content, str):
        data["form"] = "string"
    message = model.SessionMessage(
        role=neutral_role, content=tuple(blocks), provider_data=dict(data)
    )
    converted = _to_openai(message, "system", CANONICAL)
    canonical = converted[0] if converted else {}
    diff_into(data, canonical, m, children=("content", "tool_calls"))
    bare = msgspec.structs.replace(message, provider_data=None)
    if len(data) == 1 and _to_openai(bare, "system", CANONICAL):
        return bare
    return msgspec.structs.replace(message, provider_data=data)  # kept even if empty: sent as is


def from_openai_request(messages: Sequence[Mapping[str, Any]]) -> list[model.SessionMessage]:
    """The neutral messages of a Chat Completions ``messages`` list, one each, in order."""
    out: list[model.SessionMessage] = []
    for index, value in enumerate(_common.as_list(messages, "$")):
        try:
            out.append(from_openai(value))
        except WireFormatError as exc:
            raise _common.reindex(exc, index) from None
    return out
