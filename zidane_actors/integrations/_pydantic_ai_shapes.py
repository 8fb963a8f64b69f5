"""pydantic-ai messages of shapes proven to come back from their lean turns exactly.

``messages_to_turns`` converts each message back from the turns it made and
compares, to store only what gives the message back. For the shapes of
:data:`PROVEN_FIELDS` (text prompts and answers, tool calls with JSON
arguments, tool returns of text, UTC timestamps, durations, token counts; every other
field at its default) the property tests prove the lean turns always do,
so the comparison is skipped for them; a field of a newer pydantic-ai
this table does not name is taken only at a ``None`` default.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic_ai.messages import (
    FinishReason,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from ..model import has_lone_surrogate

__all__ = ["PROVEN_FIELDS", "proven"]

Rule = Callable[[Any, Any], bool]
"""A field's rule: ``rule(value, the field's default)``."""


def _default(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default


def _text(value: Any, default: Any) -> bool:
    return type(value) is str


def _maybe_text(value: Any, default: Any) -> bool:
    return value is None or type(value) is str


def _utc(value: Any, default: Any) -> bool:
    return type(value) is datetime.datetime and value.tzinfo is datetime.UTC


def _maybe_utc(value: Any, default: Any) -> bool:
    return value is None or _utc(value, default)


def _maybe_duration(value: Any, default: Any) -> bool:
    return value is None or type(value) is datetime.timedelta


def _count(value: Any, default: Any) -> bool:
    return type(value) is int and value >= 0


_FINISH_REASONS: Final = frozenset(typing.get_args(FinishReason))


def _finish_reason(value: Any, default: Any) -> bool:
    return value is None or value in _FINISH_REASONS


def _json(value: Any) -> bool:
    """A value pydantic's JSON keeps exactly: finite floats, str keys without lone
    surrogates (it replaces them), no tuples or other types."""
    kind = type(value)
    if kind in (str, int, bool) or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(_json(v) for v in value)
    return kind is dict and all(
        type(k) is str and not has_lone_surrogate(k) and _json(v) for k, v in value.items()
    )


def _arguments(value: Any, default: Any) -> bool:
    return type(value) is str or (type(value) is dict and _json(value))


def _usage(value: Any, default: Any) -> bool:
    return type(value) is RequestUsage and _fits(value)


def _parts(*kinds: type) -> Rule:
    def rule(value: Any, default: Any) -> bool:
        return type(value) is list and all(type(p) in kinds and _fits(p) for p in value)

    return rule


PROVEN_FIELDS: Final[Mapping[type, Mapping[str, Rule]]] = {
    # Each class's fields and their rules; a field not named must be at a None default.
    ModelRequest: {
        "parts": _parts(UserPromptPart, SystemPromptPart, ToolReturnPart),
        "timestamp": _maybe_utc,
        "instructions": _maybe_text,
        "kind": _default,
        "run_id": _maybe_text,
        "conversation_id": _maybe_text,
        "state": _default,
    },
    ModelResponse: {
        "parts": _parts(TextPart, ToolCallPart),
        "usage": _usage,
        "model_name": _maybe_text,
        "model_id": _maybe_text,
        "timestamp": _utc,
        "request_timestamp": _maybe_utc,
        "duration": _maybe_duration,
        "kind": _default,
        "provider_name": _maybe_text,
        "provider_response_id": _maybe_text,
        "finish_reason": _finish_reason,
        "run_id": _maybe_text,
        "conversation_id": _maybe_text,
        "state": _default,
    },
    UserPromptPart: {"content": _text, "timestamp": _utc, "part_kind": _default},
    SystemPromptPart: {
        "content": _text,
        "timestamp": _utc,
        "scope": _default,
        "part_kind": _default,
    },
    ToolReturnPart: {
        "tool_name": _text,
        "content": _text,
        "tool_call_id": _text,
        "timestamp": _utc,
        "outcome": _default,
        "part_kind": _default,
    },
    TextPart: {"content": _text, "part_kind": _default},
    ToolCallPart: {
        "tool_name": _text,
        "args": _arguments,
        "tool_call_id": _text,
        "part_kind": _default,
    },
    RequestUsage: {
        **{name: _count for name in ("input_tokens", "output_tokens")},
        **{name: _count for name in ("cache_read_tokens", "cache_write_tokens")},
        **{name: _default for name in ("cache_write_1h_tokens", "unmeasured_requests")},
        **{name: _default for name in ("output_reasoning_tokens", "input_audio_tokens")},
        **{name: _default for name in ("cache_audio_read_tokens", "output_audio_tokens")},
        **{name: _default for name in ("audio_seconds", "details")},
    },
}


def _fields_of(kind: type) -> tuple[tuple[str, ...], tuple[tuple[str, Rule, Any], ...]]:
    """``kind``'s fields to be ``None`` (not named, at a ``None`` default; a field of
    another default not named makes the class unproven), and the others with
    their rule and default."""
    rules = PROVEN_FIELDS[kind]
    nones: list[str] = []
    ruled: list[tuple[str, Rule, Any]] = []
    for field in dataclasses.fields(kind):
        if field.name not in rules:
            nones.append(field.name)
            if field.default is not None:  # no default, another value or a factory
                ruled.append((field.name, _never, None))
        elif field.default is not dataclasses.MISSING:
            ruled.append((field.name, rules[field.name], field.default))
        elif field.default_factory is not dataclasses.MISSING:
            ruled.append((field.name, rules[field.name], field.default_factory()))
        else:
            ruled.append((field.name, rules[field.name], None))
    return tuple(nones), tuple(ruled)


def _never(value: Any, default: Any) -> bool:
    return False


_FIELDS: Final = {kind: _fields_of(kind) for kind in PROVEN_FIELDS}


def _fits(value: Any) -> bool:
    nones, ruled = _FIELDS[type(value)]
    for name in nones:
        if getattr(value, name) is not None:
            return False
    return all(rule(getattr(value, name), default) for name, rule, default in ruled)


def proven(message: ModelMessage) -> bool:
    """Whether ``message`` has a shape of :data:`PROVEN_FIELDS` (its lean turns give it back)."""
    return type(message) in (ModelRequest, ModelResponse) and _fits(message)
