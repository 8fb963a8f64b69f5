"""Shared helpers of the converters: located input checks, media types, data URLs, arguments."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import msgspec

from ..errors import WireFormatError
from ..model import (
    SessionMessage,
    SessionTurn,
    ToolCallBlock,
    ToolResultBlock,
    check_json,
    check_shape,
)

__all__ = [
    "RAW_ARGUMENTS_KEY",
    "arguments_from_json",
    "as_list",
    "as_mapping",
    "check_messages",
    "diagnosed",
    "diagnosed_async",
    "fail",
    "get_opt_str",
    "get_str",
    "normalize_media_type",
    "parse_data_url",
    "reindex",
    "to_data_url",
    "tool_id_map",
]

RAW_ARGUMENTS_KEY = "_raw"
"""Key under which tool arguments that are not a JSON object are kept verbatim."""

_DATA_URL = re.compile(r"^data:([^;,]+)?((?:;[^;,]*)*);base64,(.*)$", re.DOTALL)


P = ParamSpec("P")
R = TypeVar("R")

MESSAGE_TYPES: tuple[type[SessionMessage], type[SessionTurn]] = (SessionMessage, SessionTurn)
"""What the converters take as a message (a turn is one, with an id and a time)."""


def check_messages(messages: object, *, one: bool = False) -> None:
    """Refuse messages (or, with ``one``, a message) built with a field of the wrong type.

    A converter would otherwise turn a wrong value into another one on the
    wire (an unknown role into ``assistant``, ``isError="no"`` into ``true``)
    or fail deep inside. Located :class:`WireFormatError` (see ``model.check_shape``).
    """
    what = "message" if one else "messages"
    check_shape(messages, MESSAGE_TYPES, what=what, one=one, error=WireFormatError)


def diagnosed(
    param: str, types: tuple[type[msgspec.Struct], ...] = MESSAGE_TYPES, *, one: bool = False
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Re-raise a ``TypeError``/``AttributeError`` of the wrapped function, when its argument
    ``param`` (the first positional one) holds a value of the wrong type, as that value's
    located :class:`WireFormatError`.

    A valid call pays nothing; a crash on a wrongly built value says which
    and where (the functions that only read messages and pass them on, and
    the converters, after their own check, for what msgspec reads loosely:
    a dict standing for a block).
    """
    what = ("message" if param == "msg" else param.rstrip("s")) if one else param

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except (TypeError, AttributeError):
                given = args[0] if args else kwargs.get(param)
                check_shape(given, types, what=what, one=one, error=WireFormatError, walk=True)
                raise

        return call

    return wrap


def diagnosed_async(
    param: str, types: tuple[type[msgspec.Struct], ...] = MESSAGE_TYPES
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """:func:`diagnosed` for an async function."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return await fn(*args, **kwargs)
            except (TypeError, AttributeError):
                given = args[0] if args else kwargs.get(param)
                check_shape(given, types, what=param, error=WireFormatError, walk=True)
                raise

        return call

    return wrap


def fail(message: str, path: str) -> NoReturn:
    """Raise the located :class:`WireFormatError`."""
    raise WireFormatError(message, path=path)


def _kind(value: object) -> str:
    return type(value).__name__


def as_mapping(value: object, path: str) -> Mapping[str, Any]:
    """``value`` as a mapping, or a located error."""
    if not isinstance(value, Mapping):
        fail(f"expected an object, got {_kind(value)}", path)
    return value


def as_list(value: object, path: str) -> Sequence[Any]:
    """``value`` as a list (not a string), or a located error."""
    if not isinstance(value, list | tuple):
        fail(f"expected an array, got {_kind(value)}", path)
    return value


def get_str(obj: Mapping[str, Any], key: str, path: str, *, non_empty: bool = False) -> str:
    """The required string field ``key`` of ``obj``."""
    value = obj.get(key)
    if not isinstance(value, str):
        what = "missing" if key not in obj else f"expected a string, got {_kind(value)}"
        fail(f"{what} field {key!r}", f"{path}.{key}")
    if non_empty and not value:
        fail(f"field {key!r} must not be empty", f"{path}.{key}")
    return value


def get_opt_str(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    """The optional string field ``key`` of ``obj`` (absent or ``null`` → ``None``)."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        fail(f"expected a string, got {_kind(value)}", f"{path}.{key}")
    return value


def normalize_media_type(media_type: str) -> str:
    """Lower-case a media type and fix the common ``image/jpg`` alias."""
    lowered = media_type.strip().lower()
    return "image/jpeg" if lowered == "image/jpg" else lowered


def parse_data_url(url: str) -> tuple[str, str] | None:
    """``(media_type, base64_data)`` of a base64 ``data:`` URL, ``None`` for other URLs."""
    match = _DATA_URL.match(url)
    if match is None:
        return None
    return normalize_media_type(match.group(1) or "application/octet-stream"), match.group(3)


def to_data_url(media_type: str, data: str) -> str:
    """A base64 ``data:`` URL."""
    return f"data:{media_type};base64,{data}"


def arguments_from_json(arguments: str) -> dict[str, Any]:
    """Tool arguments (a JSON string) as the neutral input object.

    Text that is not a JSON object (invalid, empty, an array…), or one JSON
    cannot store exactly (``NaN``, nested past ``MAX_JSON_DEPTH``), is kept as
    ``{"_raw": text}`` so other providers still get an object; the converters
    keep the original text itself in ``providerData``.
    """
    parsed = _exact_object(arguments)
    return {RAW_ARGUMENTS_KEY: arguments} if parsed is None else parsed


def _exact_object(text: str) -> dict[str, Any] | None:
    """``text`` parsed, when it is a JSON object a store keeps exactly (see ``check_json``)."""
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            check_json(parsed)  # as the store checks a ToolCallBlock.input
            return parsed
    except (ValueError, RecursionError):
        pass
    return None


def reindex(exc: WireFormatError, index: int) -> WireFormatError:
    """``exc`` re-located inside element ``index`` of a list (``$.x`` → ``$[index].x``)."""
    path = exc.path or "$"
    text = str(exc)
    suffix = f" (at {exc.path})"
    message = text[: -len(suffix)] if exc.path and text.endswith(suffix) else text
    return WireFormatError(message, path=f"$[{index}]{path[1:]}")


def tool_id_map(
    messages: Iterable[SessionMessage],
    keep: Callable[[str], bool],
    candidate: Callable[[str, int], str],
) -> dict[str, str]:
    """Replacement ids for the tool ids of ``messages`` not to ``keep``.

    Both sides of a pair get the same replacement: ``candidate(id, widen)``,
    ``widen`` counting up from 0 until it collides with no other id (kept or
    given), ids taken in sorted order so the map is deterministic.
    """
    ids: dict[str, None] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                ids[block.id] = None
            elif isinstance(block, ToolResultBlock):
                ids[block.call_id] = None
    taken = {i for i in ids if keep(i)}
    mapping: dict[str, str] = {}
    for call_id in sorted(i for i in ids if i not in taken):
        widen = 0
        replacement = candidate(call_id, widen)
        while replacement in taken:
            widen += 1
            replacement = candidate(call_id, widen)
        mapping[call_id] = replacement
        taken.add(replacement)
    return mapping
