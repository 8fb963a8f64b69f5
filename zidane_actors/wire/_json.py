"""Copying untrusted JSON objects into fresh builtins (so outputs never alias inputs)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import WireTypeError
from ..model import preview
from ._common import fail

__all__ = [
    "arguments_to_json",
    "check_json_types",
    "copy_json_object",
    "copy_json_value",
    "json_text",
]


def _copy(value: object, path: str, depth: int) -> Any:
    if depth > 256:
        fail("JSON nesting is too deep", path)
    if isinstance(value, float) and not math.isfinite(value):
        fail(f"not a JSON number: {preview(value)}", path)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_copy(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireTypeError(f"object key {preview(key)} is not a string", path=path)
            out[key] = _copy(item, f"{path}.{key}", depth + 1)
        return out
    raise WireTypeError(f"not a JSON value: {type(value).__name__}", path=path)


def check_json_types(value: object, path: str) -> None:
    """Raise the located :class:`WireTypeError` for the first value of a type JSON cannot carry.

    Only types and keys are checked (a ``NaN``, or nesting past what JSON
    keeps, is left to the converters); nesting past 256 levels is not walked.
    """
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        here, where, depth = stack.pop()
        if here is None or isinstance(here, bool | int | float | str) or depth > 256:
            continue
        if isinstance(here, list | tuple):
            children = [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(here)]
        elif isinstance(here, Mapping):
            children = []
            for key, v in here.items():
                if not isinstance(key, str):
                    raise WireTypeError(f"object key {preview(key)} is not a string", path=where)
                children.append((v, f"{where}.{key}", depth + 1))
        else:
            raise WireTypeError(f"not a JSON value: {type(here).__name__}", path=where)
        stack.extend(reversed(children))  # depth first, in order: the first bad value is named


def copy_json_object(value: object, path: str) -> dict[str, Any]:
    """A deep copy of the JSON object ``value``, or a located error if it is not one."""
    if not isinstance(value, Mapping):
        fail(f"expected an object, got {type(value).__name__}", path)
    copied: dict[str, Any] = _copy(value, path, 0)
    return copied


def copy_json_value(value: object, path: str) -> Any:
    """A deep copy of the JSON value ``value``, or a located error if it is not one."""
    return _copy(value, path, 0)


def json_text(value: object, path: str, *, compact: bool = True, sort_keys: bool = False) -> str:
    """``value`` as JSON text; what JSON cannot carry is a located error.

    The happy path is one ``json.dumps``; only a value it refuses (nested
    past what it recurses through, ``NaN``, a non-JSON type) is walked again
    to name where (``$.content[0].input.a[3]``), never a ``RecursionError``.
    """
    separators = (",", ":") if compact else (", ", ": ")
    try:
        return json.dumps(
            value, ensure_ascii=False, separators=separators, sort_keys=sort_keys, allow_nan=False
        )
    except (RecursionError, ValueError, TypeError):
        copy_json_value(value, path)  # raises the located error when the walk finds it
        raise


def arguments_to_json(tool_input: Mapping[str, Any], path: str) -> str:
    """The neutral input object as compact JSON arguments text.

    Always the object itself, so an input that really has a ``_raw`` key
    reaches the tool as it is.
    """
    return json_text(tool_input, f"{path}.input")
