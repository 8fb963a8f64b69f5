"""Anthropic Messages API ↔ neutral messages."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from .. import model
from ..errors import WireFormatError
from ..model._types import ToolResultPart
from . import _common
from ._downgrade import CANONICAL, ConvertContext, DowngradeSink, foreign_text, native_type
from ._json import copy_json_object
from ._provider_data import (
    ANTHROPIC,
    apply_container_patch,
    apply_patch,
    content_form,
    data_for,
    diff_into,
    sniff_image_media_type,
)
from ._reasoning import reasoning_wire_action

__all__ = [
    "ANTHROPIC_IMAGE_MEDIA_TYPES",
    "REFUSAL_FALLBACK_TEXT",
    "anthropic_tool_id_map",
    "from_anthropic",
    "from_anthropic_request",
    "refusal_text",
    "to_anthropic",
    "to_anthropic_request",
]

ANTHROPIC_IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Media types Anthropic accepts for base64 images."""

_VALID_ID = re.compile(r"[a-zA-Z0-9_-]+")
_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9_-]")


REFUSAL_FALLBACK_TEXT = "(The model declined to answer.)"
"""What a blank OpenAI refusal becomes for a provider without refusals."""


def refusal_text(block: model.TextBlock) -> str | None:
    """The text of an OpenAI refusal block for a provider without refusals (never blank).

    ``None`` when ``block`` is not a refusal.
    """
    data = block.provider_data
    if (
        not data
        or not str(data.get("provider", "")).startswith("openai")
        or not data.get("refusal")
    ):
        return None
    return block.text if block.text.strip() else REFUSAL_FALLBACK_TEXT


# ---------------------------------------------------------------- wire → neutral


def _image_from(block: Mapping[str, Any], path: str) -> model.ImageBlock | None:
    source = _common.as_mapping(block.get("source"), f"{path}.source")
    kind = _common.get_str(source, "type", f"{path}.source")
    if kind == "base64":
        media_type = _common.get_str(source, "media_type", f"{path}.source", non_empty=True)
        data = _common.get_str(source, "data", f"{path}.source")
        return model.ImageBlock(media_type=_common.normalize_media_type(media_type), data=data)
    if kind == "url":
        return model.ImageBlock(url=_common.get_str(source, "url", f"{path}.source"))
    return None


def _document_from(block: Mapping[str, Any], path: str) -> model.FileBlock | None:
    source = _common.as_mapping(block.get("source"), f"{path}.source")
    kind = _common.get_str(source, "type", f"{path}.source")
    title = block.get("title")
    name = title if isinstance(title, str) and title else None
    if kind == "base64":
        media_type = _common.get_str(source, "media_type", f"{path}.source", non_empty=True)
        data = _common.get_str(source, "data", f"{path}.source")
        return model.FileBlock(
            media_type=_common.normalize_media_type(media_type), data=data, name=name
        )
    if kind == "text":
        return model.FileBlock(text=_common.get_str(source, "data", f"{path}.source"), name=name)
    if kind == "url":
        return model.FileBlock(url=_common.get_str(source, "url", f"{path}.source"), name=name)
    return None


def _tool_result_from(block: Mapping[str, Any], path: str) -> model.ToolResultBlock:
    call_id = _common.get_str(block, "tool_use_id", path, non_empty=True)
    content = block.get("content", "")
    output: str | tuple[ToolResultPart, ...]
    if isinstance(content, str):
        output = content
    else:
        parts = _common.as_list(content, f"{path}.content")
        output = tuple(_part_from(p, f"{path}.content[{i}]") for i, p in enumerate(parts))
    is_error = block.get("is_error", False)
    if is_error is None:
        is_error = False
    if not isinstance(is_error, bool):
        _common.fail("expected a boolean", f"{path}.is_error")
    return model.ToolResultBlock(call_id=call_id, output=output, is_error=is_error or None)


def _neutral_from(
    block: Mapping[str, Any], kind: str, path: str
) -> model.SessionContentBlock | None:
    if kind == "text":
        return model.TextBlock(_common.get_str(block, "text", path))
    if kind == "image":
        return _image_from(block, path)
    if kind == "document":
        return _document_from(block, path)
    if kind == "tool_use":
        return model.ToolCallBlock(
            id=_common.get_str(block, "id", path, non_empty=True),
            name=_common.get_str(block, "name", path, non_empty=True),
            input=copy_json_object(block.get("input"), f"{path}.input"),
        )
    if kind == "tool_result":
        return _tool_result_from(block, path)
    if kind == "thinking":
        signature = _common.get_opt_str(block, "signature", path)
        return model.ReasoningBlock(
            text=_common.get_str(block, "thinking", path),
            provider="anthropic",
            signature=signature or None,
        )
    if kind == "redacted_thinking":
        return model.ReasoningBlock(
            provider="anthropic", redacted_data=_common.get_str(block, "data", path, non_empty=True)
        )
    return None


def _with_data(
    neutral: Any, original: Mapping[str, Any], role: str, path: str, children: Iterable[str]
) -> Any:
    """``neutral`` carrying what of ``original`` its canonical form does not reproduce."""
    canonical = _block_to(neutral, role, path, CANONICAL)
    if canonical is None:  # left out on the way back anyway (blank text, unsendable reasoning)
        return neutral
    data: dict[str, Any] = {"provider": ANTHROPIC}
    diff_into(data, canonical, original, children=children, path=path)
    if len(data) == 1:
        return neutral
    return msgspec.structs.replace(neutral, provider_data=data)


def _native(block: Mapping[str, Any], path: str) -> model.NativeBlock:
    return model.NativeBlock(provider=ANTHROPIC, data=copy_json_object(block, path))


def _part_from(value: object, path: str) -> ToolResultPart:
    block = _common.as_mapping(value, path)
    kind = _common.get_str(block, "type", path)
    neutral = _neutral_from(block, kind, path) if kind in ("text", "image", "document") else None
    if neutral is None:
        return _native(block, path)
    assert isinstance(neutral, model.TextBlock | model.ImageBlock | model.FileBlock)
    part: ToolResultPart = _safe_with_data(neutral, block, "user", path)
    return part


def _safe_with_data(neutral: Any, block: Mapping[str, Any], role: str, path: str) -> Any:
    children = ("content",) if isinstance(neutral, model.ToolResultBlock) else ()
    try:
        return _with_data(neutral, block, role, path, children)
    except WireFormatError:  # no canonical form (e.g. an unusual media type): keep it verbatim
        return _native(block, path)


def _block_from(value: object, role: str, path: str) -> model.SessionContentBlock:
    block = _common.as_mapping(value, path)
    kind = _common.get_str(block, "type", path)
    neutral = _neutral_from(block, kind, path)
    if neutral is None:
        return _native(block, path)
    return _safe_with_data(neutral, block, role, path)  # type: ignore[no-any-return]


_MESSAGE_PARAM_KEYS = frozenset({"role", "content"})
"""The keys of a ``MessageParam``; the API refuses any other key in a request message."""


def from_anthropic(msg: Mapping[str, Any]) -> model.SessionMessage:
    """Convert an Anthropic message (``user``, ``assistant`` or ``system``) to a neutral message.

    Every block the API defines is kept: text, images, documents, tool use
    and results, thinking map to neutral blocks (their other fields, such as
    ``cache_control``, ``citations``, ``title``/``context``, in
    ``providerData``); server-tool blocks, search results, file-id sources
    and any other block become :class:`~zidane_actors.model.NativeBlock`.
    ``to_anthropic`` gives the same JSON back. A response ``Message``'s
    envelope (``id``, ``model``, ``usage``, ``stop_reason``…: every key but
    ``role`` and ``content``) is kept under ``providerData["response"]`` and
    left out of what ``to_anthropic`` writes, which the API would refuse.
    """
    return _from_anthropic(msg, entry=True)


def _from_anthropic(msg: Mapping[str, Any], *, entry: bool) -> model.SessionMessage:
    m = _common.as_mapping(msg, "$")
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        _common.fail(f"unsupported role {model.preview(role)}", "$.role")
    content = m.get("content")
    blocks: tuple[model.SessionContentBlock, ...]
    if isinstance(content, str):
        blocks = (model.TextBlock(content),)
    else:
        listed = _common.as_list(content, "$.content")
        blocks = tuple(_block_from(b, role, f"$.content[{i}]") for i, b in enumerate(listed))
    data: dict[str, Any] = {"provider": ANTHROPIC}
    if isinstance(content, str):
        data["form"] = "string"
    if role == "system" and entry:
        data["entry"] = True  # a system entry of the messages list: it stays there
    envelope = {k: v for k, v in m.items() if k not in _MESSAGE_PARAM_KEYS}
    if envelope:  # a response (``Message``) passed as a message: kept, never sent back
        data["response"] = copy_json_object(envelope, "$")
    message = model.SessionMessage(role=role, content=blocks, provider_data=dict(data))
    canonical = _to_anthropic(message, CANONICAL)
    request = {k: v for k, v in m.items() if k in _MESSAGE_PARAM_KEYS}
    diff_into(data, canonical, request, children=("content",))
    message = msgspec.structs.replace(message, provider_data=data if len(data) > 1 else None)
    return message


def from_anthropic_request(request: Mapping[str, Any]) -> list[model.SessionMessage]:
    """The conversation of a ``messages.create`` request (its ``system`` and ``messages``).

    A top-level ``system`` (string or block list) becomes a leading system
    message; other request options are not part of the conversation and are
    ignored. ``to_anthropic_request`` gives ``system`` and ``messages`` back.
    """
    r = _common.as_mapping(request, "$")
    out: list[model.SessionMessage] = []
    if r.get("system") is not None:
        try:
            out.append(_from_anthropic({"role": "system", "content": r["system"]}, entry=False))
        except WireFormatError as exc:
            path = (exc.path or "$").replace("$.content", "$.system", 1)
            raise WireFormatError(_bare(exc), path=path) from None
    for index, value in enumerate(_common.as_list(r.get("messages"), "$.messages")):
        try:
            out.append(from_anthropic(value))
        except WireFormatError as exc:
            path = exc.path or "$"
            raise WireFormatError(_bare(exc), path=f"$.messages[{index}]{path[1:]}") from None
    return out


def _bare(exc: WireFormatError) -> str:
    text = str(exc)
    suffix = f" (at {exc.path})"
    return text[: -len(suffix)] if exc.path and text.endswith(suffix) else text


# ---------------------------------------------------------------- neutral → wire


def _candidate(call_id: str, widen: int) -> str:
    stem = _INVALID_CHAR.sub("_", call_id)[:48]
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    if widen < 52:
        return f"{stem}_{digest[: 12 + widen]}"
    return f"{stem}_{digest}_{widen}"


@_common.diagnosed("messages")
def anthropic_tool_id_map(messages: Iterable[model.SessionMessage]) -> dict[str, str]:
    """Replacement ids for the tool ids Anthropic would reject (``^[a-zA-Z0-9_-]+$``).

    Both sides of a pair get the same replacement; each is derived from the
    original id (sanitized stem + sha256 prefix, so it is deterministic) and
    widened until it collides with no other id of ``messages``.
    """
    return _common.tool_id_map(messages, lambda i: _VALID_ID.fullmatch(i) is not None, _candidate)


def _emit_image(block: model.ImageBlock, path: str) -> dict[str, Any]:
    if block.url is not None:
        return {"type": "image", "source": {"type": "url", "url": block.url}}
    if block.data is None:
        _common.fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": block.media_type, "data": block.data},
    }


def _emit_document(block: model.FileBlock, path: str) -> dict[str, Any]:
    source: dict[str, Any]
    if block.url is not None:
        source = {"type": "url", "url": block.url}
    elif block.text is not None:
        source = {"type": "text", "media_type": "text/plain", "data": block.text}
    elif block.data is not None:
        media_type = _common.normalize_media_type(block.media_type or "")
        if media_type == "application/pdf":
            source = {"type": "base64", "media_type": media_type, "data": block.data}
        elif media_type == "text/plain":
            try:
                text = base64.b64decode(block.data, validate=True).decode("utf-8")
            except ValueError:  # binascii.Error, non-ASCII text, UnicodeDecodeError
                _common.fail("text/plain file data is not base64 UTF-8", f"{path}.data")
            source = {"type": "text", "media_type": "text/plain", "data": text}
        else:
            _common.fail(
                f"Anthropic documents do not accept {model.preview(media_type)}",
                f"{path}.mediaType",
            )
    else:
        _common.fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    out: dict[str, Any] = {"type": "document", "source": source}
    if block.name:
        out["title"] = block.name
    return out


def _emit_part(part: ToolResultPart, path: str) -> dict[str, Any]:
    if isinstance(part, model.TextBlock):
        return {"type": "text", "text": part.text}
    if isinstance(part, model.ImageBlock):
        return _emit_image(part, path)
    if isinstance(part, model.FileBlock):
        return _emit_document(part, path)
    return copy_json_object(part.data, f"{path}.data")


def _emit(block: model.SessionContentBlock, path: str = "$") -> dict[str, Any]:
    """The canonical Anthropic JSON of ``block`` (no provider data, no checks, ids as they are)."""
    if isinstance(block, ToolResultPart):
        return _emit_part(block, path)
    if isinstance(block, model.ToolCallBlock):
        tool_input = copy_json_object(model.call_input(block), f"{path}.input")
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": tool_input}
    if isinstance(block, model.ToolResultBlock):
        content: str | list[dict[str, Any]]
        if isinstance(block.output, str):
            content = block.output
        else:
            content = [
                _finish(p, _emit_part(p, f"{path}.output[{i}]")) for i, p in enumerate(block.output)
            ]
        out: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": block.call_id,
            "content": content,
        }
        if block.is_error:
            out["is_error"] = True
        return out
    if block.redacted_data:
        return {"type": "redacted_thinking", "data": block.redacted_data}
    return {
        "type": "thinking",
        "thinking": model.reasoning_text(block),
        "signature": block.signature,
    }


def _finish(block: model.SessionContentBlock, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with ``block``'s Anthropic provider data applied, then the validity fixes."""
    if isinstance(block, model.NativeBlock):
        return out
    data = data_for(block.provider_data, ANTHROPIC)
    if data:
        apply_patch(out, data)
    source = out.get("source")
    if out.get("type") == "image" and isinstance(source, dict) and source.get("type") == "base64":
        data_text = source.get("data")
        declared = _common.normalize_media_type(str(source.get("media_type") or ""))
        sniffed = sniff_image_media_type(data_text) if isinstance(data_text, str) else None
        source["media_type"] = sniffed or declared
    return out


def _foreign(block: model.NativeBlock, path: str, ctx: ConvertContext) -> dict[str, Any] | None:
    text = foreign_text(block, path, ctx)
    return None if text is None else {"type": "text", "text": text}


def _part_to(part: ToolResultPart, path: str, ctx: ConvertContext) -> dict[str, Any] | None:
    if isinstance(part, model.NativeBlock):
        if part.provider == ANTHROPIC:
            return copy_json_object(part.data, f"{path}.data")
        return _foreign(part, path, ctx)
    if isinstance(part, model.TextBlock):
        refusal = refusal_text(part)
        if refusal is not None:
            return {"type": "text", "text": refusal}
        if not part.text.strip():
            return None
    out = _finish(part, _emit_part(part, path))
    if not _accepted_media(out):
        ctx.report(path, "dropped", "image")  # e.g. a BMP: Anthropic takes none
        return None
    return out


def _accepted_media(out: Mapping[str, Any]) -> bool:
    """Whether Anthropic takes ``out``'s inline image media type (other blocks: yes)."""
    source = out.get("source")
    if not (out.get("type") == "image" and isinstance(source, Mapping)):
        return True
    return source.get("type") != "base64" or source.get("media_type") in ANTHROPIC_IMAGE_MEDIA_TYPES


def _block_to(
    block: model.SessionContentBlock, role: str, path: str, ctx: ConvertContext
) -> dict[str, Any] | None:
    if isinstance(block, ToolResultPart):
        return _part_to(block, path, ctx)
    if isinstance(block, model.ToolCallBlock):
        if role != "assistant":
            _common.fail("tool_call blocks belong in assistant messages", path)
        out = _finish(block, _emit(block, path))
        out["id"] = ctx.ids.get(block.id, block.id)
        return out
    if isinstance(block, model.ToolResultBlock):
        if role != "user":
            _common.fail("tool_result blocks belong in user messages", path)
        content: str | list[dict[str, Any]]
        if isinstance(block.output, str):
            content = block.output
        else:
            converted = (
                _part_to(p, f"{path}.output[{i}]", ctx) for i, p in enumerate(block.output)
            )
            content = [p for p in converted if p is not None]
        out = _emit(msgspec.structs.replace(block, output=""), path)
        out["content"] = content
        out = _finish(block, out)
        out["tool_use_id"] = ctx.ids.get(block.call_id, block.call_id)
        return out
    if reasoning_wire_action(block, "anthropic") == "drop":
        ctx.report(path, "dropped", "reasoning")
        return None
    return _finish(block, _emit(block, path))


def _form(content: list[dict[str, Any]], form: object) -> str | list[dict[str, Any]]:
    single = len(content) == 1 and content[0].keys() == {"type", "text"}
    if form == "string" and single and content[0]["type"] == "text":
        text: str = content[0]["text"]
        return text
    return content


def _to_anthropic(msg: model.SessionMessage, ctx: ConvertContext) -> dict[str, Any]:
    blocks = list(enumerate(msg.content))
    if msg.role == "system":  # system content is text: other media are dropped, reported
        for j, block in blocks:
            if isinstance(block, model.ImageBlock | model.FileBlock):
                ctx.report(f"$.content[{j}]", "dropped", str(block.__struct_config__.tag))
            elif isinstance(block, model.NativeBlock) and block.provider == ANTHROPIC:
                ctx.report(f"$.content[{j}]", "dropped", native_type(block))
            elif not isinstance(block, model.TextBlock | model.NativeBlock):
                _common.fail("system messages may hold text only", f"$.content[{j}]")
        blocks = [
            (j, b)
            for j, b in blocks
            if not isinstance(b, model.ImageBlock | model.FileBlock)
            and not (isinstance(b, model.NativeBlock) and b.provider == ANTHROPIC)
        ]
    converted = (_block_to(b, msg.role, f"$.content[{i}]", ctx) for i, b in blocks)
    content = [b for b in converted if b is not None]
    data = data_for(msg.provider_data, ANTHROPIC)
    out = {"role": msg.role, "content": _form(content, content_form(msg, ANTHROPIC))}
    return apply_container_patch(out, data, ("content",))


@_common.diagnosed("msg", one=True)
def to_anthropic(
    msg: model.SessionMessage, *, on_downgrade: DowngradeSink | None = None
) -> dict[str, Any]:
    """Convert a neutral message to an Anthropic message (``MessageParam``).

    Anthropic ``providerData`` and native blocks come back exactly; another
    provider's native blocks become their text or are dropped, each reported
    to ``on_downgrade``; empty or whitespace-only text is left out, foreign
    reasoning is dropped (:func:`reasoning_wire_action`), tool ids Anthropic
    would reject are remapped (:func:`anthropic_tool_id_map`), an image's
    media type is taken from its bytes when they disagree.
    """
    _common.check_messages(msg, one=True)
    return _to_anthropic(msg, ConvertContext(anthropic_tool_id_map([msg]), 0, on_downgrade))


def _strip_final_whitespace(out: list[dict[str, Any]]) -> None:
    """Anthropic refuses a final assistant message whose text ends in whitespace (a prefill)."""
    last = out[-1]
    content = last["content"]
    if isinstance(content, str):
        last["content"] = content.rstrip()
        if not last["content"]:
            out.pop()
        return
    if content and content[-1].get("type") == "text" and isinstance(content[-1].get("text"), str):
        stripped = content[-1]["text"].rstrip()
        if stripped:
            content[-1]["text"] = stripped
        else:
            content.pop()
            if not content:
                out.pop()


@_common.diagnosed("messages")
def to_anthropic_request(
    messages: Sequence[model.SessionMessage], *, on_downgrade: DowngradeSink | None = None
) -> dict[str, Any]:
    """``{"system"?, "messages"}`` for ``messages.create``.

    Leading system messages form the top-level ``system`` (a string again
    when it came as one; left out when empty); a later system message stays
    a ``system`` entry at its position. The others are converted with one
    tool-id map for the whole conversation; those left with no content are
    skipped (a dropped audio reference, an emptied message: no tool call is
    ever lost, so pairing holds). A final assistant message (a prefill) loses
    the trailing whitespace of its last text, which Anthropic refuses.
    """
    _common.check_messages(messages)
    ids = anthropic_tool_id_map(messages)
    system: list[dict[str, Any]] = []
    system_form: object = None
    leading = 0
    while (
        leading < len(messages)
        and messages[leading].role == "system"
        and not data_for(messages[leading].provider_data, ANTHROPIC).get("entry")
    ):
        leading += 1
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        ctx = ConvertContext(ids, index, on_downgrade)
        try:
            converted = _to_anthropic(message, ctx)
        except WireFormatError as exc:
            raise _common.reindex(exc, index) from None
        if index < leading:
            content = converted["content"]
            system.extend(
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
            system_form = content_form(message, ANTHROPIC) if leading == 1 else None
        elif converted["content"]:
            out.append(converted)
    if out and out[-1]["role"] == "assistant":
        _strip_final_whitespace(out)
    request: dict[str, Any] = {"messages": out}
    if system:
        request["system"] = _form(system, system_form)
    return request
