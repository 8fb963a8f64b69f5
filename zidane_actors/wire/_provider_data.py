"""``providerData``: the wire details a neutral block or message has no field for.

A converter reading provider JSON builds the neutral value, converts it back
the canonical way, and keeps here only what differs from the original, so the
same wire format gets the original back byte-exact and every other reader sees
ordinary neutral fields. The value is a JSON object::

    {"provider": "anthropic",                 # the wire format it belongs to
     "set": {"/cache_control": {...}},        # JSON Pointer → original value
     "unset": ["/content"],                   # pointers the original lacked
     "form": "string" | "list",               # the content's form, when not the default
     ...}                                     # documented per-format keys (docs/wire.md)

Pointers follow RFC 6901 and address the block's (or message's) own wire
object. Differences inside lists replace the whole list.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import WireTypeError
from ..model import preview
from ._common import fail
from ._json import copy_json_value

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "RESPONSES",
    "apply_container_patch",
    "apply_patch",
    "content_form",
    "data_for",
    "diff_into",
    "json_same",
    "sniff_image_media_type",
    "written_as_string",
]

ANTHROPIC = "anthropic"
CHAT = "openai-chat"
RESPONSES = "openai-responses"


def data_for(provider_data: Mapping[str, Any] | None, provider: str) -> Mapping[str, Any]:
    """``provider_data`` when it belongs to ``provider``, else an empty mapping."""
    if provider_data is None or provider_data.get("provider") != provider:
        return {}
    return provider_data


def written_as_string(message: Any) -> bool:
    """Whether any wire format wrote ``message``'s content as a plain string.

    Other formats follow that form where they have it (a single text).
    """
    data = message.provider_data or {}
    if data.get("form") == "string":
        return True
    if len(message.content) != 1:
        return False
    block_data = getattr(message.content[0], "provider_data", None) or {}
    item = block_data.get("item") if block_data.get("provider") == RESPONSES else None
    return isinstance(item, Mapping) and item.get("form") == "string"


def content_form(message: Any, provider: str) -> object:
    """The content form to write ``message`` in for ``provider``: its own record, else the hint."""
    own = data_for(message.provider_data, provider)
    if "form" in own:
        return own["form"]
    return "string" if written_as_string(message) else None


def json_same(a: object, b: object) -> bool:
    """Equality of JSON values that tells ``1``, ``1.0`` and ``true`` apart.

    Objects and arrays compare by content whatever their Python class (a session's
    frozen memory holds ``FrozenDict``/``FrozenList``, a caller's copy plain ones).
    """
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _non_empty(value: object) -> bool:
    return isinstance(value, str | list | tuple) and len(value) > 0


def diff_into(
    out: dict[str, Any],
    canonical: Mapping[str, Any],
    original: Mapping[str, Any],
    *,
    children: Iterable[str] = (),
    path: str = "$",
) -> None:
    """Record in ``out`` (``set``/``unset``) how ``canonical`` becomes ``original``.

    Top-level ``children`` keys hold converted sub-values (content blocks,
    tool calls) that carry their own data: a non-empty original there is
    not recorded (the children rebuild it), only the empty forms
    (``null``, ``""``, ``[]``, absent) are.
    """
    sets: dict[str, Any] = dict(out.get("set", {}))
    unsets: list[str] = list(out.get("unset", []))
    skip = frozenset(children)

    def walk(c: Mapping[str, Any], o: Mapping[str, Any], pointer: str, top: bool) -> None:
        for key, value in o.items():
            if not isinstance(key, str):
                raise WireTypeError(f"object key {preview(key)} is not a string", path=path)
            here = f"{pointer}/{_escape(key)}"
            if top and key in skip and key in c and _non_empty(value):
                continue
            if key not in c:
                sets[here] = copy_json_value(value, f"{path}.{key}")
            elif isinstance(value, Mapping) and isinstance(c[key], Mapping):
                walk(c[key], value, here, False)
            elif not json_same(c[key], value):
                sets[here] = copy_json_value(value, f"{path}.{key}")
        unsets.extend(f"{pointer}/{_escape(key)}" for key in c if key not in o)

    walk(canonical, original, "", True)
    if sets:
        out["set"] = sets
    if unsets:
        out["unset"] = unsets


def apply_patch(obj: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with ``data``'s ``set``/``unset`` applied (``obj`` is modified and returned)."""
    sets = data.get("set") or {}
    unsets = data.get("unset") or []
    if not isinstance(sets, Mapping) or not isinstance(unsets, list | tuple):
        fail("providerData set/unset must be an object and an array", "$.providerData")
    for pointer, value in sets.items():
        parent, key = _walk(obj, pointer, create=True)
        if parent is not None:
            parent[key] = copy_json_value(value, "$.providerData.set")
    for pointer in unsets:
        parent, key = _walk(obj, pointer, create=False)
        if parent is not None:
            parent.pop(key, None)
    return obj


def apply_container_patch(
    obj: dict[str, Any], data: Mapping[str, Any], children: Iterable[str]
) -> dict[str, Any]:
    """:func:`apply_patch` for a message or item: non-empty ``children`` it holds are kept.

    The patch only records the empty forms of those keys, so content added
    after reading (a repair, an edit) is never replaced by them.
    """
    kept = {key: obj[key] for key in children if _non_empty(obj.get(key))}
    apply_patch(obj, data)
    obj.update(kept)
    return obj


def _walk(
    obj: dict[str, Any], pointer: object, *, create: bool
) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        fail(f"providerData pointer {preview(pointer)} is not a JSON Pointer", "$.providerData")
    tokens = [_unescape(t) for t in pointer[1:].split("/")]
    node: dict[str, Any] = obj
    for token in tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            if not create:
                return None, ""
            child = {}
            node[token] = child
        node = child
    return node, tokens[-1]


# ---------------------------------------------------------------- images

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image_media_type(data: str) -> str | None:
    """The image type the base64 ``data`` starts with (PNG/JPEG/GIF/WebP), else ``None``."""
    head = data[:24]
    head = head[: len(head) - len(head) % 4]
    try:
        raw = base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return None
    for magic, media_type in _MAGIC:
        if raw.startswith(magic):
            return media_type
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return None
