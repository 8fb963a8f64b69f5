"""OpenAI Chat Completions and Responses API ↔ neutral messages."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
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
from ._anthropic import refusal_text, tool_ids
from ._common import (
    arguments_from_json,
    as_list,
    as_mapping,
    check_messages,
    diagnosed,
    fail,
    get_opt_str,
    get_str,
    normalize_media_type,
    parse_data_url,
    reindex,
    to_data_url,
)
from ._downgrade import CANONICAL, ConvertContext, DowngradeSink, foreign_text, native_type
from ._json import arguments_to_json, copy_json_object
from ._provider_data import (
    CHAT,
    RESPONSES,
    apply_container_patch,
    apply_patch,
    content_form,
    data_for,
    diff_into,
    sniff_image_media_type,
    written_as_string,
)
from ._reasoning import reasoning_wire_action

__all__ = [
    "OPENAI_TOOL_ID_MAX_LENGTH",
    "from_openai",
    "from_openai_request",
    "from_openai_responses",
    "openai_tool_id_map",
    "to_openai",
    "to_openai_request",
    "to_openai_responses",
]

ToolResultPart = TextBlock | ImageBlock | FileBlock | NativeBlock
Role = Literal["system", "user", "assistant"]

OPENAI_TOOL_ID_MAX_LENGTH = 40
"""OpenAI rejects tool-call ids longer than this."""

_DEFAULT_FILE_MEDIA_TYPE = "application/pdf"


# ---------------------------------------------------------------- shared pieces


def _short_id(call_id: str, widen: int) -> str:
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    size = 16 + widen
    if size <= OPENAI_TOOL_ID_MAX_LENGTH - 1:
        return f"{call_id[: OPENAI_TOOL_ID_MAX_LENGTH - 1 - size]}_{digest[:size]}"
    text = f"{call_id}#{widen}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(text).hexdigest()[:OPENAI_TOOL_ID_MAX_LENGTH]


@diagnosed("messages")
def openai_tool_id_map(messages: Iterable[SessionMessage]) -> dict[str, str]:
    """Replacement ids for tool ids longer than OpenAI's 40 characters.

    Both sides of a pair get the same replacement: the id's first characters
    plus a sha256 prefix of the whole id (deterministic), widened until it
    collides with no other id of ``messages``.
    """
    ids = tool_ids(messages)
    taken = {i for i in ids if len(i) <= OPENAI_TOOL_ID_MAX_LENGTH}
    mapping: dict[str, str] = {}
    for call_id in sorted(i for i in ids if i not in taken):
        widen = 0
        candidate = _short_id(call_id, widen)
        while candidate in taken:
            widen += 1
            candidate = _short_id(call_id, widen)
        mapping[call_id] = candidate
        taken.add(candidate)
    return mapping


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


def _fix_image_url(url: object) -> object:
    """A data URL whose declared image type disagrees with its bytes, re-typed from the bytes."""
    if not isinstance(url, str):
        return url
    inline = parse_data_url(url)
    if inline is None:
        return url
    sniffed = sniff_image_media_type(inline[1])
    if sniffed is None or sniffed == inline[0]:
        return url
    return to_data_url(sniffed, inline[1])


def _file_data(block: FileBlock, path: str) -> str:
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return to_data_url(normalize_media_type(block.media_type or ""), block.data)


def _with_data(
    neutral: Any,
    canonical: Mapping[str, Any] | None,
    original: Mapping[str, Any],
    provider: str,
    path: str,
    children: Iterable[str] = (),
) -> Any:
    """``neutral`` carrying what of ``original`` its ``canonical`` form does not reproduce."""
    if canonical is None:
        return neutral
    data: dict[str, Any] = dict(neutral.provider_data or {"provider": provider})
    diff_into(data, canonical, original, children=children, path=path)
    return msgspec.structs.replace(neutral, provider_data=data) if len(data) > 1 else neutral


def _patched(out: dict[str, Any], block: Any, provider: str) -> dict[str, Any]:
    data = data_for(block.provider_data, provider)
    return apply_patch(out, data) if data else out


def _refusal_kind(block: TextBlock) -> str | None:
    data = block.provider_data
    if data and str(data.get("provider", "")).startswith("openai"):
        kind = data.get("refusal")
        return kind if isinstance(kind, str) else None
    return None


def _form(parts: list[dict[str, Any]], form: object, default: str) -> str | list[dict[str, Any]]:
    if (form or default) != "string" or len(parts) != 1:
        return parts
    part = parts[0]
    plain_text = part.get("type") in ("text", "input_text", "output_text")
    if plain_text and set(part) <= {"type", "text", "annotations"} and not part.get("annotations"):
        text: str = part["text"]
        return text
    return parts


def _foreign_part(
    block: NativeBlock, kind: str, path: str, ctx: ConvertContext
) -> dict[str, Any] | None:
    text = foreign_text(block, path, ctx)
    return None if text is None else {"type": kind, "text": text}


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


# ---------------------------------------------------------------- Responses API: neutral → wire

_OUTPUT_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "web_search_call",
        "file_search_call",
        "computer_call",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "tool_search_call",
    }
)
_USER_ITEMS = frozenset(
    {
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
        "tool_search_output",
    }
)


def _chat_file_by_id(block: NativeBlock) -> dict[str, Any] | None:
    """A Chat ``file`` part by ``file_id`` as a Responses ``input_file`` (one Files API)."""
    file = block.data.get("file")
    if block.provider != CHAT or block.data.get("type") != "file" or not isinstance(file, Mapping):
        return None
    file_id = file.get("file_id")
    if not isinstance(file_id, str):
        return None
    out: dict[str, Any] = {"type": "input_file", "file_id": file_id}
    if isinstance(file.get("filename"), str):
        out["filename"] = file["filename"]
    return out


def _responses_part_to(
    block: ToolResultPart, list_assistant: bool, path: str, ctx: ConvertContext
) -> dict[str, Any] | None:
    text_type = "output_text" if list_assistant else "input_text"
    out: dict[str, Any]
    if isinstance(block, NativeBlock):
        if block.provider == RESPONSES:
            return copy_json_object(block.data, f"{path}.data")
        by_id = _chat_file_by_id(block)
        if by_id is not None and not list_assistant:
            ctx.report(path, "converted", "file")
            return by_id
        return _foreign_part(block, text_type, path, ctx)
    if isinstance(block, TextBlock):
        refusal = refusal_text(block)
        if (
            refusal is not None
            and list_assistant
            and _refusal_kind(block)
            and (block.provider_data or {}).get("provider") == RESPONSES
        ):
            out = {"type": "refusal", "refusal": block.text}
        elif refusal is None and not block.text.strip():
            return None
        else:
            out = {"type": text_type, "text": block.text if refusal is None else refusal}
            if list_assistant:
                out["annotations"] = []
    elif isinstance(block, ImageBlock):
        out = {"type": "input_image", "detail": "auto", "image_url": _image_url(block, path)}
    elif block.text is not None:
        out = {"type": "input_text", "text": block.text}
    else:
        out = {"type": "input_file"}
        if block.url is not None:
            out["file_url"] = block.url
        else:
            out["file_data"] = _file_data(block, path)
        if block.name:
            out["filename"] = block.name
    out = _patched(out, block, RESPONSES)
    if out.get("type") == "input_image":
        out["image_url"] = _fix_image_url(out.get("image_url"))
    return out


def _item_data(block: SessionContentBlock) -> Mapping[str, Any]:
    data = data_for(getattr(block, "provider_data", None), RESPONSES)
    item = data.get("item")
    return item if isinstance(item, Mapping) else {}


class _Items:
    """Builds the item list, grouping message parts into message items."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.origin: list[int] = []
        self._parts: list[dict[str, Any]] | None = None
        self._role = ""
        self._data: Mapping[str, Any] = {}
        self._index = 0

    def flush(self) -> None:
        if self._parts is None:
            return
        default = "string" if self._role == "assistant" else "list"
        item = {
            "type": "message",
            "role": self._role,
            "content": _form(self._parts, self._data.get("form"), default),
        }
        self.add(apply_container_patch(item, self._data, ("content",)), self._index)
        self._parts = None

    def add(self, item: dict[str, Any], index: int) -> None:
        self.items.append(item)
        self.origin.append(index)

    def part(
        self, part: dict[str, Any], role: str, data: Mapping[str, Any] | None, index: int
    ) -> None:
        """Add ``part``: to the open item, or (``data`` given) to a new item with that data."""
        if data is not None or self._parts is None or self._role != role:
            self.flush()
            self._parts, self._role, self._data, self._index = [], role, data or {}, index
        assert self._parts is not None
        self._parts.append(part)


def _responses_tool_output(
    block: ToolResultBlock, path: str, ctx: ConvertContext
) -> dict[str, Any]:
    output: str | list[dict[str, Any]]
    if isinstance(block.output, str):
        output = block.output
    else:
        converted = (
            _responses_part_to(p, False, f"{path}.output[{j}]", ctx)
            for j, p in enumerate(block.output)
        )
        output = [p for p in converted if p is not None]
    out = {"type": "function_call_output", "call_id": block.call_id, "output": output}
    out = _patched(out, block, RESPONSES)
    out["call_id"] = ctx.ids.get(block.call_id, block.call_id)
    return out


def _responses_call(block: ToolCallBlock, path: str, ctx: ConvertContext) -> dict[str, Any]:
    out = {
        "type": "function_call",
        "call_id": block.id,
        "name": block.name,
        "arguments": arguments_to_json(call_input(block), path),
    }
    out = _patched(out, block, RESPONSES)
    out["call_id"] = ctx.ids.get(block.id, block.id)
    return out


def _responses_reasoning(block: ReasoningBlock) -> dict[str, Any]:
    text = reasoning_text(block)
    summary = [{"type": "summary_text", "text": text}] if text else []
    out = {
        "type": "reasoning",
        "id": block.id,
        "summary": summary,
        "encrypted_content": block.signature,
    }
    return _patched(out, block, RESPONSES)


def _responses_message(
    msg: SessionMessage, items: _Items, index: int, ctx: ConvertContext, *, store: bool = True
) -> None:
    role = msg.role
    hint = role != "assistant" and written_as_string(msg)
    chat_set = data_for(msg.provider_data, CHAT).get("set") or {}
    wire_role = "developer" if chat_set.get("/role") == "developer" else role  # Chat's developer
    for i, block in enumerate(msg.content):
        path = f"$.content[{i}]"
        item_data = _item_data(block)
        starts = (
            item_data
            if "item" in data_for(getattr(block, "provider_data", None), RESPONSES)
            else None
        )
        if hint and starts is None and isinstance(block, TextBlock):
            starts = {"form": "string"}  # another format wrote it as a string: so does this one
        joins = bool(data_for(getattr(block, "provider_data", None), RESPONSES).get("join"))
        if isinstance(block, NativeBlock) and block.provider == RESPONSES:
            if not store and _id_only_reasoning(block.data):
                ctx.report(path, "dropped", "reasoning")  # as a ReasoningBlock without signature
                continue
            items.flush()  # a whole item (parts of a Responses payload never stand alone)
            items.add(copy_json_object(block.data, f"{path}.data"), index)
        elif isinstance(block, ToolResultBlock):
            if role != "user":
                fail("tool_result blocks belong in user messages", path)
            items.flush()
            items.add(_responses_tool_output(block, path, ctx), index)
        elif isinstance(block, ToolCallBlock):
            if role != "assistant":
                fail(f"ToolCallBlock does not belong in a {role} message", path)
            items.flush()
            items.add(_responses_call(block, path, ctx), index)
        elif isinstance(block, ReasoningBlock):
            if (
                role == "assistant"
                and reasoning_wire_action(block, "openai", store=store) == "keep"
            ):
                items.flush()
                items.add(_responses_reasoning(block), index)
            else:
                ctx.report(path, "dropped", "reasoning")
        else:
            if role == "assistant" and isinstance(block, ImageBlock | FileBlock):
                ctx.report(path, "dropped", "image" if isinstance(block, ImageBlock) else "file")
                continue  # assistant messages carry no media here
            list_assistant = role == "assistant" and (
                joins or (starts is not None and starts.get("form") == "list")
            )
            part = _responses_part_to(block, list_assistant, path, ctx)
            if part is None:
                continue
            if role == "assistant" and not joins and starts is None:
                starts = {}  # assistant text: one item per block unless joined
            items.part(part, wire_role, starts, index)
    items.flush()


def _id_only_reasoning(item: Mapping[str, Any]) -> bool:
    """Whether ``item`` is a reasoning item without ``encrypted_content``: known by id only.

    Only an API that stored the item can resolve such an id; a request sent
    with ``store: false`` is refused when it holds one.
    """
    encrypted = item.get("encrypted_content")
    return item.get("type") == "reasoning" and not (isinstance(encrypted, str) and encrypted)


def _follows(items: list[dict[str, Any]], i: int) -> bool:
    j = i + 1
    while j < len(items) and items[j].get("type") == "reasoning":
        j += 1
    if j >= len(items):
        return False
    item = items[j]
    kind = item.get("type", "message")
    return kind in _OUTPUT_ITEMS or (kind == "message" and item.get("role") == "assistant")


@diagnosed("messages")
def to_openai_responses(
    messages: Sequence[SessionMessage],
    *,
    on_downgrade: DowngradeSink | None = None,
    store: bool = True,
) -> list[dict[str, Any]]:
    """Convert neutral messages to Responses API input items.

    Responses ``providerData`` and native items come back exactly (item ids,
    ``status``, ``phase``, parts grouped as they came, summaries, reasoning
    ``content``…). User tool results become ``function_call_output`` items,
    assistant text one assistant ``message`` per block, tool calls
    ``function_call`` items, OpenAI reasoning a ``reasoning`` item (other
    reasoning is dropped); a reasoning item is only sent when the item it
    belongs to follows it. Tool ids over 40 characters are remapped.
    ``store=False`` is for a request sent with ``store: false``: the API
    keeps no items then, so reasoning known only by its id (no
    ``encrypted_content``: a reasoning block, or a native reasoning item) is
    dropped and reported instead of replayed.
    """
    check_messages(messages)
    ids = openai_tool_id_map(messages)
    items = _Items()
    for index, message in enumerate(messages):
        try:
            ctx = ConvertContext(ids, index, on_downgrade)
            _responses_message(message, items, index, ctx, store=store)
        except WireFormatError as exc:
            raise reindex(exc, index) from None
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items.items):
        if item.get("type") == "reasoning" and not _follows(items.items, i):
            ConvertContext(ids, items.origin[i], on_downgrade).report("$", "dropped", "reasoning")
            continue
        out.append(item)
    return out


# ---------------------------------------------------------------- Responses API: wire → neutral


def _responses_part_from(
    value: object, role: str, list_assistant: bool, path: str
) -> ToolResultPart:
    part = as_mapping(value, path)
    kind = get_str(part, "type", path)
    neutral: TextBlock | ImageBlock | FileBlock | None = None
    if kind in ("input_text", "output_text"):
        neutral = TextBlock(get_str(part, "text", path))
    elif kind == "refusal":
        neutral = TextBlock(
            get_str(part, "refusal", path), provider_data={"provider": RESPONSES, "refusal": "part"}
        )
    elif kind == "input_image":
        url = get_opt_str(part, "image_url", path)
        if url is not None:
            neutral = _image_from_url(url)
    elif kind == "input_file":
        name = get_opt_str(part, "filename", path)
        data = get_opt_str(part, "file_data", path)
        url = get_opt_str(part, "file_url", path)
        if data is not None:
            neutral = _file_from_data(data, name)
        elif url is not None:
            neutral = FileBlock(url=url, name=name)
    if neutral is None:  # files and images by id, audio, anything newer
        return NativeBlock(provider=RESPONSES, data=copy_json_object(part, path))
    try:
        canonical = _responses_part_to(neutral, list_assistant, path, CANONICAL)
    except WireFormatError:
        return NativeBlock(provider=RESPONSES, data=copy_json_object(part, path))
    return _with_data(neutral, canonical, part, RESPONSES, path)  # type: ignore[no-any-return]


def _mark(block: Any, key: str, value: object) -> Any:
    data = dict(block.provider_data or {"provider": RESPONSES})
    data[key] = value
    return msgspec.structs.replace(block, provider_data=data)


def _message_item_from(
    item: Mapping[str, Any], path: str
) -> tuple[Role, tuple[SessionContentBlock, ...]]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        fail(f"unsupported role {preview(role)}", f"{path}.role")
    neutral: Role = "system" if role == "developer" else role
    content = item.get("content")
    form = "string" if isinstance(content, str) else "list"
    default = "string" if neutral == "assistant" else "list"
    list_assistant = neutral == "assistant" and form == "list"
    if isinstance(content, str):
        parts: list[ToolResultPart] = [TextBlock(content)]
    else:
        listed = as_list(content, f"{path}.content")
        parts = [
            _responses_part_from(p, neutral, list_assistant, f"{path}.content[{i}]")
            for i, p in enumerate(listed)
        ]
    if not parts or any(isinstance(p, NativeBlock) for p in parts):
        return neutral, (NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    item_data: dict[str, Any] = {} if form == default else {"form": form}
    blocks: list[SessionContentBlock] = [_mark(parts[0], "item", item_data)] if parts else []
    blocks.extend(_mark(p, "join", True) if neutral == "assistant" else p for p in parts[1:])
    probe = _Items()
    try:
        _responses_message(SessionMessage(role=neutral, content=tuple(blocks)), probe, 0, CANONICAL)
    except WireFormatError:
        probe.items = []
    if len(probe.items) != 1 or probe.items[0].get("type") != "message":
        return neutral, (NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    diff_into(item_data, probe.items[0], item, children=("content",), path=path)
    blocks[0] = _mark(blocks[0], "item", item_data)
    check = _Items()
    _responses_message(SessionMessage(role=neutral, content=tuple(blocks)), check, 0, CANONICAL)
    if check.items != [item]:  # a shape the neutral blocks cannot give back: keep it verbatim
        return neutral, (NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    return neutral, tuple(blocks)


def _responses_item_from(value: object, path: str) -> tuple[Role, tuple[SessionContentBlock, ...]]:
    item = as_mapping(value, path)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _message_item_from(item, path)
    if kind in ("function_call", "custom_tool_call"):
        call_id = get_str(item, "call_id", path, non_empty=True)
        name = get_str(item, "name", path, non_empty=True)
        if kind == "function_call":
            tool_input = arguments_from_json(get_str(item, "arguments", path))
        else:
            tool_input = {"input": get_str(item, "input", path)}
        call = ToolCallBlock(id=call_id, name=name, input=tool_input)
        return "assistant", (
            _with_data(call, _responses_call(call, path, CANONICAL), item, RESPONSES, path),
        )
    if kind in ("function_call_output", "custom_tool_call_output") and item.get("call_id"):
        raw = item.get("output")
        output: str | tuple[ToolResultPart, ...]
        if isinstance(raw, str):
            output = raw
        else:
            listed = as_list(raw, f"{path}.output")
            output = tuple(
                _responses_part_from(p, "user", False, f"{path}.output[{i}]")
                for i, p in enumerate(listed)
            )
        result = ToolResultBlock(
            call_id=get_str(item, "call_id", path, non_empty=True), output=output
        )
        canonical = _responses_tool_output(result, path, CANONICAL)
        return "user", (_with_data(result, canonical, item, RESPONSES, path, ("output",)),)
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
        return "assistant", (
            _with_data(reasoning, _responses_reasoning(reasoning), item, RESPONSES, path),
        )
    if kind is not None and not isinstance(kind, str):
        fail("item type must be a string", f"{path}.type")
    native = NativeBlock(provider=RESPONSES, data=copy_json_object(item, path))
    user_side = kind in _USER_ITEMS or kind in ("function_call_output", "custom_tool_call_output")
    return ("user" if user_side else "assistant"), (native,)


def _is_part(block: SessionContentBlock) -> bool:
    return isinstance(block, TextBlock | ImageBlock | FileBlock)


def _drop_empty_item_mark(block: SessionContentBlock) -> SessionContentBlock:
    """Leave out an ``item: {}`` mark where the default grouping starts a new item anyway."""
    data = getattr(block, "provider_data", None)
    if not data or data.get("provider") != RESPONSES or data.get("item") != {}:
        return block
    rest = {k: v for k, v in data.items() if k != "item"}
    return msgspec.structs.replace(block, provider_data=rest if len(rest) > 1 else None)


def from_openai_responses(items: Sequence[Mapping[str, Any]]) -> list[SessionMessage]:
    """Convert Responses API input items to neutral messages.

    Consecutive items of one role merge into one message: ``function_call``,
    ``custom_tool_call`` and ``reasoning`` items are assistant content,
    ``function_call_output`` items user content; ``developer`` messages
    become ``system``; server-side tool items (web search, MCP, computer
    use…) and item references become native blocks. Item ids, ``status``,
    ``phase`` and how parts were grouped are kept in ``providerData``;
    ``to_openai_responses`` gives the same items back.
    """
    listed = as_list(items, "$")
    out: list[SessionMessage] = []
    for index, value in enumerate(listed):
        role, blocks = _responses_item_from(value, f"$[{index}]")
        after_part = bool(out) and out[-1].role == role and _is_part(out[-1].content[-1])
        if blocks and not (after_part and role != "assistant"):
            blocks = (_drop_empty_item_mark(blocks[0]), *blocks[1:])
        if out and out[-1].role == role:
            out[-1] = SessionMessage(role=role, content=out[-1].content + blocks)
        else:
            out.append(SessionMessage(role=role, content=blocks))
    return out
