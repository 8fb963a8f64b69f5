"""Converting a wire message of unknown provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model import SessionMessage
from ._anthropic import from_anthropic
from ._common import as_mapping
from ._openai_chat import from_openai
from ._openai_responses import from_openai_responses

__all__ = ["auto_detect_and_convert"]

_OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
_OPENAI_KEYS = frozenset(
    {"tool_calls", "function_call", "refusal", "audio", "name", "tool_call_id", "reasoning_content"}
)
_RESPONSES_PARTS = frozenset({"input_text", "input_image", "input_file", "output_text"})


def _part_types(content: object) -> set[str]:
    if not isinstance(content, list | tuple):
        return set()
    return {
        part["type"]
        for part in content
        if isinstance(part, Mapping) and isinstance(part.get("type"), str)
    }


def auto_detect_and_convert(msg: Mapping[str, Any]) -> SessionMessage:
    """Convert an Anthropic or OpenAI message; block types decide, Anthropic is the default.

    A Responses item is recognised by a ``type`` without a ``role`` (or
    ``type: "message"``) or by ``input_*``/``output_text`` parts; Chat
    Completions by its roles (``tool``, ``developer``, ``function``), its
    message fields (``tool_calls``, ``refusal``, ``audio``, ``name``…), a
    ``null`` content or part types (``image_url``, ``file``,
    ``input_audio``, ``refusal``).
    """
    m = as_mapping(msg, "$")
    types = _part_types(m.get("content"))
    kind = m.get("type")
    if "role" not in m and isinstance(kind, str):
        return from_openai_responses([m])[0]  # a function_call, reasoning, web_search_call… item
    if types & _RESPONSES_PARTS or (kind == "message" and not m.keys() & {"model", "stop_reason"}):
        return from_openai_responses([m])[0]
    openai_shaped = m.get("role") in ("tool", "developer", "function") or m.keys() & _OPENAI_KEYS
    if openai_shaped or m.get("content") is None or types & _OPENAI_PARTS:
        return from_openai(m)
    return from_anthropic(m)
