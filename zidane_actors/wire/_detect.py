"""Converting a wire message of unknown provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model import SessionMessage
from ._anthropic import from_anthropic
from ._common import as_mapping
from ._openai import from_openai, from_openai_responses

__all__ = ["auto_detect_and_convert"]

_OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
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

    OpenAI Chat Completions is recognised by its roles (``tool``,
    ``developer``), ``tool_calls``, a ``null`` content or part types (``image_url``, ``file``,
    ``input_audio``, ``refusal``); a Responses ``message`` item by its
    ``input_*``/``output_text`` parts.
    """
    m = as_mapping(msg, "$")
    types = _part_types(m.get("content"))
    openai_shaped = m.get("role") in ("tool", "developer") or "tool_calls" in m
    if openai_shaped or m.get("content") is None or types & _OPENAI_PARTS:
        return from_openai(m)
    if types & _RESPONSES_PARTS:
        return from_openai_responses([m])[0]
    return from_anthropic(m)
