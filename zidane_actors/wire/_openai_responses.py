"""OpenAI Responses API ↔ neutral messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .. import model
from ..errors import WireFormatError
from ..model._types import ToolResultPart
from . import _common, _openai_common
from ._anthropic import refusal_text
from ._downgrade import CANONICAL, ConvertContext, DowngradeSink
from ._json import arguments_to_json, copy_json_object
from ._provider_data import (
    CHAT,
    RESPONSES,
    apply_container_patch,
    data_for,
    diff_into,
    written_as_string,
)
from ._reasoning import reasoning_wire_action

__all__ = [
    "from_openai_responses",
    "to_openai_responses",
]


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


def _chat_file_by_id(block: model.NativeBlock) -> dict[str, Any] | None:
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
    if isinstance(block, model.NativeBlock):
        if block.provider == RESPONSES:
            return copy_json_object(block.data, f"{path}.data")
        by_id = _chat_file_by_id(block)
        if by_id is not None and not list_assistant:
            ctx.report(path, "converted", "file")
            return by_id
        return _openai_common.foreign_part(block, text_type, path, ctx)
    if isinstance(block, model.TextBlock):
        refusal = refusal_text(block)
        if (
            refusal is not None
            and list_assistant
            and _openai_common.refusal_kind(block)
            and (block.provider_data or {}).get("provider") == RESPONSES
        ):
            out = {"type": "refusal", "refusal": block.text}
        elif refusal is None and not block.text.strip():
            return None
        else:
            out = {"type": text_type, "text": block.text if refusal is None else refusal}
            if list_assistant:
                out["annotations"] = []
    elif isinstance(block, model.ImageBlock):
        out = {
            "type": "input_image",
            "detail": "auto",
            "image_url": _openai_common.image_url(block, path),
        }
    elif block.text is not None:
        out = {"type": "input_text", "text": block.text}
    else:
        out = {"type": "input_file"}
        if block.url is not None:
            out["file_url"] = block.url
        else:
            out["file_data"] = _openai_common.file_data(block, path)
        if block.name:
            out["filename"] = block.name
    out = _openai_common.patched(out, block, RESPONSES)
    if out.get("type") == "input_image":
        out["image_url"] = _openai_common.fix_image_url(out.get("image_url"))
    return out


def _item_data(block: model.SessionContentBlock) -> Mapping[str, Any]:
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
            "content": _openai_common.form(self._parts, self._data.get("form"), default),
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
    block: model.ToolResultBlock, path: str, ctx: ConvertContext
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
    out = _openai_common.patched(out, block, RESPONSES)
    out["call_id"] = ctx.ids.get(block.call_id, block.call_id)
    return out


def _responses_call(block: model.ToolCallBlock, path: str, ctx: ConvertContext) -> dict[str, Any]:
    out = {
        "type": "function_call",
        "call_id": block.id,
        "name": block.name,
        "arguments": arguments_to_json(model.call_input(block), path),
    }
    out = _openai_common.patched(out, block, RESPONSES)
    out["call_id"] = ctx.ids.get(block.id, block.id)
    return out


def _responses_reasoning(block: model.ReasoningBlock) -> dict[str, Any]:
    text = model.reasoning_text(block)
    summary = [{"type": "summary_text", "text": text}] if text else []
    out = {
        "type": "reasoning",
        "id": block.id,
        "summary": summary,
        "encrypted_content": block.signature,
    }
    return _openai_common.patched(out, block, RESPONSES)


def _responses_message(
    msg: model.SessionMessage, items: _Items, index: int, ctx: ConvertContext, *, store: bool = True
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
        if hint and starts is None and isinstance(block, model.TextBlock):
            starts = {"form": "string"}  # another format wrote it as a string: so does this one
        joins = bool(data_for(getattr(block, "provider_data", None), RESPONSES).get("join"))
        if isinstance(block, model.NativeBlock) and block.provider == RESPONSES:
            if not store and _id_only_reasoning(block.data):
                ctx.report(path, "dropped", "reasoning")  # as a ReasoningBlock without signature
                continue
            items.flush()  # a whole item (parts of a Responses payload never stand alone)
            items.add(copy_json_object(block.data, f"{path}.data"), index)
        elif isinstance(block, model.ToolResultBlock):
            if role != "user":
                _common.fail("tool_result blocks belong in user messages", path)
            items.flush()
            items.add(_responses_tool_output(block, path, ctx), index)
        elif isinstance(block, model.ToolCallBlock):
            if role != "assistant":
                _common.fail(f"ToolCallBlock does not belong in a {role} message", path)
            items.flush()
            items.add(_responses_call(block, path, ctx), index)
        elif isinstance(block, model.ReasoningBlock):
            if (
                role == "assistant"
                and reasoning_wire_action(block, "openai", store=store) == "keep"
            ):
                items.flush()
                items.add(_responses_reasoning(block), index)
            else:
                ctx.report(path, "dropped", "reasoning")
        else:
            if role == "assistant" and isinstance(block, model.ImageBlock | model.FileBlock):
                ctx.report(
                    path, "dropped", "image" if isinstance(block, model.ImageBlock) else "file"
                )
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


@_common.diagnosed("messages")
def to_openai_responses(
    messages: Sequence[model.SessionMessage],
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
    _common.check_messages(messages)
    ids = _openai_common.openai_tool_id_map(messages)
    items = _Items()
    for index, message in enumerate(messages):
        try:
            ctx = ConvertContext(ids, index, on_downgrade)
            _responses_message(message, items, index, ctx, store=store)
        except WireFormatError as exc:
            raise _common.reindex(exc, index) from None
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
    part = _common.as_mapping(value, path)
    kind = _common.get_str(part, "type", path)
    neutral: model.TextBlock | model.ImageBlock | model.FileBlock | None = None
    if kind in ("input_text", "output_text"):
        neutral = model.TextBlock(_common.get_str(part, "text", path))
    elif kind == "refusal":
        neutral = model.TextBlock(
            _common.get_str(part, "refusal", path),
            provider_data={"provider": RESPONSES, "refusal": "part"},
        )
    elif kind == "input_image":
        url = _common.get_opt_str(part, "image_url", path)
        if url is not None:
            neutral = _openai_common.image_from_url(url)
    elif kind == "input_file":
        name = _common.get_opt_str(part, "filename", path)
        data = _common.get_opt_str(part, "file_data", path)
        url = _common.get_opt_str(part, "file_url", path)
        if data is not None:
            neutral = _openai_common.file_from_data(data, name)
        elif url is not None:
            neutral = model.FileBlock(url=url, name=name)
    if neutral is None:  # files and images by id, audio, anything newer
        return model.NativeBlock(provider=RESPONSES, data=copy_json_object(part, path))
    try:
        canonical = _responses_part_to(neutral, list_assistant, path, CANONICAL)
    except WireFormatError:
        return model.NativeBlock(provider=RESPONSES, data=copy_json_object(part, path))
    return _openai_common.with_data(neutral, canonical, part, RESPONSES, path)  # type: ignore[no-any-return]


def _mark(block: Any, key: str, value: object) -> Any:
    data = dict(block.provider_data or {"provider": RESPONSES})
    data[key] = value
    return msgspec.structs.replace(block, provider_data=data)


def _message_item_from(
    item: Mapping[str, Any], path: str
) -> tuple[_openai_common.Role, tuple[model.SessionContentBlock, ...]]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        _common.fail(f"unsupported role {model.preview(role)}", f"{path}.role")
    neutral: _openai_common.Role = "system" if role == "developer" else role
    content = item.get("content")
    form = "string" if isinstance(content, str) else "list"
    default = "string" if neutral == "assistant" else "list"
    list_assistant = neutral == "assistant" and form == "list"
    if isinstance(content, str):
        parts: list[ToolResultPart] = [model.TextBlock(content)]
    else:
        listed = _common.as_list(content, f"{path}.content")
        parts = [
            _responses_part_from(p, neutral, list_assistant, f"{path}.content[{i}]")
            for i, p in enumerate(listed)
        ]
    if not parts or any(isinstance(p, model.NativeBlock) for p in parts):
        return neutral, (model.NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    item_data: dict[str, Any] = {} if form == default else {"form": form}
    blocks: list[model.SessionContentBlock] = [_mark(parts[0], "item", item_data)] if parts else []
    blocks.extend(_mark(p, "join", True) if neutral == "assistant" else p for p in parts[1:])
    probe = _Items()
    try:
        _responses_message(
            model.SessionMessage(role=neutral, content=tuple(blocks)), probe, 0, CANONICAL
        )
    except WireFormatError:
        probe.items = []
    if len(probe.items) != 1 or probe.items[0].get("type") != "message":
        return neutral, (model.NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    diff_into(item_data, probe.items[0], item, children=("content",), path=path)
    blocks[0] = _mark(blocks[0], "item", item_data)
    check = _Items()
    _responses_message(
        model.SessionMessage(role=neutral, content=tuple(blocks)), check, 0, CANONICAL
    )
    if check.items != [item]:  # a shape the neutral blocks cannot give back: keep it verbatim
        return neutral, (model.NativeBlock(provider=RESPONSES, data=copy_json_object(item, path)),)
    return neutral, tuple(blocks)


def _responses_item_from(
    value: object, path: str
) -> tuple[_openai_common.Role, tuple[model.SessionContentBlock, ...]]:
    item = _common.as_mapping(value, path)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _message_item_from(item, path)
    if kind in ("function_call", "custom_tool_call"):
        call_id = _common.get_str(item, "call_id", path, non_empty=True)
        name = _common.get_str(item, "name", path, non_empty=True)
        if kind == "function_call":
            tool_input = _common.arguments_from_json(_common.get_str(item, "arguments", path))
        else:
            tool_input = {"input": _common.get_str(item, "input", path)}
        call = model.ToolCallBlock(id=call_id, name=name, input=tool_input)
        return "assistant", (
            _openai_common.with_data(
                call, _responses_call(call, path, CANONICAL), item, RESPONSES, path
            ),
        )
    if kind in ("function_call_output", "custom_tool_call_output") and item.get("call_id"):
        raw = item.get("output")
        output: str | tuple[ToolResultPart, ...]
        if isinstance(raw, str):
            output = raw
        else:
            listed = _common.as_list(raw, f"{path}.output")
            output = tuple(
                _responses_part_from(p, "user", False, f"{path}.output[{i}]")
                for i, p in enumerate(listed)
            )
        result = model.ToolResultBlock(
            call_id=_common.get_str(item, "call_id", path, non_empty=True), output=output
        )
        canonical = _responses_tool_output(result, path, CANONICAL)
        return "user", (
            _openai_common.with_data(result, canonical, item, RESPONSES, path, ("output",)),
        )
    if kind == "reasoning":
        summary = _common.as_list(item.get("summary", []), f"{path}.summary")
        texts = []
        for i, s in enumerate(summary):
            entry = _common.as_mapping(s, f"{path}.summary[{i}]")
            texts.append(_common.get_str(entry, "text", f"{path}.summary[{i}]"))
        reasoning = model.ReasoningBlock(
            text="\n\n".join(texts),
            provider="openai",
            signature=_common.get_opt_str(item, "encrypted_content", path) or None,
            id=_common.get_opt_str(item, "id", path),
        )
        return "assistant", (
            _openai_common.with_data(
                reasoning, _responses_reasoning(reasoning), item, RESPONSES, path
            ),
        )
    if kind is not None and not isinstance(kind, str):
        _common.fail("item type must be a string", f"{path}.type")
    native = model.NativeBlock(provider=RESPONSES, data=copy_json_object(item, path))
    user_side = kind in _USER_ITEMS or kind in ("function_call_output", "custom_tool_call_output")
    return ("user" if user_side else "assistant"), (native,)


def _is_part(block: model.SessionContentBlock) -> bool:
    return isinstance(block, model.TextBlock | model.ImageBlock | model.FileBlock)


def _drop_empty_item_mark(block: model.SessionContentBlock) -> model.SessionContentBlock:
    """Leave out an ``item: {}`` mark where the default grouping starts a new item anyway."""
    data = getattr(block, "provider_data", None)
    if not data or data.get("provider") != RESPONSES or data.get("item") != {}:
        return block
    rest = {k: v for k, v in data.items() if k != "item"}
    return msgspec.structs.replace(block, provider_data=rest if len(rest) > 1 else None)


def from_openai_responses(items: Sequence[Mapping[str, Any]]) -> list[model.SessionMessage]:
    """Convert Responses API input items to neutral messages.

    Consecutive items of one role merge into one message: ``function_call``,
    ``custom_tool_call`` and ``reasoning`` items are assistant content,
    ``function_call_output`` items user content; ``developer`` messages
    become ``system``; server-side tool items (web search, MCP, computer
    use…) and item references become native blocks. Item ids, ``status``,
    ``phase`` and how parts were grouped are kept in ``providerData``;
    ``to_openai_responses`` gives the same items back.
    """
    listed = _common.as_list(items, "$")
    out: list[model.SessionMessage] = []
    for index, value in enumerate(listed):
        role, blocks = _responses_item_from(value, f"$[{index}]")
        after_part = bool(out) and out[-1].role == role and _is_part(out[-1].content[-1])
        if blocks and not (after_part and role != "assistant"):
            blocks = (_drop_empty_item_mark(blocks[0]), *blocks[1:])
        if out and out[-1].role == role:
            out[-1] = model.SessionMessage(role=role, content=out[-1].content + blocks)
        else:
            out.append(model.SessionMessage(role=role, content=blocks))
    return out
