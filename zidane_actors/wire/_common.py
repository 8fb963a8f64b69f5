"""Shared helpers of the converters: located input checks, media types, data URLs, arguments."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..errors import WireFormatError
from ..model import check_json

__all__ = [
    "RAW_ARGUMENTS_KEY",
    "arguments_from_json",
    "as_list",
    "as_mapping",
    "fail",
    "get_opt_str",
    "get_str",
    "normalize_media_type",
    "parse_data_url",
    "reindex",
    "to_data_url",
]

RAW_ARGUMENTS_KEY = "_raw"
"""Key under which tool arguments that are not a JSON object are kept verbatim."""

_DATA_URL = re.compile(r"^data:([^;,]+)?((?:;[^;,]*)*);base64,(.*)$", re.DOTALL)


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
