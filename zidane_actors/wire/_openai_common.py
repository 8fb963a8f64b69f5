"""OpenAI wire pieces both the Chat Completions and Responses converters use."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from ..model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    SessionMessage,
    TextBlock,
)
from ._common import (
    diagnosed,
    fail,
    normalize_media_type,
    parse_data_url,
    to_data_url,
    tool_id_map,
)
from ._downgrade import ConvertContext, foreign_text
from ._provider_data import (
    apply_patch,
    data_for,
    diff_into,
    sniff_image_media_type,
)

__all__ = [
    "OPENAI_TOOL_ID_MAX_LENGTH",
    "Role",
    "file_data",
    "file_from_data",
    "fix_image_url",
    "foreign_part",
    "form",
    "image_from_url",
    "image_url",
    "openai_tool_id_map",
    "patched",
    "refusal_kind",
    "with_data",
]


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
    return tool_id_map(messages, lambda i: len(i) <= OPENAI_TOOL_ID_MAX_LENGTH, _short_id)


def image_from_url(url: str) -> ImageBlock:
    inline = parse_data_url(url)
    if inline is None:
        return ImageBlock(url=url)
    return ImageBlock(media_type=inline[0], data=inline[1])


def file_from_data(file_data: str, name: str | None) -> FileBlock:
    inline = parse_data_url(file_data)
    if inline is None:  # bare base64: OpenAI file inputs are PDFs by default
        return FileBlock(media_type=_DEFAULT_FILE_MEDIA_TYPE, data=file_data, name=name)
    return FileBlock(media_type=inline[0], data=inline[1], name=name)


def image_url(block: ImageBlock, path: str) -> str:
    if block.url is not None:
        return block.url
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return to_data_url(normalize_media_type(block.media_type or ""), block.data)


def fix_image_url(url: object) -> object:
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


def file_data(block: FileBlock, path: str) -> str:
    if block.data is None:
        fail("unresolved content ref (resolve refs before converting)", f"{path}.ref")
    return to_data_url(normalize_media_type(block.media_type or ""), block.data)


def with_data(
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


def patched(out: dict[str, Any], block: Any, provider: str) -> dict[str, Any]:
    data = data_for(block.provider_data, provider)
    return apply_patch(out, data) if data else out


def refusal_kind(block: TextBlock) -> str | None:
    data = block.provider_data
    if data and str(data.get("provider", "")).startswith("openai"):
        kind = data.get("refusal")
        return kind if isinstance(kind, str) else None
    return None


def form(parts: list[dict[str, Any]], form: object, default: str) -> str | list[dict[str, Any]]:
    if (form or default) != "string" or len(parts) != 1:
        return parts
    part = parts[0]
    plain_text = part.get("type") in ("text", "input_text", "output_text")
    if plain_text and set(part) <= {"type", "text", "annotations"} and not part.get("annotations"):
        text: str = part["text"]
        return text
    return parts


def foreign_part(
    block: NativeBlock, kind: str, path: str, ctx: ConvertContext
) -> dict[str, Any] | None:
    text = foreign_text(block, path, ctx)
    return None if text is None else {"type": kind, "text": text}
